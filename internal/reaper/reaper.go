// Package reaper turns lease expiry into an event. One replica at a time
// (elected through the lease leasehold:reaper) sleeps until the earliest
// expiry is due, or until a notification says a lease now expires earlier
// (while its LISTEN connection is down, a quarter second at most), then
// marks what has expired: the leases trigger records an "expired" event
// and NOTIFYs it. A task's lease lives in the task's row: the reaper puts a
// task whose lease lapsed back to pending (or dead), and the tasks trigger
// NOTIFYs that, which wakes the workers. Correctness never depends on the
// reaper: an expired lease is free to acquire whether or not it was marked,
// and a claim takes a lapsed task whether or not it was put back.
//
// The elected reaper also runs retention (internal/retention) while it
// holds its lease: one replica at a time deletes what is too old to keep.
// And it folds, every second, the log of changes that the task counts by
// state are summed from (taskstore.Store.FoldCounts).
package reaper

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/retention"
)

// Resource is the lease that elects the reaper.
const Resource = "leasehold:reaper"

// batchSize bounds the leases marked per statement.
const batchSize = 500

// Reaper marks expired leases while it holds the reaper lease.
type Reaper struct {
	Store    *leasestore.Store
	Tasks    *taskstore.Store // nil: task leases are not the reaper's to announce
	Listener *notify.Listener
	Instance string
	Keep     lease.KeepConfig
	Log      zerolog.Logger
	// Marked, if set, is called with each lease the reaper announced as
	// expired (a task's as taskstore.LeaseResource) and the delay from its
	// expiry to the announcement.
	Marked func(resource string, lag time.Duration)
	// Retention, if set, runs while this reaper holds the reaper lease, and
	// stops as soon as the lease is lost.
	Retention *retention.Pruner

	offset time.Duration // database clock − this process's clock, as last measured
}

// Run campaigns for the reaper lease and reaps while holding it, until ctx ends.
func (r *Reaper) Run(ctx context.Context) error {
	e := &leasing.Elector{
		Leases: r.Store, Listener: r.Listener, Resource: Resource,
		Holder: r.Instance, Keep: r.Keep, Log: r.Log,
	}
	return e.Run(ctx, r.reap)
}

// reap runs one term as the reaper. It ends when the reaper lease is lost,
// at the latest at its local deadline when the database cannot be reached.
func (r *Reaper) reap(ctx context.Context, _ lease.Lease) {
	// ctx ends with the term; reap returns only then, and waits for what
	// it started.
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.Retention != nil {
		wg.Go(func() {
			if err := r.Retention.Run(ctx); err != nil {
				r.Log.Error().Err(err).Msg("retention stopped")
			}
		})
	}
	// Pruning after expiries runs beside the passes: it waits for the
	// listener's control session, which a reconnect may hold for a while
	// (after a failover, when many leases lapse at once), and the next
	// expiry must not wait for it.
	prune := make(chan struct{}, 1)
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-prune:
				r.pruneWaiters(ctx)
			}
		}
	})
	if r.Tasks != nil {
		wg.Go(func() { r.foldCounts(ctx) })
	}
	// Subscribe before the first pass so that no change falls between.
	sub := r.Listener.Subscribe(notify.ChannelLease, 1024)
	defer sub.Close()
	// Task leases are announced per claim statement, with their earliest expiry.
	claims := r.Listener.Subscribe(notify.ChannelTask, 1024)
	defer claims.Close()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		wakeAt   time.Time // on this process's clock
		failures int       // passes failed in a row: say so once, not at every retry
		instant  int       // of them, those retried at once after a lost connection
		// The start of the first of those passes, and the last one's error.
		firstFailed time.Time
		lastErr     error
	)
	sooner := func(expires time.Time) {
		// The payloads carry expiries by the database clock; the last pass
		// measured the offset to ours.
		if due := expires.Add(-r.offset); due.Before(wakeAt) {
			wakeAt = due
			timer.Reset(time.Until(due))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			began := time.Now()
			next, expired, err := r.pass(ctx)
			if expired {
				select {
				case prune <- struct{}{}:
				default: // one is pending already
				}
			}
			switch {
			case err == nil:
				if failures > 0 {
					// An expiry is promised within a second: a longer gap
					// may have broken that promise, which an operator should
					// see at the default level.
					gap := time.Since(firstFailed)
					ev := r.Log.Info()
					if gap >= time.Second {
						ev = r.Log.Warn()
					}
					ev.Int("failed_passes", failures).Stringer("since_first_failure", gap.Round(time.Millisecond)).
						AnErr("last_error", lastErr).Msg("reaping again")
				}
				failures, instant = 0, 0
				wakeAt = next
			case ctx.Err() != nil:
				return
			default:
				ev := r.Log.Debug()
				if failures == 0 {
					ev = r.Log.Warn()
					firstFailed = began
				}
				failures++
				lastErr = err
				if connectionLost(err) && instant < maxInstantRetries {
					// The pool dropped the dead connection; its other
					// idle ones may be dead too (all of a process's
					// connections cut at once), and each costs one
					// failed statement: try the next one now, not a
					// backoff later for each.
					instant++
					wakeAt = time.Now()
				} else {
					wakeAt = retryAt(began, failures-instant)
				}
				ev.Err(err).Stringer("retry_in", max(0, time.Until(wakeAt))).Msg("reaper pass failed; retrying")
			}
			if !r.Listener.Connected() {
				// A lease taken or a task claimed while the LISTEN
				// connection is down (a failover, a restart) is not
				// heard of, and may expire before the next due this
				// pass found: look again soon until the listener is
				// back (its resync brings a pass at once).
				wakeAt = earliest(wakeAt, time.Now().Add(deafPoll))
			}
			timer.Reset(time.Until(wakeAt))
		case <-sub.Resync():
			wakeAt = time.Now()
			timer.Reset(0)
		case <-claims.Resync():
			wakeAt = time.Now()
			timer.Reset(0)
		case n := <-sub.C():
			c, err := leasestore.ParseChange(n.Payload)
			if err != nil || c.Kind == "released" || c.Kind == "expired" {
				continue
			}
			sooner(c.ExpiresAt)
		case n := <-claims.C():
			if earliest, ok := notify.ParseClaimed(n.Payload); ok {
				sooner(earliest)
			}
		}
	}
}

// passRetry is the wait before another pass after the given number of
// passes failed in a row: 50 ms after one (a terminated connection, which
// the pool replaces at once), doubling up to 250 ms while the database is
// away, so that the first pass after it returns comes well within the
// second in which an expiry is promised to be announced.
func passRetry(failures int) time.Duration {
	wait := 50 * time.Millisecond
	for i := 1; i < failures && wait < maxPassRetry; i++ {
		wait *= 2
	}
	return min(wait, maxPassRetry)
}

// retryAt is when to try again after the given number of passes failed in
// a row, the last one begun at began: passRetry after its start, not its
// end. A pass that failed slowly (a connection attempt that took long to
// be refused, as when a standby is being promoted) has waited already; it
// is retried at once rather than a full wait later, when the promoted
// primary may be serving and an expiry due.
func retryAt(began time.Time, failures int) time.Time {
	return began.Add(passRetry(failures))
}

// maxInstantRetries bounds the passes in a row retried at once because
// their connection was lost: enough for a pool whose every connection was
// cut, few enough that a server which drops every new session is not
// hammered (past them, the retries back off).
const maxInstantRetries = 32

// connectionLost reports whether err is a connection that broke under a
// statement (terminated by the server or an operator, reset, closed), as
// opposed to a database that cannot be reached or a statement that failed:
// the pool has dropped that connection, and another may serve at once.
func connectionLost(err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return false // no connection to be had: back off
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// admin_shutdown (pg_terminate_backend), crash_shutdown, and the
		// connection_exception class.
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || strings.HasPrefix(pgErr.Code, "08")
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && !netErr.Timeout()
}

// maxPassRetry bounds passRetry.
const maxPassRetry = 250 * time.Millisecond

// deafPoll is the longest the reaper sleeps while its listener is not
// connected: a pass (two index lookups) every quarter second, only then.
const deafPoll = 250 * time.Millisecond

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// pass marks every due expiry and returns when the next one is due, on this
// process's clock, and whether it marked any (also when it failed after).
func (r *Reaper) pass(ctx context.Context) (next time.Time, expired bool, err error) {
	for {
		marked, err := r.Store.MarkExpired(ctx, batchSize)
		if err != nil {
			return time.Time{}, expired, err
		}
		for _, m := range marked {
			if r.Marked != nil {
				r.Marked(m.Lease.Resource, m.Lag)
			}
		}
		expired = expired || len(marked) > 0
		if len(marked) < batchSize {
			break
		}
	}
	for r.Tasks != nil {
		lapsed, err := r.Tasks.RequeueLapsed(ctx, batchSize)
		if err != nil {
			return time.Time{}, expired, err
		}
		for _, l := range lapsed {
			if r.Marked != nil {
				r.Marked(taskstore.LeaseResource(l.Task.ID), l.Lag)
			}
		}
		expired = expired || len(lapsed) > 0
		if len(lapsed) < batchSize {
			break
		}
	}
	asked := time.Now()
	next, dbNow, err := r.Store.NextExpiry(ctx)
	if err != nil {
		return time.Time{}, expired, err
	}
	if r.Tasks != nil {
		lapse, err := r.Tasks.NextLapse(ctx)
		if err != nil {
			return time.Time{}, expired, err
		}
		if lapse.Before(next) {
			next = lapse
		}
	}
	r.offset = dbNow.Sub(asked)
	// A little after the due time, so that now() in the database has passed it.
	return next.Add(-r.offset + 5*time.Millisecond), expired, nil
}

// foldEvery is how often the reaper folds the log of task count changes:
// what a read of the counts sums is about a second's changes at most, plus
// a row per state and second of the last two minutes.
const foldEvery = time.Second

// foldCounts folds the task counts' log every foldEvery until ctx ends.
func (r *Reaper) foldCounts(ctx context.Context) {
	tick := time.NewTicker(foldEvery)
	defer tick.Stop()
	failed := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_, err := r.Tasks.FoldCounts(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failed:
			// Said once: the counts stay exact, only their reads grow.
			r.Log.Warn().Err(err).Msg("folding the task counts failed; retrying every second")
			failed = true
		case err == nil && failed:
			r.Log.Info().Msg("folding the task counts again")
			failed = false
		}
	}
}

// pruneWaiters removes the registrations as waiters for inserted tasks
// (schema/0008) whose LISTEN session has ended. A lease that expired may
// be a replica that died while it waited; its registration would make
// every insert notify, at a cost to every inserter, until the next
// registration by anyone pruned it.
func (r *Reaper) pruneWaiters(ctx context.Context) {
	// Bounded: it runs on a session with no statement timeout.
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	n, err := r.Listener.PruneWaiters(ctx)
	switch {
	case err != nil:
		r.Log.Debug().Err(err).Msg("pruning the waiters of ended sessions")
	case n > 0:
		r.Log.Info().Int64("pruned", n).Msg("removed the registrations of waiters whose session has ended")
	}
}
