package checker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/taskstore"
)

// Rate is a key's rate: at most Starts of its tasks start in any Period.
type Rate struct {
	Starts int
	Period time.Duration
}

func (r Rate) String() string { return fmt.Sprintf("%d start(s) per %v", r.Starts, r.Period) }

// RateKey is what the checker saw of a key with a rate: its tasks' starts,
// as RuleRateLimit judges them.
type RateKey struct {
	Key string
	// Rate is the rate it was judged by (see RuleRateLimit).
	Rate Rate
	// Tasks are the tasks gated by the key with at least one attempt;
	// Starts, their attempts, each a start.
	Tasks, Starts int
	// MostInWindow is the most starts in one window [t, t+Period); the
	// first such window begins at BusiestAt.
	MostInWindow int
	BusiestAt    time.Time
}

// Pause is one pause of a queue, as the one who made it recorded it (see
// RuleQueuePaused): the queue_pauses row keeps only a queue's latest.
type Pause struct {
	Queue string
	// At is the pause's paused_at: the pausing statement's now(), before
	// its commit.
	At time.Time
	// From is the database clock once the pause bound every claim: no
	// session held a snapshot taken before its commit any more
	// (PauseMade). Zero: never seen so, and the pause judges nothing.
	From time.Time
	// Until is the pause's until: the end it was given, or the resume's
	// now(). Zero: not ended when the history was read.
	Until time.Time
}

// judged reports whether the pause binds any instant before until (the
// history's ReadAt for a pause not ended).
func (p Pause) judged(readAt time.Time) bool {
	return !p.From.IsZero() && p.From.Before(p.end(readAt))
}

// end is the pause's Until, or readAt when it had not ended.
func (p Pause) end(readAt time.Time) time.Time {
	if p.Until.IsZero() {
		return readAt
	}
	return p.Until
}

func (p Pause) String() string {
	until := "not ended"
	if !p.Until.IsZero() {
		until = "until " + ts(p.Until)
	}
	from := "never seen binding every claim"
	if !p.From.IsZero() {
		from = "binding every claim from " + ts(p.From)
	}
	return fmt.Sprintf("the pause of %s at %s, %s, %s", p.Queue, ts(p.At), from, until)
}

// PausedQueue is what the checker saw of a queue of Options.Pauses: its
// tasks' starts, as RuleQueuePaused judges them.
type PausedQueue struct {
	Queue string
	// Pauses are its pauses in Options.Pauses; Judged, those that bound
	// every claim before they ended; Paused, how long those bound them in
	// all (each from its From to its Until).
	Pauses, Judged int
	Paused         time.Duration
	// Tasks are its tasks with at least one attempt; Starts, their
	// attempts, each a start.
	Tasks, Starts int
	// HeldBack are the tasks created during a pause, [At, Until), whose
	// first start came after its Until: tasks the pause held back.
	HeldBack int
	// InFlight are the starts within a judged pause before it bound every
	// claim ([At, From)): claims under way at its commit. NotJudged are
	// the starts within a pause that judged nothing, Outside those outside
	// every pause. The others broke a pause.
	InFlight, NotJudged, Outside int
}

// start is one attempt's start, of a task gated by a key with a rate or of
// a paused queue.
type start struct {
	at        time.Time
	task      int64
	attempt   int
	processor string
}

func (s start) String() string {
	return fmt.Sprintf("%s attempt %d by %s at %s", taskstore.LeaseResource(s.task), s.attempt, s.processor, ts(s.at))
}

// taskStarts returns the starts of t's attempts, in their order: each
// entry of earlier_attempts, then the attempt in its columns when it is
// one of its own (hasCurrent).
func taskStarts(t Task) []start {
	out := make([]start, 0, len(t.Attempts)+1)
	for i, a := range t.Attempts {
		out = append(out, start{at: a.StartedAt, task: t.ID, attempt: i + 1, processor: a.Processor})
	}
	if hasCurrent(t) {
		out = append(out, start{at: t.StartedAt, task: t.ID, attempt: len(t.Attempts) + 1, processor: t.Processor})
	}
	return out
}

// flow keeps what RuleRateLimit and RuleQueuePaused need of the tasks.
type flow struct {
	// rates are the keys with a rate and the starts of their tasks.
	rates map[string]*rateStarts
	// pauses are the pauses of each queue of Options.Pauses, by At; queues,
	// each one's figures.
	pauses map[string][]Pause
	queues map[string]*PausedQueue
}

type rateStarts struct {
	rate   Rate
	tasks  int
	starts []start
}

// newFlow returns the flow of the keys with a rate in db (as lease_limits
// held them) or in opts.Rates, which wins, and of opts.Pauses.
func newFlow(opts Options, db map[string]Rate) *flow {
	f := &flow{rates: make(map[string]*rateStarts), pauses: make(map[string][]Pause), queues: make(map[string]*PausedQueue)}
	for key, r := range db {
		f.rates[key] = &rateStarts{rate: r}
	}
	for key, r := range opts.Rates {
		f.rates[key] = &rateStarts{rate: r}
	}
	for _, p := range opts.Pauses {
		f.pauses[p.Queue] = append(f.pauses[p.Queue], p)
		if f.queues[p.Queue] == nil {
			f.queues[p.Queue] = &PausedQueue{Queue: p.Queue}
		}
	}
	for _, ps := range f.pauses {
		slices.SortStableFunc(ps, func(a, b Pause) int { return a.At.Compare(b.At) })
	}
	return f
}

// flowTask keeps t's starts for RuleRateLimit and judges them by
// RuleQueuePaused.
func (v *verifier) flowTask(t Task) {
	r, rated := v.flow.rates[t.Lock]
	q := v.flow.queues[t.Queue]
	if !rated && q == nil {
		return
	}
	starts := taskStarts(t)
	if len(starts) == 0 {
		return
	}
	if rated {
		r.tasks++
		r.starts = append(r.starts, starts...)
	}
	if q != nil {
		q.Tasks++
		for _, s := range starts {
			v.judgePaused(q, s)
		}
		if slices.ContainsFunc(v.flow.pauses[q.Queue], func(p Pause) bool {
			end := p.end(v.readAt)
			return !t.CreatedAt.Before(p.At) && t.CreatedAt.Before(end) && !starts[0].at.Before(end)
		}) {
			q.HeldBack++
		}
	}
}

// judgePaused judges start s of a task of queue q against q's pauses: see
// RuleQueuePaused.
func (v *verifier) judgePaused(q *PausedQueue, s start) {
	q.Starts++
	inFlight, notJudged := false, false
	for _, p := range v.flow.pauses[q.Queue] {
		switch {
		case s.at.Before(p.At) || !s.at.Before(p.end(v.readAt)):
			// Outside this pause.
		case !p.judged(v.readAt):
			notJudged = true
		case !s.at.Before(p.From):
			v.violate(RuleQueuePaused, "%s started in the paused queue %s, %s after the pause bound every claim: %s",
				s, q.Queue, s.at.Sub(p.From), p)
			return
		default:
			inFlight = true
		}
	}
	switch {
	case inFlight:
		q.InFlight++
	case notJudged:
		q.NotJudged++
	default:
		q.Outside++
	}
}

// checkRates judges RuleRateLimit on every key with a rate and adds each
// key's figures to the report.
func (v *verifier) checkRates() {
	for _, key := range slices.Sorted(maps.Keys(v.flow.rates)) {
		r := v.flow.rates[key]
		ss := r.starts
		slices.SortStableFunc(ss, func(a, b start) int {
			return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.task, b.task), cmp.Compare(a.attempt, b.attempt))
		})
		stats := RateKey{Key: key, Rate: r.rate, Tasks: r.tasks, Starts: len(ss)}
		reported := -1 // the last start of the last window reported
		for i, j := 0, 0; i < len(ss); i++ {
			// ss[i:j] are the starts in [ss[i].at, ss[i].at+Period).
			windowEnd := ss[i].at.Add(r.rate.Period)
			for j < len(ss) && ss[j].at.Before(windowEnd) {
				j++
			}
			if n := j - i; n > stats.MostInWindow {
				stats.MostInWindow, stats.BusiestAt = n, ss[i].at
			}
			if j-i > r.rate.Starts && j-1 > reported {
				reported = j - 1
				in := make([]string, j-i)
				for k, s := range ss[i:j] {
					in[k] = s.String()
				}
				v.violate(RuleRateLimit, "%s, a key of %v: %d starts in [%s, %s): %s",
					key, r.rate, j-i, ts(ss[i].at), ts(windowEnd), strings.Join(in, "; "))
			}
		}
		v.rep.RateKeys = append(v.rep.RateKeys, stats)
	}
}

// finishPauses adds each paused queue's figures to the report.
func (v *verifier) finishPauses() {
	for _, queue := range slices.Sorted(maps.Keys(v.flow.queues)) {
		q := v.flow.queues[queue]
		for _, p := range v.flow.pauses[queue] {
			q.Pauses++
			if p.judged(v.readAt) {
				q.Judged++
				q.Paused += p.end(v.readAt).Sub(p.From)
			}
		}
		v.rep.PausedQueues = append(v.rep.PausedQueues, *q)
	}
}

// readRates returns each key's rate in lease_limits.
func readRates(ctx context.Context, tx pgx.Tx) (map[string]Rate, error) {
	rows, err := tx.Query(ctx, `
		SELECT resource, rate_starts, (extract(epoch FROM rate_period) * 1000000)::bigint
		FROM lease_limits WHERE rate_starts IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	rates := make(map[string]Rate)
	for rows.Next() {
		var key string
		var n int
		var micros int64
		if err := rows.Scan(&key, &n, &micros); err != nil {
			return nil, err
		}
		rates[key] = Rate{Starts: n, Period: time.Duration(micros) * time.Microsecond}
	}
	return rates, rows.Err()
}

// pollEvery is how often PauseMade looks for claims under way at a
// pause's commit.
const pollEvery = 10 * time.Millisecond

// PauseMade returns the pause of queue that the caller has just made (its
// pause was answered, so committed) as RuleQueuePaused judges it, once it
// binds every claim: At from the queue_pauses row, Until when the pause
// was given one, From the database clock once no other session of the
// database holds a snapshot taken before the pause committed.
//
// A claim reads queue_pauses with its statement's snapshot and stamps its
// tasks' started_at later in the statement, so a claim whose snapshot
// predates the commit may start the queue's tasks after it, until the
// statement ends. Such a session's backend_xmin is at or before the
// pausing transaction's xid (the row's xmin: the pause was in progress or
// not yet begun when the snapshot was taken), and its transaction began
// before the pause was seen committed; PauseMade waits until no session
// shows both, then reads the clock. A session may show both for another
// reason (a snapshot taken after the commit while an older transaction
// ran): that makes From later, never too early.
//
// It polls, since nothing announces the end of a statement, and reads
// again after an error (the database may be failing over). When ctx ends
// first it returns what it read, with a zero From, which judges nothing,
// and ctx's error.
func PauseMade(ctx context.Context, pool *pgxpool.Pool, queue string) (Pause, error) {
	p := Pause{Queue: queue}
	var (
		xid  string    // the pausing transaction's
		seen time.Time // the clock once the pause was seen committed
		last error
	)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if xid == "" {
			var until *time.Time
			last = pool.QueryRow(ctx, `SELECT paused_at, until, xmin::text, clock_timestamp() FROM queue_pauses WHERE queue = $1`, queue).
				Scan(&p.At, &until, &xid, &seen)
			if errors.Is(last, pgx.ErrNoRows) {
				return p, fmt.Errorf("checker: the queue %s was never paused", queue)
			}
			p.Until = orZero(until)
		}
		if last == nil {
			var older int
			last = pool.QueryRow(ctx, `
				SELECT count(*) FROM pg_stat_activity AS a
				WHERE a.datname = current_database() AND a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
				  AND a.backend_xmin IS NOT NULL AND age(a.backend_xmin) >= age($1::xid)
				  AND a.xact_start < $2`, xid, seen).Scan(&older)
			// The clock is read after the sessions were: by then none of
			// them held such a snapshot.
			if last == nil && older == 0 {
				if last = pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&p.From); last == nil {
					return p, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			p.From = time.Time{}
			err := ctx.Err()
			if last != nil {
				err = fmt.Errorf("%w (last: %w)", err, last)
			}
			return p, fmt.Errorf("checker: the pause of %s not seen binding every claim: %w", queue, err)
		case <-tick.C:
		}
	}
}

// PauseEnded returns p with its Until as the queue_pauses row holds it
// once the pause has ended (resumed, or its until passed): a resume sets
// it to its own now(). A p whose At was never read takes the row's. It
// fails when the row is another pause's, or has not ended.
func PauseEnded(ctx context.Context, pool *pgxpool.Pool, p Pause) (Pause, error) {
	var (
		at    time.Time
		until *time.Time
		ended bool
	)
	err := pool.QueryRow(ctx, `SELECT paused_at, until, coalesce(until <= clock_timestamp(), false) FROM queue_pauses WHERE queue = $1`, p.Queue).
		Scan(&at, &until, &ended)
	switch {
	case err != nil:
		return p, fmt.Errorf("checker: read the end of %s: %w", p, err)
	case p.At.IsZero():
		p.At = at
	case !at.Equal(p.At):
		return p, fmt.Errorf("checker: %s was overwritten by a pause at %s", p, ts(at))
	}
	if until == nil || !ended {
		return p, fmt.Errorf("checker: %s has not ended", p)
	}
	p.Until = *until
	return p, nil
}

// line is the report's line of a key with a rate.
func (r RateKey) line() string {
	busiest := ""
	if r.MostInWindow > 0 {
		busiest = ", from " + ts(r.BusiestAt)
	}
	return fmt.Sprintf("rate of %s (%v): %d start(s) of %d task(s), at most %d in a window of %v%s",
		r.Key, r.Rate, r.Starts, r.Tasks, r.MostInWindow, r.Rate.Period, busiest)
}

// line is the report's line of a paused queue.
func (q PausedQueue) line() string {
	return fmt.Sprintf("pauses of %s: %d, %d judged (binding every claim for %v in all); %d start(s) of %d task(s): "+
		"%d outside every pause, %d by claims under way at a pause's commit, %d within pauses not judged; "+
		"%d task(s) created during a pause first started after it",
		q.Queue, q.Pauses, q.Judged, q.Paused.Round(time.Millisecond), q.Starts, q.Tasks, q.Outside, q.InFlight, q.NotJudged, q.HeldBack)
}
