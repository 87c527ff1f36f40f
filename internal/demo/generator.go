// Package demo is what leasehold's demo adds to a replica, and what no
// production replica runs: the sleep kind and its workers' simulated
// faults (sleep.go), and the singleton task generator, which creates sleep
// tasks on exactly one replica at a time while a cluster-wide switch in
// the database says so.
//
// Every demo replica runs a Generator; each campaigns for the lease
// leasehold:generator, and only the holder generates:
//
//	           won the lease               read: started
//	follower ────────────────▶ stopped ────────────────────▶ started
//	   ▲                       │   ▲                            │  inserts Rate tasks/s,
//	   │                       │   └────────────────────────────┤  each insert fenced
//	   │                       │         read: stopped          │
//	   └───────────────────────┴────────────────────────────────┘
//	     the lease lost, ctx ended, or a read shows the lease is not
//	     this term's: the term ends and the elector releases the
//	     lease if it still holds it
//
// The holder reads the switch (State.Get) when it wins the lease, on every
// notification on leasehold_generator, on every resync of the listener and
// after a refused insert: the notification is a wake-up, never the data.
// While stopped it waits for one and inserts nothing; there is no polling.
// Each insert is fenced (taskstore.Store.InsertGenerated): the database refuses
// it unless the switch is on and this holder's lease with this fence is
// live, so neither a paused ex-holder nor a holder that has not yet heard
// of a stop can insert a task. On a refusal the holder reads the switch
// again and, when the lease is no longer its own, steps down at once.
//
// While the database cannot be reached no renewal succeeds, so the term
// ends at the lease's local deadline (leasing.Elector): the holder stops
// generating before another replica could win the lease. The campaign
// retries with backoff and, woken by the listener's reconnect, wins the
// lease again once the database is back; generation resumes if the switch
// is on.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
)

// Defaults and limits of a Generator's configuration.
const (
	DefaultRate     = 1.0             // tasks per second
	MaxRate         = 10000.0         // tasks per second
	DefaultMinSleep = time.Second     // shortest sleep_duration_seconds of a task
	DefaultMaxSleep = 5 * time.Second // longest sleep_duration_seconds of a task
	SleepLimit      = time.Hour       // no task sleeps longer
)

const (
	// minTick bounds how often the holder inserts: at high rates a tick
	// inserts a batch in one statement (which wakes the workers once).
	minTick = 50 * time.Millisecond
	// readRetry is the wait before reading the switch again after the read
	// failed (the database was unreachable); not a poll: only after an error.
	readRetry = time.Second
)

// Generator creates demo tasks on exactly one replica at a time.
//
// The Listener must listen on notify.ChannelLease (for the election) and
// notify.ChannelGenerator (for the switch), and run while the Generator
// runs.
type Generator struct {
	State    *State
	Tasks    *taskstore.Store
	Leases   *leasestore.Store
	Listener *notify.Listener
	// Instance names this replica: the holder of the generator lease.
	Instance string
	// Keep is how the generator lease is kept, e.g. TTL 5s.
	Keep lease.KeepConfig
	// Rate is the tasks inserted per second while started (0: DefaultRate).
	Rate float64
	// MinSleep and MaxSleep bound each task's {"sleep_duration_seconds": N}:
	// N is uniformly random between them, to the millisecond (both zero:
	// DefaultMinSleep and DefaultMaxSleep).
	MinSleep, MaxSleep time.Duration
	Log                zerolog.Logger

	// Observed, if set, is called with the switch each time the holder has
	// read it. Like the hooks below it is called on the generating
	// goroutine, which waits for it; it is meant for tests.
	Observed func(s Status)
	// Inserted, if set, is called with each task the holder inserted, and
	// the fence of the generator lease it was inserted under.
	Inserted func(t task.Task, fence int64)
	// InsertFailed, if set, is called when an insert did not happen: err is
	// taskstore.ErrNotGenerator when the database refused it (the switch is off
	// or the lease is no longer live), otherwise the database error.
	InsertFailed func(err error)
}

// settings is a Generator's configuration with the defaults filled in.
type settings struct {
	rate         float64
	minMS, maxMS int64 // the range of sleep_duration_seconds, in milliseconds
}

// Validate reports a configuration the generator cannot run with; zero
// Rate, MinSleep and MaxSleep take their defaults.
func (g *Generator) Validate() error {
	_, err := g.settings()
	return err
}

func (g *Generator) settings() (settings, error) {
	switch {
	case g.State == nil || g.Tasks == nil || g.Leases == nil || g.Listener == nil:
		return settings{}, errors.New("generator: State, Tasks, Leases and Listener must all be set")
	case g.Instance == "":
		return settings{}, errors.New("generator: Instance must name this replica")
	}
	if err := g.Keep.Validate(); err != nil {
		return settings{}, fmt.Errorf("generator lease: %w", err)
	}
	rate := g.Rate
	if rate == 0 {
		rate = DefaultRate
	}
	if !(rate > 0) || rate > MaxRate { // the negation also catches NaN
		return settings{}, fmt.Errorf("generator rate %v tasks/s is out of range: give a rate above 0 and at most %v", g.Rate, MaxRate)
	}
	lo, hi := g.MinSleep, g.MaxSleep
	if lo == 0 && hi == 0 {
		lo, hi = DefaultMinSleep, DefaultMaxSleep
	}
	switch {
	case lo < 0:
		return settings{}, fmt.Errorf("generator min sleep %s is negative: give 0 or more", lo)
	case lo > hi:
		return settings{}, fmt.Errorf("generator min sleep %s is above max sleep %s: give min ≤ max", lo, hi)
	case hi > SleepLimit:
		return settings{}, fmt.Errorf("generator max sleep %s is above the limit of %s", hi, SleepLimit)
	}
	return settings{rate: rate, minMS: lo.Milliseconds(), maxMS: hi.Milliseconds()}, nil
}

// Run campaigns for the generator lease and generates while holding it and
// while the switch is on, until ctx ends. It returns an error only for a
// configuration it cannot run with; when ctx ends it releases the lease, if
// held, and returns nil. Every goroutine it starts has ended when it returns.
func (g *Generator) Run(ctx context.Context) error {
	s, err := g.settings()
	if err != nil {
		return err
	}
	e := &leasing.Elector{
		Leases: g.Leases, Listener: g.Listener, Resource: Resource,
		Holder: g.Instance, Keep: g.Keep, Log: g.Log,
	}
	return e.Run(ctx, func(ctx context.Context, l lease.Lease) { g.lead(ctx, l, s) })
}

// lead is one term as the generator: it returns when ctx ends (the lease
// was lost, or Run is stopping) or when a read of the switch shows that
// the lease is no longer this term's.
func (g *Generator) lead(ctx context.Context, l lease.Lease, s settings) {
	log := g.Log.With().Str("resource", Resource).Int64("fence", l.Fence).Logger()
	// Subscribe before the first read so that no change falls between.
	sub := g.Listener.Subscribe(notify.ChannelGenerator, 16)
	defer sub.Close()

	period := max(time.Duration(float64(time.Second)/s.rate), minTick)
	burst := max(1, s.rate) // owed tasks never exceed a second's worth
	tick := time.NewTimer(period)
	tick.Stop()
	defer tick.Stop()
	retry := time.NewTimer(readRetry)
	retry.Stop()
	defer retry.Stop()

	var (
		started bool
		read    = true    // read the switch before anything else
		owed    float64   // tasks due but not yet inserted
		last    time.Time // when owed was last brought up to date
		failing bool      // the last insert failed: say so once, not at every tick
		unread  bool      // the last read of the switch failed: likewise
	)
	for {
		if read {
			read = false
			st, err := g.State.Get(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				// Keep the last known switch: the database refuses inserts
				// while it is off, so a stale "started" can insert nothing.
				ev := log.Debug()
				if !unread {
					ev = log.Warn()
				}
				unread = true
				ev.Err(err).Msg("could not read the generator switch; retrying")
				retry.Reset(readRetry)
			default:
				unread = false
				if g.Observed != nil {
					g.Observed(st)
				}
				if st.Holder == nil || *st.Holder != l.Holder || st.Fence == nil || *st.Fence != l.Fence {
					log.Info().Msg("the generator lease is no longer ours; stepping down")
					return
				}
				switch {
				case st.Started && !started:
					log.Info().Float64("rate", s.rate).Msg("generating")
					owed, last = 1, time.Now() // the first task at once
					tick.Reset(0)
				case !st.Started && started:
					log.Info().Str("by", st.ChangedBy).Msg("generation stopped")
					owed = 0
					tick.Stop()
				}
				started = st.Started
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
			drain(sub.C())
			read = true
		case <-sub.Resync():
			read = true
		case <-retry.C:
			read = true
		case <-tick.C:
			now := time.Now()
			owed = min(owed+s.rate*now.Sub(last).Seconds(), burst)
			last = now
			if n := int(owed); n > 0 {
				owed -= float64(n)
				err := g.insert(ctx, l, s, n)
				switch {
				case err == nil:
					if failing {
						log.Info().Msg("inserting generated tasks again")
					}
					failing = false
				case ctx.Err() != nil:
					return
				default:
					if g.InsertFailed != nil {
						g.InsertFailed(err)
					}
					if errors.Is(err, taskstore.ErrNotGenerator) {
						// Stopped, or the lease is gone: the next read tells which.
						owed = 0
						read = true
						break
					}
					if !failing {
						log.Warn().Err(err).Msg("could not insert generated tasks; retrying at every tick")
					}
					failing = true
				}
			}
			tick.Reset(period)
		}
	}
}

// insert adds n tasks in one fenced statement.
//
// The statement is not abandoned when ctx ends: the term waits for its
// outcome (at most the lease's TTL, after which the fence has lapsed anyway)
// so that the elector releases the lease only after it. An insert whose
// caller had gone could still commit on the server after a release that
// began before it, and the history would show a task inserted after its
// lease ended.
func (g *Generator) insert(ctx context.Context, l lease.Lease, s settings, n int) error {
	data := make([]json.RawMessage, n)
	for i := range data {
		data[i] = s.taskData()
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.TTL())
	defer cancel()
	tasks, err := g.Tasks.InsertGenerated(ictx, l.Holder, l.Fence, data)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if g.Inserted != nil {
			g.Inserted(t, l.Fence)
		}
	}
	return nil
}

// taskData returns {"sleep_duration_seconds": N}, N uniformly random in the
// range, in seconds with up to 3 decimals.
func (s settings) taskData() json.RawMessage {
	ms := s.minMS + rand.N(s.maxMS-s.minMS+1)
	n := strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
	return json.RawMessage(`{"sleep_duration_seconds":` + n + `}`)
}

// drain empties c without blocking: one read of the switch answers every
// notification already queued.
func drain[T any](c <-chan T) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}
