// Package leaseholdtest helps test programs that use leasehold: run a
// worker's Work on a task without a queue (Work), check that a transaction
// inserted a task of a kind (RequireInsertedTx, RequireNotInsertedTx), and
// wait until a client
// has nothing left to do (WaitIdle), all without sleeps.
package leaseholdtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/taskoutput"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// Outcome is what a Work run would make of its task.
type Outcome string

// The outcomes of Work.
const (
	Completed Outcome = "completed" // Work returned nil: the task would be done, with Output
	Failed    Outcome = "failed"    // Work returned an error: the attempt would fail (retried or dead)
	Snoozed   Outcome = "snoozed"   // Work returned leasehold.Snooze
	Cancelled Outcome = "cancelled" // Work returned leasehold.Cancel
)

// Result is what became of one Work.
type Result struct {
	Outcome Outcome
	// Output is what Work recorded (leasehold.RecordOutput), when Completed.
	Output json.RawMessage
	// Err is what Work returned.
	Err error
	// SnoozedFor is the delay of a Snoozed.
	SnoozedFor time.Duration
}

// WorkOpts set the task that Work runs (zero values: a first attempt of
// task 1 under fence 1).
type WorkOpts struct {
	ID      int64
	Attempt int
	Fence   int64
	Queue   string
}

// Work runs w's Work on a task of args as a client would: args go through
// their JSON (so that a field Work reads but the JSON loses shows), the
// context carries the task's output slot (leasehold.RecordOutput), and a
// panic is a failure with its stack. It needs no database. Its error says
// args do not round-trip through JSON; what Work returned is in Result.
func Work[T leasehold.TaskArgs](ctx context.Context, w leasehold.Worker[T], args T, opts *WorkOpts) (*Result, error) {
	var o WorkOpts
	if opts != nil {
		o = *opts
	}
	data, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("leaseholdtest: encode the args: %w", err)
	}
	var decoded T
	if err := json.Unmarshal(data, &decoded); err != nil {
		return nil, fmt.Errorf("leaseholdtest: the args' JSON %s does not decode into %T: %w", data, decoded, err)
	}
	now := time.Now()
	t := &task.Task{
		ID: max(o.ID, 1), Kind: args.Kind(), Queue: or(o.Queue, task.DefaultQueue), TaskData: data, State: task.StateRunning,
		Attempts: int32(max(o.Attempt, 1)), MaxAttempts: task.DefaultMaxAttempts, Fence: max(o.Fence, 1),
		Processor: "leaseholdtest/w1", ScheduledAt: now, CreatedAt: now, StartedAt: &now,
	}
	ctx, slot := taskoutput.With(ctx)
	err = run(ctx, w, &leasehold.Task[T]{Task: t, Args: decoded})
	var (
		snooze *worker.SnoozeError
		cancel *worker.CancelError
	)
	switch {
	case err == nil && len(slot.Out) > task.MaxPayloadBytes:
		return &Result{Outcome: Failed, Err: fmt.Errorf("the output is %d bytes of JSON; task_output holds at most %d (task.MaxPayloadBytes)",
			len(slot.Out), task.MaxPayloadBytes)}, nil
	case err == nil:
		return &Result{Outcome: Completed, Output: slot.Out}, nil
	case errors.As(err, &snooze):
		return &Result{Outcome: Snoozed, Err: err, SnoozedFor: snooze.Delay}, nil
	case errors.As(err, &cancel):
		return &Result{Outcome: Cancelled, Err: err}, nil
	}
	return &Result{Outcome: Failed, Err: err}, nil
}

func run[T leasehold.TaskArgs](ctx context.Context, w leasehold.Worker[T], t *leasehold.Task[T]) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v\n\n%s", v, debug.Stack())
		}
	}()
	return w.Work(ctx, t)
}

func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// TB is what the Require functions need of a *testing.T.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// RequireInsertedTx returns the newest task of T's kind that tx sees (so
// one tx inserted, or one committed before), decoded, and fails the test
// when there is none. With queue set, the task must be in that queue.
func RequireInsertedTx[T leasehold.TaskArgs](ctx context.Context, tb TB, tx pgx.Tx, queue string) *leasehold.Task[T] {
	tb.Helper()
	var zero T
	kind := zero.Kind()
	tasks := insertedTx(ctx, tb, tx, kind, queue, 1)
	if len(tasks) == 0 {
		where := ""
		if queue != "" {
			where = " in queue " + queue
		}
		tb.Fatalf("leaseholdtest: no task of kind %q%s was inserted", kind, where)
		return nil
	}
	var args T
	if err := json.Unmarshal(tasks[0].TaskData, &args); err != nil {
		tb.Fatalf("leaseholdtest: task %d's task_data %s does not decode into %T: %v", tasks[0].ID, tasks[0].TaskData, args, err)
	}
	return &leasehold.Task[T]{Task: &tasks[0], Args: args}
}

// RequireNotInsertedTx fails the test when tx sees a task of T's kind (in
// queue, when set).
func RequireNotInsertedTx[T leasehold.TaskArgs](ctx context.Context, tb TB, tx pgx.Tx, queue string) {
	tb.Helper()
	var zero T
	if tasks := insertedTx(ctx, tb, tx, zero.Kind(), queue, 1); len(tasks) > 0 {
		tb.Fatalf("leaseholdtest: task %d of kind %q was inserted; want none", tasks[0].ID, zero.Kind())
	}
}

// insertedTx reads the newest tasks of kind (in queue) that tx sees, whole.
func insertedTx(ctx context.Context, tb TB, tx pgx.Tx, kind, queue string, limit int) []task.Task {
	tb.Helper()
	ts, err := taskstore.NewestTx(ctx, tx, kind, queue, limit)
	if err != nil {
		tb.Fatalf("leaseholdtest: read the tasks: %v", err)
	}
	return ts
}

// idleCheck bounds the wait between two looks of WaitIdle at the queue when
// no event came: for a task scheduled for later, or run by another client.
const idleCheck = time.Second

// WaitIdle returns once none of the tasks of c's kinds in c's queues is
// running or due: what c's started workers would take is all done (or
// failed for later, or scheduled for later; due counts by the test's
// clock). It looks again as each of c's attempts ends (Subscribe), so a
// test waits no longer than the work takes; ctx bounds it (give it a
// deadline).
func WaitIdle(ctx context.Context, c *leasehold.Client) error {
	kinds := c.Kinds()
	if len(kinds) == 0 {
		return errors.New("leaseholdtest: WaitIdle needs a client with Workers")
	}
	events, end := c.Subscribe()
	defer end()
	for {
		// A look spans several queries; an attempt that ended during it
		// may have put its task back (a retry, a lost lease), so a quiet
		// look counts only if no attempt ended while it was taken.
		drain(events)
		busy, err := busy(ctx, c, kinds, c.Queues())
		if err != nil {
			return err
		}
		if !busy {
			if !drain(events) {
				return nil
			}
			continue
		}
		timer := time.NewTimer(idleCheck)
		select {
		case <-events:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return context.Cause(ctx)
		}
		timer.Stop()
	}
}

// drain empties events and reports whether any were waiting.
func drain(events <-chan *leasehold.Event) bool {
	got := false
	for {
		select {
		case <-events:
			got = true
		default:
			return got
		}
	}
}

// busy reports whether a task of kinds in queues is pending and due, or
// running. It looks at pending tasks first: a task only moves forward
// (pending, running, finished) except when an attempt ends, which WaitIdle
// watches, so a task that starts between the two looks is still seen
// running.
func busy(ctx context.Context, c *leasehold.Client, kinds, queues []string) (bool, error) {
	now := time.Now()
	for _, kind := range kinds {
		for _, queue := range queues {
			b, err := busyIn(ctx, c, kind, queue, now)
			if err != nil || b {
				return b, err
			}
		}
	}
	return false, nil
}

func busyIn(ctx context.Context, c *leasehold.Client, kind, queue string, now time.Time) (bool, error) {
	for _, state := range []task.State{task.StatePending, task.StateRunning} {
		for after := int64(0); ; {
			page, err := c.ListTasks(ctx, leasehold.ListTasksParams{Kind: kind, Queue: queue, State: state, AfterID: after, Limit: 1000})
			if err != nil {
				return false, err
			}
			for _, t := range page {
				if state == task.StateRunning || !t.ScheduledAt.After(now) {
					return true, nil
				}
			}
			if len(page) == 0 {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	return false, nil
}
