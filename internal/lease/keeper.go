package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// KeepConfig says how a holder keeps a lease alive. It follows client-go's
// leader election: TTL > RenewInterval > RetryInterval, checked by Validate.
type KeepConfig struct {
	// TTL is the lease's time to live on the server.
	TTL time.Duration
	// RenewInterval is the time between renewals (default TTL/3, with ±10 %
	// jitter so that many holders do not renew in lockstep).
	RenewInterval time.Duration
	// RetryInterval is the time between attempts after a failed renewal
	// (default RenewInterval/4); failed attempts go on until the deadline.
	RetryInterval time.Duration
	// Margin is taken off the holder's deadline to cover clock rate
	// differences and the time a request takes to arrive (default TTL/10).
	Margin time.Duration
	// Observer, if set, hears what becomes of the lease (metrics).
	Observer KeepObserver
}

// KeepObserver hears what becomes of the leases a holder keeps, so that
// metrics can count them without this package knowing about metrics. Its
// methods are called from the holder's goroutines: they must be quick and
// safe for concurrent use.
type KeepObserver interface {
	// Won is called with the lease each time an Elector wins it.
	Won(l Lease)
	// RenewFailed is called for each renewal that did not succeed: refused
	// (err wraps ErrNotHeld), or failed (the database could not be reached
	// or did not answer in time).
	RenewFailed(err error)
	// Lost is called once when the lease counts as lost: reason is
	// ErrNotHeld (a renewal was refused) or wraps ErrDeadline (no renewal
	// succeeded before the holder's deadline).
	Lost(reason error)
	// Released is called with the lease as an Elector released it.
	Released(l Lease)
}

func (c KeepConfig) won(l Lease) {
	if c.Observer != nil {
		c.Observer.Won(l)
	}
}

func (c KeepConfig) renewFailed(err error) {
	if c.Observer != nil {
		c.Observer.RenewFailed(err)
	}
}

// lost reports reason to the observer and returns it.
func (c KeepConfig) lost(reason error) error {
	if c.Observer != nil {
		c.Observer.Lost(reason)
	}
	return reason
}

func (c KeepConfig) released(l Lease) {
	if c.Observer != nil {
		c.Observer.Released(l)
	}
}

// withDefaults fills the zero fields.
func (c KeepConfig) withDefaults() KeepConfig {
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = c.RenewInterval / 4
	}
	if c.Margin == 0 {
		c.Margin = c.TTL / 10
	}
	return c
}

// Validate reports a configuration under which a holder could not keep its
// lease: TTL > RenewInterval > RetryInterval > 0, and a margin that leaves
// time for a renewal before the deadline.
func (c KeepConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.TTL < time.Second || c.TTL%time.Second != 0:
		return fmt.Errorf("lease TTL %s must be a whole number of seconds, at least 1s", c.TTL)
	case c.RenewInterval <= 0 || c.RenewInterval >= c.TTL:
		return fmt.Errorf("renew interval %s must be positive and shorter than the TTL %s", c.RenewInterval, c.TTL)
	case c.RetryInterval <= 0 || c.RetryInterval >= c.RenewInterval:
		return fmt.Errorf("retry interval %s must be positive and shorter than the renew interval %s", c.RetryInterval, c.RenewInterval)
	case c.Margin < 0 || c.RenewInterval+c.Margin >= c.TTL:
		return fmt.Errorf("margin %s plus renew interval %s must be shorter than the TTL %s", c.Margin, c.RenewInterval, c.TTL)
	}
	return nil
}

// ErrDeadline is why a lease counts as lost when no renewal succeeded
// before the holder's local deadline.
var ErrDeadline = errors.New("lease deadline passed without a successful renewal")

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
func keep(ctx context.Context, c KeepConfig, sent time.Time, renew func(ctx context.Context) error) error {
	c = c.withDefaults()
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
				return c.lost(fmt.Errorf("%w; the last renewal failed: %w", ErrDeadline, last))
			}
			return c.lost(ErrDeadline)
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
		case errors.Is(err, ErrNotHeld):
			c.renewFailed(err)
			return c.lost(ErrNotHeld)
		case ctx.Err() != nil:
			return nil
		default:
			c.renewFailed(err)
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
