package reaper_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schema"
)

// TestExpiryIsAnnouncedAfterItsConnectionsAreCut: every connection of the
// reaper's process is terminated (an operator's pg_terminate_backend, a
// pooler's restart) just before a lease expires, with its pool full of
// connections that are now dead; the expiry is still announced within 1 s.
func TestExpiryIsAnnouncedAfterItsConnectionsAreCut(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	const app = "reaper under cut"
	cfg, err := pgxpool.ParseConfig(tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.AfterConnect = schema.PrepareSession
	// A busy process's connections are never idle for the second after
	// which the pool pings one before handing it out: the dead ones are
	// handed out as they are.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	got := observe(ctx, t, &wg, tdb.URL)
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) {
		c, err := pgx.ParseConfig(tdb.URL)
		if err != nil {
			return nil, err
		}
		c.RuntimeParams["application_name"] = app
		return pgx.ConnectConfig(ctx, c)
	}, zerolog.Nop(), notify.ChannelLease, notify.ChannelTask)
	wg.Go(func() { _ = l.Run(ctx) })
	store := leasestore.NewStore(pool)
	r := &reaper.Reaper{
		Store: store, Tasks: taskstore.NewStore(pool), Listener: l, Instance: "reaper-1",
		Keep: lease.KeepConfig{TTL: time.Minute}, Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	}
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("reaper: %v", err)
		}
	})
	waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == reaper.Resource && c.Kind == "acquired" }, "the reaper's election")

	for round := range 3 {
		// Fill the pool: every connection it holds is about to die.
		conns := make([]*pgxpool.Conn, 0, cfg.MaxConns)
		for range cfg.MaxConns {
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Release()
		}
		resource := fmt.Sprintf("job:%d", round)
		acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: resource, Holder: "w", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		before := time.Until(acq.Lease.ExpiresAt)
		var cut int
		if err := tdb.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&cut); err != nil {
			t.Fatal(err)
		}
		c := waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == resource && c.Kind == "expired" }, "the expiry of "+resource)
		var late time.Duration
		if err := tdb.Pool.QueryRow(ctx, `SELECT at - expires_at FROM lease_events WHERE lease_id = $1 AND kind = 'expired'`, c.ID).Scan(&late); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d connections cut %s before the expiry; announced %s after it", round, cut, before.Round(time.Millisecond), late)
		if late >= testkit.Bound(time.Second) || late < 0 {
			t.Errorf("round %d: announced %s after its expires_at; want within %s (1 s, with the test's slack)", round, late, testkit.Bound(time.Second))
		}
	}
}
