package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schema"
)

// Defaults of the keys scenario: the size of each drain, the rounds, the one Client's
// workers (river's library drain), and the keys the keyed drains spread their tasks over.
const (
	DefaultKeysTasks   = 20000
	DefaultKeysRounds  = 3
	DefaultKeysWorkers = 100
	DefaultKeysCount   = 100
	DefaultKeysLimit   = 5
)

// The rate of every key of the rated drain: the most starts a rate allows, in its shortest
// period. A drain starts a key's tasks far less often (20,000 tasks on 100 keys at a few
// thousand a second is some tens a second per key), so the rate never binds, and the rated
// drain differs from the keyed one only in that its claims keep the rate: read each key's
// recent starts, count those within the period, and write the new ones. The scenario
// reports the most starts of one key in any period, which shows whether it bound.
const (
	keysRateStarts = lease.MaxSlots
	keysRatePeriod = time.Second
)

// keysArm is one side of the keys scenario: its drains, one a round.
type keysArm struct {
	name  string
	opts  func(i int) *leasehold.InsertOpts // nil: no keys
	check func(ctx context.Context, d *freshDB) error
	// prepare, when not nil, readies the drained database before its first task is
	// inserted (see claimTracer.prepare).
	prepare func(ctx context.Context, url string) error
	runs    []drained
}

// runKeys measures what keys of k slots cost a drain, and what a rate on them costs. In
// each of KeysRounds rounds it drains KeysTasks no-op tasks through the library three
// times, each time on a fresh database and metered as river's library drain is (one
// Client of KeysWorkers workers, InsertMany in batches of 1000, first claim to last
// completion by the database clock): with task i on the key key-<i mod KeysCount> of
// KeysLimit slots; the same, each key also given a rate that never binds (keysRateStarts
// per keysRatePeriod); and without keys. The three take turns going first, so that none
// always meets the machine as another left it.
// Beside each side's rate (the median of its rounds, each round's in the note) and the
// ratios of the rates in the same round, what explains a difference: PostgreSQL's CPU
// time, its sessions busy at once, the tasks each claim statement carried and its time,
// the WAL and the writing transactions, per task; and what the rate adds per claim
// statement and per task, the rated drain's figures less the keyed drain's of the same
// round. This process's own CPU time is left out: in a drain this slow most of it is the
// meter's sampling, which grows with the drain's length.
//
// Each keyed drain is checked against its database before it is dropped (checkKeys, and
// checkRate for the rated one): a figure from a drain that broke a limit or a rate would
// measure the wrong thing.
func runKeys(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	keys := make([]*leasehold.InsertOpts, c.KeysCount)
	names := make([]string, c.KeysCount)
	for i := range keys {
		names[i] = fmt.Sprintf("key-%d", i)
		keys[i] = &leasehold.InsertOpts{Lock: names[i], LockLimit: c.KeysLimit}
	}
	onKey := func(i int) *leasehold.InsertOpts { return keys[i%len(keys)] }
	peak, ratedPeak, ratedStarts := 0, 0, 0
	keyed := &keysArm{
		name: fmt.Sprintf("%d keys of %d", c.KeysCount, c.KeysLimit),
		opts: onKey,
		check: func(ctx context.Context, d *freshDB) error {
			p, err := checkKeys(ctx, d, c.KeysTasks, c.KeysLimit)
			peak = max(peak, p)
			return err
		},
	}
	rated := &keysArm{
		name: fmt.Sprintf("%s with a rate of %d/%s", keyed.name, keysRateStarts, keysRatePeriod),
		opts: onKey,
		check: func(ctx context.Context, d *freshDB) error {
			p, err := checkKeys(ctx, d, c.KeysTasks, c.KeysLimit)
			ratedPeak = max(ratedPeak, p)
			if err != nil {
				return err
			}
			s, err := checkRate(ctx, d, keysRateStarts, keysRatePeriod)
			ratedStarts = max(ratedStarts, s)
			return err
		},
		prepare: func(ctx context.Context, url string) error {
			return setRates(ctx, url, names, c.KeysLimit, keysRateStarts, keysRatePeriod)
		},
	}
	plain := &keysArm{name: "no keys"}
	arms := []*keysArm{keyed, rated, plain}
	for round := range c.KeysRounds {
		for j := range arms {
			a := arms[(round+j)%len(arms)]
			fmt.Fprintf(c.Log, "keys: round %d of %d: %d tasks, %s\n", round+1, c.KeysRounds, c.KeysTasks, a.name)
			claims := &claimTracer{prepare: a.prepare}
			d, err := drainLibraryOf(ctx, c, c.KeysTasks, libraryDrain{workers: c.KeysWorkers, opts: a.opts, check: claims.checked(a.check), claims: claims})
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
	order := make([]string, len(arms))
	for i, a := range arms {
		order[i] = a.name
	}
	turns := fmt.Sprintf("the drains of a round take turns going first: in round 1 %s; in each round after, the first of the round before goes last", strings.Join(order, ", then "))
	for _, pair := range [][2]*keysArm{{keyed, plain}, {rated, keyed}, {rated, plain}} {
		a, b := pair[0], pair[1]
		ratios := make([]float64, c.KeysRounds)
		for i := range ratios {
			ratios[i] = a.runs[i].rate() / b.runs[i].rate()
		}
		out = append(out, r(fmt.Sprintf("%s ÷ %s, %s", a.name, b.name, medianOf(len(ratios))), median(ratios), "×",
			fmt.Sprintf("rounds: %s; %s", listed(ratios, "%.2f"), turns)))
	}
	for _, a := range arms {
		out = append(out, a.costs()...)
	}
	out = append(out, rateCosts(rated, keyed)...)
	rateNote := fmt.Sprintf("over every round, by the tasks' started_at; below the rate's %d, so it never bound", keysRateStarts)
	if ratedStarts >= keysRateStarts {
		rateNote = fmt.Sprintf("over every round, by the tasks' started_at; the rate's %d was reached, so it may have bound, and the rated drain's figures then count waits for it", keysRateStarts)
	}
	return append(out,
		r(keyed.name+": most tasks of one key running at once", float64(peak), "tasks",
			fmt.Sprintf("over every round, from the tasks' started_at and processed_at; the limit is %d", c.KeysLimit)),
		r(rated.name+": most tasks of one key running at once", float64(ratedPeak), "tasks",
			fmt.Sprintf("over every round, from the tasks' started_at and processed_at; the limit is %d", c.KeysLimit)),
		r(fmt.Sprintf("%s: most starts of one key in any %s", rated.name, keysRatePeriod), float64(ratedStarts), "starts", rateNote)), nil
}

// rateCosts are what keeping a rate cost rated's drains beside keyed's, round by round:
// PostgreSQL's CPU per claim statement and per task, and a claim statement's mean time,
// each the rated drain's less the keyed drain's of the same round (the median of the
// rounds, each round's in the note). The two drains differ only in the rate, which the
// claims alone read and write; a difference smaller than the rounds' spread is noise.
func rateCosts(rated, keyed *keysArm) []Result {
	r := func(what string, v float64, unit, note string) Result {
		return Result{Scenario: "keys", Case: fmt.Sprintf("%s, less without the rate: %s", rated.name, what), Value: v, Unit: unit, Note: note}
	}
	statements := func(d drained) float64 { return float64(max(d.claims.claims+d.claims.handIns, 1)) }
	less := func(f func(drained) float64) (diffs, with, without []float64) {
		for i := range rated.runs {
			with, without = append(with, f(rated.runs[i])), append(without, f(keyed.runs[i]))
			diffs = append(diffs, with[i]-without[i])
		}
		return diffs, with, without
	}
	var out []Result
	measured := true
	for _, d := range append(slices.Clone(rated.runs), keyed.runs...) {
		measured = measured && d.w.cpu > 0
	}
	if measured {
		perClaim := func(d drained) float64 { return d.w.cpu.Seconds() * 1e6 / statements(d) }
		diffs, with, without := less(perClaim)
		out = append(out, r("PostgreSQL CPU per claim statement", median(diffs), "µs",
			fmt.Sprintf("rounds: %s µs (with the rate %s, without %s µs): all the drain's PostgreSQL CPU over its claim statements, the rate being read and written by claims alone",
				listed(diffs, "%+.0f"), listed(with, "%.0f"), listed(without, "%.0f"))))
		diffs, _, _ = less(func(d drained) float64 { return d.w.cpu.Seconds() * 1e6 / float64(d.tasks) })
		out = append(out, r("PostgreSQL CPU per task", median(diffs), "µs", fmt.Sprintf("rounds: %s µs", listed(diffs, "%+.0f"))))
	} else {
		out = append(out, r("PostgreSQL CPU per claim statement", 0, "", "not measured: "+cmpOr(rated.runs[0].w.notLocal, "no CPU time counted in a round")),
			r("PostgreSQL CPU per task", 0, "", "not measured: "+cmpOr(rated.runs[0].w.notLocal, "no CPU time counted in a round")))
	}
	diffs, with, without := less(func(d drained) float64 { return ms(d.claims.took) / statements(d) })
	return append(out, r("a claim statement's mean time", median(diffs), "ms",
		fmt.Sprintf("rounds: %s ms (with the rate %s, without %s ms); from its send to its last row, as this process saw it",
			listed(diffs, "%+.2f"), listed(with, "%.2f"), listed(without, "%.2f"))))
}

// setRates gives each of keys, in the database at url, limit slots and a rate of starts
// per period, on a connection of its own, as a user would before inserting its tasks
// (whose LockLimit then leaves the limit as it is).
func setRates(ctx context.Context, url string, keys []string, limit, starts int, period time.Duration) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("set the keys' rates: %w", err)
	}
	cfg.MaxConns = 1
	cfg.AfterConnect = schema.PrepareSession
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("set the keys' rates: %w", err)
	}
	defer pool.Close()
	store := leasestore.NewStore(pool)
	for _, key := range keys {
		if _, err := store.SetLimit(ctx, key, limit); err != nil {
			return err
		}
		l, err := store.SetRate(ctx, key, starts, period)
		if err != nil {
			return err
		}
		if l.Slots != limit || l.RateStarts != starts || l.RatePeriod != period {
			return fmt.Errorf("after setting its limit and rate %s has %d slots and a rate of %d per %s; want %d slots and %d per %s",
				key, l.Slots, l.RateStarts, l.RatePeriod, limit, starts, period)
		}
	}
	return nil
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

// checkRate checks a drain on keys of a rate of starts per period against its database
// (after checkKeys, which found each task started once), and returns the most starts of
// one key in any period:
//   - every key of the drain had that rate;
//   - no key had more than starts tasks start in any period, by their started_at (the
//     moment the claim took the task's slot, which the rate counts): each window
//     [started_at, started_at + period) of a key's tasks holds at most starts.
func checkRate(ctx context.Context, d *freshDB, starts int, period time.Duration) (int, error) {
	var unrated int
	err := d.Pool.QueryRow(ctx, `SELECT count(DISTINCT t.lock_resource) FROM tasks AS t
		LEFT JOIN lease_limits AS ll ON ll.resource = t.lock_resource
		WHERE ll.rate_starts IS DISTINCT FROM $1 OR ll.rate_period IS DISTINCT FROM make_interval(secs => $2)`,
		starts, period.Seconds()).Scan(&unrated)
	switch {
	case err != nil:
		return 0, fmt.Errorf("read the rated drain's keys: %w", err)
	case unrated != 0:
		return 0, fmt.Errorf("after the rated drain %d of its keys have no rate of %d per %s; want every key with it", unrated, starts, period)
	}
	// A window closed at started_at + period less 1 µs, the clock's grain, is the
	// half-open one.
	var key string
	var from time.Time
	var most int
	err = d.Pool.QueryRow(ctx, `
		SELECT key, at, n FROM (
			SELECT lock_resource AS key, started_at AS at,
			       count(*) OVER (PARTITION BY lock_resource ORDER BY started_at
			                      RANGE BETWEEN CURRENT ROW AND make_interval(secs => $1) - interval '1 microsecond' FOLLOWING)::int AS n
			FROM tasks) AS w
		ORDER BY n DESC, at LIMIT 1`, period.Seconds()).Scan(&key, &from, &most)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("count the rated drain's starts in each period: %w", err)
	case most > starts:
		return most, fmt.Errorf("%d tasks of one key (%s) started in the %s from %s, by their started_at; its rate allows %d",
			most, key, period, from.UTC().Format(time.RFC3339Nano), starts)
	}
	return most, nil
}

// claimTracer counts the claim statements sent on a pool it traces (TaskClaim, and
// TaskCompleteAndClaim, the completions that claim too) and the time they took: how many
// round trips a drain made for its tasks, and what each cost. sqlc names each statement
// in its first line. Being the drain's one tracer, it also readies the drain's database
// for an arm that needs it (prepare).
type claimTracer struct {
	// prepare, when not nil, runs once, with the URL of the traced pool's database,
	// before the pool's first LimitSeed is sent: the statement with which InsertMany
	// gives the keys of its tasks their limits, ahead of the tasks. So it runs before
	// the drain's first task is inserted and outside its meter, where drainLibraryOf
	// has no step of its own. Its error, or its not having run, is the drain's
	// (checked).
	prepare func(ctx context.Context, url string) error
	once    sync.Once

	mu       sync.Mutex
	n        claimCount
	prepared bool
	failed   error
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

// TraceQueryStart marks a claim statement's start, and runs t.prepare before the first
// LimitSeed.
func (t *claimTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.HasPrefix(data.SQL, "-- name: TaskClaim :"):
		return context.WithValue(ctx, claimStartKey{}, claimStart{at: time.Now()})
	case strings.HasPrefix(data.SQL, "-- name: TaskCompleteAndClaim :"):
		return context.WithValue(ctx, claimStartKey{}, claimStart{handIn: true, at: time.Now()})
	case t.prepare != nil && strings.HasPrefix(data.SQL, "-- name: LimitSeed :"):
		t.once.Do(func() {
			err := t.prepare(ctx, conn.Config().ConnString())
			t.mu.Lock()
			defer t.mu.Unlock()
			t.prepared, t.failed = true, err
		})
	}
	return ctx
}

// checked is check (when not nil) once t.prepare, if t has one, ran without an error:
// what a drain traced by t checks of its database.
func (t *claimTracer) checked(check func(ctx context.Context, d *freshDB) error) func(ctx context.Context, d *freshDB) error {
	return func(ctx context.Context, d *freshDB) error {
		t.mu.Lock()
		prepared, err := t.prepared, t.failed
		t.mu.Unlock()
		switch {
		case t.prepare != nil && !prepared:
			return errors.New("the drain's keys were never prepared: no LimitSeed statement came before its tasks were inserted (did InsertMany stop seeding the limits of its tasks' keys in a statement of its own?)")
		case err != nil:
			return fmt.Errorf("before the drain's first task was inserted: %w", err)
		case check == nil:
			return nil
		}
		return check(ctx, d)
	}
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
