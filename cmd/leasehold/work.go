package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/keepalive"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

const workUsage = `usage: leasehold work --kind K [--kind K2 ...] [--queue Q ...] [--concurrency 1] [--processor NAME]
                      [--shutdown-grace 30s] [--kill-grace 5s] -- CMD ARGS...

A task worker for any program. It claims tasks of the kinds and queues given
from a leasehold server (long-polling POST /api/tasks/next, one claim waiting
per free slot) and runs CMD for each: the task's task_data JSON on its stdin,
LEASEHOLD_TASK_ID, LEASEHOLD_FENCE, LEASEHOLD_ATTEMPT, LEASEHOLD_KIND,
LEASEHOLD_QUEUE and LEASEHOLD_PROCESSOR in its environment, the task's lease
heartbeated while it runs.

  CMD exits 0       the task is completed; task_output is CMD's stdout, the JSON
                    value when it is one, else a JSON string (null when empty)
  CMD exits non-0   the attempt fails, its error the end of CMD's stderr
  lease lost or     CMD gets SIGTERM, then SIGKILL after --kill-grace, and
  task cancelled    nothing is reported; a cancellation reaches CMD within 1 s
  SIGTERM, SIGINT   no new claims; running CMDs get --shutdown-grace to finish,
                    then SIGTERM (SIGKILL after --kill-grace), and their tasks
                    are handed back to the queue

Exit status: 0 after a clean shutdown; 1 the server refused the claims for a
reason that retrying cannot fix (a wrong --api-token, a --url that is not a
leasehold server); 2 bad usage. A server that cannot be reached is asked again,
with backoff, until it answers or the worker is stopped.

flags:
`

// Tunables of leasehold work.
const (
	// claimWait is how long one claim waits on the server for a task.
	claimWait = 30 * time.Second
	// cutHandBackTimeout bounds the shutdown's look for tasks claimed as it cut the claims
	// off (handBackCut).
	cutHandBackTimeout = 5 * time.Second
	// heldHeartbeatGap is the least time between the sends of two held
	// heartbeats of a task. The next goes right after an answer that came
	// when its wait was over; after a 202 that came early (a replica that
	// shuts down answers at once, until it is gone), not sooner than this.
	heldHeartbeatGap = 250 * time.Millisecond
	// firstHeldHeartbeat is how long after the claim a task's first held
	// heartbeat is sent: a CMD that ends sooner costs no heartbeat (the
	// claim's lease is fresh), and a cancellation meanwhile reaches it within
	// this. Sent at once, every short task would renew its lease once for
	// nothing: the drain of 3 × 32 slots running true fell from 571 to 250
	// tasks/s.
	firstHeldHeartbeat = 250 * time.Millisecond
	// whyLostTimeout bounds the look at a task whose heartbeat was refused,
	// which tells a cancellation from a lost lease for the log.
	whyLostTimeout = 5 * time.Second
	// maxOutputBytes bounds the task_output of a completion: with the rest
	// of its body it must fit in the API's 1 MiB per request.
	maxOutputBytes = 1<<20 - 4<<10
	// maxLogLine bounds one log record of CMD's stderr; a longer line is
	// logged in pieces.
	maxLogLine = 16 << 10
	// defaultTaskTTL is the lease TTL assumed for a task claimed without
	// one (the server gives every claimed task its own).
	defaultTaskTTL = 30 * time.Second
	// maxConcurrency bounds --concurrency, as serve's --workers.
	maxConcurrency = 1024
	// maxClaimNames bounds the kinds and the queues of one claim (the API's).
	maxClaimNames = 100
)

// workOptions is a parsed "leasehold work" command line.
type workOptions struct {
	client        *clientFlags
	kinds         []string
	queues        []string
	concurrency   int
	processor     string
	shutdownGrace time.Duration
	killGrace     time.Duration
	logLevel      string
	logFormat     string
	passToken     bool     // CMD gets LEASEHOLD_API_TOKEN
	argv          []string // CMD ARGS...
}

// namesFlag is a flag that may be given several times, each a name.
type namesFlag []string

func (n *namesFlag) String() string { return strings.Join(*n, ",") }

func (n *namesFlag) Set(v string) error {
	*n = append(*n, v)
	return nil
}

func parseWork(args []string, getenv func(string) string, stderr io.Writer) (workOptions, error) {
	fs := flag.NewFlagSet("leasehold work", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), workUsage)
		fs.PrintDefaults()
	}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	o := workOptions{client: addClientFlags(fs, getenv)}
	var kinds, queues namesFlag
	fs.Var(&kinds, "kind", "a kind of task CMD runs; repeat it for several (required)")
	fs.Var(&queues, "queue", "a queue to take tasks from; repeat it for several (default: default)")
	concurrency := fs.String("concurrency", "1", "how many tasks run at once, 1 to 1024, each its own CMD")
	fs.BoolVar(&o.passToken, "pass-token", false, "give CMD the API token in LEASEHOLD_API_TOKEN, for a command that calls the API itself (by default CMD does not see it)")
	fs.StringVar(&o.processor, "processor", "", "the worker's name: its slots claim as NAME/w1 ... NAME/wN, which must be unique among live workers (default <hostname>-<pid>)")
	shutdownGrace := fs.String("shutdown-grace", "30s", "on SIGTERM or SIGINT, how long running CMDs may go on before they are stopped and their tasks handed back")
	killGrace := fs.String("kill-grace", "5s", "when a CMD is stopped, the time between SIGTERM and SIGKILL (for a task whose TTL is shorter than twice this, half the TTL)")
	fs.StringVar(&o.logLevel, "log-level", env("LEASEHOLD_LOG_LEVEL", "info"), "debug, info, warn or error; CMD's stderr is logged whatever the level (env LEASEHOLD_LOG_LEVEL)")
	fs.StringVar(&o.logFormat, "log-format", env("LEASEHOLD_LOG_FORMAT", "json"), "json or console (env LEASEHOLD_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return o, flagError(err)
	}
	o.argv = fs.Args()
	const example = "e.g. leasehold work --kind resize -- ./resize.sh"
	var errs []error
	if len(kinds) == 0 {
		errs = append(errs, fmt.Errorf("--kind is required: the kinds of task CMD runs, %s", example))
	}
	if len(queues) == 0 {
		queues = namesFlag{task.DefaultQueue}
	}
	for _, f := range []struct {
		name  string
		names []string
		into  *[]string
	}{{"kind", kinds, &o.kinds}, {"queue", queues, &o.queues}} {
		for _, n := range f.names {
			if err := checkFlagName(f.name, n); err != nil {
				errs = append(errs, err)
			} else if !slices.Contains(*f.into, n) {
				*f.into = append(*f.into, n)
			}
		}
		if len(*f.into) > maxClaimNames {
			errs = append(errs, fmt.Errorf("%d --%s flags; a worker takes at most %d", len(*f.into), f.name, maxClaimNames))
		}
	}
	n, err := strconv.Atoi(*concurrency)
	if err != nil || n < 1 || n > maxConcurrency {
		errs = append(errs, fmt.Errorf("--concurrency %q must be an integer between 1 and %d: how many tasks run at once", *concurrency, maxConcurrency))
	}
	o.concurrency = n
	if o.processor == "" {
		o.processor = hostPID()
	}
	// The longest slot's name must be a valid processor.
	if err := checkFlagName("processor", fmt.Sprintf("%s/w%d", o.processor, max(o.concurrency, 1))); err != nil {
		errs = append(errs, err)
	}
	if o.shutdownGrace, err = durationFlag("shutdown-grace", *shutdownGrace, 0, time.Hour, false, "30s"); err != nil {
		errs = append(errs, err)
	}
	if o.killGrace, err = durationFlag("kill-grace", *killGrace, 0, 10*time.Minute, false, "5s"); err != nil {
		errs = append(errs, err)
	}
	if lv, err := zerolog.ParseLevel(o.logLevel); err != nil || lv == zerolog.NoLevel {
		errs = append(errs, fmt.Errorf("--log-level %q must be debug, info, warn or error", o.logLevel))
	}
	if o.logFormat != "json" && o.logFormat != "console" {
		errs = append(errs, fmt.Errorf("--log-format %q must be json or console", o.logFormat))
	}
	if len(o.argv) == 0 {
		errs = append(errs, fmt.Errorf("no command to run: put it after --, %s", example))
	} else if _, err := exec.LookPath(o.argv[0]); err != nil {
		errs = append(errs, fmt.Errorf("CMD %q cannot be run (%w); name a program on PATH or give its path", o.argv[0], errors.Unwrap(err)))
	}
	return o, joinUsage(errs)
}

// runWork is "leasehold work" (see workUsage). It runs until ctx ends (main
// ends it on SIGTERM or SIGINT), then shuts down gracefully and returns
// nil; or it returns an error when the server refuses its claims for good.
func runWork(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseWork(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(config{LogLevel: o.logLevel, LogFormat: o.logFormat, Instance: o.processor}, stderr)
	if err != nil {
		return err
	}
	// Per slot, a claim and a heartbeat may be under way at once.
	client, done, err := o.client.taskClient(2*o.concurrency+2, 0)
	if err != nil {
		return err
	}
	defer done()
	w := &taskWorker{o: o, api: client, log: log}
	w.reach.log = log
	return w.run(ctx)
}

// taskWorker is a running "leasehold work": its slots, each claiming a
// task and running CMD for it, one at a time.
type taskWorker struct {
	o     workOptions
	api   *taskClient
	log   zerolog.Logger
	reach reachability
	// unheld is set when the server refused wait_seconds on a heartbeat (a
	// release before held heartbeats): the worker then waits itself and
	// sends plain ones.
	unheld     atomic.Bool
	unheldOnce sync.Once

	stopClaims context.CancelCauseFunc
	fatalOnce  sync.Once
	fatal      error // why the worker gave up; read after the slots ended

	cutMu sync.Mutex
	cut   []string // the slots whose claim the shutdown cut off before its answer came
}

// run runs the slots until ctx ends or the worker gives up, then shuts
// down: the claims end at once, running CMDs get the shutdown grace, and
// those still running after it are stopped and their tasks handed back.
// It returns when every goroutine it started has ended.
func (w *taskWorker) run(ctx context.Context) error {
	claimCtx, stopClaims := context.WithCancelCause(ctx)
	defer stopClaims(nil)
	w.stopClaims = stopClaims
	abort := make(chan struct{}) // closed when the shutdown grace is over
	var slots sync.WaitGroup
	for i := range w.o.concurrency {
		s := &slot{w: w, processor: fmt.Sprintf("%s/w%d", w.o.processor, i+1)}
		slots.Go(func() { s.run(claimCtx, abort) })
	}
	w.log.Info().Strs("kinds", w.o.kinds).Strs("queues", w.o.queues).Int("concurrency", w.o.concurrency).
		Str("url", w.o.client.url).Strs("cmd", w.o.argv).Msg("worker started")

	<-claimCtx.Done()
	w.log.Info().Dur("shutdown_grace", w.o.shutdownGrace).Msg("worker stopping: no new claims; running tasks get the shutdown grace to finish")
	ended := make(chan struct{})
	go func() {
		slots.Wait()
		close(ended)
	}()
	grace := time.NewTimer(w.o.shutdownGrace)
	select {
	case <-ended:
	case <-grace.C:
		close(abort)
		<-ended
	}
	grace.Stop()
	w.handBackCut()
	w.log.Info().Msg("worker stopped")
	return w.fatal
}

// handBackCut hands back the tasks claimed for the slots whose claim the shutdown cut off:
// the server may have claimed a task for one just as the request was abandoned, and an
// answer that never arrived cannot be handed back by the slot. The server hands back what
// it claims for a client it sees gone; this finds the rest, the running tasks held by those
// slots' processors, and gives each back under its fence (a fence moved on since is
// refused, and nothing changes).
func (w *taskWorker) handBackCut() {
	w.cutMu.Lock()
	cut := w.cut
	w.cutMu.Unlock()
	if len(cut) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cutHandBackTimeout)
	defer cancel()
	const page = 1000 // the API's largest
	q := url.Values{"state": {task.StateRunning}, "limit": {strconv.Itoa(page)}}
	for {
		running, _, err := w.api.listTasks(ctx, q)
		if err != nil {
			w.log.Warn().Err(err).Strs("processors", cut).
				Msg("could not look for tasks claimed as the shutdown cut the claims off; any such task is claimed again when its lease lapses")
			return
		}
		for _, t := range running {
			if slices.Contains(cut, t.Processor) {
				w.log.Info().Int64("task", t.ID).Str("processor", t.Processor).Int64("fence", t.Fence).
					Msg("handing back a task claimed as the shutdown cut its claim off")
				w.handBack(t, t.Processor, "the worker shut down as the task was claimed for it")
			}
		}
		// Until an empty page: a page may end short of the limit when its
		// tasks are large (the server bounds its size).
		if len(running) == 0 {
			return
		}
		q.Set("after_id", strconv.FormatInt(running[len(running)-1].ID, 10))
	}
}

// giveUp stops the worker for a refusal that asking again cannot change.
func (w *taskWorker) giveUp(err error) {
	w.fatalOnce.Do(func() {
		w.fatal = err
		w.log.Error().Err(err).Msg("giving up: the server refuses the claims; stopping")
		w.stopClaims(err)
	})
}

// claimFatal reports whether a claim's refusal is one that asking again
// cannot change: bad input, a wrong token, a URL that is not the API's.
func claimFatal(err error) bool {
	switch statusOf(err) {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// reachability logs when the server stops answering the claims, once, and
// when it answers again.
type reachability struct {
	log  zerolog.Logger
	mu   sync.Mutex
	down bool
}

func (r *reachability) failed(err error, retryIn time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.log.Debug()
	if !r.down {
		ev = r.log.Warn()
		r.down = true
	}
	ev.Err(err).Dur("retry_in", retryIn).Msg("a claim failed: the server cannot be reached or is unavailable; asking again with backoff")
}

func (r *reachability) answered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		r.down = false
		r.log.Info().Msg("the server answers again; claiming tasks")
	}
}

// Errors of the task routes a holder calls: 409 is task.ErrLeaseLost and
// 404 task.ErrNotFound, each wrapping the server's answer.
func holderError(err error) error {
	switch statusOf(err) {
	case http.StatusConflict:
		return fmt.Errorf("%w: %w", task.ErrLeaseLost, err)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", task.ErrNotFound, err)
	}
	return err
}

// holder is the body of the routes a task's holder calls.
type holder struct {
	Processor string `json:"processor"`
	Fence     int64  `json:"fence"`
}

// claim long-polls POST /api/tasks/next for processor: ok is false when no
// task came within claimWait.
func (w *taskWorker) claim(ctx context.Context, processor string) (task.Task, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, claimWait+requestTimeout)
	defer cancel()
	body := struct {
		Processor   string   `json:"processor"`
		Kinds       []string `json:"kinds"`
		Queues      []string `json:"queues"`
		WaitSeconds int64    `json:"wait_seconds"`
	}{processor, w.o.kinds, w.o.queues, int64(claimWait / time.Second)}
	status, raw, err := w.api.do(ctx, http.MethodPost, "/api/tasks/next", nil, body)
	if err != nil || status == http.StatusNoContent {
		return task.Task{}, false, err
	}
	t, err := decodeTask(http.MethodPost, "/api/tasks/next", raw)
	return t, err == nil, err
}

// holderOp sends one of the writes of a task's holder (heartbeat,
// complete, fail, requeue) with body.
func (w *taskWorker) holderOp(ctx context.Context, id int64, op string, body any) (task.Task, error) {
	path := "/api/tasks/" + strconv.FormatInt(id, 10) + "/" + op
	_, raw, err := w.api.do(ctx, http.MethodPut, path, nil, body)
	if err != nil {
		return task.Task{}, holderError(err)
	}
	return decodeTask(http.MethodPut, path, raw)
}

// heartbeat renews the task's lease. With a wait (whole seconds) the
// server renews it at once and holds its answer up to the wait, answering
// 409 the moment the task is cancelled: that is how a cancellation reaches
// the worker, which polls nothing. The request is bounded by the wait and
// requestTimeout on top (and by ctx: the lease's deadline).
func (w *taskWorker) heartbeat(ctx context.Context, t task.Task, processor string, wait time.Duration) error {
	if wait > 0 && w.unheld.Load() {
		// A server that does not hold heartbeats: the wait here, then a
		// heartbeat answered at once. The lease counts from before the wait,
		// which is earlier than the server's, as it must.
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		wait = 0
	}
	rctx, cancel := context.WithTimeout(ctx, wait+requestTimeout)
	defer cancel()
	sent := time.Now()
	_, err := w.holderOp(rctx, t.ID, "heartbeat", struct {
		holder
		WaitSeconds int64 `json:"wait_seconds,omitempty"`
	}{holder{processor, t.Fence}, int64(wait / time.Second)})
	if early := heldHeartbeatGap - time.Since(sent); wait > 0 && err == nil && early > 0 {
		// Held, but answered at once: the next waits a moment, so that a
		// replica answering every heartbeat so is not asked in a loop.
		timer := time.NewTimer(early)
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
	var se *leasehold.StatusError
	if wait > 0 && errors.As(err, &se) && se.StatusCode == http.StatusBadRequest && strings.Contains(se.Message, "wait_seconds") {
		w.unheldOnce.Do(func() {
			w.log.Warn().Err(err).Msg("the server does not take wait_seconds on heartbeats (a release before held heartbeats); " +
				"heartbeating without it: a cancellation reaches CMD at the next heartbeat, not at once")
		})
		w.unheld.Store(true)
		return w.heartbeat(ctx, t, processor, wait)
	}
	return err
}

// heldWait is the wait of a task's next held heartbeat: hold (the heartbeat
// interval in whole seconds), but short enough that the answer leaves half
// an interval before the lease's deadline, ctx's; 0, a heartbeat answered
// at once, when that is under a second (after failed heartbeats, or for a
// TTL too short to hold one).
func heldWait(ctx context.Context, hold, interval time.Duration) time.Duration {
	if hold <= 0 {
		return 0
	}
	if d, ok := ctx.Deadline(); ok {
		hold = min(hold, time.Until(d)-interval/2)
	}
	return max(hold.Truncate(time.Second), 0)
}

// whyLost tells, for the log, why a heartbeat of t was refused: its
// attempt was cancelled (task.ErrCancelled, with the reason), or else
// lost is kept.
func (w *taskWorker) whyLost(t task.Task, lost error) error {
	ctx, cancel := context.WithTimeout(context.Background(), whyLostTimeout)
	defer cancel()
	cur, _, _, err := w.api.oneTask(ctx, http.MethodGet, "/api/tasks/"+strconv.FormatInt(t.ID, 10), nil)
	if err != nil {
		return lost
	}
	for _, a := range cur.EarlierAttempts {
		if a.Fence == t.Fence && a.Outcome == task.OutcomeCancelled {
			return fmt.Errorf("%w: %s", task.ErrCancelled, orDash(a.Error))
		}
	}
	return lost
}

func (w *taskWorker) requeue(ctx context.Context, t task.Task, processor, reason string) (task.Task, error) {
	return w.holderOp(ctx, t.ID, "requeue", struct {
		holder
		Reason string `json:"reason"`
	}{holder{processor, t.Fence}, reason})
}

// slot is one of the worker's --concurrency: it claims a task, runs CMD
// for it, reports what became of it, and claims the next.
type slot struct {
	w         *taskWorker
	processor string
}

// run claims and works tasks until ctx ends. abort is closed when the
// shutdown grace is over.
func (s *slot) run(ctx context.Context, abort <-chan struct{}) {
	failures := 0
	for ctx.Err() == nil {
		sent := time.Now()
		t, ok, err := s.w.claim(ctx, s.processor)
		switch {
		case ctx.Err() != nil:
			switch {
			case ok:
				s.w.handBack(t, s.processor, "the worker shut down as it claimed the task")
			case err != nil: // cut off before its answer: see handBackCut
				s.w.cutMu.Lock()
				s.w.cut = append(s.w.cut, s.processor)
				s.w.cutMu.Unlock()
			}
			return
		case err != nil && claimFatal(err):
			s.w.giveUp(fmt.Errorf("claim tasks: %w", s.w.o.client.describe(err)))
			return
		case err != nil:
			failures++
			backoff := keepalive.Jitter(min(100*time.Millisecond<<min(failures-1, 6), 5*time.Second))
			s.w.reach.failed(s.w.o.client.describe(err), backoff)
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			continue
		}
		failures = 0
		s.w.reach.answered()
		if ok {
			s.work(abort, t, sent)
		}
	}
}

// handBack gives a task claimed for processor back to the queue, not
// counted as an attempt, when the worker will not run it.
func (w *taskWorker) handBack(t task.Task, processor, reason string) {
	ttl := orDefault(t.TTL(), defaultTaskTTL)
	ctx, cancel := context.WithTimeout(context.Background(), ttl-ttl/10)
	defer cancel()
	if _, err := w.requeue(ctx, t, processor, reason); err != nil && !errors.Is(err, task.ErrLeaseLost) {
		w.log.Warn().Err(err).Int64("task", t.ID).Msg("could not hand a task back; it is claimed again when its lease lapses")
	}
}

// orDefault is d, or def when d is not positive.
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// work runs CMD for a task claimed by a request sent at sent, under the
// task's lease, and reports what became of it: completed, failed, handed
// back (stopped at shutdown), or nothing when the lease was lost or the
// task cancelled.
//
// The lease counts as lost at the send time of the last successful claim
// or heartbeat + TTL − TTL/10 − G, on this process's monotonic clock
// (keepalive.Loop), where G is --kill-grace, at most half the TTL: CMD then
// gets SIGTERM, and SIGKILL G later, so that it is gone before the server
// can give the task to another worker.
//
// The heartbeat interval is a third of that window. When it is a second or
// more, the heartbeats are held (heartbeat): each waits on the server for
// the interval in whole seconds (heldWait), the next is sent right after
// the answer, the first firstHeldHeartbeat after the claim: from then on
// one is always waiting, and a cancellation, answered 409 at once, reaches
// CMD within a round trip. Its renewal happens when it arrives, after it was sent, so the
// send time still counts. A shorter interval heartbeats every interval,
// each answered at once, which brings a cancellation within that interval.
func (s *slot) work(abort <-chan struct{}, t task.Task, sent time.Time) {
	ttl := orDefault(t.TTL(), defaultTaskTTL)
	grace := min(s.w.o.killGrace, ttl/2)
	keep := lease.KeepConfig{TTL: ttl, Margin: ttl / 10, Grace: grace}
	interval := keep.Window() / 3
	keep.RenewInterval = interval
	hold := interval.Truncate(time.Second)
	if hold > 0 {
		// Each held heartbeat right after the answer to the last (the
		// loop's interval counts between sends, and a held one waits its
		// own); retries after a failure as often as ever.
		keep.RenewInterval, keep.RetryInterval = time.Millisecond, interval/4
	}
	log := s.w.log.With().Int64("task", t.ID).Str("kind", t.Kind).Str("queue", t.Queue).Str("processor", s.processor).
		Int64("fence", t.Fence).Int32("attempt", t.Attempts).Logger()
	log.Debug().Msg("claimed a task")

	// The lease counts from when the claim was sent, which for a claim that
	// waited is long before the task was claimed: a heartbeat now starts
	// its deadline afresh.
	if time.Since(sent) > ttl/10 {
		hb := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), ttl-ttl/10)
		err := s.w.heartbeat(ctx, t, s.processor, 0)
		cancel()
		switch {
		case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			log.Warn().Err(err).Msg("the heartbeat after a long claim was refused; CMD did not run")
			return
		case err != nil:
			// It may or may not have renewed the lease: CMD does not run, and the task goes
			// back under its fence now (refused, and nothing changes, if the lease is gone)
			// rather than wait out its lease.
			log.Warn().Err(err).Msg("the heartbeat after a long claim failed; CMD did not run, handing the task back")
			s.w.handBack(t, s.processor, "the heartbeat after its claim failed: "+err.Error())
			return
		}
		sent = hb
	}

	// lost ends when the lease counts as lost, a heartbeat refused (the
	// task cancelled, or its lease taken) or its deadline passed.
	lost, lose := context.WithCancelCause(context.Background())
	defer lose(nil)
	hbCtx, stopHeartbeats := context.WithCancel(lost)
	defer stopHeartbeats()
	deadline := make(chan time.Time, 1)
	go func() {
		failing, first := false, hold > 0
		loop := keepalive.Loop{
			Config: keep,
			BeforeRenew: func(ctx context.Context) {
				if !first {
					return
				}
				first = false
				timer := time.NewTimer(firstHeldHeartbeat)
				defer timer.Stop()
				select {
				case <-ctx.Done():
				case <-timer.C:
				}
			},
			Renew: func(ctx context.Context) error {
				return s.w.heartbeat(ctx, t, s.processor, heldWait(ctx, hold, interval))
			},
			Refused: keepalive.Refusal(task.ErrLeaseLost, task.ErrNotFound),
			Lost:    func(reason error) { lose(fmt.Errorf("task %d: %w", t.ID, reason)) },
			RenewFailed: func(err error) {
				if errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound) {
					return
				}
				ev := log.Debug()
				if !failing {
					ev = log.Warn()
				}
				failing = true
				ev.Err(err).Msg("a heartbeat failed; trying again until the lease's deadline")
			},
		}
		d, _ := loop.Run(hbCtx, sent)
		deadline <- d
	}()

	res := s.runCmd(lost, log, t, abort, grace)
	stopHeartbeats()
	// CMD has ended: a report is still accepted until the lease can expire,
	// which the margin put G after the deadline.
	stopBy := <-deadline
	reportBy := stopBy.Add(grace)
	if cause := context.Cause(lost); cause != nil || !time.Now().Before(stopBy) {
		if cause == nil {
			cause = lease.ErrDeadline
		}
		if errors.Is(cause, task.ErrLeaseLost) {
			cause = s.w.whyLost(t, cause)
		}
		ev := log.Warn().Err(cause).Str("cmd", res.how())
		switch {
		case errors.Is(cause, task.ErrCancelled):
			ev.Msg("the task was cancelled; CMD was stopped and nothing is reported")
		case errors.Is(cause, lease.ErrDeadline):
			// Given up at the deadline, not refused: the last heartbeat may
			// have renewed the lease although its answer never came. CMD is
			// gone, so the task goes back under its fence now (refused, and
			// nothing changes, if the lease lapsed) rather than wait out a
			// lease nobody holds.
			ev.Msg("the task's lease was given up at its deadline; CMD was stopped (or had ended), handing the task back")
			s.w.handBack(t, s.processor, "the worker gave the lease up at its deadline: "+cause.Error())
		default:
			ev.Msg("the task's lease was lost; CMD was stopped (or had ended) and nothing is reported")
		}
		return
	}

	h := holder{s.processor, t.Fence}
	switch {
	case res.startErr != nil:
		log.Error().Err(res.startErr).Msg("CMD could not be started; failing the attempt")
		s.fail(log, t, h, "could not start "+s.w.o.argv[0]+": "+res.startErr.Error(), reportBy, ttl)
	case res.stopped == "shutdown" && !res.succeeded():
		reason := fmt.Sprintf("leasehold work shut down; CMD was stopped after the shutdown grace (%s): %s", s.w.o.shutdownGrace, res.how())
		_ = s.report(log, "handed back", reportBy, ttl, func(ctx context.Context) (task.Task, error) {
			return s.w.requeue(ctx, t, s.processor, reason)
		})
	case res.succeeded():
		output, err := res.output()
		if err != nil {
			log.Warn().Err(err).Msg("CMD exited 0, but its output cannot be recorded; failing the attempt")
			s.fail(log, t, h, err.Error(), reportBy, ttl)
			return
		}
		s.complete(log, t, h, output, reportBy, ttl)
	default:
		tail, truncated := res.stderr.tail()
		s.fail(log, t, h, failureText("", tail, truncated, res.how()), reportBy, ttl)
	}
}

// fail fails the attempt with msg as its error.
func (s *slot) fail(log zerolog.Logger, t task.Task, h holder, msg string, reportBy time.Time, ttl time.Duration) {
	body := failBody{h, failureText(msg, nil, false, "")}
	_ = s.report(log, "failed", reportBy, ttl, func(ctx context.Context) (task.Task, error) {
		return s.w.holderOp(ctx, t.ID, "fail", body)
	})
}

// failBody is the body of PUT /api/tasks/{id}/fail.
type failBody struct {
	holder
	Error string `json:"error"`
}

// complete completes the task with output. A completion whose answer was
// lost and that is refused when sent again may have been the first's
// doing: the task, read back, says. When the server refuses the output
// itself (400: JSON that PostgreSQL cannot store), the attempt fails with
// the server's reason.
func (s *slot) complete(log zerolog.Logger, t task.Task, h holder, output json.RawMessage, reportBy time.Time, ttl time.Duration) {
	sentOnce := false
	err := s.report(log, "completed", reportBy, ttl, func(ctx context.Context) (task.Task, error) {
		done, err := s.w.holderOp(ctx, t.ID, "complete", struct {
			holder
			TaskOutput json.RawMessage `json:"task_output"`
		}{h, output})
		if sentOnce && errors.Is(err, task.ErrLeaseLost) {
			path := "/api/tasks/" + strconv.FormatInt(t.ID, 10)
			if cur, _, _, gerr := s.w.api.oneTask(ctx, http.MethodGet, path, nil); gerr == nil && cur.State == task.StateDone && cur.Fence == t.Fence {
				return cur, nil
			}
		}
		sentOnce = true
		return done, err
	})
	if statusOf(err) == http.StatusBadRequest {
		var se *leasehold.StatusError
		errors.As(err, &se)
		log.Warn().Err(err).Msg("the server refused CMD's stdout as task_output; failing the attempt")
		s.fail(log, t, h, "CMD exited 0, but the server refused its stdout as task_output: "+se.Message, reportBy, ttl)
	}
}

// report makes the final write of a task (complete, fail, requeue), trying
// again after a failure that may pass until reportBy: after it the write
// could only be refused. It logs the task's new state, or why there is
// none, and returns the last error.
func (s *slot) report(log zerolog.Logger, what string, reportBy time.Time, ttl time.Duration,
	write func(ctx context.Context) (task.Task, error),
) error {
	retryEvery := max(ttl/12, 100*time.Millisecond)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithDeadline(context.Background(), reportBy)
		got, err := write(ctx)
		cancel()
		switch {
		case err == nil:
			ev := log.Debug()
			if what != "completed" {
				ev = log.Info()
			}
			ev.Str("state", got.State).Msg("task " + what)
			return nil
		case errors.Is(err, task.ErrLeaseLost) || errors.Is(err, task.ErrNotFound):
			log.Warn().Err(err).Msgf("the task could not be recorded as %s: its lease was lost (it lapsed, or the task was cancelled)", what)
			return err
		case !leasehold.IsTransient(err):
			if statusOf(err) != http.StatusBadRequest {
				log.Error().Err(err).Msgf("the server refused to record the task as %s; it is claimed again when its lease lapses", what)
			}
			return err
		case !time.Now().Add(retryEvery).Before(reportBy):
			log.Warn().Err(err).Msgf("could not record the task as %s before its lease's deadline; it is claimed again when its lease lapses", what)
			return err
		default:
			ev := log.Debug()
			if attempt == 1 {
				ev = log.Warn()
			}
			ev.Err(err).Msgf("could not record the task as %s; trying again until its lease's deadline", what)
			time.Sleep(retryEvery)
		}
	}
}

// cmdResult is what became of one run of CMD.
type cmdResult struct {
	startErr error
	waitErr  error
	state    *os.ProcessState
	stdout   *outputBuffer
	stderr   *stderrSink
	// stopped says why CMD was signalled, if it was: "lost" (the lease lost
	// or the task cancelled) or "shutdown" (the shutdown grace was over).
	stopped string
}

// succeeded reports whether CMD ran and exited 0.
func (r cmdResult) succeeded() bool { return r.state != nil && r.state.Success() }

// how words how CMD ended, as a failure's error ends: "exit status 3".
func (r cmdResult) how() string {
	switch {
	case r.startErr != nil:
		return "not started: " + r.startErr.Error()
	case r.state == nil:
		return "lost track of: " + fmt.Sprint(r.waitErr)
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return "exit status " + strconv.Itoa(r.state.ExitCode())
}

// runCmd runs CMD for t until it exits, with the task's data on its stdin.
// When lost ends, or abort is closed, CMD's process group gets SIGTERM,
// then SIGKILL after grace.
//
// CMD runs in a session of its own: a Ctrl-C at a terminal reaches
// leasehold work only, which decides what becomes of CMD; and stopping CMD
// stops what it started too. Should leasehold work die without stopping it
// (kill -9), the kernel kills CMD (Pdeathsig), since nobody heartbeats its
// lease any more.
func (s *slot) runCmd(lost context.Context, log zerolog.Logger, t task.Task, abort <-chan struct{}, grace time.Duration) cmdResult {
	argv := s.w.o.argv
	res := cmdResult{stdout: &outputBuffer{max: maxOutputBytes}, stderr: &stderrSink{log: log.Level(zerolog.TraceLevel)}}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(childEnv(s.w.o.passToken, s.w.o.client.token),
		"LEASEHOLD_TASK_ID="+strconv.FormatInt(t.ID, 10),
		"LEASEHOLD_FENCE="+strconv.FormatInt(t.Fence, 10),
		"LEASEHOLD_ATTEMPT="+strconv.Itoa(int(t.Attempts)),
		"LEASEHOLD_KIND="+t.Kind,
		"LEASEHOLD_QUEUE="+t.Queue,
		"LEASEHOLD_PROCESSOR="+s.processor,
	)
	stdin := t.TaskData
	if len(stdin) > 0 {
		stdin = append(bytes.Clone(stdin), '\n')
	}
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = res.stdout, res.stderr
	// Pdeathsig is sent when the thread that started CMD ends: this
	// goroutine keeps its thread until CMD has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// Should what CMD started keep its stdout or stderr open after it
	// exited, do not wait for that past this.
	cmd.WaitDelay = time.Second
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		res.startErr = err
		return res
	}
	log.Debug().Int("pid", cmd.Process.Pid).Msg("CMD started")
	group := -cmd.Process.Pid // CMD leads its session and process group
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var (
		killTimer *time.Timer
		kill      <-chan time.Time
		lostDone  = lost.Done()
	)
	stop := func(why string) {
		if res.stopped != "" {
			return
		}
		res.stopped = why
		_ = syscall.Kill(group, syscall.SIGTERM)
		killTimer = time.NewTimer(grace)
		kill = killTimer.C
	}
run:
	for {
		select {
		case res.waitErr = <-exited:
			break run
		case <-lostDone:
			lostDone = nil
			cause := context.Cause(lost)
			log.Warn().Err(cause).Dur("kill_grace", grace).Msg("stopping CMD: SIGTERM, then SIGKILL after the kill grace")
			stop("lost")
		case <-abort:
			abort = nil
			log.Info().Dur("kill_grace", grace).Msg("the shutdown grace is over: stopping CMD (SIGTERM, then SIGKILL after the kill grace) to hand its task back")
			stop("shutdown")
		case <-kill:
			kill = nil
			log.Warn().Dur("kill_grace", grace).Msg("CMD still runs after SIGTERM and the kill grace; SIGKILL")
			_ = syscall.Kill(group, syscall.SIGKILL)
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}
	if res.stopped != "" {
		// What CMD started and left behind would run on without the lease.
		_ = syscall.Kill(group, syscall.SIGKILL)
	}
	res.state = cmd.ProcessState
	res.stderr.flush()
	return res
}

// output is the task_output of a CMD that exited 0: its stdout as the JSON
// value it is, or else as a JSON string without its trailing newlines;
// null when it printed nothing but white space. An error says why it
// cannot be recorded: more than the API takes in a request.
func (r cmdResult) output() (json.RawMessage, error) {
	out, total := r.stdout.bytes()
	tooBig := fmt.Errorf("CMD exited 0, but its stdout (%d bytes) does not fit in task_output, which takes at most %d bytes (the API's limit of 1 MiB a request); have CMD write large results elsewhere and print where", total, maxOutputBytes)
	if total > int64(len(out)) {
		return nil, tooBig
	}
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 {
		return json.RawMessage("null"), nil
	}
	var b bytes.Buffer
	if json.Valid(trimmed) {
		if err := json.Compact(&b, trimmed); err != nil {
			return nil, err
		}
	} else {
		// Not JSON: a string, NUL (which PostgreSQL cannot store) replaced,
		// invalid UTF-8 replaced by the encoder.
		s := strings.ReplaceAll(string(bytes.TrimRight(out, "\r\n")), "\x00", "\uFFFD")
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
	}
	if b.Len() > maxOutputBytes {
		return nil, tooBig
	}
	return b.Bytes(), nil
}

// failureText is a failed attempt's error, within the API's 4096 bytes and
// without NUL: msg, or else the end of CMD's stderr (tail; truncated when
// more came before it) and a last line saying how CMD ended (how).
func failureText(msg string, tail []byte, truncated bool, how string) string {
	if msg == "" {
		s := strings.TrimRight(strings.ToValidUTF8(string(tail), "\uFFFD"), " \t\r\n")
		if s == "" {
			msg = how + " (nothing on stderr)"
		} else {
			budget := maxErrorBytes - len(how) - 1
			if truncated || len(s) > budget {
				budget -= len("...")
				cut := max(len(s)-budget, 0)
				for cut < len(s) && !utf8.RuneStart(s[cut]) {
					cut++
				}
				s = "..." + s[cut:]
			}
			msg = s + "\n" + how
		}
	}
	msg = strings.ReplaceAll(strings.ToValidUTF8(msg, "\uFFFD"), "\x00", " ")
	if len(msg) > maxErrorBytes {
		cut := maxErrorBytes - len("...")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "..."
	}
	return msg
}

// outputBuffer keeps the first max bytes written to it, and counts all.
type outputBuffer struct {
	mu    sync.Mutex
	max   int
	buf   bytes.Buffer
	total int64
}

func (b *outputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// bytes returns what was kept and how much was written.
func (b *outputBuffer) bytes() ([]byte, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Bytes(), b.total
}

// stderrSink is where CMD's stderr goes: each line to the log, as a record
// of its own whatever --log-level (so that the worker's stderr stays one
// log), and the last maxErrorBytes kept for a failure's error.
type stderrSink struct {
	log   zerolog.Logger
	mu    sync.Mutex
	line  []byte
	last  []byte
	total int64
}

func (s *stderrSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(p)
	s.total += int64(n)
	s.last = append(s.last, p...)
	if len(s.last) > 2*maxErrorBytes {
		s.last = s.last[:copy(s.last, s.last[len(s.last)-maxErrorBytes:])]
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			if len(s.line) >= maxLogLine {
				s.emit()
			}
			break
		}
		s.line = append(s.line, p[:i]...)
		s.emit()
		p = p[i+1:]
	}
	return n, nil
}

// emit logs the line gathered so far; the caller holds mu.
func (s *stderrSink) emit() {
	s.log.Info().Str("stream", "stderr").Msg(string(bytes.TrimRight(s.line, "\r")))
	s.line = s.line[:0]
}

// flush logs a last line that ended without a newline.
func (s *stderrSink) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.line) > 0 {
		s.emit()
	}
}

// tail returns the last maxErrorBytes of what was written, and whether
// more came before them.
func (s *stderrSink) tail() ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.last[max(len(s.last)-maxErrorBytes, 0):]
	return bytes.Clone(b), s.total > int64(len(b))
}
