package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
)

// Defaults of a Pool's optional settings.
const (
	DefaultSafetyPoll    = 30 * time.Second
	DefaultShutdownGrace = 10 * time.Second
	DefaultWaitLinger    = time.Second
)

// Pool runs the task workers of one queue in a process. Set its fields,
// then call Run once.
type Pool struct {
	Tasks *taskstore.Store
	// Listener is the process's LISTEN connection; it must listen on
	// notify.ChannelTask.
	Listener *notify.Listener
	// Instance names the process. Processors are named "<Instance>/w<N>"
	// (N = 1..Workers) for the default queue, "<Instance>/<Queue>/w<N>"
	// for another.
	Instance string
	// Queue is the queue the pool claims from ("": task.DefaultQueue).
	Queue string
	// Kinds are the kinds the pool claims, those Handler runs: at least one.
	// A task of another kind is never claimed by this pool.
	Kinds []string
	// Handler runs each task.
	Handler Handler
	Workers int // 0: Run does nothing until its context ends
	// TTL is the lease TTL of a task whose insert named none, a whole number
	// of seconds (1s to 1h). A task's workers heartbeat every third of its
	// TTL.
	TTL time.Duration
	// Ops, when set, are the writes the workers make under their tasks'
	// leases in place of Tasks' own: the demo wraps them to simulate
	// latency spikes (demo.SpikyHeartbeats).
	Ops Ops
	// SafetyPoll is the last-resort poll interval (default 30s); negative
	// disables it (tests that prove nobody needs it).
	SafetyPoll time.Duration
	// ShutdownGrace is how long running tasks may go on after Run's context
	// ends before they are cancelled and requeued (default 10s; negative: no
	// grace).
	ShutdownGrace time.Duration
	// Abort, when set, replaces ShutdownGrace: running tasks go on after
	// Run's context ends until Abort is closed.
	Abort <-chan struct{}
	// WaitLinger is how long the pool stays registered as a waiter for
	// inserted tasks once all its workers are busy (default 1s; negative:
	// it unregisters at once). Inserts notify while any waiter is
	// registered, and each notifying commit costs every inserter (see the
	// package comment); lingering saves a pool that is busy only for a
	// moment the barrier of registering again.
	WaitLinger time.Duration
	Log        zerolog.Logger
	// OnEvent, if set, is called with every Event, synchronously from the
	// pool's goroutines: it must be quick and safe for concurrent use.
	OnEvent func(Event)
	// Ready, if set, is called once, when the pool is first ready to be
	// woken by an insert: its first claim round is over (it registered as a
	// waiter for inserted tasks, or every worker is busy, or the round
	// failed and is retried with backoff). A task inserted before then waits
	// for that round's catch-up claim.
	Ready func()

	log       zerolog.Logger
	runner    runner
	prefix    string // of the processors' names
	workers   []*worker
	byName    map[string]*worker
	idle      chan finished // workers that finished a task; room for all, so sending never blocks
	wakeC     chan struct{} // capacity 1: wake-ups coalesce
	reasons   atomic.Uint32 // the Wake reasons behind wakeC
	completer *completer
	counters  counters
	// fed: the dispatcher's last claim got a task for every idle worker,
	// so more are likely waiting, and the completer claims each completing
	// worker's next task in the completion's statement. Cleared by a claim
	// that comes back short, and when the pool stops.
	fed atomic.Bool
	// stopping: Run's context has ended; a task claimed for a worker from
	// now on is handed back, not run.
	stopping atomic.Bool
	hints    hints
}

// finished is a worker done with its task.
type finished struct {
	w *worker
	// failed: the task went back to the queue with a backoff, so the
	// dispatcher must look again when it falls due.
	failed bool
}

// worker is one of the pool's workers: it runs the tasks the dispatcher
// sends it, one at a time.
type worker struct {
	name  string
	tasks chan claim // capacity 1; the dispatcher sends only to idle workers, and closes it when it stops
	// running is the task it runs and how to stop it, for a cancellation's
	// NOTIFY (nil while idle).
	running atomic.Pointer[runningTask]
}

// runningTask is a worker's task while it runs.
type runningTask struct {
	id     int64
	cancel context.CancelCauseFunc
}

// claim is a task the dispatcher claimed for a worker.
type claim struct {
	task task.Task
	sent time.Time // when the claim statement was sent: the lease's local deadline counts from here
	wake Wake
}

// ops are the writes under a task's lease: Ops, or else Tasks'.
func (p *Pool) ops() Ops {
	if p.Ops != nil {
		return p.Ops
	}
	return p.Tasks
}

// Counters returns the pool's running totals.
func (p *Pool) Counters() Counters { return p.counters.snapshot() }

// margin is taken off a lease's local deadline to cover clock rate
// differences and the time a request takes to arrive (as lease.KeepConfig),
// for the statements bounded by the pool's default TTL.
func (p *Pool) margin() time.Duration { return p.TTL / 10 }

// claimParams is a claim of the pool's queue and kinds for the workers named.
// With hints, the claim reads their branches alone (taskstore.ClaimParams'
// Known): a hinted claim that comes back short is followed by one without
// hints, which looks for every branch.
func (p *Pool) claimParams(names []string, hints []taskstore.Hint, withLapsed bool) taskstore.ClaimParams {
	return taskstore.ClaimParams{
		Processors: names, TTL: p.TTL, Queues: []string{p.Queue}, Kinds: p.Kinds, Hints: hints, Known: len(hints) > 0,
		WithLapsed: withLapsed,
	}
}

// init checks the settings and fills the defaults.
func (p *Pool) init() error {
	switch {
	case p.Tasks == nil:
		return errors.New("worker pool: Tasks is nil")
	case p.Listener == nil:
		return errors.New("worker pool: Listener is nil")
	case p.Instance == "":
		return errors.New("worker pool: Instance is empty")
	case len(p.Kinds) == 0:
		return errors.New("worker pool: no Kinds: name the kinds Handler runs")
	case p.Handler == nil:
		return errors.New("worker pool: Handler is nil")
	case p.Workers < 0:
		return fmt.Errorf("worker pool: %d workers: want 0 or more", p.Workers)
	case p.TTL < time.Second || p.TTL > time.Hour || p.TTL%time.Second != 0:
		return fmt.Errorf("worker pool: task lease TTL %s must be a whole number of seconds from 1s to 1h", p.TTL)
	}
	if p.Queue == "" {
		p.Queue = task.DefaultQueue
	}
	p.prefix = p.Instance
	if p.Queue != task.DefaultQueue {
		p.prefix += "/" + p.Queue
	}
	if p.SafetyPoll == 0 {
		p.SafetyPoll = DefaultSafetyPoll
	}
	if p.ShutdownGrace == 0 {
		p.ShutdownGrace = DefaultShutdownGrace
	}
	if p.WaitLinger == 0 {
		p.WaitLinger = DefaultWaitLinger
	}
	p.log = p.Log.With().Str("component", "worker").Logger()
	p.workers = make([]*worker, p.Workers)
	p.byName = make(map[string]*worker, p.Workers)
	for i := range p.workers {
		w := &worker{name: fmt.Sprintf("%s/w%d", p.prefix, i+1), tasks: make(chan claim, 1)}
		p.workers[i] = w
		p.byName[w.name] = w
	}
	p.idle = make(chan finished, p.Workers)
	p.completer = newCompleter(p)
	p.runner = runner{
		ops: p.ops(), complete: p.completer.complete, handler: p.Handler, ttl: p.TTL,
		log: p.log, counters: &p.counters, onEvent: p.OnEvent,
	}
	p.wakeC = make(chan struct{}, 1)
	return nil
}

// Run claims and runs tasks until ctx ends, then shuts down gracefully (see
// the package comment). It returns when every goroutine it started has
// exited; the error is only ever about the settings.
func (p *Pool) Run(ctx context.Context) error {
	if err := p.init(); err != nil {
		return err
	}
	if p.Workers == 0 {
		<-ctx.Done()
		return nil
	}
	// Subscribe before the first claim, so that nothing inserted after it
	// goes unnoticed.
	taskSub := p.Listener.Subscribe(notify.ChannelTask, 64)
	defer taskSub.Close()

	// Tasks run under workCtx, which outlives ctx by the shutdown grace.
	workCtx, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(nil)
	var workers, watcher, completing sync.WaitGroup
	// The watcher outlives the workers too: a task cancelled during the
	// grace stops at once.
	watchCtx, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
	// The completer outlives the workers: they complete during the grace.
	completerCtx, stopCompleter := context.WithCancel(context.WithoutCancel(ctx))
	completing.Go(func() { p.completer.run(completerCtx) })
	for _, w := range p.workers {
		workers.Go(func() {
			for first := range w.tasks {
				c := &first
				for {
					outcome, next := p.runner.work(workCtx, w, c)
					if next == nil {
						p.idle <- finished{w: w, failed: outcome == EventFailed}
						break
					}
					// The completion's statement claimed this worker's next task.
					if p.stopping.Load() {
						p.handBack([]task.Task{next.task})
						p.idle <- finished{w: w}
						break
					}
					p.claimed(next.task, next.wake)
					c = next
				}
			}
		})
	}
	watcher.Go(func() { p.watch(ctx, watchCtx, taskSub) })
	p.log.Info().Int("workers", p.Workers).Str("queue", p.Queue).Strs("kinds", p.Kinds).Stringer("ttl", p.TTL).Msg("worker pool started")

	p.dispatch(ctx) // until ctx ends; then no more claims, and the workers' channels are closed

	p.log.Info().Stringer("grace", max(p.ShutdownGrace, 0)).Msg("worker pool stopping: running tasks get the grace period")
	stopGrace := graceFor(p.ShutdownGrace, p.Abort, func() { stopWork(ErrShutdown) })
	workers.Wait()
	stopGrace()
	stopCompleter()
	completing.Wait()
	stopWatching()
	watcher.Wait()
	p.log.Info().Msg("worker pool stopped")
	return nil
}

// poke wakes the dispatcher for reason r without ever blocking: a wake-up
// already pending absorbs this one.
func (p *Pool) poke(r Wake) {
	p.reasons.Or(uint32(r))
	select {
	case p.wakeC <- struct{}{}:
	default:
	}
}

// watch turns the listener's notifications into wake-ups until ctx ends,
// and stops the handler of a task cancelled while it runs until stop ends.
func (p *Pool) watch(ctx, stop context.Context, tasks *notify.Subscription) {
	for {
		select {
		case <-stop.Done():
			return
		case n := <-tasks.C():
			if id, ok := notify.ParseCancelled(n.Payload); ok {
				p.cancelRunning(id)
				continue
			}
			if ctx.Err() != nil {
				continue // no more claims
			}
			switch n.Payload {
			case notify.TasksInserted:
				p.poke(WakeInsert)
			case notify.TasksRequeued:
				p.poke(WakeRequeued)
			}
			// Claims and completions free nothing to claim.
		case <-tasks.Resync():
			if ctx.Err() == nil {
				p.poke(WakeResync)
			}
		}
	}
}

// cancelRunning stops the handler of task id if this pool runs it. A
// cancellation is rare; a look at every worker costs nothing while none
// comes.
func (p *Pool) cancelRunning(id int64) {
	for _, w := range p.workers {
		if r := w.running.Load(); r != nil && r.id == id {
			r.cancel(fmt.Errorf("task %d: %w", id, task.ErrCancelled))
		}
	}
}

// dispatcher is the state of the dispatch loop, owned by its goroutine.
type dispatcher struct {
	p    *Pool
	idle []*worker
	// backlog: work may be waiting that no idle worker could take (the last
	// claim got all it asked for, or a wake-up came while every worker was
	// busy). A worker that becomes idle then wakes the dispatcher.
	backlog     bool
	timer       *time.Timer // the next due task, or a retry after an error
	timerReason Wake
	safety      *time.Timer // nil when the safety poll is disabled
	failures    int         // consecutive failed statements
	recheck     time.Duration
	// waiter is the pool's registration as waiting for inserted tasks: it
	// is registered whenever the dispatcher sleeps with idle workers.
	waiter *notify.Waiter
	// linger fires WaitLinger after the workers all became busy: then the
	// pool unregisters, unless a claim left workers idle meanwhile.
	linger      *time.Timer
	lingering   bool // linger is set
	regFailures int  // consecutive failed registrations
}

// dispatch claims tasks for idle workers whenever woken, until ctx ends.
func (p *Pool) dispatch(ctx context.Context) {
	d := &dispatcher{
		p: p, idle: append([]*worker(nil), p.workers...), timer: time.NewTimer(time.Hour),
		waiter: p.Listener.Waiter(p.prefix + "/workers"), linger: time.NewTimer(time.Hour),
	}
	d.timer.Stop()
	defer d.timer.Stop()
	d.linger.Stop()
	defer d.linger.Stop()
	// No more claims: inserts need not wake this pool. Briefly: a database
	// that does not answer must not hold up the shutdown (the row goes
	// with the LISTEN session anyway).
	defer d.waiter.UnregisterWithin(ctx, time.Second)
	// Nor completions: a task claimed by one in flight is handed back.
	defer func() {
		p.stopping.Store(true)
		p.fed.Store(false)
	}()
	var safetyC <-chan time.Time
	if p.SafetyPoll > 0 {
		// The last resort, not the mechanism: every way work appears is
		// announced (NOTIFY on insert, on a requeue: a failed, handed-back
		// or lapsed task, a resync after a reconnect) or known in advance (the due timer).
		// This poll only bounds how long a lost hint — a notification
		// dropped by a bug, or an expiry while no reaper runs — can leave a
		// task waiting. It is reset by every round, so it never fires while
		// the queue is busy.
		d.safety = time.NewTimer(p.SafetyPoll)
		defer d.safety.Stop()
		safetyC = d.safety.C
	}
	defer func() {
		for _, w := range p.workers {
			close(w.tasks)
		}
	}()
	wake := WakeStart
	ready := p.Ready
	for {
		if wake != 0 {
			d.round(ctx, wake)
			wake = 0
		}
		if ready != nil {
			ready()
			ready = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wakeC:
			wake |= Wake(p.reasons.Swap(0))
		case f := <-p.idle:
			d.idle = append(d.idle, f.w)
			if d.backlog || f.failed {
				wake |= WakeWorkerIdle
			}
		case <-d.timer.C:
			wake |= d.timerReason
		case <-safetyC:
			wake |= WakeSafetyPoll
		case <-d.linger.C:
			d.lingering = false
			if d.backlog && len(d.idle) == 0 {
				d.waiter.UnregisterWithin(ctx, p.TTL-p.margin()) // still all busy: a worker that finishes claims anyway
			}
		}
	}
}

// round claims for the idle workers until a claim comes back short (nothing
// more is due) or no worker is idle, then sets the timer for the next task
// that falls due.
func (d *dispatcher) round(ctx context.Context, wake Wake) {
	p := d.p
	defer func() { p.emit(Event{Kind: EventAsleep, Wake: wake}) }()
	if d.safety != nil {
		d.safety.Reset(p.SafetyPoll)
	}
	for {
		if ctx.Err() != nil {
			return // shutting down: stop claiming at once
		}
		d.collectIdle()
		if len(d.idle) == 0 {
			// All busy: a worker that finishes wakes the dispatcher, so
			// inserts need not, once this has lasted WaitLinger.
			d.backlog = true
			d.lingerThenUnregister(ctx)
			return
		}
		names := make([]string, len(d.idle))
		for i, w := range d.idle {
			names[i] = w.name
		}
		// The claim is not cut short by ctx: had it committed, its tasks
		// would be stranded until their leases lapse. Its answer is useless
		// after TTL − margin, when the workers would count the leases lost.
		// It skips what earlier claims took (hints) only while the queue
		// has a backlog, and claims again without when that comes back
		// short.
		var hints []taskstore.Hint
		hinted := false
		if wake&hintedWakes == wake {
			hints, hinted = p.hints.forClaim()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.TTL-p.margin())
		sent := time.Now()
		tasks, err := p.Tasks.Claim(cctx, p.claimParams(names, hints, wake&lookForLapsed != 0))
		cancel()
		p.counters.claims.Add(1)
		if err != nil {
			d.retryLater(ctx, err, "claim")
			return
		}
		d.recovered()
		p.hints.claimed(sent, !hinted, tasks)
		p.counters.claimed.Add(int64(len(tasks)))
		if len(tasks) == 0 {
			p.counters.empty.Add(1)
		}
		if ctx.Err() != nil {
			p.handBack(tasks) // claimed as shutdown began
			return
		}
		for _, t := range tasks {
			d.assign(t, sent, wake)
		}
		if len(tasks) < len(names) && hinted {
			// A task may sit before a hint: look without them.
			wake = WakeBacklog | WakeShort
			continue
		}
		if len(tasks) < len(names) {
			// Workers stay idle, and only a notification will bring them
			// work: the pool must be a registered waiter, registered
			// before the claim that found too little, or the claim after
			// the registration must be the one.
			if !d.waiter.Registered() {
				rctx, cancel := context.WithTimeout(ctx, p.TTL-p.margin())
				err := d.waiter.Register(rctx)
				cancel()
				switch {
				case err == nil:
					p.counters.registered.Add(1)
					d.registered()
					wake = WakeRegistered
					continue // the catch-up claim
				case errors.Is(err, notify.ErrNotListening):
					// The listener is reconnecting; its resync will wake
					// this dispatcher, which registers then.
				default:
					d.registerLater(ctx, err)
					return
				}
			}
			d.backlog = false
			p.fed.Store(false)
			d.stopLinger()
			break
		}
		p.fed.Store(true) // more may be waiting: completions claim the next tasks
		wake = WakeBacklog
	}
	d.scheduleNextDue(ctx)
}

// lookForLapsed are the wake-ups whose claim also takes running tasks whose
// lease lapsed. Otherwise the reaper announces a lapse by putting the task
// back to pending, and the "requeued" notification wakes the dispatcher:
// only the catch-ups (start, reconnect) and the safety poll look for what a
// missing reaper or a lost notification left behind, since looking walks
// the index of running tasks, which holds an entry for every task run since
// the last VACUUM.
const lookForLapsed = WakeStart | WakeResync | WakeSafetyPoll

// hintedWakes are the wake-ups whose claim may skip what the pool's
// earlier claims took (hints): while the queue has a backlog. Any other
// reason in the set (a notification, a catch-up) makes the claim look at
// everything.
const hintedWakes = WakeBacklog | WakeWorkerIdle

// lingerThenUnregister unregisters the pool as a waiter for inserted tasks
// after WaitLinger, or at once when WaitLinger is negative.
func (d *dispatcher) lingerThenUnregister(ctx context.Context) {
	if d.p.WaitLinger < 0 {
		d.waiter.UnregisterWithin(ctx, d.p.TTL-d.p.margin())
		return
	}
	if !d.lingering {
		d.linger.Reset(d.p.WaitLinger)
		d.lingering = true
	}
}

func (d *dispatcher) stopLinger() {
	if d.lingering {
		d.linger.Stop()
		d.lingering = false
	}
}

// registered notes a registration that succeeded, logging the end of a run
// of failures.
func (d *dispatcher) registered() {
	d.endRun(&d.regFailures, "registered as a waiter for inserted tasks")
}

// registerLater sets the timer to claim and register again after a failed
// registration, with backoff as retryLater: the dispatcher cannot sleep on
// notifications alone until a registration succeeds.
func (d *dispatcher) registerLater(ctx context.Context, err error) {
	d.backOff(ctx, &d.regFailures, err, "registering as a waiter for inserted tasks failed; claiming again with backoff")
}

// collectIdle takes in every worker that has finished meanwhile, so that
// one claim serves them all.
func (d *dispatcher) collectIdle() {
	for {
		select {
		case f := <-d.p.idle:
			d.idle = append(d.idle, f.w)
		default:
			return
		}
	}
}

// assign hands a claimed task to the worker it was claimed for.
func (d *dispatcher) assign(t task.Task, sent time.Time, wake Wake) {
	p := d.p
	name := t.Processor
	w := p.byName[name]
	if w == nil {
		// Cannot happen: Claim pairs each task with one of the names given.
		p.log.Error().Int64("task", t.ID).Str("processor", name).Msg("claimed a task for an unknown worker; its lease will lapse")
		return
	}
	for i, iw := range d.idle {
		if iw == w {
			d.idle = append(d.idle[:i], d.idle[i+1:]...)
			break
		}
	}
	p.claimed(t, wake)
	w.tasks <- claim{task: t, sent: sent, wake: wake}
}

// claimed logs and emits the claim of t, about to be run by its processor.
func (p *Pool) claimed(t task.Task, wake Wake) {
	p.log.Debug().Int64("task", t.ID).Str("kind", t.Kind).Str("processor", t.Processor).Int64("fence", t.Fence).
		Int32("attempt", t.Attempts).Stringer("wake", wake).Msg("claimed task")
	p.emit(Event{Kind: EventClaimed, TaskKind: t.Kind, Processor: t.Processor, TaskID: t.ID, Fence: t.Fence, Attempts: t.Attempts, Wake: wake, Waited: waited(t)})
}

// scheduleNextDue sets the timer for when the next pending task falls due:
// a retry's backoff ends without anyone notifying.
func (d *dispatcher) scheduleNextDue(ctx context.Context) {
	// Bounded, as the claim is: a database that does not answer must not
	// stall the dispatcher.
	qctx, cancel := context.WithTimeout(ctx, d.p.TTL-d.p.margin())
	asked := time.Now()
	due, dbNow, err := d.p.Tasks.NextDue(qctx, []string{d.p.Queue}, d.p.Kinds)
	cancel()
	if err != nil {
		d.retryLater(ctx, err, "next due")
		return
	}
	d.recovered()
	// The database clock decides when a task is due: convert through the
	// offset between its clock and ours, as the reaper does, and wake a
	// little after, so that now() in the database has passed it.
	offset := dbNow.Sub(asked)
	wait := time.Until(due.Add(-offset)) + 5*time.Millisecond
	if wait <= 0 {
		// A task is due that the claim did not get: rows locked by another
		// replica's claim at that moment (SKIP LOCKED), or due just after
		// the claim. Look again soon, backing off while that goes on.
		d.recheck = min(max(2*d.recheck, 10*time.Millisecond), time.Second)
		wait = d.recheck
	} else {
		d.recheck = 0
	}
	d.timer.Reset(wait)
	d.timerReason = WakeDue
}

// retryLater sets the timer to try again after a failed statement, with
// backoff: while the database is unreachable the dispatcher claims nothing
// and does not spin; recovered says when it is over.
func (d *dispatcher) retryLater(ctx context.Context, err error, what string) {
	d.backOff(ctx, &d.failures, err, what+" failed; retrying with backoff")
}

// recovered notes a statement that succeeded, logging the end of a run of
// failures.
func (d *dispatcher) recovered() {
	d.endRun(&d.failures, "the database answers again; claiming tasks")
}

// backOff counts one more failure of a run in *failures and sets the timer
// to wake the dispatcher after a backoff (100ms doubling to 5s). The first
// failure of a run is logged as a warning, the others only at debug level,
// so that an outage is not a flood of lines.
func (d *dispatcher) backOff(ctx context.Context, failures *int, err error, msg string) {
	if ctx.Err() != nil {
		return
	}
	*failures++
	wait := min(100*time.Millisecond<<min(*failures-1, 6), 5*time.Second)
	ev := d.p.log.Debug()
	if *failures == 1 {
		ev = d.p.log.Warn()
	}
	ev.Err(err).Int("failures", *failures).Stringer("retry_in", wait).Msg(msg)
	d.timer.Reset(wait)
	d.timerReason = WakeRetry
}

// endRun ends a run of failures counted in *failures, logging msg if there
// was one.
func (d *dispatcher) endRun(failures *int, msg string) {
	if *failures > 0 {
		d.p.log.Info().Int("failures", *failures).Msg(msg)
	}
	*failures = 0
}

// handBack requeues tasks claimed as the pool began to shut down.
func (p *Pool) handBack(tasks []task.Task) {
	for _, t := range tasks {
		// Asked again while it fails (a connection cut mid-write), until the
		// lease's deadline; refused under the fence when an earlier try had
		// committed, or the lease is gone.
		err := requeueUntil(p.Tasks, nil, t, t.Processor, "the worker pool shut down", time.Now().Add(p.TTL-p.margin()), p.TTL/12)
		if errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound) {
			continue
		}
		if err != nil {
			p.log.Warn().Err(err).Int64("task", t.ID).Msg("could not hand back a task claimed at shutdown; it will be claimed again when its lease lapses")
			continue
		}
		p.counters.requeued.Add(1)
		p.emit(Event{Kind: EventRequeued, Processor: t.Processor, TaskID: t.ID, Fence: t.Fence, Attempts: t.Attempts, TaskKind: t.Kind})
	}
}

func (p *Pool) emit(e Event) {
	if p.OnEvent != nil {
		p.OnEvent(e)
	}
}

// waited is how long a claimed task waited: from the later of its insert
// and its schedule to its claim (started_at), by the database clock.
func waited(t task.Task) time.Duration {
	if t.StartedAt == nil {
		return 0
	}
	ready := t.CreatedAt
	if t.ScheduledAt.After(ready) {
		ready = t.ScheduledAt
	}
	return max(t.StartedAt.Sub(ready), 0)
}
