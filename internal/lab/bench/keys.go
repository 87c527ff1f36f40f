package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold"
)

// Defaults of the keys scenario: the size of each drain, the rounds, the one Client's
// workers (river's library drain), and the keys the keyed drain spreads its tasks over.
const (
	DefaultKeysTasks   = 20000
	DefaultKeysRounds  = 3
	DefaultKeysWorkers = 100
	DefaultKeysCount   = 100
	DefaultKeysLimit   = 5
)

// keysArm is one side of the keys scenario: its drains, one a round.
type keysArm struct {
	name  string
	opts  func(i int) *leasehold.InsertOpts // nil: no keys
	check func(ctx context.Context, d *freshDB) error
	runs  []drained
}

// runKeys measures what keys of k slots cost a drain. In each of KeysRounds rounds it
// drains KeysTasks no-op tasks through the library twice, each time on a fresh database
// and metered as river's library drain is (one Client of KeysWorkers workers, InsertMany
// in batches of 1000, first claim to last completion by the database clock): once with
// task i on the key key-<i mod KeysCount> of KeysLimit slots, once without keys. The two
// take turns going first, so that neither always meets the machine as the other left it.
// Beside each side's rate (the median of its rounds, each round's in the note) and the
// ratio of the two, what explains a difference: PostgreSQL's CPU time, its sessions busy
// at once, the tasks each claim statement carried and its time, the WAL and the writing
// transactions, per task. This process's own CPU time is left out: in a drain this slow
// most of it is the meter's sampling, which grows with the drain's length.
//
// Each keyed drain is checked against its database before it is dropped (checkKeys): a
// figure from a drain that broke a limit would measure the wrong thing.
func runKeys(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	keys := make([]*leasehold.InsertOpts, c.KeysCount)
	for i := range keys {
		keys[i] = &leasehold.InsertOpts{Lock: fmt.Sprintf("key-%d", i), LockLimit: c.KeysLimit}
	}
	peak := 0
	keyed := &keysArm{
		name: fmt.Sprintf("%d keys of %d", c.KeysCount, c.KeysLimit),
		opts: func(i int) *leasehold.InsertOpts { return keys[i%len(keys)] },
		check: func(ctx context.Context, d *freshDB) error {
			p, err := checkKeys(ctx, d, c.KeysTasks, c.KeysLimit)
			peak = max(peak, p)
			return err
		},
	}
	plain := &keysArm{name: "no keys"}
	arms := []*keysArm{keyed, plain}
	for round := range c.KeysRounds {
		for j := range arms {
			a := arms[(round+j)%len(arms)]
			fmt.Fprintf(c.Log, "keys: round %d of %d: %d tasks, %s\n", round+1, c.KeysRounds, c.KeysTasks, a.name)
			d, err := drainLibraryOf(ctx, c, c.KeysTasks, libraryDrain{workers: c.KeysWorkers, opts: a.opts, check: a.check, claims: &claimTracer{}})
			if err != nil {
				return nil, fmt.Errorf("round %d, the drain with %s: %w", round+1, a.name, err)
			}
			a.runs = append(a.runs, d)
		}
	}

	setup := fmt.Sprintf("%d tasks, one Client of %d workers", c.KeysTasks, c.KeysWorkers)
	r := func(what string, v float64, unit, note string) Result {
		return Result{Scenario: "keys", Case: what, Value: v, Unit: unit, Note: note}
	}
	var out []Result
	for _, a := range arms {
		rates := each(a.runs, drained.rate)
		out = append(out, r(fmt.Sprintf("%s, %s: drain, %s", a.name, setup, medianOf(len(rates))), median(rates), "tasks/s",
			fmt.Sprintf("rounds: %s tasks/s; first claim to last completion by the database clock", listed(rates, "%.0f"))))
	}
	ratios := make([]float64, c.KeysRounds)
	for i := range ratios {
		ratios[i] = keyed.runs[i].rate() / plain.runs[i].rate()
	}
	out = append(out, r(fmt.Sprintf("%s ÷ %s, %s", keyed.name, plain.name, medianOf(len(ratios))), median(ratios), "×",
		fmt.Sprintf("rounds: %s; the two drains of a round in turn first, %s in odd rounds", listed(ratios, "%.2f"), keyed.name)))
	for _, a := range arms {
		out = append(out, a.costs()...)
	}
	return append(out, r(keyed.name+": most tasks of one key running at once", float64(peak), "tasks",
		fmt.Sprintf("over every round, from the tasks' started_at and processed_at; the limit is %d", c.KeysLimit))), nil
}

// costs are what a's drains cost per task, over all its rounds, with each round's figure.
func (a *keysArm) costs() []Result {
	tasks := 0
	var cpu time.Duration
	var wal float64
	var xacts, ckpts int64
	var samples, busy int // the meter's samples, and those in which another database was busy
	measured := true
	for _, d := range a.runs {
		tasks += d.tasks
		cpu, wal, xacts, ckpts = cpu+d.w.cpu, wal+d.w.wal, xacts+d.w.xacts, ckpts+d.w.ckpts
		samples, busy = samples+d.w.n, busy+d.w.otherActive
		measured = measured && d.w.cpu > 0
	}
	// The WAL and the transaction ids are the server's: what else it does is counted too.
	shared := fmt.Sprintf("; server-wide: other databases' sessions were active in %d of %d samples", busy, samples)
	if ckpts > 0 {
		shared += fmt.Sprintf(", %d checkpoint(s) began (their full-page images are counted)", ckpts)
	}
	per := float64(max(tasks, 1))
	perTask := func(f func(drained) float64) []float64 {
		return each(a.runs, func(d drained) float64 { return f(d) / float64(d.tasks) })
	}
	r := func(what string, v float64, unit, note string) Result {
		return Result{Scenario: "keys", Case: a.name + ": " + what, Value: v, Unit: unit, Note: note}
	}
	var out []Result
	if measured {
		out = append(out, r("PostgreSQL CPU per task", cpu.Seconds()*1e6/per, "µs",
			fmt.Sprintf("rounds: %s µs; the database's sessions and PostgreSQL's shared processes", listed(perTask(func(d drained) float64 { return d.w.cpu.Seconds() * 1e6 }), "%.0f"))))
	} else {
		out = append(out, r("PostgreSQL CPU per task", 0, "", "not measured: "+cmpOr(a.runs[0].w.notLocal, "no CPU time counted in a round")))
	}
	active := each(a.runs, func(d drained) float64 { return float64(d.w.sum) / float64(max(d.w.n, 1)) })
	out = append(out, r("PostgreSQL sessions active at once, mean", median(active), "sessions",
		fmt.Sprintf("rounds: %s; the drain's sessions not idle in pg_stat_activity, sampled every %s: how many statements the database worked on together", listed(active, "%.1f"), sampleEvery)))
	var claims claimCount
	for _, d := range a.runs {
		claims = claims.plus(d.claims)
	}
	statements := claims.claims + claims.handIns
	out = append(out,
		r("tasks per claim statement", per/float64(max(statements, 1)), "tasks",
			fmt.Sprintf("rounds: %s; %d statements in all: %d claims (%d of which found nothing) and %d completions that claimed too", listed(each(a.runs, func(d drained) float64 {
				return float64(d.tasks) / float64(max(d.claims.claims+d.claims.handIns, 1))
			}), "%.1f"), statements, claims.claims, claims.empty, claims.handIns)),
		r("a claim statement's mean time", ms(claims.took)/float64(max(statements, 1)), "ms",
			fmt.Sprintf("rounds: %s ms; from its send to its last row, as this process saw it", listed(each(a.runs, func(d drained) float64 {
				return ms(d.claims.took) / float64(max(d.claims.claims+d.claims.handIns, 1))
			}), "%.2f"))))
	return append(out,
		r("WAL per task", wal/per, "B", fmt.Sprintf("rounds: %s B%s", listed(perTask(func(d drained) float64 { return d.w.wal }), "%.0f"), shared)),
		r("transactions that wrote, per task", float64(xacts)/per, "xacts",
			fmt.Sprintf("rounds: %s; a claim or a completion of a batch is one%s", listed(perTask(func(d drained) float64 { return float64(d.w.xacts) }), "%.3f"), shared)))
}

// checkKeys checks a keyed drain of n tasks on keys of limit slots against its database,
// and returns the most tasks of one key that ran at once:
//   - every task is done, in one attempt (so that its started_at and processed_at are its
//     only run);
//   - no key had more than limit tasks running at once, by those times: a task runs from
//     its claim (started_at, its slot's grant) to its completion (processed_at, the start
//     of the transaction that releases the slot);
//   - every task's attempt was a holding of a slot of its key, the slot's acquisition under
//     the task's fence in the lease history, and no slot was acquired while it was held.
func checkKeys(ctx context.Context, d *freshDB, n, limit int) (int, error) {
	var done, retried, unkeyed int
	err := d.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE attempts <> 1),
		count(*) FILTER (WHERE lock_resource IS NULL) FROM tasks`).Scan(&done, &retried, &unkeyed)
	switch {
	case err != nil:
		return 0, fmt.Errorf("read the keyed drain's tasks: %w", err)
	case done != n || retried != 0 || unkeyed != 0:
		return 0, fmt.Errorf("after the keyed drain %d of %d tasks are done, %d took more than one attempt and %d have no key; want all done at the first attempt, each on a key",
			done, n, retried, unkeyed)
	}
	// At equal times a completion counts before a start.
	var peak int
	err = d.Pool.QueryRow(ctx, `
		WITH edge AS (
			SELECT lock_resource AS key, started_at AS at, 1 AS step FROM tasks
			UNION ALL
			SELECT lock_resource, processed_at, -1 FROM tasks
		)
		SELECT coalesce(max(running), 0)::int FROM (
			SELECT sum(step) OVER (PARTITION BY key ORDER BY at, step ROWS UNBOUNDED PRECEDING) AS running FROM edge
		) AS r`).Scan(&peak)
	if err != nil {
		return 0, fmt.Errorf("count the keyed drain's tasks running at once: %w", err)
	}
	if peak > limit {
		var key string
		_ = d.Pool.QueryRow(ctx, `SELECT a.lock_resource FROM tasks AS a JOIN tasks AS b
			ON b.lock_resource = a.lock_resource AND b.started_at <= a.started_at AND b.processed_at > a.started_at
			GROUP BY a.id, a.lock_resource ORDER BY count(*) DESC LIMIT 1`).Scan(&key)
		return peak, fmt.Errorf("%d tasks of one key (%s) ran at once, by their started_at and processed_at; the limit is %d", peak, key, limit)
	}
	var outside, overlapping int
	err = d.Pool.QueryRow(ctx, `
		SELECT
			(SELECT count(*) FROM tasks AS t
			 WHERE NOT EXISTS (SELECT 1 FROM lease_events AS e
			                   WHERE e.resource = ANY (lease_slot_names(t.lock_resource, $1)) AND e.fence = t.fence AND e.kind = 'acquired')),
			(SELECT count(*) FROM (
				SELECT e.kind, lag(e.kind) OVER (PARTITION BY e.resource ORDER BY e.id) AS before
				FROM lease_events AS e WHERE e.resource LIKE 'key-%#%') AS h
			 WHERE h.kind = 'acquired' AND h.before NOT IN ('released', 'expired'))`, limit).Scan(&outside, &overlapping)
	switch {
	case err != nil:
		return peak, fmt.Errorf("read the keyed drain's lease history: %w", err)
	case outside != 0 || overlapping != 0:
		return peak, fmt.Errorf("in the lease history %d tasks ran on no acquisition of a slot of their key (#1 to #%d) under their fence, and %d slots were acquired while held; want 0 and 0",
			outside, limit, overlapping)
	}
	return peak, nil
}

// claimTracer counts the claim statements sent on a pool it traces (TaskClaim, and
// TaskCompleteAndClaim, the completions that claim too) and the time they took: how many
// round trips a drain made for its tasks, and what each cost. sqlc names each statement
// in its first line.
type claimTracer struct {
	mu sync.Mutex
	n  claimCount
}

// claimCount is what a claimTracer counted.
type claimCount struct {
	claims  int           // TaskClaim statements
	empty   int           // of which claimed nothing
	handIns int           // TaskCompleteAndClaim statements
	took    time.Duration // all of them, from send to last row
}

func (a claimCount) plus(b claimCount) claimCount {
	return claimCount{a.claims + b.claims, a.empty + b.empty, a.handIns + b.handIns, a.took + b.took}
}

// claimStart is a claim statement under way, in its context.
type claimStart struct {
	handIn bool
	at     time.Time
}

type claimStartKey struct{}

// TraceQueryStart marks a claim statement's start.
func (t *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.HasPrefix(data.SQL, "-- name: TaskClaim :"):
		return context.WithValue(ctx, claimStartKey{}, claimStart{at: time.Now()})
	case strings.HasPrefix(data.SQL, "-- name: TaskCompleteAndClaim :"):
		return context.WithValue(ctx, claimStartKey{}, claimStart{handIn: true, at: time.Now()})
	}
	return ctx
}

// TraceQueryEnd counts a claim statement once its rows are read.
func (t *claimTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	s, ok := ctx.Value(claimStartKey{}).(claimStart)
	if !ok {
		return
	}
	took := time.Since(s.at)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n.took += took
	if s.handIn {
		t.n.handIns++
		return
	}
	t.n.claims++
	if data.Err == nil && data.CommandTag.RowsAffected() == 0 {
		t.n.empty++
	}
}

// count is what t has counted so far.
func (t *claimTracer) count() claimCount {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// each is f of every drain of ds.
func each(ds []drained, f func(drained) float64) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = f(d)
	}
	return out
}

// median is the middle of xs (the mean of the two middle ones of an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianOf says what a median of n rounds is.
func medianOf(n int) string {
	if n == 1 {
		return "1 round"
	}
	return fmt.Sprintf("median of %d rounds", n)
}

// listed is xs, each in format, separated by commas.
func listed(xs []float64, format string) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(out, ", ")
}
