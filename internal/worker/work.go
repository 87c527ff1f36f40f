package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lease"
	"github.com/leasehold/leasehold/internal/task"
)

// errCrashed is what a task's run returns after a simulated crash whose
// Crash hook returned: the worker must behave as if it had died.
var errCrashed = errors.New("simulated crash")

// work runs one claimed task under its lease, then completes it, fails it,
// hands it back (shutdown) or, when the lease was lost, leaves it alone.
// workCtx ends when the shutdown grace is over. It returns what became of
// the task and, when the completion's statement claimed one, the worker's
// next task.
func (p *Pool) work(workCtx context.Context, w *worker, c claim) (EventKind, *claim) {
	t := c.task
	fence := deref(t.Fence)
	log := p.log.With().Int64("task", t.ID).Str("processor", w.name).Int64("fence", fence).Int32("attempt", t.Attempts).Logger()
	ev := Event{Processor: w.name, TaskID: t.ID, Fence: fence, Attempts: t.Attempts}

	// The task runs under taskCtx, which the heartbeat cancels the moment
	// the lease counts as lost.
	taskCtx, cancelTask := context.WithCancelCause(workCtx)
	defer cancelTask(nil)
	hbCtx, stopHeartbeats := context.WithCancel(taskCtx)
	// The lease's local deadline when the heartbeats stopped; the claim's
	// when none was due.
	deadline := c.sent.Add(p.TTL - p.margin())
	// The heartbeat goroutine starts when the first heartbeat is nearly
	// due (the earliest its jitter allows): most tasks of a busy queue are
	// over by then, and cost no goroutine and no timers of their own.
	var (
		hb      sync.WaitGroup
		hbMu    sync.Mutex
		stopped bool
	)
	first := time.AfterFunc(time.Until(c.sent.Add(p.TTL/3-p.TTL/30)), func() {
		hbMu.Lock()
		defer hbMu.Unlock()
		if !stopped {
			hb.Go(func() { deadline = p.heartbeat(hbCtx, log, t.ID, w.name, fence, c.sent, cancelTask) })
		}
	})
	output, runErr := p.run(taskCtx, log, w.name, t)
	stopHeartbeats()
	first.Stop()
	hbMu.Lock()
	stopped = true
	hbMu.Unlock()
	hb.Wait()
	cause := context.Cause(taskCtx)

	switch {
	case errors.Is(runErr, errCrashed):
		// A dead process does nothing more: the lease lapses, and the
		// reaper's expiry notification wakes a worker to take the task.
		log.Warn().Msg("simulated crash: task abandoned without completing it")
		p.counters.crashed.Add(1)
		ev.Kind = EventCrashed
		p.emit(ev)
		return EventCrashed, nil
	case errors.Is(cause, task.ErrLeaseLost) || errors.Is(cause, lease.ErrDeadline):
		log.Warn().Err(cause).Bool("interrupted", runErr != nil).Msg("task lease lost: abandoned the task without completing it")
		p.counters.leaseLost.Add(1)
		ev.Kind, ev.Err, ev.Interrupted = EventLeaseLost, cause, runErr != nil
		p.emit(ev)
		return EventLeaseLost, nil
	case runErr == nil:
		var next *claim // from the last attempt: a retry's batch claims afresh
		kind := p.finish(workCtx, log, ev, deadline, EventCompleted, func(ctx context.Context) (string, error) {
			n, err := p.completer.complete(ctx, task.Completion{ID: t.ID, Processor: w.name, Fence: fence, Output: output})
			next = n
			return task.StateDone, err
		})
		return kind, next
	case errors.Is(runErr, context.Canceled) && workCtx.Err() != nil:
		return p.finish(workCtx, log, ev, deadline, EventRequeued, func(ctx context.Context) (string, error) {
			t, err := p.Tasks.Requeue(ctx, t.ID, w.name, fence, "the worker shut down before the task finished")
			return t.State, err
		}), nil
	default:
		ev.Err = runErr
		return p.finish(workCtx, log, ev, deadline, EventFailed, func(ctx context.Context) (string, error) {
			t, err := p.Tasks.Fail(ctx, t.ID, w.name, fence, runErr.Error())
			return t.State, err
		}), nil
	}
}

// finish makes the task's final write (complete, fail or requeue), even
// when ctx has ended, retrying a failed write until the lease's local
// deadline: after that the write could only be refused. It returns kind
// when the write succeeded, EventLeaseLost when it was refused, "" when it
// could not be made.
func (p *Pool) finish(ctx context.Context, log zerolog.Logger, ev Event, deadline time.Time,
	kind EventKind, write func(ctx context.Context) (state string, err error),
) EventKind {
	ev.Kind = kind
	for retry := false; ; retry = true {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(time.Until(deadline), 0)+p.margin())
		state, err := write(wctx)
		if retry && kind == EventCompleted && errors.Is(err, task.ErrLeaseLost) {
			// The attempt that seemed to fail may have committed.
			if cur, gerr := p.Tasks.Get(wctx, ev.TaskID); gerr == nil && cur.State == task.StateDone && deref(cur.Fence) == ev.Fence {
				state, err = cur.State, nil
			}
		}
		cancel()
		switch {
		case err == nil:
			ev.State = state
			switch kind {
			case EventCompleted:
				p.counters.completed.Add(1)
				log.Debug().Msg("completed task")
			case EventFailed:
				p.counters.failed.Add(1)
				log.Info().Err(ev.Err).Str("state", state).Msg("task failed")
			case EventRequeued:
				p.counters.requeued.Add(1)
				log.Info().Msg("handed the task back at shutdown")
			}
			p.emit(ev)
			return kind
		case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			log.Warn().Err(err).Msgf("task lease lost: %s refused", kind)
			p.counters.leaseLost.Add(1)
			ev.Kind, ev.Err = EventLeaseLost, err
			p.emit(ev)
			return EventLeaseLost
		case !time.Now().Add(p.retryInterval()).Before(deadline):
			log.Warn().Err(err).Msgf("could not record the task as %s; it will be claimed again when its lease lapses", kind)
			return ""
		default:
			ev := log.Debug()
			if !retry {
				ev = log.Warn() // once per task: the retries are no news
			}
			ev.Err(err).Msgf("could not record the task as %s; retrying until the lease's deadline", kind)
			time.Sleep(p.retryInterval())
		}
	}
}

// retryInterval is the wait between attempts after a failed heartbeat or
// final write (as lease.KeepConfig: a quarter of the heartbeat interval).
func (p *Pool) retryInterval() time.Duration { return p.TTL / 12 }

// heartbeat renews the task's lease every TTL/3 (with jitter) until ctx
// ends, and calls lost — at once — when the lease counts as lost: a
// heartbeat was refused, or none succeeded before the local deadline, the
// time the claim or the last successful heartbeat was sent + TTL − margin.
// A transient error is retried until that deadline. heartbeat returns the
// deadline as it stood when it stopped.
func (p *Pool) heartbeat(ctx context.Context, log zerolog.Logger, id int64, processor string, fence int64,
	sent time.Time, lost context.CancelCauseFunc,
) time.Time {
	deadline := sent.Add(p.TTL - p.margin())
	// The deadline is kept by its own timer, not by this loop, so that the
	// task is stopped on time even while a heartbeat hangs or a simulated
	// spike pauses this goroutine.
	expire := time.AfterFunc(time.Until(deadline), func() {
		lost(fmt.Errorf("task %d: %w", id, lease.ErrDeadline))
	})
	defer expire.Stop()
	// A heartbeat is due TTL/3 after the request that last succeeded was
	// sent (the claim first), not after its answer came.
	interval := p.TTL / 3
	due := sent.Add(jitter(interval))
	failing := false // the last heartbeat failed: the retries are logged at debug level
	timer := time.NewTimer(time.Until(due))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return deadline
		case <-timer.C:
		}
		if p.SimSpikeRate > 0 && rand.Float64() < p.SimSpikeRate {
			pause := p.TTL + p.TTL/2
			log.Warn().Dur("pause", pause).Msg("simulated latency spike before a heartbeat")
			timer.Reset(pause)
			select {
			case <-ctx.Done(): // the deadline passed meanwhile: the lease is lost
				return deadline
			case <-timer.C:
			}
		}
		attempt := time.Now()
		hctx, cancel := context.WithDeadline(ctx, deadline)
		_, err := p.Tasks.Heartbeat(hctx, id, processor, fence)
		cancel()
		switch {
		case err == nil:
			if !expire.Stop() {
				return deadline // the deadline passed first: the lease counts as lost
			}
			if failing {
				log.Info().Msg("heartbeat succeeded again")
			}
			failing = false
			deadline = attempt.Add(p.TTL - p.margin())
			expire.Reset(time.Until(deadline))
			due = attempt.Add(jitter(interval))
		case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			p.emit(Event{Kind: EventHeartbeatFailed, Processor: processor, TaskID: id, Fence: fence, Err: err})
			lost(fmt.Errorf("task %d: heartbeat refused: %w", id, task.ErrLeaseLost))
			return deadline
		case ctx.Err() != nil:
			return deadline
		default:
			p.emit(Event{Kind: EventHeartbeatFailed, Processor: processor, TaskID: id, Fence: fence, Err: err})
			ev := log.Debug()
			if !failing {
				ev = log.Warn()
			}
			failing = true
			ev.Err(err).Msg("heartbeat failed; retrying until the lease's deadline")
			due = time.Now().Add(p.retryInterval())
		}
		timer.Reset(time.Until(due))
	}
}

// jitter returns d ± 10 %, so that many workers do not heartbeat in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + rand.N(d/5+1)
}

// MaxSleep bounds a task's sleep_duration_seconds.
const MaxSleep = 3600

// sleepStep is how long a task sleeps between looks at its context.
const sleepStep = 100 * time.Millisecond

// sleepData is the task_data workers understand.
type sleepData struct {
	SleepDurationSeconds *float64 `json:"sleep_duration_seconds"`
}

// sleepOutput is the output of a completed task.
type sleepOutput struct {
	SleptSeconds float64 `json:"slept_seconds"`
	Processor    string  `json:"processor"`
}

// parseTaskData returns how long a task sleeps, or an error saying what is
// wrong with its task_data.
func parseTaskData(raw json.RawMessage) (float64, error) {
	const want = `want an object like {"sleep_duration_seconds": 5}`
	var d sleepData
	if err := json.Unmarshal(raw, &d); err != nil {
		return 0, fmt.Errorf("task_data %.100s is not valid: %w; %s", raw, err, want)
	}
	switch {
	case d.SleepDurationSeconds == nil:
		return 0, fmt.Errorf("task_data %.100s has no sleep_duration_seconds: %s", raw, want)
	case *d.SleepDurationSeconds < 0 || *d.SleepDurationSeconds > MaxSleep:
		return 0, fmt.Errorf("sleep_duration_seconds %v is out of range: want 0 to %d", *d.SleepDurationSeconds, MaxSleep)
	}
	return *d.SleepDurationSeconds, nil
}

// run performs the task: it sleeps sleep_duration_seconds, honouring ctx,
// and returns the output. With SimCrashRate it crashes midway.
func (p *Pool) run(ctx context.Context, log zerolog.Logger, processor string, t task.Task) (json.RawMessage, error) {
	secs, err := parseTaskData(t.TaskData)
	if err != nil {
		return nil, err
	}
	d := time.Duration(secs * float64(time.Second))
	if p.SimCrashRate > 0 && rand.Float64() < p.SimCrashRate {
		if err := sleep(ctx, d/2); err != nil {
			return nil, err
		}
		log.Error().Msg("simulated crash mid-task")
		p.Crash()
		return nil, errCrashed
	}
	if err := sleep(ctx, d); err != nil {
		return nil, err
	}
	return json.Marshal(sleepOutput{SleptSeconds: secs, Processor: processor})
}

// sleep waits d in small steps, returning ctx's error as soon as it ends.
func sleep(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		timer.Reset(min(left, sleepStep))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
}
