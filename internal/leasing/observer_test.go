package leasing_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// observed records what a KeepObserver hears.
type observed struct {
	mu            sync.Mutex
	won, released []lease.Lease
	renewFailures []error
	lost          []error
}

func (o *observed) Won(l lease.Lease) { o.mu.Lock(); o.won = append(o.won, l); o.mu.Unlock() }
func (o *observed) RenewFailed(err error) {
	o.mu.Lock()
	o.renewFailures = append(o.renewFailures, err)
	o.mu.Unlock()
}
func (o *observed) Lost(reason error) { o.mu.Lock(); o.lost = append(o.lost, reason); o.mu.Unlock() }
func (o *observed) Released(l lease.Lease) {
	o.mu.Lock()
	o.released = append(o.released, l)
	o.mu.Unlock()
}

// observeElector runs an elector on resource with the observer until lead
// has run terms times, and returns what the observer heard. lead gets the
// term's number, from 1.
func observeElector(t *testing.T, tdb pgtest.DB, store *leasestore.Store, resource string, terms int,
	lead func(ctx context.Context, term int, l lease.Lease),
) *observed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = listener.Run(ctx) })
	o := &observed{}
	e := &leasing.Elector{Leases: store, Listener: listener, Resource: resource, Holder: "observed",
		Keep: lease.KeepConfig{TTL: 2 * time.Second, Observer: o}, Log: zerolog.Nop()}
	done := make(chan error, 1)
	term := 0
	go func() {
		done <- e.Run(ctx, func(lctx context.Context, l lease.Lease) {
			term++
			lead(lctx, term, l)
			if term == terms {
				cancel() // no further term
			}
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("elector: %v", err)
		}
	case <-time.After(time.Minute): // keeps a broken test from hanging
		t.Fatalf("the elector did not run its %d terms", terms)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o
}

// TestElectorObserverWinsReleasesLoses: the observer hears each win, the
// release of a term that ended, and a renewal refused with the loss it
// means, after the lease was taken from under the elector.
func TestElectorObserverWinsReleasesLoses(t *testing.T) {
	t.Parallel()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var fences []int64
	o := observeElector(t, tdb, store, "observed", 2, func(ctx context.Context, term int, l lease.Lease) {
		fences = append(fences, l.Fence)
		if term == 1 {
			return // steps down: the lease is released
		}
		// The lease is released behind the holder's back: its next renewal is refused.
		if _, err := tdb.Pool.Exec(context.Background(),
			`UPDATE leases SET released_at = now(), expires_at = now() WHERE resource = 'observed' AND fence = $1`, l.Fence); err != nil {
			t.Error(err)
			return
		}
		<-ctx.Done()
	})
	if len(o.won) != 2 || o.won[0].Fence != fences[0] || o.won[1].Fence != fences[1] {
		t.Errorf("won %+v, want the leases of fences %v", o.won, fences)
	}
	if len(o.released) != 1 || o.released[0].Fence != fences[0] || o.released[0].ReleasedAt == nil ||
		o.released[0].ReleasedAt.Before(o.released[0].CreatedAt) {
		t.Errorf("released %+v, want the first term's lease (fence %d) with released_at after created_at", o.released, fences[0])
	}
	if len(o.renewFailures) != 1 || !errors.Is(o.renewFailures[0], lease.ErrNotHeld) {
		t.Errorf("renew failures %v, want one refusal (%v)", o.renewFailures, lease.ErrNotHeld)
	}
	if len(o.lost) != 1 || !errors.Is(o.lost[0], lease.ErrNotHeld) {
		t.Errorf("lost %v, want one loss by refusal (%v)", o.lost, lease.ErrNotHeld)
	}
}

// TestElectorObserverDeadline: when renewals fail (here the holder's pool
// is closed, as good as an unreachable database), each failure is heard,
// then the loss at the holder's deadline.
func TestElectorObserverDeadline(t *testing.T) {
	t.Parallel()
	tdb := pgtest.New(t)
	pool, err := pgxpool.New(context.Background(), tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	o := observeElector(t, tdb, leasestore.NewStore(pool), "observed", 1, func(ctx context.Context, _ int, _ lease.Lease) {
		pool.Close()
		<-ctx.Done()
	})
	if len(o.won) != 1 || len(o.released) != 0 {
		t.Errorf("won %d, released %d times; want 1 and 0 (a lost lease is not released)", len(o.won), len(o.released))
	}
	if len(o.renewFailures) == 0 {
		t.Error("no renewal failure heard, though every renewal failed")
	}
	for _, err := range o.renewFailures {
		if errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("renew failure %v: no renewal reached the database to be refused", err)
		}
	}
	if len(o.lost) != 1 || !errors.Is(o.lost[0], lease.ErrDeadline) {
		t.Errorf("lost %v, want one loss at the deadline (%v)", o.lost, lease.ErrDeadline)
	}
}
