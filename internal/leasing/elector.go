package leasing

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/keepalive"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/lease"
)

// Service acquires, renews and releases leases: the Store on the database,
// or a leasehold service's REST API. An Acquire with Wait is waited for by
// a service that can (the REST API's wait_seconds); the Store never waits.
type Service interface {
	Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error)
	Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error)
	Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error)
}

// Elector runs a function only while it holds the lease on a resource: the
// way one replica of many becomes the reaper or the generator. Followers
// wait for the holder's lease to be released or to expire: woken by NOTIFY
// through Listener or, without one, by the service itself (an acquisition
// that waits), and by their own timer at the holder's expires_at.
type Elector struct {
	Leases Service
	// Listener, when set, wakes followers on a release or an expiry; it
	// must listen on notify.ChannelLease. Without it each campaign is an
	// acquisition that waits up to a TTL (Leases must wait: the REST API).
	Listener *notify.Listener
	Resource string
	Holder   string
	Keep     lease.KeepConfig
	Log      zerolog.Logger
	// Observed, if set, is called with the holder of the lease each time a
	// campaign finds it held by another (its callbacks' OnNewLeader).
	Observed func(holder string)
	// Stopped, if set, is called with the lease each time a holding ends,
	// after it was released or counted lost (reason nil when released).
	Stopped func(l lease.Lease, reason error)
}

// Run campaigns until ctx ends. Each time it wins, it calls lead with a
// context that is cancelled as soon as the lease is lost (or ctx ends); when
// lead returns, the lease is released and the campaign goes on.
//
// While the service cannot be reached, the campaign retries with backoff
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
		sub := e.subscribe()
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
			sub = e.subscribe()
			log.Info().Int64("fence", acq.Lease.Fence).Msg("gave up the lease")
			// Having just stepped down, let the followers, woken by the
			// release within milliseconds, go first; then campaign again,
			// since the lease may be free with nobody else to take it.
			wait = min(wait, stepDownPause)
		case errors.As(err, &held):
			failures = 0
			if e.Observed != nil {
				e.Observed(held.Lease.Holder)
			}
			// The holder's lease runs out at its expires_at by the service's
			// clock; a little after that, try again even if nobody says so.
			// A service that waited for it answers after its own wait.
			if acq.DBNow.IsZero() {
				wait = 0
			} else {
				wait = held.UntilExpiry(acq.DBNow)
			}
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
			ev.Err(err).Int("failures", failures).Stringer("retry_in", wait).Msg("campaign failed; retrying with backoff")
		}
		turn := waitForTurn(ctx, sub, e.Resource, wait)
		sub.Close()
		if !turn {
			return nil
		}
	}
}

func (e *Elector) subscribe() leasestore.Subscription {
	return leasestore.Subscribe(e.Listener)
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
// did not time; and an acquisition that waited for the lease was sent
// before its wait. campaign then renews it at once, with this elector's
// TTL, so that the deadline counts from a request it sent and the lease
// lasts as long on the service as the elector believes.
//
// Each request is bounded by the window (KeepConfig.Window, plus the wait it asks for): a
// later answer would arrive past the deadline it starts, and a service that
// does not answer must not stall the campaign.
func (e *Elector) campaign(ctx context.Context, keep lease.KeepConfig) (lease.Acquisition, time.Time, error) {
	p := lease.AcquireParams{Resource: e.Resource, Holder: e.Holder, TTL: keep.TTL}
	if e.Listener == nil {
		p.Wait = keep.TTL // the service wakes us on a release or an expiry
	}
	actx, cancel := context.WithTimeout(ctx, keep.Window()+p.Wait)
	defer cancel()
	sent := time.Now()
	acq, err := e.Leases.Acquire(actx, p)
	if err != nil || (acq.New && p.Wait == 0) {
		return acq, sent, err
	}
	rctx, cancel := context.WithTimeout(ctx, keep.Window())
	defer cancel()
	sent = time.Now()
	acq.Lease, err = e.Leases.Renew(rctx, lease.RenewParams{Resource: e.Resource, Holder: e.Holder, Fence: acq.Lease.Fence, TTL: keep.TTL})
	return acq, sent, err
}

// RunUntilDone holds the lease for as long as ctx lasts (campaigning again
// whenever it is lost): how a replica keeps a lease that only says it is
// alive, such as leasehold:instance:<id>.
func (e *Elector) RunUntilDone(ctx context.Context) error {
	return e.Run(ctx, func(ctx context.Context, _ lease.Lease) { <-ctx.Done() })
}

// stepDownPause is how long an elector that gave up its lease waits before
// campaigning again, unless told the lease is free.
const stepDownPause = 250 * time.Millisecond

// hold runs lead while keeping the lease (the keep-alive loop every holder
// uses), then releases it: also when it gave the lease up at its deadline,
// but not when a renewal was refused.
func (e *Elector) hold(ctx context.Context, l lease.Lease, sent time.Time, lead func(ctx context.Context, l lease.Lease)) {
	leadCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lost := make(chan error, 1)
	go func() {
		loop := keepalive.Loop{
			Config: e.Keep,
			Renew: func(rctx context.Context) error {
				_, err := e.Leases.Renew(rctx, lease.RenewParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
				return err
			},
			Refused: keepalive.Refusal(lease.ErrNotHeld),
			Lost:    cancel,
		}
		_, reason := loop.Run(leadCtx, sent)
		lost <- reason
		cancel(reason)
	}()
	lead(leadCtx, l)
	cancel(nil)
	if reason := <-lost; reason != nil {
		e.Log.Warn().Err(reason).Str("resource", l.Resource).Msg("lost the lease")
		if errors.Is(reason, lease.ErrDeadline) {
			// Given up at the deadline, not refused: the last renewal may
			// have renewed the lease although its answer never came. lead
			// has returned, so the lease is free to go at once.
			e.release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
		}
		if e.Stopped != nil {
			e.Stopped(l, reason)
		}
		return
	}
	e.release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
	if e.Stopped != nil {
		e.Stopped(l, nil)
	}
}

// release gives the lease up even when ctx has ended, so that a follower
// takes over at once instead of after the TTL.
func (e *Elector) release(ctx context.Context, p lease.ReleaseParams) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	l, err := e.Leases.Release(rctx, p)
	switch {
	case err == nil:
		released(e.Keep, l)
	case !errors.Is(err, lease.ErrNotHeld):
		e.Log.Warn().Err(err).Str("resource", p.Resource).Msg("release failed; the lease will expire on its own")
	}
}

// waitForTurn waits up to d for a sign that the resource may be free: its
// release or expiry notified, or a resync. It reports false when ctx ended.
func waitForTurn(ctx context.Context, sub leasestore.Subscription, resource string, d time.Duration) bool {
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
			return false
		case <-timer.C:
			return true
		case <-resync:
			return true
		case n := <-changes:
			if leasestore.Frees(n, resource) {
				return true
			}
		}
	}
}
