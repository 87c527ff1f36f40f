package leasing

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/lease"

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
	Keep     lease.KeepConfig
	Log      zerolog.Logger
}

// Run campaigns until ctx ends. Each time it wins, it calls lead with a
// context that is cancelled as soon as the lease is lost (or ctx ends); when
// lead returns, the lease is released and the campaign goes on.
//
// While the database cannot be reached, the campaign retries with backoff
// (RetryInterval doubling up to maxCampaignBackoff), and says so once, not
// at every attempt; a reconnect of the listener ends the wait at once.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, l lease.Lease)) error {
	if err := e.Keep.Validate(); err != nil {
		return err
	}
	keep := e.Keep.WithDefaults()
	log := e.Log.With().Str("resource", e.Resource).Logger()
	failures := 0 // campaigns in a row that failed on an error
	for {
		// Subscribed before each attempt, so that a release right after a
		// refused Acquire is not missed; closed while leading, when nobody
		// reads it.
		sub := e.Listener.Subscribe(notify.ChannelLease, 64)
		acq, sent, err := e.campaign(ctx, keep)
		wait := keep.RetryInterval
		var held *lease.HeldError
		switch {
		case err == nil:
			failures = 0
			sub.Close()
			log.Info().Int64("fence", acq.Lease.Fence).Msg("won the lease")
			won(keep, acq.Lease)
			e.hold(ctx, acq.Lease, sent, lead)
			sub = e.Listener.Subscribe(notify.ChannelLease, 64)
			log.Info().Int64("fence", acq.Lease.Fence).Msg("gave up the lease")
			// Having just stepped down, let the followers, woken by the
			// release within milliseconds, go first; then campaign again,
			// since the lease may be free with nobody else to take it.
			wait = min(wait, stepDownPause)
		case errors.As(err, &held):
			failures = 0
			// The holder's lease runs out at its expires_at by the database
			// clock; a little after that, try again even if nobody says so.
			wait = held.UntilExpiry(acq.DBNow)
		case ctx.Err() != nil:
			// Stopped mid-campaign: the acquisition may have committed
			// although its answer was lost. Give up whatever we may hold.
			sub.Close()
			e.release(ctx, lease.ReleaseParams{Resource: e.Resource, Holder: e.Holder})
			return nil
		case errors.Is(err, lease.ErrNotHeld):
			// Our own lease lapsed between the acquisition and its renewal:
			// the resource is free; try again after RetryInterval.
		default:
			failures++
			wait = min(keep.RetryInterval<<min(failures-1, 16), max(maxCampaignBackoff, keep.RetryInterval))
			ev := log.Debug()
			if failures == 1 {
				ev = log.Warn()
			}
			ev.Err(err).Int("failures", failures).Dur("retry_in", wait).Msg("campaign failed; retrying with backoff")
		}
		turn := waitForTurn(ctx, sub, e.Resource, wait)
		sub.Close()
		if !turn {
			return nil
		}
	}
}

// maxCampaignBackoff bounds the wait between campaigns that failed on an
// error (unless RetryInterval is longer).
const maxCampaignBackoff = 5 * time.Second

// campaign tries once to take the lease, and returns when the request that
// won it was sent: the holder's deadline counts from there.
//
// When the elector's holder already holds the lease (an earlier acquisition
// whose answer was lost, or an earlier run of a process of the same name),
// Acquire hands it back unchanged, its expiry set by a request this elector
// did not time. campaign renews it at once, with this elector's TTL, so that
// the deadline counts from a request it sent and the lease lasts as long on
// the server as the elector believes.
//
// Each request is bounded by TTL − Margin: a later answer would arrive past
// the deadline it starts, and a database that does not answer must not
// stall the campaign.
func (e *Elector) campaign(ctx context.Context, keep lease.KeepConfig) (lease.Acquisition, time.Time, error) {
	actx, cancel := context.WithTimeout(ctx, keep.TTL-keep.Margin)
	defer cancel()
	sent := time.Now()
	acq, err := e.Store.Acquire(actx, lease.AcquireParams{Resource: e.Resource, Holder: e.Holder, TTL: keep.TTL})
	if err != nil || acq.New {
		return acq, sent, err
	}
	sent = time.Now()
	acq.Lease, err = e.Store.Renew(actx, lease.RenewParams{Resource: e.Resource, Holder: e.Holder, Fence: acq.Lease.Fence, TTL: keep.TTL})
	return acq, sent, err
}

// RunUntilDone holds the lease for as long as ctx lasts (campaigning again
// whenever it is lost): how a replica keeps a lease that only says it is
// alive, such as instance:<id>.
func (e *Elector) RunUntilDone(ctx context.Context) error {
	return e.Run(ctx, func(ctx context.Context, _ lease.Lease) { <-ctx.Done() })
}

// stepDownPause is how long an elector that gave up its lease waits before
// campaigning again, unless told the lease is free.
const stepDownPause = 250 * time.Millisecond

// hold runs lead while keeping the lease, then releases it.
func (e *Elector) hold(ctx context.Context, l lease.Lease, sent time.Time, lead func(ctx context.Context, l lease.Lease)) {
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	go func() {
		lost <- keep(leadCtx, e.Keep, sent, func(rctx context.Context) error {
			_, err := e.Store.Renew(rctx, lease.RenewParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
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
	e.release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
}

// release gives the lease up even when ctx has ended, so that a follower
// takes over at once instead of after the TTL.
func (e *Elector) release(ctx context.Context, p lease.ReleaseParams) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	l, err := e.Store.Release(rctx, p)
	switch {
	case err == nil:
		released(e.Keep, l)
	case !errors.Is(err, lease.ErrNotHeld):
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
			if Frees(n, resource) {
				return true
			}
		}
	}
}
