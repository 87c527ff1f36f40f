package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/keepalive"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// runner runs claimed tasks: the handler under the task's lease, kept alive
// by heartbeats, then the final write. A Pool's runner writes to the
// database (completions in batches, through its completer); a
// RemotePool's, to a leasehold service's REST API.
type runner struct {
	ops      Ops
	complete func(ctx context.Context, c taskstore.Completion) (*claim, error)
	handler  Handler
	ttl      time.Duration // of a task that has none of its own
	// grace is how long the handler takes to stop once its context ends
	// (lease.KeepConfig.Grace, at most half a TTL): the lease is given up
	// that much earlier, so that the handler is done before anyone else
	// could claim the task.
	grace time.Duration
	// held, when set, sends held heartbeats (a remote pool's).
	held *heldHeartbeats
	// transient, when set, tells a failed final write worth making again
	// from a refusal (RemotePool.Transient); nil retries every failure.
	transient func(error) bool
	log       zerolog.Logger
	counters  *counters
	onEvent   func(Event)
}

func (r *runner) emit(e Event) {
	if r.onEvent != nil {
		r.onEvent(e)
	}
}

// Ops are the writes a worker makes under its task's lease, each a
// compare-and-set on (processor, fence, lease live) that answers
// task.ErrLeaseLost when refused: *taskstore.Store's, or a REST client's.
type Ops interface {
	Heartbeat(ctx context.Context, id int64, processor string, fence int64) (task.Task, error)
	Complete(ctx context.Context, id int64, processor string, fence int64, output json.RawMessage) (task.Task, error)
	Fail(ctx context.Context, id int64, processor string, fence int64, reason string, retryIn time.Duration) (task.Task, error)
	Requeue(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error)
	Snooze(ctx context.Context, id int64, processor string, fence int64, delay time.Duration) (task.Task, error)
	CancelHeld(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error)
	Get(ctx context.Context, id int64) (task.Task, error)
}

// taskTTL is the TTL of t's lease: its own, which the claim set, or the
// pool's default for a row that has none.
func (r *runner) taskTTL(t task.Task) time.Duration { return ttlOf(t, r.ttl) }

// ttlOf is t's lease TTL, or def when its claim said none.
func ttlOf(t task.Task, def time.Duration) time.Duration {
	if t.TTLSeconds > 0 {
		return t.TTL()
	}
	return def
}

// work runs one claimed task under its lease, then completes it, fails it,
// hands it back (shutdown), snoozes or cancels it as its handler asks; when
// the lease was given up at its local deadline it hands the task back under
// its fence, and when a heartbeat was refused (the lease taken, the task
// cancelled) it leaves the task alone. workCtx ends when the shutdown
// grace is over. It returns what became of the task and, when the
// completion's statement claimed one, the worker's next task.
func (r *runner) work(workCtx context.Context, w *worker, c *claim) (EventKind, *claim) {
	t := &c.task // not a copy: the closures below share it
	ttl := r.taskTTL(*t)
	keep := lease.KeepConfig{TTL: ttl, Grace: min(r.grace, ttl/2)}.WithDefaults()
	if keep.Grace > 0 {
		keep.RenewInterval = keep.Window() / 3
		keep.RetryInterval = keep.RenewInterval / 4
	}
	// The first heartbeat is due nearly an interval after the claim (the
	// earliest its jitter allows); a held one, at once after
	// firstHeldHeartbeat, so that a cancellation is heard from then on.
	firstDue := keep.RenewInterval - keep.RenewInterval/10
	var hold, interval time.Duration
	if r.held != nil {
		keep, hold, interval = r.held.config(keep)
		if hold > 0 {
			firstDue = firstHeldHeartbeat
		}
	}
	// The task's logger, made when something is worth saying: most tasks
	// of a busy queue say nothing.
	log := sync.OnceValue(func() *zerolog.Logger {
		l := r.log.With().Int64("task", t.ID).Str("kind", t.Kind).Str("processor", w.name).Int64("fence", t.Fence).Int32("attempt", t.Attempts).Logger()
		return &l
	})
	ev := Event{Processor: w.name, TaskID: t.ID, TaskKind: t.Kind, Fence: t.Fence, Attempts: t.Attempts}

	// The task runs under taskCtx, which the heartbeats cancel the moment
	// the lease counts as lost, and a cancellation's NOTIFY at once.
	taskCtx, cancelTask := context.WithCancelCause(workCtx)
	defer cancelTask(nil)
	w.running.Store(&runningTask{id: t.ID, cancel: cancelTask})
	defer w.running.Store(nil)
	// The lease's local deadline when the heartbeats stopped; the claim's
	// when none was due.
	deadline := c.sent.Add(keep.Window())
	// The heartbeat goroutine, and its context, start when the first
	// heartbeat is nearly due (the earliest its jitter allows): most tasks
	// of a busy queue are over by then, and cost neither.
	var (
		hb             sync.WaitGroup
		hbMu           sync.Mutex
		stopped        bool
		stopHeartbeats context.CancelFunc
	)
	first := time.AfterFunc(time.Until(c.sent.Add(firstDue)), func() {
		hbMu.Lock()
		defer hbMu.Unlock()
		if !stopped {
			var hbCtx context.Context
			hbCtx, stopHeartbeats = context.WithCancel(taskCtx)
			hb.Go(func() { deadline = r.heartbeat(hbCtx, log, *t, w.name, keep, hold, interval, c.sent, cancelTask) })
		}
	})
	output, runErr := r.run(taskCtx, *t)
	first.Stop()
	hbMu.Lock()
	stopped = true
	if stopHeartbeats != nil {
		stopHeartbeats()
	}
	hbMu.Unlock()
	hb.Wait()
	if context.Cause(taskCtx) == nil && !time.Now().Before(deadline) {
		// The deadline passed and nothing said so yet: the process went on
		// after a pause (or was not scheduled), and the handler's return was
		// seen before the deadline's timer ran. The clock decides, not which
		// goroutine ran first: the lease counts as lost, and nothing is
		// reported under it.
		cancelTask(fmt.Errorf("task %d: %w", t.ID, lease.ErrDeadline))
	}
	cause := context.Cause(taskCtx)

	var (
		snooze *SnoozeError
		cancel *CancelError
		retry  *RetryError
	)
	switch {
	case errors.Is(runErr, ErrAbandon):
		// A dead process does nothing more: the lease lapses, and the
		// reaper's expiry notification wakes a worker to take the task.
		log().Warn().Msg("the handler abandoned the task (a simulated crash): left to its lease")
		r.counters.crashed.Add(1)
		ev.Kind = EventCrashed
		r.emit(ev)
		return EventCrashed, nil
	case errors.Is(cause, lease.ErrDeadline):
		// Given up at the deadline, not refused: the last heartbeat may have
		// renewed the lease although its answer never came. The handler has
		// returned, so the task goes back under its fence now (refused, and
		// nothing changes, if the lease lapsed) instead of waiting out a
		// lease nobody holds.
		log().Warn().Err(cause).Bool("interrupted", runErr != nil).Msg("the task's lease was given up at its deadline; the handler was stopped (or had returned), handing the task back")
		handBack(r.ops, r.transient, *log(), *t, w.name, ttl, "the worker gave the lease up at its deadline: "+cause.Error())
		r.counters.leaseLost.Add(1)
		ev.Kind, ev.Err, ev.Interrupted = EventLeaseLost, cause, runErr != nil
		r.emit(ev)
		return EventLeaseLost, nil
	case errors.Is(cause, task.ErrCancelled):
		log().Warn().Err(cause).Bool("interrupted", runErr != nil).Msg("the task was cancelled; its handler was stopped and nothing is reported")
		r.counters.leaseLost.Add(1)
		ev.Kind, ev.Err, ev.Interrupted = EventLeaseLost, cause, runErr != nil
		r.emit(ev)
		return EventLeaseLost, nil
	case errors.Is(cause, task.ErrLeaseLost):
		log().Warn().Err(cause).Bool("interrupted", runErr != nil).Msg("the task's lease was lost; its handler was stopped (or had returned) and nothing is reported")
		r.counters.leaseLost.Add(1)
		ev.Kind, ev.Err, ev.Interrupted = EventLeaseLost, cause, runErr != nil
		r.emit(ev)
		return EventLeaseLost, nil
	case runErr == nil && len(output) > task.MaxPayloadBytes:
		// More than task_output holds: no write could record it, embedded
		// or remote. The attempt fails, saying so, rather than complete
		// with something else or be retried until the lease lapses.
		failure := fmt.Errorf("the handler's output is %d bytes of JSON; task_output holds at most %d (task.MaxPayloadBytes): store large results elsewhere and return where",
			len(output), task.MaxPayloadBytes)
		log().Warn().Err(failure).Msg("the task's output is too large to record; failing the attempt")
		ev.Err = failure
		return r.finishKind(workCtx, log, ev, deadline, ttl, EventFailed, func(ctx context.Context) (string, error) {
			t, err := r.ops.Fail(ctx, t.ID, w.name, t.Fence, errorText(failure), -1)
			return t.State, err
		}), nil
	case runErr == nil:
		var next *claim // from the last attempt: a retry's batch claims afresh
		kind, err := r.finish(workCtx, log, ev, deadline, ttl, EventCompleted, func(ctx context.Context) (string, error) {
			n, err := r.complete(ctx, taskstore.Completion{ID: t.ID, Processor: w.name, Fence: t.Fence, Output: output})
			next = n
			return task.StateDone, err
		})
		if kind == "" && r.transient != nil && err != nil && !r.transient(err) {
			// The service refused the output itself (a 400, a 413): no
			// retry can change that, and the attempt fails with its reason
			// rather than run again once the lease lapses.
			log().Warn().Err(err).Msg("the service refused the task's output; failing the attempt")
			failure := fmt.Errorf("the handler returned, but its output could not be recorded: %w", err)
			ev.Err = failure
			kind, _ = r.finish(workCtx, log, ev, deadline, ttl, EventFailed, func(ctx context.Context) (string, error) {
				t, err := r.ops.Fail(ctx, t.ID, w.name, t.Fence, errorText(failure), -1)
				return t.State, err
			})
		}
		return kind, next
	case workCtx.Err() != nil && errors.Is(runErr, context.Canceled):
		reason := "the worker shut down before the task finished"
		if !errors.Is(runErr, ErrShutdown) && runErr.Error() != context.Canceled.Error() {
			reason += ": " + runErr.Error()
		}
		return r.finishKind(workCtx, log, ev, deadline, ttl, EventRequeued, func(ctx context.Context) (string, error) {
			t, err := r.ops.Requeue(ctx, t.ID, w.name, t.Fence, FailureText(reason))
			return t.State, err
		}), nil
	case errors.As(runErr, &snooze):
		return r.finishKind(workCtx, log, ev, deadline, ttl, EventSnoozed, func(ctx context.Context) (string, error) {
			t, err := r.ops.Snooze(ctx, t.ID, w.name, t.Fence, snooze.Delay)
			return t.State, err
		}), nil
	case errors.As(runErr, &cancel):
		ev.Err = runErr
		return r.finishKind(workCtx, log, ev, deadline, ttl, EventCancelled, func(ctx context.Context) (string, error) {
			// The holder's own cancellation: a compare-and-set on its lease.
			ct, err := r.ops.CancelHeld(ctx, t.ID, w.name, t.Fence, errorText(cancel.Err))
			return ct.State, err
		}), nil
	default:
		ev.Err = runErr
		retryIn := time.Duration(-1) // the default backoff
		if errors.As(runErr, &retry) {
			retryIn = max(retry.Delay, 0)
		}
		return r.finishKind(workCtx, log, ev, deadline, ttl, EventFailed, func(ctx context.Context) (string, error) {
			t, err := r.ops.Fail(ctx, t.ID, w.name, t.Fence, errorText(runErr), retryIn)
			return t.State, err
		}), nil
	}
}

// handBack gives t back to the queue under its fence, its attempt not
// counted, best effort: within ttl less a tenth, after which its lease has
// lapsed anyway. Refused, and nothing changes, when the lease is gone.
func handBack(ops Ops, transient func(error) bool, log zerolog.Logger, t task.Task, processor string, ttl time.Duration, reason string) {
	err := requeueUntil(ops, transient, t, processor, reason, time.Now().Add(ttl-ttl/10), ttl/12)
	if err != nil && !errors.Is(err, task.ErrLeaseLost) && !errors.Is(err, task.ErrNotFound) {
		log.Warn().Err(err).Int64("task", t.ID).Msg("could not hand the task back; it is claimed again when its lease lapses")
	}
}

// requeueUntil puts t back in its queue under its fence, asking again every
// retryEvery while the failure may pass (transient, nil for every failure)
// until deadline: a put-back whose answer was lost (a replica that failed
// mid-request) is made again, and if the first had committed, the second is
// refused under the fence, which is as good. A refusal under the lease
// (task.ErrLeaseLost) or a task gone (task.ErrNotFound) is returned at once:
// either way the lease is not this holder's any more.
func requeueUntil(ops Ops, transient func(error) bool, t task.Task, processor, reason string, deadline time.Time, retryEvery time.Duration) error {
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := ops.Requeue(ctx, t.ID, processor, t.Fence, reason)
		cancel()
		switch {
		case err == nil || errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			return err
		case transient != nil && !transient(err):
			return err
		case !time.Now().Add(retryEvery).Before(deadline):
			return err
		}
		time.Sleep(retryEvery)
	}
}

// MaxErrorBytes bounds the error a failed attempt records, as the REST
// API's fail does.
const MaxErrorBytes = 4096

// errorText is err as a failed attempt records it (FailureText), never
// empty.
func errorText(err error) string {
	s := err.Error()
	if s == "" {
		s = fmt.Sprintf("%T with an empty message", err)
	}
	return FailureText(s)
}

// FailureText is s as a failed attempt, a cancellation or a hand-back
// records it: valid UTF-8, no NUL (which PostgreSQL text cannot hold), at
// most MaxErrorBytes, cut at a character's start with "..." where it was
// longer. The one rule for every worker's texts.
func FailureText(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", " ")
	if len(s) <= MaxErrorBytes {
		return s
	}
	cut := MaxErrorBytes - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// run calls the handler, turning a panic into a *PanicError.
func (r *runner) run(ctx context.Context, t task.Task) (output json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			output, err = nil, &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.handler(ctx, t)
}

// finish makes the task's final write (complete, fail, requeue, snooze,
// cancel), even when ctx has ended, retrying a failed write while the
// service may still hold the lease for this worker: until a TTL past the
// lease's local deadline, for a heartbeat sent just before the deadline may
// have renewed the lease although its answer was lost. The write is made
// under the fence: once the lease has lapsed it is refused, and nothing
// changes. It returns kind when the write succeeded, EventLeaseLost when it
// was refused under the lease, "" and the error when it could not be made:
// the time ran out, or the service refused it for good (see
// RemotePool.Transient).
func (r *runner) finish(ctx context.Context, log func() *zerolog.Logger, ev Event, deadline time.Time, ttl time.Duration,
	kind EventKind, write func(ctx context.Context) (state string, err error),
) (EventKind, error) {
	ev.Kind = kind
	margin, retryEvery := ttl/10, ttl/12
	horizon := deadline.Add(ttl)
	for retry := false; ; retry = true {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(time.Until(horizon), 0)+margin)
		state, err := write(wctx)
		if retry && errors.Is(err, task.ErrLeaseLost) {
			// The attempt that seemed to fail may have committed.
			if cur, gerr := r.ops.Get(wctx, ev.TaskID); gerr == nil && cur.Fence == ev.Fence && committed(kind, cur) {
				state, err = cur.State, nil
			}
		}
		cancel()
		switch {
		case err == nil:
			ev.State = state
			switch kind {
			case EventCompleted:
				r.counters.completed.Add(1)
				if r.log.Debug().Enabled() {
					log().Debug().Msg("task completed")
				}
			case EventFailed:
				r.counters.failed.Add(1)
				log().Info().Err(ev.Err).Str("state", state).Msg("task failed")
			case EventRequeued:
				r.counters.requeued.Add(1)
				log().Info().Msg("handed the task back at shutdown")
			case EventSnoozed:
				r.counters.snoozed.Add(1)
				log().Debug().Msg("snoozed task")
			case EventCancelled:
				r.counters.cancelled.Add(1)
				log().Info().Err(ev.Err).Msg("the handler cancelled its task")
			}
			r.emit(ev)
			return kind, nil
		case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			log().Warn().Err(err).Msgf("the task could not be recorded as %s: its lease was lost (it lapsed, or the task was cancelled)", kind)
			r.counters.leaseLost.Add(1)
			ev.Kind, ev.Err = EventLeaseLost, err
			r.emit(ev)
			return EventLeaseLost, nil
		case r.transient != nil && !r.transient(err):
			if kind != EventCompleted { // a refused completion fails the attempt: the caller says so
				log().Error().Err(err).Msgf("the service refused to record the task as %s; it is claimed again when its lease lapses", kind)
			}
			return "", err
		case !time.Now().Add(retryEvery).Before(horizon):
			log().Warn().Err(err).Msgf("could not record the task as %s while its lease could be live; it is claimed again when its lease lapses", kind)
			return "", err
		default:
			ev := log().Debug()
			if !retry {
				ev = log().Warn() // once per task: the retries are no news
			}
			ev.Err(err).Msgf("could not record the task as %s; retrying while its lease could be live", kind)
			time.Sleep(retryEvery)
		}
	}
}

// finishKind is finish without its error, for the writes whose refusal
// leaves nothing more to do.
func (r *runner) finishKind(ctx context.Context, log func() *zerolog.Logger, ev Event, deadline time.Time, ttl time.Duration,
	kind EventKind, write func(ctx context.Context) (state string, err error),
) EventKind {
	k, _ := r.finish(ctx, log, ev, deadline, ttl, kind, write)
	return k
}

// committed reports whether cur, read after a write of kind whose answer
// was lost, shows that write: then its retry's refusal is its own doing.
func committed(kind EventKind, cur task.Task) bool {
	switch kind {
	case EventCompleted:
		return cur.State == task.StateDone
	case EventCancelled:
		return cur.State == task.StateCancelled
	}
	return false // a failure or a put-back leaves nothing that says it was this one
}

// heartbeat renews the task's lease every third of its TTL (with jitter)
// until ctx ends, through the keep-alive loop every lease holder uses, and
// calls lost — at once — when the lease counts as lost: a heartbeat was
// refused, or none succeeded before the local deadline (the time the claim
// or the last successful heartbeat was sent + TTL − margin). It returns the
// deadline as it stood when it stopped.
func (r *runner) heartbeat(ctx context.Context, log func() *zerolog.Logger, t task.Task, processor string, keep lease.KeepConfig,
	hold, interval time.Duration, sent time.Time, lost context.CancelCauseFunc,
) time.Time {
	failing := false // the last heartbeat failed: the retries are logged at debug level
	beat := func(ctx context.Context) error {
		if r.held != nil {
			return r.held.heartbeat(ctx, t, processor, heldWait(ctx, hold, interval))
		}
		_, err := r.ops.Heartbeat(ctx, t.ID, processor, t.Fence)
		return err
	}
	loop := keepalive.Loop{
		Config: keep,
		Renew: func(ctx context.Context) error {
			err := beat(ctx)
			if err == nil && failing {
				log().Info().Msg("heartbeat succeeded again")
				failing = false
			}
			return err
		},
		Refused: keepalive.Refusal(task.ErrLeaseLost, task.ErrNotFound),
		Lost: func(reason error) {
			lost(fmt.Errorf("task %d: %w", t.ID, reason))
		},
		RenewFailed: func(err error) {
			r.emit(Event{Kind: EventHeartbeatFailed, Processor: processor, TaskID: t.ID, TaskKind: t.Kind, Fence: t.Fence, Err: err})
			if errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound) {
				return
			}
			ev := log().Debug()
			if !failing {
				ev = log().Warn()
			}
			failing = true
			ev.Err(err).Msg("heartbeat failed; retrying until the lease's deadline")
		},
	}
	deadline, _ := loop.Run(ctx, sent)
	return deadline
}
