// Package scheduler makes the tasks of leasehold's schedules: each tick of
// each schedule becomes exactly one task, on whichever replica holds the
// scheduler lease.
//
// Every replica runs a Scheduler; each campaigns for the lease
// leasehold:scheduler (leasing.Elector, as the generator does), and only
// the holder enqueues. Three things make a tick exactly one task:
//
//   - every enqueue is fenced: the statement inserts only while the
//     holder's lease with its fence is live, and holds the lease row FOR
//     SHARE until it commits, so a paused ex-holder that wakes up after
//     another replica took over inserts nothing;
//   - it is a compare-and-set on the schedule's next tick: the tick moves
//     from the one the holder read to the one after, or nothing happens;
//   - (schedule, tick) is unique among tasks, so even a second enqueuer
//     of the same tick that got past both inserts nothing.
//
// Ticks that fell due before the holder's term began, while no scheduler
// ran (every replica down, or the lease changing hands after a crash),
// are made one task, for the latest of them, and counted in the
// schedule's missed_ticks: a schedule that was down for an hour does not
// fire sixty times on return. Ticks that fall due during a term are each
// made a task, even when the holder is late.
//
// The holder sleeps until the earliest next tick; a change of the
// schedules (NOTIFY on leasehold_schedule) or a resync of the listener
// wakes it to read them again. It never polls.
package scheduler

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/lease"
)

// Resource is the lease the scheduler holds.
const Resource = "leasehold:scheduler"

// readRetry is the wait before reading the schedules again after the read
// failed (the database was unreachable): only after an error.
const readRetry = time.Second

// Scheduler enqueues the ticks of every schedule while it holds the
// scheduler lease.
//
// The Listener must listen on notify.ChannelLease (for the election) and
// notify.ChannelSchedule, and run while the Scheduler runs.
type Scheduler struct {
	Store    *schedulestore.Store
	Leases   leasing.Service
	Listener *notify.Listener
	// Instance names this replica: the holder of the scheduler lease.
	Instance string
	// Keep is how the scheduler lease is kept, e.g. TTL 5s.
	Keep lease.KeepConfig
	Log  zerolog.Logger

	// Enqueued, if set, is called for each tick made a task (taskID 0 when
	// the tick was skipped or made already). For tests and metrics.
	Enqueued func(name string, tick time.Time, taskID int64, missed int64)
}

// Run campaigns for the scheduler lease and enqueues while holding it,
// until ctx ends. It returns an error only for a configuration it cannot
// run with.
func (s *Scheduler) Run(ctx context.Context) error {
	if s.Store == nil || s.Leases == nil || s.Listener == nil || s.Instance == "" {
		return errors.New("scheduler: Store, Leases, Listener and Instance must all be set")
	}
	e := &leasing.Elector{
		Leases: s.Leases, Listener: s.Listener, Resource: Resource,
		Holder: s.Instance, Keep: s.Keep, Log: s.Log,
	}
	return e.Run(ctx, s.lead)
}

// lead is one term: it returns when ctx ends (the lease was lost, or Run
// is stopping) or when an enqueue was refused for the lease.
func (s *Scheduler) lead(ctx context.Context, l lease.Lease) {
	log := s.Log.With().Str("resource", Resource).Int64("fence", l.Fence).Logger()
	// Subscribed before the first read, so that no change falls between.
	sub := s.Listener.Subscribe(notify.ChannelSchedule, 64)
	defer sub.Close()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	termStart := l.CreatedAt
	failing := false
	for {
		wait, refused, err := s.round(ctx, log, l, termStart)
		switch {
		case ctx.Err() != nil:
			return
		case refused:
			log.Warn().Msg("an enqueue was refused under this lease: stepping down")
			return
		case err != nil:
			if !failing {
				log.Warn().Err(err).Msg("scheduler round failed; retrying")
			}
			failing = true
			wait = readRetry
		default:
			if failing {
				log.Info().Msg("scheduler round succeeded again")
			}
			failing = false
		}
		timer.Reset(wait)
	sleep:
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
				break sleep
			case <-sub.Resync():
				break sleep
			case n := <-sub.C():
				// Ticks enqueued (this holder's own, or a late ex-holder's
				// refused ones) change nothing it has to read.
				if strings.HasPrefix(n.Payload, "ticked:") {
					continue
				}
				break sleep
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// round reads the schedules, enqueues every due tick, and returns how long
// to sleep until the next. refused: an enqueue was refused and the
// schedule had not changed, so the lease is no longer live.
func (s *Scheduler) round(ctx context.Context, log zerolog.Logger, l lease.Lease, termStart time.Time) (wait time.Duration, refused bool, err error) {
	all, now, err := s.Store.Times(ctx)
	if err != nil {
		return 0, false, err
	}
	earliest := time.Time{}
	for _, d := range all {
		if d.SpecErr != nil {
			// Written by an older or newer release that reads it
			// differently: left alone, said once per round.
			log.Error().Err(d.SpecErr).Str("schedule", d.Name).Msg("schedule cannot be read; its ticks are not enqueued")
			continue
		}
		next, refusedHere, err := s.catchUp(ctx, l, d, now, termStart)
		if err != nil {
			return 0, false, err
		}
		if refusedHere {
			// The compare-and-set found the schedule changed (the next
			// read sees it), or the lease is gone: a changed schedule
			// NOTIFYs, so a read after it tells the two apart.
			all2, _, err := s.Store.Times(ctx)
			if err != nil {
				return 0, false, err
			}
			for _, d2 := range all2 {
				if d2.ID == d.ID && d2.Next.Equal(next) {
					return 0, true, nil
				}
			}
			return 0, false, nil // changed: read again at once
		}
		if earliest.IsZero() || next.Before(earliest) {
			earliest = next
		}
	}
	if earliest.IsZero() {
		return time.Hour, false, nil
	}
	return max(earliest.Sub(now), 0), false, nil
}

// catchUp enqueues the due ticks of one schedule and returns its next
// tick. refused: a compare-and-set failed at expect (returned as next).
func (s *Scheduler) catchUp(ctx context.Context, l lease.Lease, d schedulestore.Due, now, termStart time.Time) (next time.Time, refused bool, err error) {
	expect := d.Next
	if !expect.After(termStart) && !expect.After(now) {
		// Missed while no scheduler ran: one task, for the latest.
		last, missed := expect, int64(0)
		for {
			n := d.Spec.Next(last)
			if n.IsZero() || n.After(termStart) || n.After(now) {
				break
			}
			last, missed = n, missed+1
		}
		if refused, err := s.make(ctx, l, d, expect, last, missed); err != nil || refused {
			return expect, refused, err
		}
		expect = d.Spec.Next(last)
	}
	for !expect.IsZero() && !expect.After(now) {
		if refused, err := s.make(ctx, l, d, expect, expect, 0); err != nil || refused {
			return expect, refused, err
		}
		expect = d.Spec.Next(expect)
	}
	if expect.IsZero() {
		expect = now.Add(time.Hour) // no tick in five years: look again later
	}
	return expect, false, nil
}

// make enqueues one tick: the schedule's next tick moves from expect to
// the one after tick.
func (s *Scheduler) make(ctx context.Context, l lease.Lease, d schedulestore.Due, expect, tick time.Time, missed int64) (refused bool, err error) {
	after := d.Spec.Next(tick)
	if after.IsZero() {
		after = tick.AddDate(100, 0, 0) // never again: far enough
	}
	res, err := s.Store.Enqueue(ctx, s.Instance, l.Fence, d.ID, expect, tick, after, missed)
	if err != nil {
		return false, err
	}
	if !res.OK {
		return true, nil
	}
	if s.Enqueued != nil {
		s.Enqueued(d.Name, tick, res.TaskID, missed)
	}
	return false, nil
}
