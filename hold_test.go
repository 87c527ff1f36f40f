package leasehold_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/lease"
)

// TestHoldTakesTheDefaults: a zero KeepConfig holds with the client's
// Config.LeaseTTL, and a TTL the service would refuse is an
// ErrInvalidArgument, as it is for Acquire, with nothing sent.
func TestHoldTakesTheDefaults(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{LeaseTTL: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Leases().Hold(t.Context(), "defaults", "me", lease.KeepConfig{})
	if err != nil {
		t.Fatalf("Hold with a zero KeepConfig: %v", err)
	}
	defer h.Release(context.Background()) //nolint:errcheck // the test's end
	if ttl := h.Lease().TTL(); ttl != 7*time.Second {
		t.Errorf("the held lease's TTL is %s; want the client's LeaseTTL, 7s", ttl)
	}
	for _, ttl := range []time.Duration{1500 * time.Millisecond, 2 * time.Hour, -time.Second} {
		if _, err := c.Leases().Hold(t.Context(), "bad-ttl", "me", lease.KeepConfig{TTL: ttl}); !errors.Is(err, leasehold.ErrInvalidArgument) {
			t.Errorf("Hold with TTL %s: %v; want ErrInvalidArgument", ttl, err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM leases WHERE resource = 'bad-ttl'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d leases of the refused holds (%v); want none", n, err)
	}
}

// TestOneHoldingPerHolder: two holdings of one lease by one holder in one
// process would both believe they alone held it. The second Hold is
// refused (a *lease.HoldingError, errors.Is lease.ErrHeld); a HoldWait
// waits until the first ends, then holds the lease under a new fence; and
// a holding whose lease the program releases itself learns at once.
func TestOneHoldingPerHolder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	leases := c.Leases()
	first, err := leases.Hold(t.Context(), "the-lock", c.ID(), lease.KeepConfig{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = leases.Hold(t.Context(), "the-lock", c.ID(), lease.KeepConfig{})
	var dup *lease.HoldingError
	if !errors.As(err, &dup) || !errors.Is(err, lease.ErrHeld) || dup.Lease.Fence != first.Lease().Fence {
		t.Fatalf("a second Hold by the same holder: %v; want a *lease.HoldingError naming the first holding's lease", err)
	}

	type held struct {
		h   *leasehold.Holding
		err error
	}
	second := make(chan held, 1)
	go func() {
		h, err := leases.HoldWait(t.Context(), "the-lock", c.ID(), time.Hour, lease.KeepConfig{})
		second <- held{h, err}
	}()
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := testkit.Receive(t, "the waiting holding", second)
	if got.err != nil {
		t.Fatalf("HoldWait after the first holding ended: %v", got.err)
	}
	if got.h.Lease().Fence <= first.Lease().Fence {
		t.Errorf("the second holding's fence %d is not above the first's %d", got.h.Lease().Fence, first.Lease().Fence)
	}

	// Released by the program itself, under the holding: it learns at once.
	if _, err := leases.Release(t.Context(), lease.ReleaseParams{Resource: "the-lock", Holder: c.ID()}); err != nil {
		t.Fatal(err)
	}
	testkit.Receive(t, "the holding's context to end", got.h.Context().Done())
	if err := got.h.Err(); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("the holding ended with %v; want lease.ErrNotHeld", err)
	}
	if err := got.h.Release(t.Context()); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Release of a holding whose lease was released: %v; want lease.ErrNotHeld", err)
	}
}
