package taskstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/task"
)

// Errors of the task store beyond package task's.
var (
	// ErrNotGenerator: a generator insert was refused because the generator
	// is stopped or the caller's generator lease is no longer live.
	ErrNotGenerator = errors.New("not the live generator")
)

func fromRow(r db.Task) task.Task {
	t := task.Task{
		ID: r.ID, Kind: r.Kind, Queue: r.Queue, Priority: r.Priority, TaskData: r.TaskData, State: r.State,
		UniqueKey: deref(r.UniqueKey), ScheduledAt: r.ScheduledAt, Processor: deref(r.Processor),
		Fence: deref(r.Fence), TTLSeconds: deref(r.TTLSeconds), Attempts: r.Attempts, MaxAttempts: r.MaxAttempts,
		LastHeartbeatAt: r.LastHeartbeatAt, MustHeartbeatBefore: r.MustHeartbeatBefore,
		StartedAt: r.StartedAt, ProcessedAt: r.ProcessedAt, TaskOutput: r.TaskOutput,
		LastError: deref(r.LastError), CreatedAt: r.CreatedAt,
		Lock: deref(r.LockResource), Schedule: deref(r.Schedule), ScheduleTick: r.ScheduleTick,
	}
	if len(r.Metadata) > 0 {
		_ = json.Unmarshal(r.Metadata, &t.Metadata) // written as an object of strings only
	}
	if len(r.EarlierAttempts) > 2 { // "[]" is the common case
		// Written by task_attempt only: a row that does not parse is a bug,
		// and the history is left out rather than the task refused.
		_ = json.Unmarshal(r.EarlierAttempts, &t.EarlierAttempts)
	}
	return t
}

func fromRows(rows []db.Task) []task.Task {
	ts := make([]task.Task, len(rows))
	for i, r := range rows {
		ts[i] = fromRow(r)
	}
	return ts
}

// LeaseResource is the name of a task's lease, as the history and the
// logs call it. The lease itself lives in the task's row (schema/0009).
func LeaseResource(id int64) string { return fmt.Sprintf("task:%d", id) }

// Store is the task queue on the database.
type Store struct {
	q *db.Queries
}

// NewStore returns a store on the pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{q: db.New(pool)} }

// DefaultKind is the kind of a task inserted without one: the demo's
// sleep, as the REST API has it. The library always names a kind.
const DefaultKind = "sleep"

// NewTask is a task to insert. Zero values take the defaults.
type NewTask struct {
	TaskData json.RawMessage
	Kind     string // "": DefaultKind
	Queue    string // "": task.DefaultQueue
	Priority int16
	// UniqueKey, when set, makes the insert a no-op while another task of
	// the kind, not cancelled, holds it.
	UniqueKey   string
	TTL         time.Duration // whole seconds; zero: the first claimer's default
	ScheduledAt time.Time     // zero: now, by the database clock
	MaxAttempts int32         // zero: task.DefaultMaxAttempts
	// Lock, when set, gates the task on that resource's lease (task.Task.Lock).
	Lock string
	// LockLimit, when not zero, makes Lock a key of that many slots if it
	// has no limit yet (lease.AcquireParams.Slots).
	LockLimit int
	// Metadata travels with the task (task.Task.Metadata); nil for none.
	Metadata map[string]string
}

// Inserted is what became of one NewTask.
type Inserted struct {
	Task task.Task
	// Duplicate: nothing was inserted; Task is the task that holds the
	// unique key.
	Duplicate bool
}

// Insert adds tasks in one statement, so that workers are woken once.
func (s *Store) Insert(ctx context.Context, tasks []NewTask) ([]Inserted, error) {
	return insert(ctx, s.q, tasks)
}

// InsertTx is Insert inside the caller's transaction: the tasks exist if
// and when it commits, and the workers waiting for them are told then.
func (s *Store) InsertTx(ctx context.Context, tx pgx.Tx, tasks []NewTask) ([]Inserted, error) {
	return insert(ctx, s.q.WithTx(tx), tasks)
}

func insert(ctx context.Context, q *db.Queries, tasks []NewTask) ([]Inserted, error) {
	if err := seedLimits(ctx, q, tasks); err != nil {
		return nil, err
	}
	n := len(tasks)
	p := db.TaskInsertParams{
		TaskData: make([][]byte, n), Kinds: make([]string, n), Queues: make([]string, n),
		Priorities: make([]int16, n), UniqueKeys: make([]string, n), TTLSeconds: make([]int32, n),
		ScheduledAt: make([]string, n), MaxAttempts: make([]int32, n), Locks: make([]string, n),
		Metadata: make([][]byte, n),
	}
	for i, t := range tasks {
		p.TaskData[i] = t.TaskData
		p.Kinds[i] = or(t.Kind, DefaultKind)
		p.Queues[i] = or(t.Queue, task.DefaultQueue)
		p.Priorities[i] = t.Priority
		p.UniqueKeys[i] = t.UniqueKey
		p.TTLSeconds[i] = int32(t.TTL / time.Second)
		if !t.ScheduledAt.IsZero() {
			p.ScheduledAt[i] = t.ScheduledAt.Format(time.RFC3339Nano)
		}
		p.MaxAttempts[i] = or(t.MaxAttempts, task.DefaultMaxAttempts)
		p.Locks[i] = t.Lock
		if len(t.Metadata) > 0 {
			b, err := json.Marshal(t.Metadata)
			if err != nil {
				return nil, fmt.Errorf("insert tasks: encode the metadata: %w", err)
			}
			p.Metadata[i] = b
		}
	}
	rows, err := q.TaskInsert(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("insert tasks: %w", err)
	}
	inserted := fromRows(rows)
	out := make([]Inserted, n)
	type key struct{ kind, unique string }
	// The inserted tasks come back in the order given; a keyed task was
	// inserted when the first task back with its key is its own.
	taken := make(map[key]int, n) // key → index in out of the task holding it
	var missing []key
	next := 0
	for i := range tasks {
		k := key{p.Kinds[i], p.UniqueKeys[i]}
		if k.unique == "" {
			out[i] = Inserted{Task: inserted[next]}
			next++
			continue
		}
		if j, ok := taken[k]; ok { // a second task of the batch with this key
			out[i] = Inserted{Task: out[j].Task, Duplicate: true}
			continue
		}
		if next < len(inserted) && inserted[next].Kind == k.kind && inserted[next].UniqueKey == k.unique {
			out[i] = Inserted{Task: inserted[next]}
			next++
			taken[k] = i
			continue
		}
		missing = append(missing, k)
		taken[k] = i
		out[i] = Inserted{Duplicate: true}
	}
	if len(missing) == 0 {
		return out, nil
	}
	kp := db.TaskGetByUniqueKeysParams{Kinds: make([]string, len(missing)), UniqueKeys: make([]string, len(missing))}
	for i, k := range missing {
		kp.Kinds[i], kp.UniqueKeys[i] = k.kind, k.unique
	}
	holders, err := q.TaskGetByUniqueKeys(ctx, kp)
	if err != nil {
		return nil, fmt.Errorf("read the tasks holding %d unique keys: %w", len(missing), err)
	}
	byKey := make(map[key]task.Task, len(holders))
	for _, h := range fromRows(holders) {
		byKey[key{h.Kind, h.UniqueKey}] = h
	}
	for i := range tasks {
		if !out[i].Duplicate || out[i].Task.ID != 0 {
			continue
		}
		k := key{p.Kinds[i], p.UniqueKeys[i]}
		h, ok := byKey[k]
		if !ok {
			// Its holder was cancelled (or pruned) between the two statements:
			// the key is free again, but this call did not take it.
			return nil, fmt.Errorf("insert tasks: the task holding the unique key %q of kind %q was cancelled meanwhile; retry the insert", k.unique, k.kind)
		}
		out[i].Task = h
	}
	// A second task of the batch with a missing key pointed at its empty Task.
	for i := range tasks {
		if out[i].Duplicate && out[i].Task.ID == 0 {
			out[i].Task = byKey[key{p.Kinds[i], p.UniqueKeys[i]}]
		}
	}
	return out, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// InsertGenerated is the generator's fenced insert of demo tasks: refused
// with ErrNotGenerator unless the generator is started and holder's
// generator lease with this fence is live.
func (s *Store) InsertGenerated(ctx context.Context, holder string, fence int64, data []json.RawMessage) ([]task.Task, error) {
	p := db.TaskInsertGeneratedParams{Holder: holder, Fence: fence, TaskData: make([][]byte, len(data))}
	for i, d := range data {
		p.TaskData[i] = d
	}
	rows, err := s.q.TaskInsertGenerated(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("insert generated tasks: %w", err)
	}
	if len(rows) == 0 && len(data) > 0 {
		return nil, ErrNotGenerator
	}
	return fromRows(rows), nil
}

// Hint tells a claim where, in one branch (queue, kind, priority), the last
// task its claimer took there stands: the claim reads the branch from
// after it, skipping the entries of tasks claimed since the last VACUUM
// (schema/0011, task_branches). A hint is a shortcut that may skip a task
// (one put back at its old schedule, an insert that committed late), so a
// claimer also claims without hints now and then.
type Hint struct {
	Queue       string
	Kind        string
	Priority    int16
	ScheduledAt time.Time
	ID          int64
}

// HintOf is the hint a claimed task leaves for its branch.
func HintOf(t task.Task) Hint {
	return Hint{Queue: t.Queue, Kind: t.Kind, Priority: t.Priority, ScheduledAt: t.ScheduledAt, ID: t.ID}
}

// After reports whether h stands after o in the same branch.
func (h Hint) After(o Hint) bool {
	return h.ScheduledAt.After(o.ScheduledAt) || (h.ScheduledAt.Equal(o.ScheduledAt) && h.ID > o.ID)
}

// ClaimParams says what to claim, and for whom.
type ClaimParams struct {
	// Processors are the workers to claim for: at most one task each.
	Processors []string
	// TTL is the lease TTL of a task whose insert named none: whole seconds,
	// 1s to 1h.
	TTL time.Duration
	// Queues and Kinds restrict the claim; nil for all.
	Queues []string
	Kinds  []string
	// Hints, at most one per branch, let the claim skip what the claimer
	// already took (see Hint).
	Hints []Hint
	// Known: with Hints, claim from their branches alone and look for no
	// other (a new kind, a new priority): the cheapest claim, for a busy
	// claimer that also claims without it now and then. Every hint must
	// lie within Queues and Kinds.
	Known bool
	// WithLapsed also takes running tasks whose lease lapsed before a reaper
	// put them back, reading the index of running tasks, which holds an
	// entry for every task run since the table's last VACUUM: for the
	// catch-ups, not the claims a busy dispatcher makes again and again.
	WithLapsed bool
}

type hintArrays struct {
	queues, kinds []string
	priorities    []int16
	at            []time.Time
	ids           []int64
}

func arraysOf(hints []Hint) hintArrays {
	a := hintArrays{
		queues: make([]string, len(hints)), kinds: make([]string, len(hints)),
		priorities: make([]int16, len(hints)), at: make([]time.Time, len(hints)), ids: make([]int64, len(hints)),
	}
	for i, h := range hints {
		a.queues[i], a.kinds[i], a.priorities[i], a.at[i], a.ids[i] = h.Queue, h.Kind, h.Priority, h.ScheduledAt, h.ID
	}
	return a
}

// Claim claims up to one task for each processor named, in one statement,
// each under a new lease: due pending tasks of the queues and kinds asked
// for, lowest (priority, scheduled_at, id) first, and with WithLapsed
// running tasks whose lease lapsed. The i-th task returned belongs to the
// processor named in its Processor field.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]task.Task, error) {
	h := arraysOf(p.Hints)
	rows, err := s.q.TaskClaim(ctx, db.TaskClaimParams{
		Processors: p.Processors, TTLSeconds: int32(p.TTL / time.Second), WithLapsed: p.WithLapsed,
		WantQueues: p.Queues, WantKinds: p.Kinds,
		HintQueues: h.queues, HintKinds: h.kinds, HintPriorities: h.priorities, HintAt: h.at, HintIds: h.ids,
		Discover: !p.Known,
	})
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	ts := make([]task.Task, len(rows))
	for i, r := range rows {
		ts[i] = fromRow(db.Task(r)) // a task's columns, of the claim's and tasks_gated's rows
	}
	return ts, nil
}

// Heartbeat renews the task's lease for its processor. task.ErrLeaseLost
// when it is not the processor's (or not with this fence, when fence is not
// 0), is finished or cancelled, or its lease lapsed; task.ErrNotFound when
// there is no such task.
func (s *Store) Heartbeat(ctx context.Context, id int64, processor string, fence int64) (task.Task, error) {
	row, err := s.q.TaskHeartbeat(ctx, db.TaskHeartbeatParams{ID: id, Processor: processor, Fence: optional(fence)})
	return s.casResult(ctx, id, row, err, "heartbeat")
}

// Complete finishes the task with its output, at most once, under the same
// compare-and-set as Heartbeat.
func (s *Store) Complete(ctx context.Context, id int64, processor string, fence int64, output json.RawMessage) (task.Task, error) {
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	row, err := s.q.TaskComplete(ctx, db.TaskCompleteParams{ID: id, Processor: processor, Fence: optional(fence), TaskOutput: output})
	return s.casResult(ctx, id, row, err, "complete")
}

// Completion is one task for CompleteMany to complete.
type Completion struct {
	ID        int64
	Processor string
	Fence     int64 // required: a batch names each lease exactly
	Output    json.RawMessage
}

// CompleteMany completes many tasks in one statement and one commit, each
// under the compare-and-set of Complete, and returns the ids of those it
// completed. A task missing from the result was refused: its lease was
// lost or it was already processed (task.ErrLeaseLost for Complete).
func (s *Store) CompleteMany(ctx context.Context, cs []Completion) (map[int64]bool, error) {
	ids, processors, fences, outputs := completionArrays(cs)
	done, err := s.q.TaskCompleteMany(ctx, db.TaskCompleteManyParams{Ids: ids, Processors: processors, Fences: fences, Outputs: outputs})
	if err != nil {
		return nil, fmt.Errorf("complete %d tasks: %w", len(cs), err)
	}
	return idSet(done), nil
}

// CompleteAndClaim is CompleteMany and a Claim of due pending tasks (never
// lapsed ones: WithLapsed is ignored) for claim.Processors (at most one
// task each), in one statement and one commit: a busy replica's workers
// hand in their completions and get their next tasks in the same round
// trip. The claimed tasks carry their processor; the completions are
// judged as CompleteMany's, whatever is claimed.
func (s *Store) CompleteAndClaim(ctx context.Context, cs []Completion, claim ClaimParams) (map[int64]bool, []task.Task, error) {
	ids, processors, fences, outputs := completionArrays(cs)
	h := arraysOf(claim.Hints)
	rows, err := s.q.TaskCompleteAndClaim(ctx, db.TaskCompleteAndClaimParams{
		Ids: ids, Processors: processors, Fences: fences, Outputs: outputs,
		ClaimFor: claim.Processors, TTLSeconds: int32(claim.TTL / time.Second),
		WantQueues: claim.Queues, WantKinds: claim.Kinds,
		HintQueues: h.queues, HintKinds: h.kinds, HintPriorities: h.priorities, HintAt: h.at, HintIds: h.ids,
		Discover: !claim.Known,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("complete %d tasks and claim for %d workers: %w", len(cs), len(claim.Processors), err)
	}
	if len(rows) == 0 { // cannot happen: the completions' row always comes back
		return nil, nil, fmt.Errorf("complete %d tasks and claim for %d workers: no result", len(cs), len(claim.Processors))
	}
	var (
		claimed = make([]task.Task, 0, len(rows))
		done    []int64
	)
	for _, r := range rows {
		if r.CompletedIds != nil {
			done = r.CompletedIds // on one row only
		}
		if r.ID == 0 {
			continue // nothing claimed
		}
		// The two times the task points to, in one allocation.
		at := &struct{ started, expires time.Time }{r.StartedAt, r.MustHeartbeatBefore}
		claimed = append(claimed, task.Task{
			ID: r.ID, Kind: r.Kind, Queue: r.Queue, Priority: r.Priority, TaskData: r.TaskData,
			State: task.StateRunning, ScheduledAt: r.ScheduledAt, Processor: r.Processor,
			Fence: r.Fence, TTLSeconds: r.TTLSeconds, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts,
			LastHeartbeatAt: &at.started, MustHeartbeatBefore: &at.expires, StartedAt: &at.started,
			CreatedAt: r.CreatedAt, Lock: r.LockResource, Schedule: r.Schedule,
		})
		if r.Schedule != "" {
			tick := r.ScheduleTick
			claimed[len(claimed)-1].ScheduleTick = &tick
		}
		if len(r.Metadata) > 0 {
			_ = json.Unmarshal(r.Metadata, &claimed[len(claimed)-1].Metadata)
		}
	}
	return idSet(done), claimed, nil
}

// completionArrays lays out completions as the batch statements take them.
func completionArrays(cs []Completion) (ids []int64, processors []string, fences []int64, outputs [][]byte) {
	ids, processors = make([]int64, len(cs)), make([]string, len(cs))
	fences, outputs = make([]int64, len(cs)), make([][]byte, len(cs))
	for i, c := range cs {
		ids[i], processors[i], fences[i], outputs[i] = c.ID, c.Processor, c.Fence, c.Output
		if len(c.Output) == 0 {
			outputs[i] = []byte("null")
		}
	}
	return ids, processors, fences, outputs
}

func idSet(ids []int64) map[int64]bool {
	set := make(map[int64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// The default backoff of failed attempts: Base × 2^(attempts−1), at most
// Max, times a random factor in [0.5, 1) so that failed tasks do not retry
// in lockstep.
const (
	BackoffBase = time.Second
	BackoffMax  = 5 * time.Minute
)

// Fail records a failed attempt: the task goes back to pending after
// retryIn (negative: the default backoff), or dead when it has used its
// attempts. Same compare-and-set as Heartbeat.
func (s *Store) Fail(ctx context.Context, id int64, processor string, fence int64, reason string, retryIn time.Duration) (task.Task, error) {
	p := db.TaskFailParams{
		ID: id, Processor: processor, Fence: optional(fence), Error: reason,
		BaseSeconds: BackoffBase.Seconds(), MaxBackoffSeconds: BackoffMax.Seconds(),
	}
	if retryIn >= 0 {
		secs := retryIn.Seconds()
		p.RetryInSeconds = &secs
	}
	row, err := s.q.TaskFail(ctx, p)
	return s.casResult(ctx, id, row, err, "fail")
}

// Requeue hands a running task back without counting the attempt: a worker
// that shuts down before finishing it. Another worker may claim it at once.
func (s *Store) Requeue(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error) {
	row, err := s.q.TaskPutBack(ctx, db.TaskPutBackParams{
		ID: id, Processor: processor, Fence: optional(fence), Outcome: task.OutcomeRequeued, Reason: &reason,
	})
	return s.casResult(ctx, id, row, err, "requeue")
}

// Snooze ends the running attempt without counting it and puts the task
// back, due after delay: a handler that asks to run again later.
func (s *Store) Snooze(ctx context.Context, id int64, processor string, fence int64, delay time.Duration) (task.Task, error) {
	row, err := s.q.TaskPutBack(ctx, db.TaskPutBackParams{
		ID: id, Processor: processor, Fence: optional(fence), Outcome: task.OutcomeSnoozed, DelaySeconds: max(delay, 0).Seconds(),
	})
	return s.casResult(ctx, id, row, err, "snooze")
}

// Cancel cancels a pending or running task with the reason; a running
// task's lease is revoked at once and its worker told by NOTIFY.
// task.ErrNotCancellable when the task is done, dead or cancelled already;
// task.ErrNotFound when there is none.
func (s *Store) Cancel(ctx context.Context, id int64, reason string) (task.Task, error) {
	row, err := s.q.TaskCancel(ctx, db.TaskCancelParams{ID: id, Reason: reason})
	return s.cancelResult(ctx, id, row, err)
}

// CancelHeld is Cancel by the task's holder (a handler that gives up on its
// task), under the compare-and-set of Heartbeat: task.ErrLeaseLost when
// the task is not running under processor's lease (with fence).
func (s *Store) CancelHeld(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error) {
	row, err := s.q.TaskCancel(ctx, db.TaskCancelParams{ID: id, Reason: reason, Processor: &processor, Fence: optional(fence)})
	return s.casResult(ctx, id, row, err, "cancel")
}

func (s *Store) cancelResult(ctx context.Context, id int64, row db.Task, err error) (task.Task, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		if _, gerr := s.Get(ctx, id); gerr != nil {
			return task.Task{}, gerr
		}
		return task.Task{}, task.ErrNotCancellable
	}
	if err != nil {
		return task.Task{}, fmt.Errorf("cancel task %d: %w", id, err)
	}
	return fromRow(row), nil
}

// Retry puts a dead or cancelled task back to pending, due now, with a
// fresh budget of attempts. task.ErrNotRetryable when the task is neither;
// task.ErrUniqueKeyTaken when another task holds its unique key;
// task.ErrNotFound when there is none.
func (s *Store) Retry(ctx context.Context, id int64) (task.Task, error) {
	row, err := s.q.TaskRetry(ctx, id)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, gerr := s.Get(ctx, id); gerr != nil {
			return task.Task{}, gerr
		}
		return task.Task{}, task.ErrNotRetryable
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		return task.Task{}, task.ErrUniqueKeyTaken
	case err != nil:
		return task.Task{}, fmt.Errorf("retry task %d: %w", id, err)
	}
	return fromRow(row), nil
}

// casResult turns the outcome of a compare-and-set into task.ErrLeaseLost or
// task.ErrNotFound when no row came back.
func (s *Store) casResult(ctx context.Context, id int64, row db.Task, err error, op string) (task.Task, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := s.Get(ctx, id)
		if gerr != nil {
			return task.Task{}, gerr
		}
		return task.Task{}, &task.LeaseLostError{State: cur.State}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == lockLost {
		// A gated task whose lock's lease is gone (schema/0012,
		// task_lock_follow): its renewal is refused, as a lapsed lease's.
		return task.Task{}, task.ErrLeaseLost
	}
	if err != nil {
		return task.Task{}, fmt.Errorf("%s task %d: %w", op, id, err)
	}
	return fromRow(row), nil
}

// lockLost is the SQLSTATE of a gated task's renewal when its lock's lease
// is no longer held.
const lockLost = "LH001"

func optional(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

func deref[T any](v *T) T {
	var zero T
	if v == nil {
		return zero
	}
	return *v
}

// Lapsed is a task whose lease the reaper found lapsed and announced.
type Lapsed struct {
	Task task.Task
	// Lag is the delay from the lease's expiry to the announcement, by the
	// database clock.
	Lag time.Duration
}

// RequeueLapsed announces up to batch lapsed task leases: each of those
// tasks goes back to pending, or dead when it has used its attempts (which
// NOTIFYs, and wakes the workers).
func (s *Store) RequeueLapsed(ctx context.Context, batch int32) ([]Lapsed, error) {
	rows, err := s.q.TaskRequeueLapsed(ctx, batch)
	if err != nil {
		return nil, fmt.Errorf("requeue lapsed tasks: %w", err)
	}
	out := make([]Lapsed, 0, len(rows))
	for _, r := range rows {
		t := fromRow(r)
		if len(t.EarlierAttempts) == 0 {
			return nil, fmt.Errorf("requeue lapsed tasks: task %d: the lapsed attempt is missing from earlier_attempts", r.ID)
		}
		last := t.EarlierAttempts[len(t.EarlierAttempts)-1]
		out = append(out, Lapsed{Task: t, Lag: last.EndedAt.Sub(last.ExpiresAt)})
	}
	return out, nil
}

// nextLapseWait bounds how long NextLapse waits for the claims in flight
// to commit; when it runs out NextLapse returns the database's now, so
// that the reaper looks again at once.
const nextLapseWait = 200 * time.Millisecond

// NextLapse returns when the earliest running task's lease runs out (an
// hour from now when none runs), as seen after every claim that did not
// announce its expiry (one that expires after a running task's) has
// committed: the reaper's sleep until then misses no claim that expires
// sooner, since those are announced (schema/0009).
func (s *Store) NextLapse(ctx context.Context) (time.Time, error) {
	t, err := s.q.TaskNextLapse(ctx, int32(nextLapseWait/time.Millisecond))
	if err != nil {
		return time.Time{}, fmt.Errorf("next task lease lapse: %w", err)
	}
	return t, nil
}

// Get returns the task, task.ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id int64) (task.Task, error) {
	row, err := s.q.TaskGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return task.Task{}, task.ErrNotFound
	}
	if err != nil {
		return task.Task{}, fmt.Errorf("get task %d: %w", id, err)
	}
	return fromRow(row), nil
}

// ListParams selects a page of tasks, in id order. Nil filters match all.
type ListParams struct {
	States  []string
	Kinds   []string
	Queues  []string
	Started bool // only tasks claimed at least once
	AfterID int64
	Limit   int32
}

// List returns a page of tasks in id order.
func (s *Store) List(ctx context.Context, p ListParams) ([]task.Task, error) {
	rows, err := s.q.TaskList(ctx, db.TaskListParams{
		States: p.States, Kinds: p.Kinds, Queues: p.Queues, Started: p.Started, AfterID: p.AfterID, RowLimit: p.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Running returns up to limit running tasks, oldest claim first.
func (s *Store) Running(ctx context.Context, limit int32) ([]task.Task, error) {
	rows, err := s.q.TaskListRunning(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list running tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Dead returns up to limit dead tasks, the most recent first.
func (s *Store) Dead(ctx context.Context, limit int32) ([]task.Task, error) {
	rows, err := s.q.TaskListDead(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Stats returns the counts of tasks by state.
func (s *Store) Stats(ctx context.Context) (task.Stats, error) {
	r, err := s.q.TaskStats(ctx)
	if err != nil {
		return task.Stats{}, fmt.Errorf("task stats: %w", err)
	}
	return task.Stats(r), nil
}

// FoldCounts folds the log of changes the counts by state are summed from
// (schema/0017), so that Stats reads a few hundred rows however many tasks
// there are, and returns how many rows it folded. The elected reaper calls
// it about every second; folds at once are safe, as is none for a while
// (Stats then sums more rows).
func (s *Store) FoldCounts(ctx context.Context) (int64, error) {
	n, err := s.q.TaskCountsFold(ctx)
	if err != nil {
		return 0, fmt.Errorf("fold the task counts: %w", err)
	}
	return n, nil
}

// NextDue returns when the next pending task of the queues and kinds (nil:
// all) falls due (an hour from now when none is pending) and the database
// clock now.
func (s *Store) NextDue(ctx context.Context, queues, kinds []string) (due, dbNow time.Time, err error) {
	r, err := s.q.TaskNextDue(ctx, db.TaskNextDueParams{WantQueues: queues, WantKinds: kinds})
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("next due task: %w", err)
	}
	return r.NextDue, r.DBNow, nil
}

// Pending is the pending tasks of one (queue, kind).
type Pending struct {
	Queue string `json:"queue"`
	Kind  string `json:"kind"`
	// Count is at most the maxCount asked for: a count equal to it means
	// "at least".
	Count int64 `json:"count"`
	// OldestWait is how long the longest-waiting due task has waited since
	// its scheduled_at, by the database clock; zero when none is due.
	OldestWait time.Duration `json:"-"`
}

// PendingByKind counts the pending tasks of each (queue, kind), at most
// maxCount each, with the oldest wait: what shows a kind that no live
// worker handles.
func (s *Store) PendingByKind(ctx context.Context, maxCount int32) ([]Pending, error) {
	rows, err := s.q.TaskPendingSummary(ctx, maxCount)
	if err != nil {
		return nil, fmt.Errorf("pending tasks by kind: %w", err)
	}
	out := make([]Pending, len(rows))
	for i, r := range rows {
		out[i] = Pending{Queue: r.Queue, Kind: r.Kind, Count: r.Pending,
			OldestWait: time.Duration(r.OldestWaitSeconds * float64(time.Second))}
	}
	return out, nil
}

// TasksOf returns the tasks of ins, inserted or duplicate alike, and err:
// for a caller of Insert that wants the tasks only.
func TasksOf(ins []Inserted, err error) ([]task.Task, error) {
	if err != nil {
		return nil, err
	}
	ts := make([]task.Task, len(ins))
	for i, in := range ins {
		ts[i] = in.Task
	}
	return ts, nil
}

// copyColumns are the columns CopyInsert writes; the others take their
// defaults (scheduled_at: now, by the database clock, unless copyScheduled).
var copyColumns = []string{"task_data", "kind", "queue", "priority", "ttl_seconds", "max_attempts", "lock_resource", "metadata"}

// seedLimits gives the locks of tasks with a LockLimit that limit, unless
// they have one already: in the caller's transaction when q has one.
func seedLimits(ctx context.Context, q *db.Queries, tasks []NewTask) error {
	var p db.LimitSeedParams
	for _, t := range tasks {
		if t.Lock != "" && t.LockLimit > 0 {
			p.Resources = append(p.Resources, t.Lock)
			p.Slots = append(p.Slots, int32(t.LockLimit))
		}
	}
	if len(p.Resources) == 0 {
		return nil
	}
	if err := q.LimitSeed(ctx, p); err != nil {
		return fmt.Errorf("insert tasks: set the limits of their locks: %w", err)
	}
	return nil
}

// CopyInsert adds tasks with COPY, in one statement per group (those with a
// ScheduledAt of their own, those without): the fastest way in for a large
// batch. The tasks may have no UniqueKey (COPY cannot skip a row). It
// returns how many it inserted. The insert trigger runs once per statement:
// waiting workers are woken as for Insert. q runs in the caller's
// transaction when it has one (Tx), so that all groups go in together.
func CopyInsert(ctx context.Context, tx pgx.Tx, tasks []NewTask) (int64, error) {
	if err := seedLimits(ctx, db.New(tx), tasks); err != nil {
		return 0, err
	}
	conn := tx
	var now, later [][]any
	for _, t := range tasks {
		var meta any
		if len(t.Metadata) > 0 {
			b, err := json.Marshal(t.Metadata)
			if err != nil {
				return 0, fmt.Errorf("copy tasks: encode the metadata: %w", err)
			}
			meta = b
		}
		var ttl, lock any
		if t.TTL > 0 {
			ttl = int32(t.TTL / time.Second)
		}
		if t.Lock != "" {
			lock = t.Lock
		}
		row := []any{[]byte(t.TaskData), or(t.Kind, DefaultKind), or(t.Queue, task.DefaultQueue), t.Priority, ttl,
			or(t.MaxAttempts, task.DefaultMaxAttempts), lock, meta}
		if t.ScheduledAt.IsZero() {
			now = append(now, row)
		} else {
			later = append(later, append(row, t.ScheduledAt))
		}
	}
	var n int64
	if len(now) > 0 {
		c, err := conn.CopyFrom(ctx, pgx.Identifier{"tasks"}, copyColumns, pgx.CopyFromRows(now))
		if err != nil {
			return 0, fmt.Errorf("copy tasks: %w", err)
		}
		n += c
	}
	if len(later) > 0 {
		c, err := conn.CopyFrom(ctx, pgx.Identifier{"tasks"}, append(slices.Clone(copyColumns), "scheduled_at"), pgx.CopyFromRows(later))
		if err != nil {
			return n, fmt.Errorf("copy tasks: %w", err)
		}
		n += c
	}
	return n, nil
}

// NewestTx returns the newest tasks of kind (in queue, when set) that tx
// sees, newest first, at most limit: for tests that look into a
// transaction (leaseholdtest).
func NewestTx(ctx context.Context, tx pgx.Tx, kind, queue string, limit int) ([]task.Task, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM tasks WHERE kind = $1 AND ($2 = '' OR queue = $2) ORDER BY id DESC LIMIT $3`, kind, queue, limit)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	q := db.New(tx)
	out := make([]task.Task, 0, len(ids))
	for _, id := range ids {
		r, err := q.TaskGet(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, fromRow(r))
	}
	return out, nil
}
