package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keepalive"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// RemoteTasks is the queue as a RemotePool reaches it: a leasehold
// service's REST API.
type RemoteTasks interface {
	Ops
	// HeartbeatWait renews the lease and has the service hold the answer
	// up to wait, answering at once (task.ErrCancelled) when the task is
	// cancelled meanwhile.
	HeartbeatWait(ctx context.Context, id int64, processor string, fence int64, wait time.Duration) (task.Task, error)
	// Claim claims for processor the next due task of queues and kinds,
	// waiting up to wait for one to become claimable (the service wakes
	// the wait by NOTIFY: no polling on either side). ok is false when
	// none came in time.
	Claim(ctx context.Context, processor string, queues, kinds []string, wait time.Duration) (t task.Task, ok bool, err error)
	// HeldBy returns the running tasks of queues whose lease one of processors holds.
	HeldBy(ctx context.Context, queues, processors []string) ([]task.Task, error)
}

// RemotePool runs task workers against a leasehold
// service over HTTP, for a program without database credentials: the same
// Handler as a Pool's, under the same leases. Idle workers long-poll the
// service for tasks (at most Fetchers claims wait at once); each claimed
// task runs under its lease, kept by held heartbeats (see heldHeartbeats:
// one always waits on the service, which answers it the moment the task is
// cancelled, so the handler's context ends with task.ErrCancelled within a
// round trip, as a Pool's does through LISTEN), and is completed, failed,
// snoozed or cancelled through the API. It is the one REST worker:
// leasehold work runs its commands on it.
type RemotePool struct {
	Tasks    RemoteTasks
	Instance string
	// Queues are the queues a claim takes tasks from (none:
	// task.DefaultQueue).
	Queues []string
	// Name, when set, names the workers' processors Name/w1 ... Name/wN;
	// by default they are named as a Pool's, from Instance and the queue.
	Name    string
	Kinds   []string
	Handler Handler
	Workers int
	// TTL is the lease TTL assumed for a task whose claim said none (the
	// service sets every claimed task's).
	TTL time.Duration
	// Fetchers bounds the claims waiting at once (default: Workers, at
	// most 4). Each waits up to ClaimWait (default 30 s) per request.
	Fetchers  int
	ClaimWait time.Duration
	// ShutdownGrace is how long running tasks may go on after Run's context
	// ends before they are cancelled and handed back (default 10s;
	// negative: no grace).
	ShutdownGrace time.Duration
	// Grace is how long Handler takes to stop once its context ends (a
	// command given SIGTERM, then SIGKILL: leasehold work's --kill-grace),
	// at most half a task's TTL. A task's lease is given up that much
	// before its deadline (lease.KeepConfig.Grace), so that the handler has
	// stopped before the service could give the task to another worker.
	Grace time.Duration
	// Abort, when set, replaces ShutdownGrace: running tasks go on after
	// Run's context ends until Abort is closed.
	Abort <-chan struct{}
	// Transient tells a failed write that may pass when made again (the
	// service unreachable, a 503) from a refusal no retry can change (a
	// 400, a 413): the first is retried while the lease could be live, the
	// second is not, and a completion refused so fails the attempt with
	// the service's reason. Nil retries every failure.
	Transient func(error) bool
	Log       zerolog.Logger
	OnEvent   func(Event)

	counters counters
}

// Counters returns the pool's running totals.
func (p *RemotePool) Counters() Counters { return p.counters.snapshot() }

// Run claims and runs tasks until ctx ends, then shuts down gracefully:
// no more claims, running tasks get ShutdownGrace, the rest are handed
// back. It returns when every goroutine it started has exited. Its error is
// about the settings, or a *ClaimsRefusedError: the service refused the
// claims for a reason asking again cannot change (a wrong token, a URL that
// is not a leasehold service), and the pool stopped as for ctx's end.
func (p *RemotePool) Run(ctx context.Context) error {
	switch {
	case p.Tasks == nil:
		return errors.New("remote worker pool: Tasks is nil")
	case p.Instance == "":
		return errors.New("remote worker pool: Instance is empty")
	case len(p.Kinds) == 0:
		return errors.New("remote worker pool: no Kinds: name the kinds Handler runs")
	case p.Handler == nil:
		return errors.New("remote worker pool: Handler is nil")
	case p.Workers < 0:
		return fmt.Errorf("remote worker pool: %d workers: want 0 or more", p.Workers)
	case p.TTL < time.Second || p.TTL > time.Hour || p.TTL%time.Second != 0:
		return fmt.Errorf("remote worker pool: task lease TTL %s must be a whole number of seconds from 1s to 1h", p.TTL)
	}
	if p.Workers == 0 {
		<-ctx.Done()
		return nil
	}
	queues := p.Queues
	if len(queues) == 0 {
		queues = []string{task.DefaultQueue}
	}
	prefix := p.Name
	if prefix == "" {
		prefix = p.Instance
		if len(queues) == 1 && queues[0] != task.DefaultQueue {
			prefix += "/" + queues[0]
		}
	}
	fetchers := p.Fetchers
	if fetchers <= 0 {
		fetchers = min(p.Workers, 4)
	}
	wait := p.ClaimWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	grace := p.ShutdownGrace
	if grace == 0 {
		grace = DefaultShutdownGrace
	}
	log := p.Log.With().Str("component", "worker").Strs("queues", queues).Logger()
	r := &runner{
		ops: p.Tasks, handler: p.Handler, ttl: p.TTL, grace: max(p.Grace, 0), log: log, counters: &p.counters, onEvent: p.OnEvent,
		transient: p.Transient,
		held:      &heldHeartbeats{tasks: p.Tasks, log: log},
		complete: func(ctx context.Context, c taskstore.Completion) (*claim, error) {
			_, err := p.Tasks.Complete(ctx, c.ID, c.Processor, c.Fence, c.Output)
			return nil, err
		},
	}

	idle := make(chan *worker, p.Workers)
	workers := make([]*worker, p.Workers)
	for i := range workers {
		workers[i] = &worker{name: fmt.Sprintf("%s/w%d", prefix, i+1), tasks: make(chan claim, 1)}
		idle <- workers[i]
	}
	workCtx, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(nil)
	var running, fetching sync.WaitGroup
	for _, w := range workers {
		running.Go(func() {
			for c := range w.tasks {
				r.work(workCtx, w, &c)
				idle <- w
			}
		})
	}
	cut := &cutClaims{}
	claimCtx, stopClaims := context.WithCancelCause(ctx)
	defer stopClaims(nil)
	var refused refusedOnce
	for range fetchers {
		fetching.Go(func() {
			if err := p.fetch(claimCtx, log, idle, queues, wait, cut); err != nil && refused.set(err) {
				log.Error().Err(err).Msg("giving up: the service refuses the claims; stopping")
				stopClaims(err)
			}
		})
	}
	log.Info().Int("workers", p.Workers).Strs("kinds", p.Kinds).Msg("remote worker pool started")
	fetching.Wait()
	p.handBackCut(log, queues, cut.processors)
	for _, w := range workers {
		close(w.tasks)
	}
	log.Info().Stringer("grace", max(grace, 0)).Msg("remote worker pool stopping: running tasks get the grace period")
	stopGrace := graceFor(grace, p.Abort, func() { stopWork(ErrShutdown) })
	running.Wait()
	stopGrace()
	log.Info().Msg("remote worker pool stopped")
	return refused.get()
}

// ClaimsRefusedError is why a RemotePool stopped on its own: the service
// refused its claims for a reason that asking again cannot change.
type ClaimsRefusedError struct{ Err error }

func (e *ClaimsRefusedError) Error() string {
	return "the service refuses the claims: " + e.Err.Error()
}
func (e *ClaimsRefusedError) Unwrap() error { return e.Err }

// refusedOnce keeps the first ClaimsRefusedError of the fetchers.
type refusedOnce struct {
	mu  sync.Mutex
	err error
}

func (r *refusedOnce) set(err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return false
	}
	r.err = err
	return true
}

func (r *refusedOnce) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// claimRefusedForGood reports whether a claim's refusal is one that asking
// again cannot change: bad input, a wrong token, a token without the work
// scope, a URL that is not the API's.
func claimRefusedForGood(err error) bool {
	switch statusOf(err) {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// handBack gives a task claimed for processor back to the queue, not counted as an attempt,
// when it will not run.
func (p *RemotePool) handBack(log zerolog.Logger, t task.Task, processor, reason string) {
	handBack(p.Tasks, p.Transient, log, t, processor, ttlOf(t, p.TTL), reason) // p.TTL is 1s at least: Run checks it
}

const stoppedAsClaimed = "the worker pool stopped as it claimed the task"

// cutClaims are the workers whose claim the pool's stop cut off before its answer came.
type cutClaims struct {
	mu         sync.Mutex
	processors []string
}

func (c *cutClaims) add(processor string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.processors = append(c.processors, processor)
}

// handBackCut hands back the tasks claimed for workers whose claim the stop cut off: the
// service may have claimed a task for one just as the request was abandoned, an answer
// that never arrived. The service hands back what it claims for a client it sees gone;
// this finds the rest, the running tasks those workers' names hold, and gives each back
// under its fence (one whose fence moved on since is refused, and nothing changes).
func (p *RemotePool) handBackCut(log zerolog.Logger, queues, processors []string) {
	if len(processors) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cutHandBackTimeout)
	defer cancel()
	// Asked again while it fails and may pass (a replica that failed
	// mid-request), until the timeout.
	held, err := p.Tasks.HeldBy(ctx, queues, processors)
	for err != nil && (p.Transient == nil || p.Transient(err)) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(cutHandBackRetry):
			held, err = p.Tasks.HeldBy(ctx, queues, processors)
		}
	}
	if err != nil {
		log.Warn().Err(err).Strs("processors", processors).
			Msg("could not look for tasks claimed as the stop cut the claims off; any such task is claimed again when its lease lapses")
	}
	for _, t := range held {
		log.Info().Int64("task", t.ID).Str("processor", t.Processor).Int64("fence", t.Fence).
			Msg("handing back a task claimed as the stop cut its claim off")
		p.handBack(log, t, t.Processor, stoppedAsClaimed)
	}
}

// cutHandBackTimeout bounds the stop's look for tasks claimed as it cut the claims off.
const cutHandBackTimeout = 5 * time.Second

// cutHandBackRetry is how long that look waits before it asks again after a
// failure.
const cutHandBackRetry = 200 * time.Millisecond

// fetch claims tasks for idle workers until ctx ends: one waiting claim at
// a time, for the worker it took from idle, which gets the task or goes
// back. A claim that ctx's end cuts off is added to cut. It returns a
// *ClaimsRefusedError when the service refuses a claim for good.
func (p *RemotePool) fetch(ctx context.Context, log zerolog.Logger, idle chan *worker, queues []string, wait time.Duration, cut *cutClaims) error {
	failures := 0
	for {
		var w *worker
		select {
		case <-ctx.Done():
			return nil
		case w = <-idle:
		}
		sent := time.Now()
		t, ok, err := p.Tasks.Claim(ctx, w.name, queues, p.Kinds, wait)
		p.counters.claims.Add(1)
		switch {
		case ctx.Err() != nil:
			switch {
			case ok: // it came as the pool stopped: it will not run here
				p.handBack(log, t, w.name, stoppedAsClaimed)
			case err != nil: // cut off before its answer: see handBackCut
				cut.add(w.name)
			}
			idle <- w
			return nil
		case err != nil && claimRefusedForGood(err):
			idle <- w
			return &ClaimsRefusedError{Err: err}
		case err != nil:
			idle <- w
			failures++
			backoff := keepalive.Jitter(min(100*time.Millisecond<<min(failures-1, 6), 5*time.Second))
			ev := log.Debug()
			if failures == 1 {
				ev = log.Warn()
			}
			ev.Err(err).Int("failures", failures).Str("retry_in", backoff.Round(time.Millisecond).String()).
				Msg("a claim failed: the service cannot be reached or is unavailable; asking again with backoff")
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
			continue
		case !ok:
			p.counters.empty.Add(1)
			idle <- w
		default:
			if failures > 0 {
				log.Info().Int("failures", failures).Msg("the service answers again; claiming tasks")
			}
			p.counters.claimed.Add(1)
			// The lease counts from when the claim was sent, which for a
			// claim that waited is long before the task was claimed: a
			// heartbeat now starts its deadline afresh.
			if ttl := t.TTL(); ttl > 0 && time.Since(sent) > ttl/10 {
				hb := time.Now()
				// Not cut off by the pool's stop: the task is handed back below then,
				// which a heartbeat cut off would leave to its lease.
				hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl-ttl/10)
				_, err := p.Tasks.Heartbeat(hctx, t.ID, w.name, t.Fence)
				cancel()
				switch {
				case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
					log.Warn().Err(err).Int64("task", t.ID).Msg("the heartbeat after a long claim was refused; the task is not this worker's")
					idle <- w
					continue
				case err != nil:
					// It may or may not have renewed the lease: the task does not run here,
					// and goes back under its fence now (refused, and nothing changes, if the
					// lease is gone) rather than wait out its lease.
					log.Warn().Err(err).Int64("task", t.ID).Msg("the heartbeat after a long claim failed; handing the task back")
					p.handBack(log, t, w.name, "the heartbeat after its claim failed: "+err.Error())
					idle <- w
					continue
				}
				sent = hb
			}
			if ctx.Err() != nil { // the pool stopped meanwhile: the task will not run here
				p.handBack(log, t, w.name, stoppedAsClaimed)
				idle <- w
				continue
			}
			w.tasks <- claim{task: t, sent: sent}
			if p.OnEvent != nil {
				p.OnEvent(Event{Kind: EventClaimed, TaskKind: t.Kind, Processor: w.name, TaskID: t.ID, Fence: t.Fence, Attempts: t.Attempts, Waited: waited(t)})
			}
		}
		failures = 0
	}
}
