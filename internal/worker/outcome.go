package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/task"
)

// Handler runs one task under its lease. It returns nil to complete the task
// with output (nil: null), or an error to fail it; the errors below ask for
// more than a failure. ctx ends as soon as the lease is lost (its cause
// wraps task.ErrLeaseLost or lease.ErrDeadline) or the task is cancelled
// (task.ErrCancelled), and when the pool's shutdown grace is over
// (ErrShutdown): a handler that returns then has its task put back, not
// failed.
type Handler func(ctx context.Context, t task.Task) (output json.RawMessage, err error)

// SnoozeError is what a handler returns to put its task back to run again
// after Delay without counting the attempt.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// CancelError is what a handler returns to cancel its task: it is not
// retried.
type CancelError struct{ Err error }

func (e *CancelError) Error() string { return "cancelled by its handler: " + e.Err.Error() }

// Unwrap returns the handler's reason.
func (e *CancelError) Unwrap() error { return e.Err }

// RetryError is what a handler returns to fail the attempt with a retry
// after Delay instead of the default backoff (the kind's retry policy).
type RetryError struct {
	Err   error
	Delay time.Duration
}

func (e *RetryError) Error() string { return e.Err.Error() }

// Unwrap returns the failure.
func (e *RetryError) Unwrap() error { return e.Err }

// ErrAbandon is what a handler returns to make the worker leave the task as
// a process that died would: no completion, no failure, no more heartbeats;
// the lease lapses and the task is claimed again. The demo's simulated
// crash uses it when its crash hook returns.
var ErrAbandon = errors.New("task abandoned")

// ErrShutdown is the cause of a running task's context when the pool's
// shutdown grace is over.
var ErrShutdown = errors.New("worker pool shutting down")

// PanicError is a handler's panic, recovered: the task fails with it.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", e.Value, e.Stack) }

// graceFor calls cancel when the shutdown grace is over: after grace, or
// when abort (if set) is closed. The function it returns stops waiting.
func graceFor(grace time.Duration, abort <-chan struct{}, cancel func()) (stop func()) {
	if abort == nil {
		t := time.AfterFunc(max(grace, 0), cancel)
		return func() { t.Stop() }
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-abort:
			cancel()
		case <-done:
		}
	}()
	return func() { close(done) }
}
