// Package task holds the types of leasehold's tasks: a task as the API and
// the database show it, its states, the history of its attempts, and the
// errors a caller tests for. The same types serve tasks inserted and worked
// in-process on a PostgreSQL pool and over a leasehold service's REST API
// (package leasehold).
//
// A task moves through these states:
//
//	          claim: a new lease in the task's row
//	          and fence, attempts + 1
//	pending ───────────────────────────────▶ running ──┐
//	  ▲  ▲                                   │  │  ▲ ◀──┘ heartbeat: the lease renewed
//	  │  │ fail (attempts left):             │  │  │
//	  │  └─ backoff; snooze: later ──────────┘  │  │ the lease lapsed (worker crashed
//	  │                                         │  │ or stalled): put back, or
//	  │  hand back (shutdown: not counted)      │  │ claimed again
//	  │  lapsed                                 │  └──────────────────────────────
//	  └─────────────────────────────────────────┤
//	  ▲                                         ├── complete ──▶ done
//	  │ retry (a fresh budget)                  ├── fail, no attempts left, or lapsed
//	  │                                         │   on the last one ──▶ dead
//	  └──────── dead, cancelled ◀─── cancel ────┴── (pending or running)
//
// A task's lease lives in its own row: Processor is the holder, Fence the
// fencing token (from the sequence every lease draws from, so greater than
// every fence handed out before), MustHeartbeatBefore the expiry. Every
// change of a running task is a compare-and-set on (processor, fence, lease
// live): a worker that lost its lease gets ErrLeaseLost and can never
// complete the task, so each task is done at most once.
package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
)

// State is where a task stands.
type State = string

// The states of a task.
const (
	StatePending   = "pending"   // waiting to be claimed: due, scheduled for later, or put back
	StateRunning   = "running"   // claimed, under a live lease
	StateDone      = "done"      // completed
	StateDead      = "dead"      // gave up after MaxAttempts
	StateCancelled = "cancelled" // cancelled before it was done
)

// Errors of the task queue.
var (
	// ErrNotFound: no task has the id asked for.
	ErrNotFound = errors.New("task not found")
	// ErrLeaseLost: the task is not the caller's (another processor,
	// another fence), is already finished or cancelled, or its lease
	// lapsed. A normal outcome for a worker that stalled: another worker
	// has the task, or will.
	ErrLeaseLost = errors.New("task lease lost")
	// ErrCancelled is the cause of a running task's context when the task
	// was cancelled: its lease is revoked, and nothing its worker reports
	// will be accepted.
	ErrCancelled = errors.New("task cancelled")
	// ErrNotCancellable: only a pending or running task can be cancelled.
	ErrNotCancellable = errors.New("task is not pending or running")
	// ErrNotRetryable: only a dead or cancelled task can be retried.
	ErrNotRetryable = errors.New("task is not dead or cancelled")
	// ErrUniqueKeyTaken: the task cannot go back to the queue because
	// another task of its kind, not cancelled, holds its unique key.
	ErrUniqueKeyTaken = errors.New("another task of the kind holds the unique key")
)

// LeaseLostError is ErrLeaseLost as a refusal found it, with the task's
// State then ("" when not known). It is also ErrCancelled when the task was
// cancelled: a worker whose heartbeat is refused learns why, embedded or
// over REST, and tells its handler so (context.Cause is ErrCancelled).
type LeaseLostError struct {
	State State
}

func (e *LeaseLostError) Error() string {
	switch e.State {
	case "":
		return ErrLeaseLost.Error()
	case StateCancelled:
		return ErrLeaseLost.Error() + ": the task was cancelled"
	}
	return ErrLeaseLost.Error() + ": the task is " + e.State
}

// Is reports ErrLeaseLost, and ErrCancelled for a cancelled task.
func (e *LeaseLostError) Is(target error) bool {
	return target == ErrLeaseLost || (target == ErrCancelled && e.State == StateCancelled)
}

// MaxPayloadBytes bounds a task's task_data and task_output, as JSON: 1000
// KiB, what one request of the REST API (at most 1 MiB) carries with the
// rest of its body. The bound is the same embedded and remote: an insert
// of more is refused before anything is written, and a handler's output of
// more fails its attempt, saying so.
const MaxPayloadBytes = 1000 << 10

// Defaults of a task that names none.
const (
	DefaultQueue       = "default" // the queue of a task that names none
	DefaultMaxAttempts = 5
)

// Task is one task as the API shows it. Zero values stand for what the API
// shows as null: no Processor (""), no Fence (0), no TTL (0), no
// UniqueKey (""), no LastError ("").
type Task struct {
	ID       int64           `json:"id"`
	Kind     string          `json:"kind"`
	Queue    string          `json:"queue"`
	Priority int16           `json:"priority"`
	TaskData json.RawMessage `json:"task_data"`
	State    State           `json:"state"`
	// UniqueKey, when set, is unique among the kind's tasks that are not
	// cancelled.
	UniqueKey   string    `json:"unique_key"`
	ScheduledAt time.Time `json:"scheduled_at"`
	// Processor holds (or last held) the task's lease, Fence is that
	// lease's fencing token: the running attempt's, or the last one's.
	Processor string `json:"processor"`
	Fence     int64  `json:"fence"`
	// TTLSeconds is the TTL of the task's leases: the one its insert asked
	// for or, when it asked for none, its first claimer's default.
	TTLSeconds          int32           `json:"ttl_seconds"`
	Attempts            int32           `json:"attempts"`
	MaxAttempts         int32           `json:"max_attempts"`
	LastHeartbeatAt     *time.Time      `json:"last_heartbeat_at"`
	MustHeartbeatBefore *time.Time      `json:"must_heartbeat_before"`
	StartedAt           *time.Time      `json:"started_at"`
	ProcessedAt         *time.Time      `json:"processed_at"`
	TaskOutput          json.RawMessage `json:"task_output"`
	LastError           string          `json:"last_error"`
	CreatedAt           time.Time       `json:"created_at"`
	// Lock, when set, is the resource whose lease the task holds while it
	// runs: it is claimed only when that lease is free, the claim acquires
	// it with the task's fence, and the task's end releases it.
	Lock string `json:"lock"`
	// Schedule names the schedule that made the task, and ScheduleTick is
	// the tick it was made for; "" and nil for tasks inserted otherwise.
	Schedule     string     `json:"schedule"`
	ScheduleTick *time.Time `json:"schedule_tick"`
	// EarlierAttempts are the attempts that ended otherwise than by the
	// completion, oldest first: the task's history. The running attempt,
	// or the completed one, is not among them: it is the task's own
	// Processor, Fence and StartedAt.
	EarlierAttempts []Attempt `json:"earlier_attempts"`
	// Metadata are string pairs that travel with the task from its insert
	// to each attempt's worker (a trace context, a tenant); nil for none.
	Metadata map[string]string `json:"metadata"`
}

// Bounds of a task's Metadata.
const (
	MaxMetadataPairs = 32
	MaxMetadataBytes = 8 << 10 // of its JSON
)

// CheckMetadata says what is wrong with m as a task's metadata: more than
// MaxMetadataPairs pairs, a key that is empty or over 255 bytes, or more
// than MaxMetadataBytes of JSON.
func CheckMetadata(m map[string]string) error {
	if len(m) > MaxMetadataPairs {
		return fmt.Errorf("metadata has %d pairs; a task carries at most %d", len(m), MaxMetadataPairs)
	}
	size := 2
	for k, v := range m {
		if k == "" || len(k) > 255 {
			return fmt.Errorf("metadata key %.40q must be 1 to 255 bytes", k)
		}
		size += len(k) + len(v) + 6
	}
	if size > MaxMetadataBytes {
		return fmt.Errorf("metadata is about %d bytes of JSON; a task carries at most %d", size, MaxMetadataBytes)
	}
	return nil
}

// wire is Task as it goes on the wire: null for the zero values.
type wire struct {
	ID                  int64             `json:"id"`
	Kind                string            `json:"kind"`
	Queue               string            `json:"queue"`
	Priority            int16             `json:"priority"`
	TaskData            json.RawMessage   `json:"task_data"`
	State               State             `json:"state"`
	UniqueKey           *string           `json:"unique_key"`
	ScheduledAt         string            `json:"scheduled_at"`
	Processor           *string           `json:"processor"`
	Fence               *int64            `json:"fence"`
	TTLSeconds          *int32            `json:"ttl_seconds"`
	Attempts            int32             `json:"attempts"`
	MaxAttempts         int32             `json:"max_attempts"`
	LastHeartbeatAt     *string           `json:"last_heartbeat_at"`
	MustHeartbeatBefore *string           `json:"must_heartbeat_before"`
	StartedAt           *string           `json:"started_at"`
	ProcessedAt         *string           `json:"processed_at"`
	TaskOutput          json.RawMessage   `json:"task_output"`
	LastError           *string           `json:"last_error"`
	CreatedAt           string            `json:"created_at"`
	Lock                *string           `json:"lock"`
	Schedule            *string           `json:"schedule"`
	ScheduleTick        *string           `json:"schedule_tick"`
	EarlierAttempts     []attemptWire     `json:"earlier_attempts"`
	Metadata            map[string]string `json:"metadata"`
}

// attemptWire is Attempt as it goes on the wire: its times as the task's
// are, and null for no error.
type attemptWire struct {
	Processor string  `json:"processor"`
	Fence     int64   `json:"fence"`
	StartedAt string  `json:"started_at"`
	ExpiresAt string  `json:"expires_at"`
	EndedAt   string  `json:"ended_at"`
	Outcome   string  `json:"outcome"`
	Error     *string `json:"error"`
}

// MarshalJSON writes the task as the API shows it: timestamps as RFC 3339
// UTC with milliseconds, null for what is not set, and earlier_attempts
// always a list ([] when there were none).
func (t Task) MarshalJSON() ([]byte, error) {
	out := t.TaskOutput
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	data := t.TaskData
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	attempts := make([]attemptWire, len(t.EarlierAttempts))
	for i, a := range t.EarlierAttempts {
		attempts[i] = attemptWire{
			Processor: a.Processor, Fence: a.Fence, StartedAt: apitime.Format(a.StartedAt),
			ExpiresAt: apitime.Format(a.ExpiresAt), EndedAt: apitime.Format(a.EndedAt),
			Outcome: a.Outcome, Error: nonZero(a.Error),
		}
	}
	return json.Marshal(wire{
		ID: t.ID, Kind: t.Kind, Queue: t.Queue, Priority: t.Priority, TaskData: data, State: t.State,
		UniqueKey: nonZero(t.UniqueKey), ScheduledAt: apitime.Format(t.ScheduledAt),
		Processor: nonZero(t.Processor), Fence: nonZero(t.Fence), TTLSeconds: nonZero(t.TTLSeconds),
		Attempts: t.Attempts, MaxAttempts: t.MaxAttempts,
		LastHeartbeatAt: apitime.FormatPtr(t.LastHeartbeatAt), MustHeartbeatBefore: apitime.FormatPtr(t.MustHeartbeatBefore),
		StartedAt: apitime.FormatPtr(t.StartedAt), ProcessedAt: apitime.FormatPtr(t.ProcessedAt),
		TaskOutput: out, LastError: nonZero(t.LastError), CreatedAt: apitime.Format(t.CreatedAt),
		Lock: nonZero(t.Lock), Schedule: nonZero(t.Schedule),
		ScheduleTick: apitime.FormatPtr(t.ScheduleTick), EarlierAttempts: attempts, Metadata: t.Metadata,
	})
}

// UnmarshalJSON reads a task as the API shows it.
func (t *Task) UnmarshalJSON(b []byte) error {
	var w struct {
		wire
		ScheduledAt         time.Time  `json:"scheduled_at"`
		LastHeartbeatAt     *time.Time `json:"last_heartbeat_at"`
		MustHeartbeatBefore *time.Time `json:"must_heartbeat_before"`
		StartedAt           *time.Time `json:"started_at"`
		ProcessedAt         *time.Time `json:"processed_at"`
		CreatedAt           time.Time  `json:"created_at"`
		ScheduleTick        *time.Time `json:"schedule_tick"`
		EarlierAttempts     []struct {
			attemptWire
			StartedAt time.Time `json:"started_at"`
			ExpiresAt time.Time `json:"expires_at"`
			EndedAt   time.Time `json:"ended_at"`
		} `json:"earlier_attempts"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*t = Task{
		ID: w.ID, Kind: w.Kind, Queue: w.Queue, Priority: w.Priority, TaskData: w.TaskData, State: w.State,
		UniqueKey: deref(w.UniqueKey), ScheduledAt: w.ScheduledAt, Processor: deref(w.Processor),
		Fence: deref(w.Fence), TTLSeconds: deref(w.TTLSeconds), Attempts: w.Attempts, MaxAttempts: w.MaxAttempts,
		LastHeartbeatAt: w.LastHeartbeatAt, MustHeartbeatBefore: w.MustHeartbeatBefore, StartedAt: w.StartedAt,
		ProcessedAt: w.ProcessedAt, TaskOutput: w.TaskOutput, LastError: deref(w.LastError), CreatedAt: w.CreatedAt,
		Lock: deref(w.Lock), Schedule: deref(w.Schedule),
		ScheduleTick: w.ScheduleTick, Metadata: w.Metadata,
	}
	if string(t.TaskOutput) == "null" {
		t.TaskOutput = nil
	}
	if len(w.EarlierAttempts) > 0 {
		t.EarlierAttempts = make([]Attempt, len(w.EarlierAttempts))
		for i, a := range w.EarlierAttempts {
			t.EarlierAttempts[i] = Attempt{
				Processor: a.Processor, Fence: a.Fence, StartedAt: a.StartedAt, ExpiresAt: a.ExpiresAt,
				EndedAt: a.EndedAt, Outcome: a.Outcome, Error: deref(a.Error),
			}
		}
	}
	return nil
}

// TTL is the task's lease TTL as a duration; zero when not set yet.
func (t Task) TTL() time.Duration { return time.Duration(t.TTLSeconds) * time.Second }

func nonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Attempt is an attempt at a task that ended otherwise than by its
// completion: an entry of the task's history.
type Attempt struct {
	Processor string    `json:"processor"`
	Fence     int64     `json:"fence"`
	StartedAt time.Time `json:"started_at"`
	// ExpiresAt is when the attempt's lease would have run out.
	ExpiresAt time.Time `json:"expires_at"`
	EndedAt   time.Time `json:"ended_at"`
	Outcome   string    `json:"outcome"` // one of the Outcome constants
	// Error is why the attempt ended: the failure's error, the
	// cancellation's reason; empty when none was given.
	Error string `json:"error,omitempty"`
}

// The outcomes of an Attempt.
const (
	OutcomeExpired   = "expired"   // its lease lapsed; EndedAt is when that was announced
	OutcomeFailed    = "failed"    // its processor failed it
	OutcomeRequeued  = "requeued"  // its processor handed it back, shutting down
	OutcomeSnoozed   = "snoozed"   // its handler asked to run again later; not counted as an attempt
	OutcomeCancelled = "cancelled" // the task was cancelled while it ran
)

// Stats counts tasks by state.
type Stats struct {
	Pending        int64 `json:"pending"`
	Running        int64 `json:"running"`
	Done           int64 `json:"done"`
	Dead           int64 `json:"dead"`
	Cancelled      int64 `json:"cancelled"`
	DoneLastMinute int64 `json:"done_last_minute"`
}
