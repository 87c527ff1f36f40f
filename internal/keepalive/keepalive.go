// Package keepalive is the one loop that keeps a lease alive: a lease a
// holder took (lease.Keep, an elector) and a task's lease (a worker's
// heartbeats) are renewed by the same code, so that they count a lease lost
// by the same rule.
//
// The rule, as client-go's leader election and River's leadership have it:
// the holder's deadline is the time it sent the request that last succeeded
// (the acquisition, or a renewal) + TTL − Margin − Grace
// (lease.KeepConfig.Window), on its own monotonic clock. The service
// decides expiry by its own clock, from when that request arrived, which is
// later; so a holder that stops at its deadline stops before the service
// can hand the lease to anyone else, however late the answers came and
// whatever the two clocks say. The deadline is kept by a timer of its own,
// not by the loop, so the holder is told on time even while a renewal hangs
// or the loop is held up.
//
// A holder that gives up at its deadline does not know what became of its
// last renewal: the request may have arrived and renewed the lease while
// its answer was lost. So every holder, once its work has stopped, releases
// the lease (a task: hands it back) under its fence, best effort: the lease
// is free at once instead of at an expiry the holder cannot know, and a
// release the service refuses (the lease lapsed, or is another's) changes
// nothing. Only a refusal (Refused) says the lease is gone for certain.
package keepalive

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// Loop renews one lease. Set its fields, then call Run once.
type Loop struct {
	// Config is the lease's TTL and intervals (lease.KeepConfig, validated
	// by the caller); its Observer hears of every failed renewal and of the
	// loss.
	Config lease.KeepConfig
	// Renew sends one renewal, bounded by ctx (which ends at the deadline).
	Renew func(ctx context.Context) error
	// Refused reports whether a renewal's error is the service saying the
	// lease is not held any more (as opposed to a failure worth retrying).
	Refused func(err error) bool
	// Lost, if set, is called once, at once, when the lease counts as lost:
	// with a reason that wraps lease.ErrNotHeld (refused, after the
	// renewal's own error) or lease.ErrDeadline (the deadline passed; after
	// the last renewal's error, if any). Run returns the same reason.
	Lost func(reason error)
	// RenewFailed, if set, is called with the error of every renewal that
	// did not succeed, refused or not.
	RenewFailed func(err error)
	// BeforeRenew, if set, is called before each renewal is sent (a test's
	// or the demo's simulated pause); the deadline timer runs meanwhile.
	BeforeRenew func(ctx context.Context)
}

// Run renews the lease until ctx ends or the lease is lost. sent is when
// the request that took the lease (or last renewed it) was sent. It returns
// the deadline as it stood when it stopped and why it stopped: nil when ctx
// ended, else the reason Lost was given.
func (l *Loop) Run(ctx context.Context, sent time.Time) (time.Time, error) {
	c := l.Config.WithDefaults()
	var (
		mu       sync.Mutex
		deadline = sent.Add(c.Window())
		lastErr  error // the last renewal's error, nil after a success
		reason   error // set once, by the first of lose's callers
	)
	lose := func(why error) error {
		mu.Lock()
		defer mu.Unlock()
		if reason != nil {
			return reason
		}
		reason = why
		if c.Observer != nil {
			c.Observer.Lost(why)
		}
		if l.Lost != nil {
			l.Lost(why)
		}
		return why
	}
	expire := time.AfterFunc(time.Until(deadline), func() {
		mu.Lock()
		last := lastErr
		mu.Unlock()
		if last != nil {
			_ = lose(fmt.Errorf("%w; the last renewal failed: %w", lease.ErrDeadline, last))
			return
		}
		_ = lose(lease.ErrDeadline)
	})
	defer expire.Stop()
	lostYet := func() (time.Time, error) {
		mu.Lock()
		defer mu.Unlock()
		return deadline, reason
	}
	// A renewal is due RenewInterval after the request that last succeeded
	// was sent, not after its answer came: a slow answer must not push the
	// next renewal towards the deadline.
	due := sent.Add(jitter(c.RenewInterval))
	timer := time.NewTimer(time.Until(due))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			d, r := lostYet()
			return d, r
		case <-timer.C:
		}
		if l.BeforeRenew != nil {
			l.BeforeRenew(ctx)
		}
		if d, r := lostYet(); r != nil {
			return d, r
		}
		attempt := time.Now()
		d, _ := lostYet()
		rctx, cancel := context.WithDeadline(ctx, d)
		err := l.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			if !expire.Stop() {
				// The deadline passed while the renewal was under way: the
				// lease counts as lost, whatever the service said.
				d, r := lostYet()
				return d, r
			}
			mu.Lock()
			lastErr = nil
			deadline = attempt.Add(c.Window())
			d = deadline
			mu.Unlock()
			expire.Reset(time.Until(d))
			due = attempt.Add(jitter(c.RenewInterval))
		case l.Refused(err):
			if l.RenewFailed != nil {
				l.RenewFailed(err)
			}
			if c.Observer != nil {
				c.Observer.RenewFailed(err)
			}
			expire.Stop()
			why := lose(fmt.Errorf("%w: %w", lease.ErrNotHeld, err))
			d, _ := lostYet()
			return d, why
		case ctx.Err() != nil:
			d, r := lostYet()
			return d, r
		default:
			if l.RenewFailed != nil {
				l.RenewFailed(err)
			}
			if c.Observer != nil {
				c.Observer.RenewFailed(err)
			}
			mu.Lock()
			lastErr = err
			mu.Unlock()
			due = time.Now().Add(c.RetryInterval)
		}
		timer.Reset(time.Until(due))
	}
}

// Refusal makes a Refused function of sentinel errors.
func Refusal(targets ...error) func(error) bool {
	return func(err error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
}

// jitter returns d ± 10 %, so that many holders do not renew in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + rand.N(d/5+1)
}

// Jitter is jitter for callers that schedule the first renewal themselves.
func Jitter(d time.Duration) time.Duration { return jitter(d) }
