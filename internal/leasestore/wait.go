package leasestore

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/lease"
)

// ErrStopping ends an acquisition's wait when its process shuts down.
var ErrStopping = errors.New("shutting down")

// WaitParams says how an acquisition waits (AcquireWaiting).
type WaitParams struct {
	// Listener wakes the wait on a release or an expiry; it must listen on
	// notify.ChannelLease. Without it the wait wakes only at the holder's
	// expires_at.
	Listener *notify.Listener
	// Stopping, when closed, ends the wait with ErrStopping.
	Stopping <-chan struct{}
	// Statement bounds each statement of the wait (zero: ctx alone), so
	// that a database that does not answer cannot hold it past its wait.
	Statement time.Duration
	// Waiting, if set, is called once, with the holder's lease, when the
	// acquisition begins to wait.
	Waiting func(held lease.Lease)
}

// AcquireWaiting acquires p and, while another holder holds the resource,
// waits up to p.Wait for its lease to be released or to expire (woken by
// NOTIFY, or at its expires_at by the database clock) and tries again.
// Waiters are not queued: whichever acquisition lands first wins, the
// others wait on. When the wait runs out the error is the current holder's
// *lease.HeldError, as without a wait. When ctx ends after the lease was
// won, it is released again (nobody will hold it) and the error is ctx's.
func (s *Store) AcquireWaiting(ctx context.Context, p lease.AcquireParams, w WaitParams) (lease.Acquisition, error) {
	if p.Wait <= 0 {
		return s.Acquire(ctx, p)
	}
	deadline := time.Now().Add(p.Wait)
	// Subscribed before the first attempt, so that a release right after a
	// refused acquisition is not missed.
	sub := Subscribe(w.Listener)
	defer sub.Close()
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if w.Statement > 0 {
			actx, cancel = context.WithTimeout(ctx, w.Statement)
		}
		acq, err := s.Acquire(actx, p)
		cancel()
		var held *lease.HeldError
		if !errors.As(err, &held) {
			if err == nil && acq.New && ctx.Err() != nil {
				// Won as the caller went away: nobody will hold it.
				s.releaseAbandoned(acq.Lease)
				return lease.Acquisition{}, ctx.Err()
			}
			return acq, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return acq, err
		}
		if w.Waiting != nil {
			w.Waiting(held.Lease)
			w.Waiting = nil
		}
		// The holder's lease runs out at its expires_at by the database
		// clock; try again a little after that even if nobody says so.
		if err := waitForRelease(ctx, w.Stopping, sub, p.Resource, min(left, held.UntilExpiry(acq.DBNow))); err != nil {
			return lease.Acquisition{}, err
		}
	}
}

// waitForRelease waits up to d for a sign that resource may be free: its
// release or expiry notified, or a resync of the subscription. It returns
// ctx's error when ctx ends first, ErrStopping when stopping is closed
// first.
func waitForRelease(ctx context.Context, stopping <-chan struct{}, sub Subscription, resource string, d time.Duration) error {
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	var (
		changes <-chan notify.Notification
		resync  <-chan struct{}
	)
	if sub.Subscription != nil {
		changes, resync = sub.C(), sub.Resync()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopping:
			return ErrStopping
		case <-timer.C:
			return nil
		case <-resync:
			return nil
		case n := <-changes:
			if Frees(n, resource) {
				return nil
			}
		}
	}
}

// releaseAbandoned gives up a lease won for a caller that went away before
// it could hear so, rather than leave the resource held for a whole TTL.
func (s *Store) releaseAbandoned(l lease.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.Release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
}

// Subscription is a subscription to the lease channel, or nothing without
// a listener (its channel then never delivers).
type Subscription struct{ *notify.Subscription }

// Subscribe subscribes to the lease channel of l, which may be nil.
func Subscribe(l *notify.Listener) Subscription {
	if l == nil {
		return Subscription{}
	}
	return Subscription{l.Subscribe(notify.ChannelLease, 64)}
}

// Close ends the subscription.
func (s Subscription) Close() {
	if s.Subscription != nil {
		s.Subscription.Close()
	}
}
