package lease

import (
	"errors"
	"fmt"
	"time"
)

// KeepConfig says how a holder keeps a lease alive. It follows client-go's
// leader election: TTL > RenewInterval > RetryInterval, checked by Validate.
// Zero fields take the defaults WithDefaults fills in.
type KeepConfig struct {
	// TTL is the lease's time to live on the server: whole seconds, 1s to 1h.
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
	// Grace is how long the holder's own work may take to stop once the
	// lease counts as lost (default 0: it stops at once). It is taken off
	// the deadline too, so that work told to stop at the deadline is gone,
	// grace included, before the service could hand the lease to another;
	// and a holder that gave the lease up at its deadline (a renewal whose
	// answer was lost may still have renewed it) releases it only once the
	// work has stopped, or Grace after the deadline.
	Grace time.Duration
	// Observer, if set, hears what becomes of the lease (metrics).
	Observer KeepObserver
}

// KeepObserver hears what becomes of the leases a holder keeps, so that
// metrics can count them without the holder knowing about metrics. Its
// methods are called from the holder's goroutines: they must be quick and
// safe for concurrent use.
type KeepObserver interface {
	// Won is called with the lease each time an elector wins it.
	Won(l Lease)
	// RenewFailed is called for each renewal that did not succeed: refused
	// (err wraps ErrNotHeld), or failed (the service could not be reached
	// or did not answer in time).
	RenewFailed(err error)
	// Lost is called once when the lease counts as lost: reason is
	// ErrNotHeld (a renewal was refused) or wraps ErrDeadline (no renewal
	// succeeded before the holder's deadline).
	Lost(reason error)
	// Released is called with the lease as an elector released it.
	Released(l Lease)
}

// WithDefaults returns c with its zero intervals filled in.
func (c KeepConfig) WithDefaults() KeepConfig {
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
	c = c.WithDefaults()
	switch {
	case c.TTL < time.Second || c.TTL > time.Hour || c.TTL%time.Second != 0:
		return fmt.Errorf("lease TTL %s must be a whole number of seconds from 1s to 1h", c.TTL)
	case c.RenewInterval <= 0 || c.RenewInterval >= c.TTL:
		return fmt.Errorf("renew interval %s must be positive and shorter than the TTL %s", c.RenewInterval, c.TTL)
	case c.RetryInterval <= 0 || c.RetryInterval >= c.RenewInterval:
		return fmt.Errorf("retry interval %s must be positive and shorter than the renew interval %s", c.RetryInterval, c.RenewInterval)
	case c.Margin < 0 || c.Grace < 0:
		return fmt.Errorf("margin %s and grace %s must not be negative", c.Margin, c.Grace)
	case c.RenewInterval+c.Margin+c.Grace >= c.TTL:
		return fmt.Errorf("margin %s, grace %s and renew interval %s must add up to less than the TTL %s", c.Margin, c.Grace, c.RenewInterval, c.TTL)
	}
	return nil
}

// Window is how long after a request was sent its success keeps the lease
// counted as held: TTL − Margin − Grace, the holder's deadline from that
// request.
func (c KeepConfig) Window() time.Duration {
	c = c.WithDefaults()
	return c.TTL - c.Margin - c.Grace
}

// Why a kept lease stopped being held, besides ErrNotHeld.
var (
	// ErrDeadline: no renewal succeeded before the holder's local deadline
	// (the time the last successful renewal was sent + Window), so the
	// holder gave the lease up before the service could hand it to another.
	ErrDeadline = errors.New("lease deadline passed without a successful renewal")
	// ErrReleased: the holder released the lease itself.
	ErrReleased = errors.New("lease released by its holder")
)
