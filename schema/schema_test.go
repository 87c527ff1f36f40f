package schema_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/schema"
)

// TestMigrateConcurrently starts migrations from several pools (several
// replicas starting at once) on an empty database: all succeed, the
// migrations are applied exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.NewEmpty(t)
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	const replicas = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int64
	)
	start := make(chan struct{})
	for range replicas {
		pool, err := pgxpool.New(ctx, tdb.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		wg.Go(func() {
			<-start
			vs, err := schema.Migrate(ctx, pool)
			if err != nil {
				t.Errorf("migrate: %v", err)
			}
			mu.Lock()
			applied = append(applied, vs...)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if len(applied) != len(ms) {
		t.Fatalf("applied %v across %d replicas; want each of the %d migrations once", applied, replicas, len(ms))
	}
	latest, _ := schema.Latest()
	got, err := schema.Applied(ctx, tdb.Pool)
	if err != nil || got != latest {
		t.Fatalf("applied version %d, %v; want %d", got, err, latest)
	}
	var rows int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM leasehold_migrations`).Scan(&rows); err != nil || rows != len(ms) {
		t.Fatalf("leasehold_migrations has %d rows, %v; want %d", rows, err, len(ms))
	}
	if again, err := schema.Migrate(ctx, tdb.Pool); err != nil || len(again) != 0 {
		t.Fatalf("second migrate: applied %v, %v; want nothing", again, err)
	}
}

func TestAppliedOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	tdb := pgtest.NewEmpty(t)
	v, err := schema.Applied(context.Background(), tdb.Pool)
	if err != nil || v != 0 {
		t.Fatalf("Applied on an empty database = %d, %v; want 0, nil", v, err)
	}
}

// TestPrepareSession: a pool that prepares its sessions plans with generic
// plans, on every connection it opens.
func TestPrepareSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.NewEmpty(t)
	cfg, err := pgxpool.ParseConfig(tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = schema.PrepareSession
	cfg.MinConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Two connections at once: each is prepared, not only the first.
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()
	for i, c := range []*pgxpool.Conn{c1, c2} {
		var mode string
		if err := c.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if mode != "force_generic_plan" {
			t.Errorf("connection %d: plan_cache_mode %q, want force_generic_plan", i+1, mode)
		}
	}
}
