package lease

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
)

// Elector runs a function only while it holds the lease on a resource: the
// way one replica of many becomes the reaper or the generator. Followers wait
// for the holder's lease to be released or to expire, woken by NOTIFY or, when
// no reaper announces the expiry, by their own timer at its expires_at.
type Elector struct {
	Store    *Store
	Listener *notify.Listener
	Resource string
	Holder   string
	Keep     KeepConfig
	Log      zerolog.Logger
}

// Run campaigns until ctx ends. Each time it wins, it calls lead with a
// context that is cancelled as soon as the lease is lost (or ctx ends); when
// lead returns, the lease is released and the campaign goes on.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, l Lease)) error {
	if err := e.Keep.Validate(); err != nil {
		return err
	}
	log := e.Log.With().Str("resource", e.Resource).Logger()
	for {
		// Subscribed before each attempt, so that a release right after a
		// refused Acquire is not missed; closed while leading, when nobody
		// reads it.
		sub := e.Listener.Subscribe(notify.ChannelLease, 64)
		sent := time.Now()
		acq, err := e.Store.Acquire(ctx, AcquireParams{Resource: e.Resource, Holder: e.Holder, TTL: e.Keep.TTL})
		wait := e.Keep.withDefaults().RetryInterval
		var held *HeldError
		switch {
		case err == nil:
			sub.Close()
			log.Info().Int64("fence", acq.Lease.Fence).Msg("won the lease")
			e.hold(ctx, acq.Lease, sent, lead)
			sub = e.Listener.Subscribe(notify.ChannelLease, 64)
			log.Info().Int64("fence", acq.Lease.Fence).Msg("gave up the lease")
			// Having just stepped down, let the followers, woken by the
			// release within milliseconds, go first; then campaign again,
			// since the lease may be free with nobody else to take it.
			wait = min(wait, stepDownPause)
		case errors.As(err, &held):
			// The holder's lease runs out at its expires_at by the database
			// clock; a little after that, try again even if nobody says so.
			wait = held.Lease.ExpiresAt.Sub(acq.DBNow) + 10*time.Millisecond
		case ctx.Err() != nil:
			// Stopped mid-campaign: the acquisition may have committed
			// although its answer was lost. Give up whatever we may hold.
			sub.Close()
			e.release(ctx, ReleaseParams{Resource: e.Resource, Holder: e.Holder})
			return nil
		default:
			log.Warn().Err(err).Msg("campaign failed; retrying")
		}
		turn := waitForTurn(ctx, sub, e.Resource, wait)
		sub.Close()
		if !turn {
			return nil
		}
	}
}

// RunUntilDone holds the lease for as long as ctx lasts (campaigning again
// whenever it is lost): how a replica keeps a lease that only says it is
// alive, such as instance:<id>.
func (e *Elector) RunUntilDone(ctx context.Context) error {
	return e.Run(ctx, func(ctx context.Context, _ Lease) { <-ctx.Done() })
}

// stepDownPause is how long an elector that gave up its lease waits before
// campaigning again, unless told the lease is free.
const stepDownPause = 250 * time.Millisecond

// hold runs lead while keeping the lease, then releases it.
func (e *Elector) hold(ctx context.Context, l Lease, sent time.Time, lead func(ctx context.Context, l Lease)) {
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	go func() {
		lost <- keep(leadCtx, e.Keep, sent, func(rctx context.Context) error {
			_, err := e.Store.Renew(rctx, RenewParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
			return err
		})
		cancel()
	}()
	lead(leadCtx, l)
	cancel()
	if reason := <-lost; reason != nil {
		e.Log.Warn().Err(reason).Str("resource", l.Resource).Msg("lost the lease")
		return
	}
	e.release(ctx, ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
}

// release gives the lease up even when ctx has ended, so that a follower
// takes over at once instead of after the TTL.
func (e *Elector) release(ctx context.Context, p ReleaseParams) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := e.Store.Release(rctx, p); err != nil && !errors.Is(err, ErrNotHeld) {
		e.Log.Warn().Err(err).Str("resource", p.Resource).Msg("release failed; the lease will expire on its own")
	}
}

// waitForTurn waits up to d for a sign that the resource may be free: its
// release or expiry notified, or a resync. It reports false when ctx ended.
func waitForTurn(ctx context.Context, sub *notify.Subscription, resource string, d time.Duration) bool {
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-sub.Resync():
			return true
		case n := <-sub.C():
			c, err := ParseChange(n.Payload)
			if err == nil && c.Resource == resource && (c.Kind == "released" || c.Kind == "expired") {
				return true
			}
		}
	}
}
