package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// DefaultPartsTasks and DefaultPartsRounds are claim-parts' tasks per drain and rounds
// when Config.PartsTasks and Config.PartsRounds are zero.
const (
	DefaultPartsTasks  = 30000
	DefaultPartsRounds = 3
)

// DefaultPartsLoops and DefaultPartsBatch are claim-parts' claimers and the tasks each of
// their statements claims when Config.PartsLoops and Config.PartsBatch are zero: each
// claimer a loop of statements that hand in the tasks its previous statement claimed and
// claim the next batch, as a busy Client's completer does (taskstore.Store.CompleteAndClaim),
// with nothing between a claim and a completion; two of fifty, as a Client of 100 workers
// keeps in flight.
const (
	DefaultPartsLoops = 2
	DefaultPartsBatch = 50
)

const partsTTL = 30 * time.Second

// partsHint is where the highest claimed task stands in its branch: each pick reads the
// pending index from after it, as leasehold's claims do with their hints, so that no
// variant walks the entries of the tasks claimed before it (which stay in the index
// until VACUUM).
type partsHint struct {
	mu sync.Mutex
	h  taskstore.Hint
}

func (p *partsHint) get() taskstore.Hint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.h
}

func (p *partsHint) claimed(h taskstore.Hint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.Priority > p.h.Priority || (h.Priority == p.h.Priority && h.After(p.h)) {
		p.h = h
	}
}

// partsTask is a claimed task as a loop keeps it until its completion.
type partsTask struct {
	id, fence int64
	processor string
}

// partsVariant is one way to claim and complete: round hands in done and claims for
// processors.
type partsVariant struct {
	name       string
	what       string
	noTriggers bool
	round      func(ctx context.Context, d *freshDB, s *taskstore.Store, done []partsTask, processors []string, hint *partsHint) ([]partsTask, error)
}

// The SQL variants' common pick: the due pending tasks of one branch, from after the hint,
// in leasehold's claim order, on the index leasehold's claims read (tasks_claim_idx).
const partsPick = `
pick AS (
    SELECT p.id, p.priority, p.scheduled_at, row_number() OVER (ORDER BY p.priority, p.scheduled_at, p.id) AS n
    FROM (SELECT x.id, x.priority, x.scheduled_at FROM tasks AS x
          WHERE x.state = 'pending' AND x.lock_resource IS NULL AND x.queue = 'default' AND x.kind = 'sleep'
            AND x.scheduled_at <= now()
            AND (x.priority, x.scheduled_at, x.id) > ($2::smallint, $3::timestamptz, $4::bigint)
          ORDER BY x.priority, x.scheduled_at, x.id
          LIMIT cardinality($5::text[])
          FOR UPDATE SKIP LOCKED) AS p
)`

// partsBare is a claim with no lease: the state alone, as an unfenced queue's.
const partsBare = `
WITH done AS (
    UPDATE tasks AS c SET state = 'done', processed_at = now()
    WHERE c.id = ANY ($1::bigint[]) AND c.state = 'running'
),` + partsPick + `
UPDATE tasks AS t SET state = 'running', started_at = now()
FROM pick
WHERE t.id = pick.id
RETURNING t.id, t.priority, t.scheduled_at, 0::bigint, ''::text`

// partsLeased is partsBare with a lease but no fence: a processor, a counted attempt and
// a deadline, and a completion only under that lease (processor and deadline compared).
// With fence, the lease has a fence too: drawn from the one sequence, compared by the completion.
func partsLeased(fence bool) string {
	setFence, checkFence := "", ""
	if fence {
		setFence, checkFence = "fence = nextval('lease_fence_seq'), ", " AND c.fence = input.fence"
	}
	return `
WITH input AS (
    SELECT unnest($1::bigint[]) AS id, unnest($6::text[]) AS processor, unnest($7::bigint[]) AS fence
),
done AS (
    UPDATE tasks AS c SET state = 'done', processed_at = now(), task_output = NULL, last_error = NULL
    FROM input
    WHERE c.id = input.id AND c.state = 'running' AND c.processor = input.processor` + checkFence + `
      AND c.must_heartbeat_before > now()
),` + partsPick + `,
assigned AS (
    SELECT pick.id, w.processor FROM pick JOIN unnest($5::text[]) WITH ORDINALITY AS w (processor, n) ON w.n = pick.n
)
UPDATE tasks AS t
SET state = 'running', processor = a.processor, ` + setFence + `
    ttl_seconds = coalesce(t.ttl_seconds, $8::integer), attempts = t.attempts + 1,
    started_at = now(), last_heartbeat_at = now(),
    must_heartbeat_before = now() + make_interval(secs => coalesce(t.ttl_seconds, $8::integer))
FROM assigned AS a
WHERE t.id = a.id
RETURNING t.id, t.priority, t.scheduled_at, coalesce(t.fence, 0), t.processor`
}

// sqlRound runs one of the SQL variants.
func sqlRound(query string, leased bool) func(context.Context, *freshDB, *taskstore.Store, []partsTask, []string, *partsHint) ([]partsTask, error) {
	return func(ctx context.Context, d *freshDB, _ *taskstore.Store, done []partsTask, processors []string, hint *partsHint) ([]partsTask, error) {
		ids := make([]int64, len(done))
		procs := make([]string, len(done))
		fences := make([]int64, len(done))
		for i, t := range done {
			ids[i], procs[i], fences[i] = t.id, t.processor, t.fence
		}
		h := hint.get()
		args := []any{ids, h.Priority, h.ScheduledAt, h.ID, processors}
		if leased {
			args = append(args, procs, fences, int32(partsTTL/time.Second))
		}
		rows, err := d.Pool.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []partsTask
		for rows.Next() {
			var t partsTask
			h := taskstore.Hint{Queue: task.DefaultQueue, Kind: taskstore.DefaultKind}
			if err := rows.Scan(&t.id, &h.Priority, &h.ScheduledAt, &t.fence, &t.processor); err != nil {
				return nil, err
			}
			h.ID = t.id
			hint.claimed(h)
			out = append(out, t)
		}
		return out, rows.Err()
	}
}

// leaseholdRound is leasehold's own statement, as a busy Client's dispatcher runs it.
func leaseholdRound(ctx context.Context, _ *freshDB, s *taskstore.Store, done []partsTask, processors []string, hint *partsHint) ([]partsTask, error) {
	cs := make([]taskstore.Completion, len(done))
	for i, t := range done {
		cs[i] = taskstore.Completion{ID: t.id, Processor: t.processor, Fence: t.fence}
	}
	h := hint.get()
	var hints []taskstore.Hint
	if h.ID != 0 {
		hints = []taskstore.Hint{h}
	}
	_, claimed, err := s.CompleteAndClaim(ctx, cs, taskstore.ClaimParams{
		Processors: processors, TTL: partsTTL, Queues: []string{task.DefaultQueue}, Kinds: []string{taskstore.DefaultKind},
		Hints: hints, Known: len(hints) > 0,
	})
	if err != nil {
		return nil, err
	}
	out := make([]partsTask, len(claimed))
	for i, t := range claimed {
		out[i] = partsTask{id: t.ID, fence: t.Fence, processor: t.Processor}
		hint.claimed(taskstore.HintOf(t))
	}
	return out, nil
}

var partsVariants = []partsVariant{
	{name: "no lease, no triggers", noTriggers: true, round: sqlRound(partsBare, false),
		what: "the state alone, the table's triggers off (no counts by state, no notifications)"},
	{name: "no lease", round: sqlRound(partsBare, false),
		what: "the state alone, with the table's triggers (counts by state, notifications)"},
	{name: "lease without a fence", round: sqlRound(partsLeased(false), true),
		what: "the state and a lease: processor, an attempt, a deadline; completions under it (processor and deadline compared)"},
	{name: "fenced lease", round: sqlRound(partsLeased(true), true),
		what: "the lease with a fence from the one sequence, drawn per task under the row lock, and compared by completions"},
	{name: "leasehold's statement", round: leaseholdRound,
		what: "taskstore's CompleteAndClaim, as a busy Client runs it (its pick function, the gated and paused probes, whole tasks returned)"},
}

// runClaimParts prices the parts of leasehold's claim: the same drain of PartsTasks
// zero-work tasks five ways (partsVariants), from the state alone on a table without
// triggers up to leasehold's own statement, each by PartsLoops loops that hand in their
// last batch and claim the next PartsBatch in one statement, with nothing between. No
// worker, no handler, no Go beyond the loops: what the server spends per task on each way,
// and so what each part adds, and the fewest CPU microseconds a claimed and completed task
// costs on this table. PartsRounds rounds, the variants taking turns going first; each
// drain on a fresh database, metered as river's are.
func runClaimParts(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	per := make([][]partsFigures, len(partsVariants))
	for r := range c.PartsRounds {
		for k := range partsVariants {
			i := (k + r) % len(partsVariants)
			v := partsVariants[i]
			fmt.Fprintf(c.Log, "claim-parts: round %d: %s\n", r+1, v.name)
			f, err := partsDrain(ctx, c, v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			per[i] = append(per[i], f)
		}
	}
	var out []Result
	medians := make([]partsFigures, len(partsVariants))
	for i, v := range partsVariants {
		for k, field := range partsFields {
			rounds := make([]float64, len(per[i]))
			for j, f := range per[i] {
				rounds[j] = f[k]
			}
			medians[i][k] = median(rounds)
			note := field.note
			if k == figRate {
				note = v.what + "; median"
			}
			if note != "" {
				note += "; "
			}
			out = append(out, Result{Scenario: "claim-parts", Case: v.name + ": " + field.what, Value: medians[i][k], Unit: field.unit,
				Note: note + "rounds: " + listed(rounds, field.format)})
		}
	}
	// What each part adds, from the medians.
	for i := 1; i < len(partsVariants); i++ {
		a, b := medians[i-1], medians[i]
		out = append(out, Result{
			Scenario: "claim-parts", Case: fmt.Sprintf("what %q adds to %q: PostgreSQL CPU per task", partsVariants[i].name, partsVariants[i-1].name),
			Value: b[figPGCPU] - a[figPGCPU], Unit: "µs",
			Note: fmt.Sprintf("medians %.1f − %.1f; WAL per task %+.0f B; its own CPU per task %+.1f µs",
				b[figPGCPU], a[figPGCPU], b[figWAL]-a[figWAL], b[figApp]-a[figApp]),
		})
	}
	return out, nil
}

// The figures claim-parts reports of each way, each per task but the rate: figure k of a
// drain's partsFigures is described by partsFields[k].
const (
	figRate = iota
	figPGCPU
	figApp
	figWAL
	figStatements
)

var partsFields = [...]struct{ what, unit, format, note string }{
	figRate:       {"drain", "tasks/s", "%.0f", ""}, // its note says what the way is
	figPGCPU:      {"PostgreSQL CPU per task", "µs", "%.1f", ""},
	figApp:        {"the loops' own CPU per task", "µs", "%.1f", "this process: the loops, pgx, and the meter's sampling"},
	figWAL:        {"WAL per task", "B", "%.0f", ""},
	figStatements: {"statements per task", "statements", "%.3f", ""},
}

// partsFigures are one metered drain's figures.
type partsFigures [len(partsFields)]float64

// partsDrain drains PartsTasks fresh tasks one way, metered.
func partsDrain(ctx context.Context, c Config, v partsVariant) (partsFigures, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.PartsLoops+2))
	if err != nil {
		return partsFigures{}, err
	}
	defer d.Close()
	s := taskstore.NewStore(d.Pool)
	if err := insertMany(ctx, s, c.PartsTasks); err != nil {
		return partsFigures{}, err
	}
	if v.noTriggers {
		if _, err := d.Pool.Exec(ctx, `ALTER TABLE tasks DISABLE TRIGGER USER`); err != nil {
			return partsFigures{}, err
		}
	}
	m, err := settledMeter(ctx, d)
	if err != nil {
		return partsFigures{}, err
	}
	defer m.close(ctx)
	before := selfCPU()
	hint := &partsHint{}
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		firstErr   error
		statements int
	)
	for loop := range c.PartsLoops {
		processors := make([]string, c.PartsBatch)
		for i := range processors {
			processors[i] = fmt.Sprintf("parts-%d/w%d", loop, i)
		}
		wg.Go(func() {
			var done []partsTask
			n := 0
			defer func() {
				mu.Lock()
				statements += n
				mu.Unlock()
			}()
			for {
				got, err := v.round(ctx, d, s, done, processors, hint)
				n++
				if err == nil && len(got) == 0 && len(done) == 0 {
					// Nothing after the hint: once more from the start of the
					// branch, for a task a pick passed while another held it.
					got, err = v.round(ctx, d, s, nil, processors, &partsHint{})
					n++
					if err == nil && len(got) == 0 {
						return
					}
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				done = got
			}
		})
	}
	wg.Wait()
	app := selfCPU() - before
	w, err := m.stop(ctx)
	if err != nil {
		return partsFigures{}, err
	}
	if firstErr != nil {
		return partsFigures{}, firstErr
	}
	var finished, all int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM tasks`).Scan(&finished, &all); err != nil {
		return partsFigures{}, err
	}
	if finished != c.PartsTasks || all != c.PartsTasks {
		return partsFigures{}, fmt.Errorf("after the drain %d of %d tasks are done, want all %d", finished, all, c.PartsTasks)
	}
	n := float64(c.PartsTasks)
	return partsFigures{
		figRate: n / w.elapsed.Seconds(), figPGCPU: w.cpu.Seconds() * 1e6 / n, figApp: app.Seconds() * 1e6 / n,
		figWAL: w.wal / n, figStatements: float64(statements) / n,
	}, nil
}
