package leasing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// The observer's calls, for a KeepConfig whose Observer may be nil.

func won(c lease.KeepConfig, l lease.Lease) {
	if c.Observer != nil {
		c.Observer.Won(l)
	}
}

func renewFailed(c lease.KeepConfig, err error) {
	if c.Observer != nil {
		c.Observer.RenewFailed(err)
	}
}

// lost reports reason to the observer and returns it.
func lost(c lease.KeepConfig, reason error) error {
	if c.Observer != nil {
		c.Observer.Lost(reason)
	}
	return reason
}

func released(c lease.KeepConfig, l lease.Lease) {
	if c.Observer != nil {
		c.Observer.Released(l)
	}
}

// keep renews a lease until ctx ends or the lease is lost, and returns why
// it stopped: nil when ctx ended, ErrNotHeld when a renewal was refused,
// ErrDeadline (wrapped with the last renewal's error, if any) when no
// renewal succeeded in time. sent is when the request that acquired the
// lease was sent: the holder's deadline is the send time of its last
// successful renewal + TTL − Margin, on the monotonic clock, so the holder
// gives the lease up before the server can hand it to another. A renewal
// that hangs (an unreachable database) is cut short at that deadline.
// renew must return ErrNotHeld (wrapped or not) when the server refused.
// c.Observer hears of every failed renewal and of the loss.
func keep(ctx context.Context, c lease.KeepConfig, sent time.Time, renew func(ctx context.Context) error) error {
	c = c.WithDefaults()
	deadline := sent.Add(c.TTL - c.Margin)
	// A renewal is due RenewInterval after the request that last succeeded
	// was sent, not after its answer came: a slow answer must not push the
	// next renewal towards the deadline.
	due := sent.Add(jitter(c.RenewInterval))
	var last error // the last renewal's error, nil after a success
	for {
		timer := time.NewTimer(time.Until(earliest(due, deadline)))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		if !time.Now().Before(deadline) {
			if last != nil {
				return lost(c, fmt.Errorf("%w; the last renewal failed: %w", lease.ErrDeadline, last))
			}
			return lost(c, lease.ErrDeadline)
		}
		attempt := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := renew(rctx)
		cancel()
		switch {
		case err == nil:
			deadline = attempt.Add(c.TTL - c.Margin)
			due = attempt.Add(jitter(c.RenewInterval))
			last = nil
		case errors.Is(err, lease.ErrNotHeld):
			renewFailed(c, err)
			return lost(c, lease.ErrNotHeld)
		case ctx.Err() != nil:
			return nil
		default:
			renewFailed(c, err)
			due = time.Now().Add(c.RetryInterval)
			last = err
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// jitter returns d ± 10 %.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + rand.N(d/5+1)
}
