package leasehold_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/lease"
)

// TestHoldSlot: a key of 2 slots, held through an embedded and a remote
// client alike: two holdings at once, each on a slot of its own with its
// own fence, a third refused with the slot that expires first; a released
// slot goes to the waiting third (woken by the release's NOTIFY when
// embedded; the test server has no listener, so remotely at the expiry the
// refusal named); a bad number of slots is refused before
// anything is sent.
func TestHoldSlot(t *testing.T) {
	t.Parallel()
	modes := map[string]func(t *testing.T) *leasehold.Leases{
		"embedded": func(t *testing.T) *leasehold.Leases {
			c, err := leasehold.NewClient(pgtest.New(t).Pool, leasehold.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return c.Leases()
		},
		"remote": func(t *testing.T) *leasehold.Leases { return startClientServer(t, "").client() },
	}
	for name, leases := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ls := leases(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a, err := ls.HoldSlot(ctx, "imports", "a", 2, 0, lease.KeepConfig{TTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			b, err := ls.HoldSlot(ctx, "imports", "b", 2, 0, lease.KeepConfig{TTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if a.Lease().Resource == b.Lease().Resource || a.Lease().Fence == b.Lease().Fence {
				t.Fatalf("two holdings share a slot: %+v, %+v", a.Lease(), b.Lease())
			}
			for _, h := range []*leasehold.Holding{a, b} {
				if key, ok := lease.SlotKey(h.Lease().Resource); !ok || key != "imports" {
					t.Fatalf("holding on %q, want a slot of imports", h.Lease().Resource)
				}
			}
			var held *lease.HeldError
			if _, err := ls.HoldSlot(ctx, "imports", "c", 2, 0, lease.KeepConfig{TTL: 3 * time.Second}); !errors.As(err, &held) {
				t.Fatalf("a third holder of 2 slots: %v, want a *lease.HeldError", err)
			}
			got := make(chan *leasehold.Holding, 1)
			go func() {
				h, err := ls.HoldSlot(ctx, "imports", "c", 2, time.Minute, lease.KeepConfig{TTL: 3 * time.Second})
				if err != nil {
					t.Error(err)
				}
				got <- h
			}()
			freed := a.Lease().Resource
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			c3 := <-got
			if c3 == nil {
				return
			}
			if c3.Lease().Resource != freed || c3.Lease().Fence <= a.Lease().Fence {
				t.Errorf("the waiting holder got %+v, want the freed slot %s with a greater fence", c3.Lease(), freed)
			}
			lim, err := ls.Limit(ctx, "imports")
			if err != nil || lim.Slots != 2 || lim.Held != 2 {
				t.Errorf("limit %+v, %v; want 2 slots, 2 held", lim, err)
			}
			for _, h := range []*leasehold.Holding{b, c3} {
				if err := h.Release(ctx); err != nil {
					t.Error(err)
				}
			}
			for _, slots := range []int{-1, 1001} {
				if _, err := ls.HoldSlot(ctx, "imports", "d", slots, 0, lease.KeepConfig{}); !errors.Is(err, leasehold.ErrInvalidArgument) {
					t.Errorf("HoldSlot with %d slots: %v, want ErrInvalidArgument", slots, err)
				}
			}
			if _, err := ls.SetLimit(ctx, "imports", 0); !errors.Is(err, leasehold.ErrInvalidArgument) {
				t.Errorf("SetLimit 0: %v, want ErrInvalidArgument", err)
			}
			if _, err := ls.Limit(ctx, "exports"); !errors.Is(err, lease.ErrNotFound) {
				t.Errorf("the limit of a key without one: %v, want lease.ErrNotFound", err)
			}
		})
	}
}
