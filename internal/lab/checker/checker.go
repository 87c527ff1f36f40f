// Package checker verifies leasehold's guarantees (docs/promises.md) after the fact, from what the
// database recorded: the lease history (lease_events) and the tasks, whose rows carry their
// own leases, the locks, queues and schedule ticks of the tasks, and the limits and rates of
// the keys of k slots (lease_limits).
//
// Check reads the history; Verify judges it. Verify is a pure function of a
// History, so every rule can be tested on a hand-made one. Check does not
// build a History: it streams the rows through the same steps as Verify, one
// resource at a time, then one task at a time, and keeps only what the
// cross-resource rules need (the fences, the holding intervals of the
// generator, of the reaper, of the resources that gate tasks and of the
// slots of the keys with a limit, the schedules' ticks, and the starts of
// the tasks of the keys with a rate), so a history
// of millions of events and tasks fits in memory.
//
// A holding interval is one acquisition of a resource, up to its release or
// its expiry. A lease's intervals come from its events: acquired, renewed,
// released, expired. A task's lease lives in the task's row (schema/0009),
// so its intervals come from there: each entry of earlier_attempts is an
// attempt that ended otherwise than by the completion (acquired at
// started_at, expiring at expires_at, released at ended_at when failed or
// requeued, its expiry announced at ended_at when expired), and the lease
// columns (processor, fence, started_at, must_heartbeat_before) hold the
// running attempt, or the completed one of a done task, released at
// processed_at. A pending or dead task's columns repeat its last entry and
// are not counted again. Reports and violations name a task's lease
// task:<id>, as the logs do.
//
// The rules, each with the name its violations carry:
//
//   - RuleOverlap: per resource, no two holding intervals [acquired, end)
//     overlap, where end = min(released, expires_at) and a lease's
//     expires_at is the latest of its acquired and renewed events.
//     The history alone gives every interval, announced or not.
//   - RuleFenceOrder, RuleFenceReused: per resource, fences strictly increase
//     in the order the acquisitions were recorded; across resources no fence
//     is handed out twice.
//   - RuleOrphanEvent: a renewed, released or expired event that does not
//     belong to the interval it follows (another holder or fence, after the
//     release, a renewal after the expiry was announced), or a task attempt
//     of no known outcome.
//   - RuleTaskUnfinished, RuleTaskLost, RuleTaskCompletion,
//     RuleTaskReclaimed: every task ends done, dead or cancelled (by
//     someone who asked), none is lost, a completion ends the task's live
//     lease, and a finished task is never leased again.
//   - RuleGeneratorFence: every generated task was inserted inside the
//     generator interval of its fence.
//   - RuleExpiryLate, RuleExpiryEarly: while a reaper ran, an expiry is
//     announced within Options.ExpiryBound of its expires_at, and never
//     before it; a task lease's lapse is announced when a reaper
//     puts the task back, or a claim takes it.
//   - RuleLockHeld: every attempt of a lease-gated task held its lock's
//     lease, acquired by its claim with its fence, throughout, and no
//     other holder of the lock (a lease's or another gated task's) held
//     it meanwhile. The lock's holdings are in the lease history
//     like any lease's, so RuleOverlap judges them against each other.
//   - RuleSlotLimit: never more holders of a key of k slots at once than
//     k, counting the holdings of its slots (KEY#n) in the lease history,
//     the tasks claimed into them included; a task gated by such a key
//     runs inside its slot's holding (RuleLockHeld).
//   - RuleRateLimit: never more starts of a key's tasks, every attempt
//     counted, in a window of the key's period than its rate.
//   - RuleQueuePaused: no attempt of a task of a paused queue started
//     while the pause bound every claim (Options.Pauses: the pauses a
//     caller made, since queue_pauses keeps a queue's latest only).
//   - RuleScheduleDuplicate, RuleScheduleTick, RuleScheduleCount,
//     RuleScheduleBehind: a schedule made at most one task per tick, each
//     for one of its ticks and not before it fell due; every tick it
//     passed was made, missed or skipped, and it passed every tick due by
//     its end but the last.
//
// Each rule's doc comment gives the exact comparison it makes.
package checker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Window is a span of time, e.g. one in which the database was down.
type Window struct {
	From, To time.Time
}

// Exit is the end of a process that held leases as Holder.
type Exit struct {
	Holder string
	At     time.Time
}

// Options say what the checker may expect of the history.
type Options struct {
	// Outages are the spans in which no expiry could be announced although a
	// reaper held its lease: PostgreSQL down or restarting, or the reaper's
	// process stopped (SIGSTOP) and later resumed. The expiry-lateness rule
	// skips every expiry whose span [expires_at, expires_at+ExpiryBound]
	// meets one. A reaper killed outright needs no window: the checker counts
	// a reaper as running only up to its last renewal (see RuleExpiryLate).
	Outages []Window
	// Exits are the moments at which a process holding leases under a
	// holder name ended (killed, crashed or stopped). A supervisor that
	// restarts it under the same name lets the new process renew the old
	// one's lease under the same fence; the expiry-lateness rule counts the
	// reaper as running up to the old process's last sign of life before its
	// exit, and again from the new one's first after it, not across.
	Exits []Exit
	// ExpiryBound is how late an expiry may be announced while a reaper ran;
	// 0 (or less) means 1s.
	ExpiryBound time.Duration
	// ExpectedTasks are ids of tasks the caller inserted and saw committed; each must exist
	// and be done or dead (none lost). Tasks the generator inserted are found in the table.
	ExpectedTasks []int64
	// AllowUnfinished lets tasks still be pending or running (a check taken mid-run).
	AllowUnfinished bool
	// Schedules are schedules whose ticks to judge (RuleScheduleTick,
	// RuleScheduleCount, RuleScheduleBehind), as the caller knew them: the
	// history has the tasks they made, but not when they began and ended.
	// Every schedule's tasks are judged by RuleScheduleDuplicate.
	Schedules []Schedule
	// Limits are keys of k slots with the highest limit the caller set
	// on each, for RuleSlotLimit: a key's limit in lease_limits when the
	// history is read may be lower, had the caller lowered it. A key
	// named here that lease_limits lacks is judged too.
	Limits map[string]int
	// Rates are keys with the rate the caller gave each, for
	// RuleRateLimit: a key named here is judged by this rate, any other
	// by its rate in lease_limits when the history is read.
	Rates map[string]Rate
	// Pauses are the pauses of queues the caller made, each recorded as
	// it was made and ended (PauseMade, PauseEnded), for RuleQueuePaused.
	Pauses []Pause
}

// DefaultExpiryBound is the ExpiryBound leasehold promises: an expiry is
// announced within a second of its expires_at.
const DefaultExpiryBound = time.Second

func (o Options) expiryBound() time.Duration {
	if o.ExpiryBound <= 0 {
		return DefaultExpiryBound
	}
	return o.ExpiryBound
}

// Check reads the history from pool's database and verifies every guarantee.
//
// It reads in one read-only REPEATABLE READ transaction, so the lease history
// and the tasks are one consistent snapshot, and takes the database clock at
// the start of that snapshot as the history's ReadAt: every event it sees
// was committed before then. The rows are read with plain SQL rather than
// through sqlc: the queries are this audit tool's, not the product's, and
// sqlc's generated methods would return every row at once instead of
// streaming them.
func Check(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Report, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("check: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only: nothing to undo, and the error of a failed read is the one to report

	// The snapshot is taken by this first statement, and clock_timestamp()
	// runs after that: nothing the snapshot holds happened later.
	var readAt time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&readAt); err != nil {
		return nil, fmt.Errorf("check: read the database clock: %w", err)
	}
	locks, err := lockResources(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("check: read the tasks' locks: %w", err)
	}
	limits, err := readLimits(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("check: read lease_limits: %w", err)
	}
	rates, err := readRates(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("check: read the rates of lease_limits: %w", err)
	}
	v := newVerifier(opts, readAt, locks, limits, rates)
	if err := streamEvents(ctx, tx, v.resource); err != nil {
		return nil, fmt.Errorf("check: read lease_events: %w", err)
	}
	if err := streamTasks(ctx, tx, v.task); err != nil {
		return nil, fmt.Errorf("check: read tasks: %w", err)
	}
	return v.finish(), nil
}

// streamEvents calls each with the events of one resource at a time, in id
// order; the slice is reused between calls.
func streamEvents(ctx context.Context, tx pgx.Tx, each func([]lease.Event)) error {
	rows, err := tx.Query(ctx, `
		SELECT id, at, lease_id, resource, holder, fence, kind, expires_at
		FROM lease_events
		ORDER BY resource, id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var group []lease.Event
	for rows.Next() {
		var e lease.Event
		if err := rows.Scan(&e.ID, &e.At, &e.LeaseID, &e.Resource, &e.Holder, &e.Fence, &e.Kind, &e.ExpiresAt); err != nil {
			return err
		}
		if len(group) > 0 && group[0].Resource != e.Resource {
			each(group)
			group = group[:0]
		}
		group = append(group, e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(group) > 0 {
		each(group)
	}
	return nil
}

// lockResources returns the resources that gate tasks, whose holdings
// RuleLockHeld needs once the tasks are read.
func lockResources(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT DISTINCT lock_resource FROM tasks WHERE lock_resource IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// streamTasks calls each with every task, in id order.
func streamTasks(ctx context.Context, tx pgx.Tx, each func(Task)) error {
	rows, err := tx.Query(ctx, `
		SELECT id, state, queue, coalesce(processor, ''), coalesce(fence, 0), started_at, must_heartbeat_before,
		       processed_at, created_at, coalesce(generator_fence, 0), earlier_attempts,
		       coalesce(lock_resource, ''), coalesce(schedule, ''), schedule_tick
		FROM tasks
		ORDER BY id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			t                                 Task
			started, expires, processed, tick *time.Time
			earlier                           []byte
		)
		if err := rows.Scan(&t.ID, &t.State, &t.Queue, &t.Processor, &t.Fence, &started, &expires,
			&processed, &t.CreatedAt, &t.GeneratorFence, &earlier, &t.Lock, &t.Schedule, &tick); err != nil {
			return err
		}
		t.StartedAt, t.ExpiresAt, t.ProcessedAt, t.ScheduleTick = orZero(started), orZero(expires), orZero(processed), orZero(tick)
		if err := json.Unmarshal(earlier, &t.Attempts); err != nil {
			return fmt.Errorf("task %d: earlier_attempts is not a list of attempts: %w", t.ID, err)
		}
		each(t)
	}
	return rows.Err()
}

// orZero is *t, or the zero time for NULL.
func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
