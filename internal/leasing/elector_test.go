package leasing_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// TestElectorTakesOverFromCrashedHolder: the holder "crashed" (its lease
// is never renewed nor released) and no reaper runs to announce the
// expiry; the follower's own timer at the lease's expires_at wins it.
func TestElectorTakesOverFromCrashedHolder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	ghost, err := store.Acquire(ctx, lease.AcquireParams{Resource: "singleton", Holder: "crashed", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease)
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })
	e := &leasing.Elector{Leases: store, Listener: listener, Resource: "singleton", Holder: "follower",
		Keep: lease.KeepConfig{TTL: 2 * time.Second}, Log: zerolog.Nop()}
	led := make(chan lease.Lease, 1)
	wg.Go(func() {
		_ = e.Run(ctx, func(ctx context.Context, l lease.Lease) {
			led <- l
			<-ctx.Done()
		})
	})
	select {
	case l := <-led:
		if l.Fence <= ghost.Lease.Fence {
			t.Errorf("follower's fence %d not above the crashed holder's %d", l.Fence, ghost.Lease.Fence)
		}
	case <-time.After(30 * time.Second): // keeps a broken test from hanging
		t.Fatal("the follower never took over")
	}
	cancel()
	wg.Wait()
	testkit.CheckLeaseHistory(t, tdb.Pool, "singleton")
}

// TestElectorsLeadOneAtATime: several electors on one resource, each
// leading briefly then stepping down; never two leaders at once, every
// elector leads at some point, and the history agrees.
func TestElectorsLeadOneAtATime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease)
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })

	const electors, terms = 4, 12
	var (
		leaders  atomic.Int32
		termsRun atomic.Int32
		mu       sync.Mutex
		ledBy    = map[string]int{}
		done     = make(chan struct{})
	)
	var ewg sync.WaitGroup
	for i := range electors {
		name := string(rune('a' + i))
		e := &leasing.Elector{Leases: store, Listener: listener, Resource: "job", Holder: name,
			Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop()}
		ewg.Go(func() {
			_ = e.Run(ctx, func(ctx context.Context, l lease.Lease) {
				if n := leaders.Add(1); n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				mu.Lock()
				ledBy[name]++
				mu.Unlock()
				// Lead for one renewal's worth of work, then step down.
				time.Sleep(10 * time.Millisecond)
				leaders.Add(-1)
				if termsRun.Add(1) == terms {
					close(done)
				}
			})
		})
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the electors did not complete their terms")
	}
	cancel()
	ewg.Wait()
	wg.Wait()
	if len(ledBy) < 2 {
		t.Errorf("only %v led; stepping down should hand the lease to another elector", ledBy)
	}
	testkit.CheckLeaseHistory(t, tdb.Pool, "job")
}

// TestElectorRenewsLeaseItAlreadyHolds: an elector whose holder already
// holds the lease (a process of the same name that died, with a shorter
// TTL) does not trust the expiry it finds: before leading it renews the
// lease with its own TTL, so the lease lasts on the server at least as
// long as the elector believes it holds it.
func TestElectorRenewsLeaseItAlreadyHolds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	earlier, err := store.Acquire(ctx, lease.AcquireParams{Resource: "singleton", Holder: "replica-a", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease)
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })
	e := &leasing.Elector{Leases: store, Listener: listener, Resource: "singleton", Holder: "replica-a",
		Keep: lease.KeepConfig{TTL: 30 * time.Second}, Log: zerolog.Nop()}
	led := make(chan lease.Lease, 1)
	wg.Go(func() {
		_ = e.Run(ctx, func(ctx context.Context, l lease.Lease) {
			led <- l
			<-ctx.Done()
		})
	})
	var l lease.Lease
	select {
	case l = <-led:
	case <-time.After(30 * time.Second): // keeps a broken test from hanging
		t.Fatal("the elector never led")
	}
	cancel()
	wg.Wait()
	if l.Fence != earlier.Lease.Fence {
		t.Errorf("led with fence %d, want the lease it already held, fence %d", l.Fence, earlier.Lease.Fence)
	}
	if l.RenewedAt == nil || l.TTLSeconds != 30 || !l.ExpiresAt.After(earlier.Lease.ExpiresAt) {
		t.Errorf("led with %+v; want the lease renewed with the elector's TTL of 30s before leading (it expired at %s)",
			l, earlier.Lease.ExpiresAt)
	}
}
