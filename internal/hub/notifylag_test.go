package hub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// TestNotifyLag: the feed reports, for each lease change it was notified
// of, the delay from the change (its event's time) to the notification's
// arrival: one sample per change, after the change and no later than now,
// with or without a browser connected.
func TestNotifyLag(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator)
	lags := make(chan time.Duration, 16)
	h := hub.New(hub.Deps{
		Leases: leasestore.NewStore(db.Pool), Tasks: taskstore.NewStore(db.Pool), Generator: demo.NewState(db.Pool),
		Instances: instance.NewStore(db.Pool), Listener: listener, Instance: "lagged", Log: zerolog.Nop(),
		NotifyLag: func(lag time.Duration) { lags <- lag },
	})
	ready := listener.Subscribe(notify.ChannelLease, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = listener.Run(ctx) })
	wg.Go(func() { _ = h.Run(ctx) })
	select {
	case <-ready.Resync(): // every channel is LISTENed
	case <-time.After(time.Minute):
		t.Fatal("the listener never connected")
	}
	ready.Close()

	store := leasestore.NewStore(db.Pool)
	acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: "lagged", Holder: "h", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := store.Release(ctx, lease.ReleaseParams{Resource: "lagged", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	for _, change := range []struct {
		kind string
		at   time.Time
	}{{"acquired", acq.Lease.CreatedAt}, {"released", *rel.ReleasedAt}} {
		select {
		case lag := <-lags:
			if upper := time.Since(change.at); lag <= 0 || lag > upper {
				t.Errorf("%s: notify lag %s, want above 0 and at most %s, the time since the change", change.kind, lag, upper)
			}
		case <-time.After(time.Minute):
			t.Fatalf("no notify lag reported for the lease's %s event", change.kind)
		}
	}
}
