package leasehold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/taskoutput"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// TaskArgs are the arguments of a task of one kind: a type whose JSON
// encoding is the task's task_data (a JSON object), and whose Kind names
// what runs it. Define Kind on the value, not the pointer:
//
//	type WelcomeEmail struct {
//		UserID int64 `json:"user_id"`
//	}
//
//	func (WelcomeEmail) Kind() string { return "welcome_email" }
type TaskArgs interface {
	Kind() string
}

// InsertOptsProvider is implemented by TaskArgs that carry defaults for
// their inserts (a queue, a priority, ...); an insert's own InsertOpts
// override them field by field.
type InsertOptsProvider interface {
	InsertOpts() InsertOpts
}

// Task is a claimed task with its arguments decoded: what a Worker's Work
// is given. The embedded *task.Task has the rest: its ID, Fence (the
// fencing token of this attempt's lease: pass it to whatever the task
// writes, so that a stale attempt can be refused), Attempts (this one
// included), Processor, TTLSeconds, ...
type Task[T TaskArgs] struct {
	*task.Task
	Args T
}

// Worker runs the tasks of one kind. Work runs with ctx cancelled as soon
// as the task's lease is lost (context.Cause wraps task.ErrLeaseLost or
// lease.ErrDeadline), the task is cancelled (task.ErrCancelled), its kind's
// Timeout passes, or the client's shutdown grace is over: then return
// promptly, since nothing the worker reports will be accepted.
//
// Return nil to complete the task (with RecordOutput's output, if any), an
// error to fail the attempt (retried after the kind's backoff, or dead
// after its max attempts), Snooze(d) to run it again later without counting
// the attempt, or Cancel(err) to give up on it for good. A panic fails the
// attempt with its stack.
type Worker[T TaskArgs] interface {
	Work(ctx context.Context, t *Task[T]) error
}

// WorkFunc makes a function a Worker. Its type argument follows from the
// function's:
//
//	leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[Hello]) error {
//		…
//	}), leasehold.KindConfig{})
//
// A nil f makes a worker AddWorker refuses.
func WorkFunc[T TaskArgs](f func(ctx context.Context, t *Task[T]) error) Worker[T] {
	return workFunc[T](f)
}

// workFunc is a function that is a Worker.
type workFunc[T TaskArgs] func(ctx context.Context, t *Task[T]) error

func (f workFunc[T]) Work(ctx context.Context, t *Task[T]) error { return f(ctx, t) }

// KindConfig is how the tasks of one kind are run. The zero value is the
// defaults.
type KindConfig struct {
	// MaxAttempts is the attempts a task of this kind gets when its insert
	// (through a client with these Workers) names none: 1 to 100, zero for
	// task.DefaultMaxAttempts.
	MaxAttempts int
	// Timeout, when not zero, bounds each attempt: Work's context ends
	// then, and the attempt fails with a timeout error.
	Timeout time.Duration
	// Backoff, when set, is how long a failed attempt waits before the
	// next: it gets the number of the attempt that failed (1 for the
	// first). Nil: the service's default, 1 s × 2^(attempt−1), at most
	// 5 min, times a random 0.5–1.
	Backoff func(attempt int) time.Duration
}

// Workers are the kinds a Client runs, each with its Worker. Make it with
// NewWorkers, add each kind with AddWorker, then pass it in Config.Workers.
// It is safe for concurrent use, but a Client reads it once, in NewClient.
type Workers struct {
	mu    sync.Mutex
	kinds map[string]*kindWorker
}

// kindWorker is one registered kind.
type kindWorker struct {
	cfg KindConfig
	run worker.Handler
}

// NewWorkers returns an empty set of workers.
func NewWorkers() *Workers { return &Workers{kinds: map[string]*kindWorker{}} }

// AddWorker registers worker for the kind of T, with cfg. It returns an
// error wrapping ErrInvalidConfig, and registers nothing, when w or worker
// is nil, the kind is not a valid name (T's Kind on its zero value), it is
// registered already, or cfg is out of range.
func AddWorker[T TaskArgs](w *Workers, worker Worker[T], cfg KindConfig) error {
	if w == nil {
		return fmt.Errorf("%w: AddWorker needs Workers from NewWorkers, not nil", ErrInvalidConfig)
	}
	if isNil(worker) {
		return fmt.Errorf("%w: AddWorker needs a worker, not a nil %T", ErrInvalidConfig, worker)
	}
	kind, err := kindOf[T]()
	if err != nil {
		return err
	}
	if cfg.MaxAttempts < 0 || cfg.MaxAttempts > 100 {
		return fmt.Errorf("%w: kind %q: MaxAttempts %d must be 1 to 100, or 0 for the default", ErrInvalidConfig, kind, cfg.MaxAttempts)
	}
	if cfg.Timeout < 0 {
		return fmt.Errorf("%w: kind %q: Timeout %s must not be negative (zero: no timeout)", ErrInvalidConfig, kind, cfg.Timeout)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kinds == nil {
		w.kinds = map[string]*kindWorker{}
	}
	if _, dup := w.kinds[kind]; dup {
		return fmt.Errorf("%w: kind %q has a worker already", ErrInvalidConfig, kind)
	}
	w.kinds[kind] = &kindWorker{cfg: cfg, run: handlerOf(kind, worker, cfg)}
	return nil
}

// isNil reports whether v is nil, or an interface holding a nil func,
// pointer, map, channel or slice (a declared but unset WorkFunc), whose
// method would panic on every task.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Func, reflect.Pointer, reflect.Map, reflect.Chan, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// kindOf is T's Kind, on its zero value, checked as a name.
func kindOf[T TaskArgs]() (kind string, err error) {
	var zero T
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %T's Kind panicked on the zero value (%v); define Kind on the value type, returning a constant", ErrInvalidConfig, zero, v)
		}
	}()
	kind = zero.Kind()
	if err := checkName("kind", kind); err != nil {
		return "", fmt.Errorf("%w: %T's Kind: %w", ErrInvalidConfig, zero, err)
	}
	return kind, nil
}

// list returns the registered kinds, sorted, and their workers.
func (w *Workers) list() ([]string, map[string]*kindWorker) {
	if w == nil {
		return nil, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	kinds := make([]string, 0, len(w.kinds))
	m := make(map[string]*kindWorker, len(w.kinds))
	for k, v := range w.kinds {
		kinds = append(kinds, k)
		m[k] = v
	}
	slices.Sort(kinds)
	return kinds, m
}

// RecordOutput records v, encoded as JSON, as the output of the task that
// ctx belongs to: its task_output once Work returns nil. It returns an
// error when ctx is not a Work's, or v does not encode.
func RecordOutput(ctx context.Context, v any) error {
	slot, ok := taskoutput.From(ctx)
	if !ok {
		return errors.New("RecordOutput: ctx is not the context of a task's Work")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("RecordOutput: %w", err)
	}
	slot.Out = b
	return nil
}

// Snooze is what Work returns to run its task again after d, without
// counting the attempt (the attempt stays in the task's history, as
// snoozed).
func Snooze(d time.Duration) error { return &worker.SnoozeError{Delay: max(d, 0)} }

// Cancel is what Work returns to give up on its task for good: it becomes
// cancelled, with err as the reason, and is not retried (Client.Retry can
// still put it back).
func Cancel(err error) error {
	if err == nil {
		err = errors.New("cancelled by its worker")
	}
	return &worker.CancelError{Err: err}
}

// handlerOf adapts a typed worker to the engine's Handler: it decodes the
// task's data into T, gives Work a context with the kind's timeout and an
// output slot, and turns a failure into a retry after the kind's backoff.
func handlerOf[T TaskArgs](kind string, w Worker[T], cfg KindConfig) worker.Handler {
	return func(ctx context.Context, row task.Task) (json.RawMessage, error) {
		var args T
		if err := json.Unmarshal(row.TaskData, &args); err != nil {
			return nil, fmt.Errorf("task_data of kind %q does not decode into %T: %w", kind, args, err)
		}
		ctx, slot := taskoutput.With(ctx)
		if cfg.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
		}
		err := w.Work(ctx, &Task[T]{Task: &row, Args: args})
		if err == nil {
			return slot.Out, nil
		}
		if cfg.Timeout > 0 && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			err = fmt.Errorf("the attempt timed out after %s (the kind's Timeout): %w", cfg.Timeout, err)
		}
		var (
			snooze *worker.SnoozeError
			cancel *worker.CancelError
		)
		if cfg.Backoff != nil && !errors.As(err, &snooze) && !errors.As(err, &cancel) {
			err = &worker.RetryError{Err: err, Delay: max(cfg.Backoff(int(row.Attempts)), 0)}
		}
		return nil, err
	}
}
