package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lease"
)

// The states of a task.
const (
	StatePending = "pending"
	StateRunning = "running"
	StateDone    = "done"
	StateDead    = "dead"
)

// Errors of the task queue.
var (
	ErrNotFound = errors.New("task not found")
	// ErrLeaseLost: the task is not the caller's (another processor, another
	// fence), is already processed, or its lease lapsed.
	ErrLeaseLost = errors.New("task lease lost")
	// ErrNotGenerator: a generator insert was refused because the generator
	// is stopped or the caller's generator lease is no longer live.
	ErrNotGenerator = errors.New("not the live generator")
)

// Task is one task as the API shows it.
type Task struct {
	ID                  int64           `json:"id"`
	TaskData            json.RawMessage `json:"task_data"`
	State               string          `json:"state"`
	ScheduledAt         time.Time       `json:"scheduled_at"`
	Processor           *string         `json:"processor"`
	Fence               *int64          `json:"fence"`
	Attempts            int32           `json:"attempts"`
	MaxAttempts         int32           `json:"max_attempts"`
	LastHeartbeatAt     *time.Time      `json:"last_heartbeat_at"`
	MustHeartbeatBefore *time.Time      `json:"must_heartbeat_before"`
	StartedAt           *time.Time      `json:"started_at"`
	ProcessedAt         *time.Time      `json:"processed_at"`
	TaskOutput          json.RawMessage `json:"task_output"`
	LastError           *string         `json:"last_error"`
	CreatedAt           time.Time       `json:"created_at"`
	GeneratorFence      *int64          `json:"generator_fence"`
}

// MarshalJSON writes timestamps as RFC 3339 UTC with milliseconds, and a
// missing output as null.
func (t Task) MarshalJSON() ([]byte, error) {
	type plain Task
	out := t.TaskOutput
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	return json.Marshal(struct {
		plain
		TaskOutput          json.RawMessage `json:"task_output"`
		ScheduledAt         string          `json:"scheduled_at"`
		LastHeartbeatAt     *string         `json:"last_heartbeat_at"`
		MustHeartbeatBefore *string         `json:"must_heartbeat_before"`
		StartedAt           *string         `json:"started_at"`
		ProcessedAt         *string         `json:"processed_at"`
		CreatedAt           string          `json:"created_at"`
	}{
		plain:               plain(t),
		TaskOutput:          out,
		ScheduledAt:         lease.FormatTime(t.ScheduledAt),
		LastHeartbeatAt:     lease.FormatTimePtr(t.LastHeartbeatAt),
		MustHeartbeatBefore: lease.FormatTimePtr(t.MustHeartbeatBefore),
		StartedAt:           lease.FormatTimePtr(t.StartedAt),
		ProcessedAt:         lease.FormatTimePtr(t.ProcessedAt),
		CreatedAt:           lease.FormatTime(t.CreatedAt),
	})
}

func fromRow(r db.Task) Task {
	return Task{
		ID: r.ID, TaskData: r.TaskData, State: r.State, ScheduledAt: r.ScheduledAt,
		Processor: r.Processor, Fence: r.Fence, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts,
		LastHeartbeatAt: r.LastHeartbeatAt, MustHeartbeatBefore: r.MustHeartbeatBefore,
		StartedAt: r.StartedAt, ProcessedAt: r.ProcessedAt, TaskOutput: r.TaskOutput,
		LastError: r.LastError, CreatedAt: r.CreatedAt, GeneratorFence: r.GeneratorFence,
	}
}

func fromRows(rows []db.Task) []Task {
	ts := make([]Task, len(rows))
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

// NewTask is a task to insert.
type NewTask struct {
	TaskData    json.RawMessage
	ScheduledAt time.Time // zero: now, by the database clock
	MaxAttempts int32     // zero: 5
}

// DefaultMaxAttempts is the attempts a task gets when it names none.
const DefaultMaxAttempts = 5

// Insert adds tasks in one statement, so that workers are woken once.
func (s *Store) Insert(ctx context.Context, tasks []NewTask) ([]Task, error) {
	p := db.TaskInsertParams{
		TaskData:    make([][]byte, len(tasks)),
		ScheduledAt: make([]string, len(tasks)),
		MaxAttempts: make([]int32, len(tasks)),
	}
	for i, t := range tasks {
		p.TaskData[i] = t.TaskData
		if !t.ScheduledAt.IsZero() {
			p.ScheduledAt[i] = t.ScheduledAt.Format(time.RFC3339Nano)
		}
		p.MaxAttempts[i] = t.MaxAttempts
		if p.MaxAttempts[i] == 0 {
			p.MaxAttempts[i] = DefaultMaxAttempts
		}
	}
	rows, err := s.q.TaskInsert(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("insert tasks: %w", err)
	}
	return fromRows(rows), nil
}

// InsertGenerated is the generator's fenced insert: refused with
// ErrNotGenerator unless the generator is started and holder's generator
// lease with this fence is live.
func (s *Store) InsertGenerated(ctx context.Context, holder string, fence int64, data []json.RawMessage) ([]Task, error) {
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

// Claim claims up to one task for each processor named, in one statement,
// each under a new lease of the given TTL: due pending tasks, and running
// tasks whose lease lapsed. The i-th task returned belongs to the
// processor named in its Processor field.
func (s *Store) Claim(ctx context.Context, processors []string, ttl time.Duration) ([]Task, error) {
	return s.claim(ctx, processors, ttl, true)
}

// ClaimPending is Claim of due pending tasks only: it does not look for
// running tasks whose lease lapsed, which the reaper puts back to pending
// (RequeueLapsed). It is the claim a busy dispatcher makes again and
// again: looking for lapsed tasks walks the index of running tasks, which
// holds an entry for every task run since the table's last VACUUM.
func (s *Store) ClaimPending(ctx context.Context, processors []string, ttl time.Duration) ([]Task, error) {
	return s.claim(ctx, processors, ttl, false)
}

func (s *Store) claim(ctx context.Context, processors []string, ttl time.Duration, withLapsed bool) ([]Task, error) {
	rows, err := s.q.TaskClaim(ctx, db.TaskClaimParams{
		Processors: processors, TTLSeconds: int32(ttl / time.Second), WithLapsed: withLapsed,
	})
	if err != nil {
		return nil, fmt.Errorf("claim tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Heartbeat renews the task's lease for its processor. ErrLeaseLost when
// it is not the processor's (or not with this fence, when fence is not 0),
// is processed, or its lease lapsed; ErrNotFound when there is no such task.
func (s *Store) Heartbeat(ctx context.Context, id int64, processor string, fence int64) (Task, error) {
	row, err := s.q.TaskHeartbeat(ctx, db.TaskHeartbeatParams{ID: id, Processor: processor, Fence: optional(fence)})
	return s.casResult(ctx, id, row, err, "heartbeat")
}

// Complete finishes the task with its output, at most once, under the same
// compare-and-set as Heartbeat.
func (s *Store) Complete(ctx context.Context, id int64, processor string, fence int64, output json.RawMessage) (Task, error) {
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
// lost or it was already processed (ErrLeaseLost for Complete).
func (s *Store) CompleteMany(ctx context.Context, cs []Completion) (map[int64]bool, error) {
	ids, processors, fences, outputs := completionArrays(cs)
	done, err := s.q.TaskCompleteMany(ctx, db.TaskCompleteManyParams{Ids: ids, Processors: processors, Fences: fences, Outputs: outputs})
	if err != nil {
		return nil, fmt.Errorf("complete %d tasks: %w", len(cs), err)
	}
	return idSet(done), nil
}

// CompleteAndClaim is CompleteMany and ClaimPending for the processors
// claimFor (at most one task each), in one statement and one commit: a
// busy replica's workers hand in their completions and get their next
// tasks in the same round trip. The claimed tasks carry their processor;
// the completions are judged as CompleteMany's, whatever is claimed.
func (s *Store) CompleteAndClaim(ctx context.Context, cs []Completion, claimFor []string, ttl time.Duration) (map[int64]bool, []Task, error) {
	ids, processors, fences, outputs := completionArrays(cs)
	rows, err := s.q.TaskCompleteAndClaim(ctx, db.TaskCompleteAndClaimParams{
		Ids: ids, Processors: processors, Fences: fences, Outputs: outputs,
		ClaimFor: claimFor, TTLSeconds: int32(ttl / time.Second),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("complete %d tasks and claim for %d workers: %w", len(cs), len(claimFor), err)
	}
	if len(rows) == 0 { // cannot happen: the completions' row always comes back
		return nil, nil, fmt.Errorf("complete %d tasks and claim for %d workers: no result", len(cs), len(claimFor))
	}
	var (
		claimed []Task
		done    []int64
	)
	for _, r := range rows {
		if r.CompletedIds != nil {
			done = r.CompletedIds // on one row only
		}
		if r.ID == nil {
			continue // nothing claimed
		}
		claimed = append(claimed, Task{
			ID: *r.ID, TaskData: r.TaskData, State: StateRunning, ScheduledAt: *r.ScheduledAt,
			Processor: r.Processor, Fence: r.Fence, Attempts: *r.Attempts, MaxAttempts: *r.MaxAttempts,
			LastHeartbeatAt: r.StartedAt, MustHeartbeatBefore: r.MustHeartbeatBefore, StartedAt: r.StartedAt,
			CreatedAt: *r.CreatedAt,
		})
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

// Backoff of failed attempts: Base × 2^(attempts−1), at most Max, times a
// random factor in [0.5, 1) so that failed tasks do not retry in lockstep.
const (
	BackoffBase = time.Second
	BackoffMax  = 5 * time.Minute
)

// Fail records a failed attempt: the task goes back to pending after a
// backoff, or dead when it has used its attempts. Same compare-and-set as
// Heartbeat.
func (s *Store) Fail(ctx context.Context, id int64, processor string, fence int64, reason string) (Task, error) {
	row, err := s.q.TaskFail(ctx, db.TaskFailParams{
		ID: id, Processor: processor, Fence: optional(fence), Error: reason,
		BaseSeconds: BackoffBase.Seconds(), MaxBackoffSeconds: BackoffMax.Seconds(),
	})
	return s.casResult(ctx, id, row, err, "fail")
}

// Requeue hands a running task back without counting the attempt: a worker
// that shuts down before finishing it. Another worker may claim it at once.
func (s *Store) Requeue(ctx context.Context, id int64, processor string, fence int64, reason string) (Task, error) {
	row, err := s.q.TaskFail(ctx, db.TaskFailParams{
		ID: id, Processor: processor, Fence: optional(fence), Error: reason, Requeue: true,
	})
	return s.casResult(ctx, id, row, err, "requeue")
}

// casResult turns the outcome of a compare-and-set into ErrLeaseLost or
// ErrNotFound when no row came back.
func (s *Store) casResult(ctx context.Context, id int64, row db.Task, err error, op string) (Task, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		if _, gerr := s.Get(ctx, id); gerr != nil {
			return Task{}, gerr
		}
		return Task{}, ErrLeaseLost
	}
	if err != nil {
		return Task{}, fmt.Errorf("%s task %d: %w", op, id, err)
	}
	return fromRow(row), nil
}

func optional(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

// Lapsed is a task whose lease the reaper found lapsed and announced.
type Lapsed struct {
	Task Task
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
		var a []Attempt
		if err := json.Unmarshal(r.EarlierAttempts, &a); err != nil {
			return nil, fmt.Errorf("requeue lapsed tasks: task %d: unreadable earlier_attempts: %w", r.ID, err)
		}
		if len(a) == 0 {
			return nil, fmt.Errorf("requeue lapsed tasks: task %d: the lapsed attempt is missing from earlier_attempts", r.ID)
		}
		last := a[len(a)-1]
		out = append(out, Lapsed{Task: fromRow(r), Lag: last.EndedAt.Sub(last.ExpiresAt)})
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

// Attempt is an attempt at a task that ended otherwise than by its
// completion: an entry of the column earlier_attempts.
type Attempt struct {
	Processor string    `json:"processor"`
	Fence     int64     `json:"fence"`
	StartedAt time.Time `json:"started_at"`
	// ExpiresAt is when the attempt's lease would have run out.
	ExpiresAt time.Time `json:"expires_at"`
	EndedAt   time.Time `json:"ended_at"`
	Outcome   string    `json:"outcome"` // OutcomeExpired, OutcomeFailed or OutcomeRequeued
}

// The outcomes of an Attempt.
const (
	OutcomeExpired  = "expired"  // its lease lapsed; EndedAt is when that was announced
	OutcomeFailed   = "failed"   // its processor failed it
	OutcomeRequeued = "requeued" // its processor handed it back, shutting down
)

// Get returns the task, ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id int64) (Task, error) {
	row, err := s.q.TaskGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, ErrNotFound
	}
	if err != nil {
		return Task{}, fmt.Errorf("get task %d: %w", id, err)
	}
	return fromRow(row), nil
}

// Filters of List.
const (
	FilterAll       = "all"
	FilterProcessed = "processed" // done or dead
	FilterStarted   = "started"   // claimed at least once
)

// List returns a page of tasks in id order.
func (s *Store) List(ctx context.Context, filter string, afterID int64, limit int32) ([]Task, error) {
	rows, err := s.q.TaskList(ctx, db.TaskListParams{Filter: filter, AfterID: afterID, RowLimit: limit})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Running returns up to limit running tasks, oldest claim first.
func (s *Store) Running(ctx context.Context, limit int32) ([]Task, error) {
	rows, err := s.q.TaskListRunning(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list running tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Dead returns up to limit dead tasks, the most recent first.
func (s *Store) Dead(ctx context.Context, limit int32) ([]Task, error) {
	rows, err := s.q.TaskListDead(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead tasks: %w", err)
	}
	return fromRows(rows), nil
}

// Stats counts tasks by state.
type Stats struct {
	Pending        int64 `json:"pending"`
	Running        int64 `json:"running"`
	Done           int64 `json:"done"`
	Dead           int64 `json:"dead"`
	DoneLastMinute int64 `json:"done_last_minute"`
}

// Stats returns the counts of tasks by state.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	r, err := s.q.TaskStats(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("task stats: %w", err)
	}
	return Stats(r), nil
}

// NextDue returns when the next pending task falls due (an hour from now
// when none is pending) and the database clock now.
func (s *Store) NextDue(ctx context.Context) (due, dbNow time.Time, err error) {
	r, err := s.q.TaskNextDue(ctx)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("next due task: %w", err)
	}
	return r.NextDue, r.DBNow, nil
}
