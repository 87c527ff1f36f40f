package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/taskstore"
)

// Defaults of the longpoll scenario.
const (
	DefaultWaiters     = 100
	DefaultIdleWaiters = 200
	DefaultIdleHold    = 60 * time.Second
	DefaultRESTWorkers = 32
)

// workKind is the kind the `leasehold work` processes of longpoll run.
const workKind = "bench_true"

// pollReplicas are Replicas API servers on one database, each with its own LISTEN
// connection, as `serve --roles api` runs them.
type pollReplicas struct {
	apis     []*apiServer
	stopping chan struct{}
	cancel   context.CancelFunc
	bg       sync.WaitGroup
}

func startPollReplicas(ctx context.Context, d *freshDB, n int) (*pollReplicas, error) {
	runCtx, cancel := context.WithCancel(ctx)
	r := &pollReplicas{stopping: make(chan struct{}), cancel: cancel}
	for i := range n {
		l, err := d.listen(runCtx, &r.bg, notify.ChannelTask)
		if err != nil {
			r.Close()
			return nil, err
		}
		api, err := startAPI(server.Deps{
			Leases: leasestore.NewStore(d.Pool), Tasks: taskstore.NewStore(d.Pool), Generator: demo.NewState(d.Pool),
			Instances: instance.NewStore(d.Pool), DefaultTTL: 30 * time.Second, Listener: l, Stopping: r.stopping,
			Instance: server.Instance{ID: fmt.Sprintf("bench-api-%d", i+1), StartedAt: time.Now().UTC(), Roles: []string{"api"}, Version: "bench"},
		})
		if err != nil {
			r.Close()
			return nil, err
		}
		r.apis = append(r.apis, api)
	}
	return r, nil
}

// Close answers the waiting claims (as a shutdown does), then stops the servers and
// their listeners.
func (r *pollReplicas) Close() {
	select {
	case <-r.stopping:
	default:
		close(r.stopping)
	}
	for _, a := range r.apis {
		a.Close()
	}
	r.cancel()
	r.bg.Wait()
}

// claimed is a task a waiting claim was answered, and when its answer arrived.
type claimed struct {
	id int64
	at time.Time
}

// pollClaim sends one waiting claim; it returns the task's id, or 0 when the wait ran out.
func (a *apiServer) pollClaim(ctx context.Context, body string) (int64, error) {
	var t struct {
		ID int64 `json:"id"`
	}
	err := a.call(ctx, "POST", "/api/tasks/next", body, http.StatusOK, &t)
	var status statusError
	if errors.As(err, &status) && status.got == http.StatusNoContent {
		return 0, nil
	}
	return t.ID, err
}

// runLongpoll measures the long-poll claims of POST /api/tasks/next on Replicas API servers:
// the wake latency of Waiters waiting claims, what IdleWaiters claims cost while nothing
// happens for IdleHold, and two REST drains of Tasks tasks (RESTWorkers long-polling HTTP
// workers per replica doing no work, and Replicas `leasehold work` processes of as many
// slots running `true`).
func runLongpoll(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	var out []Result
	wake, err := longpollWake(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("wake latency: %w", err)
	}
	out = append(out, wake...)
	idle, err := longpollIdle(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("idle waiters: %w", err)
	}
	out = append(out, idle...)
	drain, err := longpollDrain(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("REST drain: %w", err)
	}
	out = append(out, drain)
	work, err := longpollWork(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("leasehold work drain: %w", err)
	}
	return append(out, work), nil
}

// longpollWake: Waiters claims wait, spread over the replicas, each asking again as soon
// as it was answered; Samples tasks are inserted one at a time, each timed from its
// insert's commit (the midpoint of its round trip) to the arrival of the answer to the
// waiting claim it went to.
func longpollWake(ctx context.Context, c Config) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*4+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	rs, err := startPollReplicas(ctx, d, c.Replicas)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); rs.Close(); wg.Wait() }()
	got := make(chan claimed, c.Waiters)
	errs := make(chan error, c.Waiters)
	for i := range c.Waiters {
		api := rs.apis[i%len(rs.apis)]
		body := fmt.Sprintf(`{"processor":"bench-waiter-%d","wait_seconds":300}`, i+1)
		wg.Go(func() {
			for wctx.Err() == nil {
				id, err := api.pollClaim(wctx, body)
				switch {
				case wctx.Err() != nil:
					return
				case err != nil:
					errs <- err
					return
				case id != 0:
					got <- claimed{id: id, at: time.Now()}
				}
			}
		})
	}
	tasks := taskstore.NewStore(d.Pool)
	one := []taskstore.NewTask{{TaskData: zeroWork}}
	const warmUp = 20 // the waiters' first claims and registrations
	lat := make([]time.Duration, 0, c.Samples)
	for i := range c.Samples + warmUp {
		sent := time.Now()
		ts, err := tasks.Insert(ctx, one)
		if err != nil {
			return nil, err
		}
		from := sent.Add(time.Since(sent) / 2)
		select {
		case cl := <-got:
			if cl.id != ts[0].Task.ID {
				return nil, fmt.Errorf("a waiter was answered task %d, want %d", cl.id, ts[0].Task.ID)
			}
			if i >= warmUp {
				lat = append(lat, cl.at.Sub(from))
			}
		case err := <-errs:
			return nil, err
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("task %d went to no waiting claim within 30s", ts[0].Task.ID)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	slices.Sort(lat)
	setup := fmt.Sprintf("insert commit → answer to a waiting claim, %d tasks one at a time, %d claims waiting on %d replicas",
		c.Samples, c.Waiters, c.Replicas)
	var out []Result
	for _, p := range []struct {
		name string
		at   float64
	}{{"p50", 50}, {"p95", 95}, {"p99", 99}, {"max", 100}} {
		out = append(out, Result{Scenario: "longpoll", Case: p.name + ", " + setup, Value: ms(percentile(lat, p.at)), Unit: "ms"})
	}
	return out, nil
}

// longpollIdle counts the transactions of the scenario's database (pg_stat_database, read
// from another database) for IdleHold with no claim waiting, then for IdleHold while
// IdleWaiters claims wait on the replicas, and what their registration cost.
func longpollIdle(ctx context.Context, c Config) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*4+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	admin, err := pgx.Connect(ctx, c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var name string
	if err := d.Pool.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		return nil, err
	}
	// A backend reports its counts when it goes idle, but at most once a second; what
	// it could not report then it reports 10 s later (PostgreSQL's PGSTAT_IDLE_INTERVAL):
	// what happened is counted after that.
	const flush = 12 * time.Second
	xacts := func() (int64, error) {
		if err := pause(ctx, flush); err != nil {
			return 0, err
		}
		var n int64
		err := admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&n)
		return n, err
	}
	rs, err := startPollReplicas(ctx, d, c.Replicas)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); rs.Close(); wg.Wait() }()

	before, err := xacts()
	if err != nil {
		return nil, err
	}
	if err := pause(ctx, c.IdleHold); err != nil {
		return nil, err
	}
	quiet, err := xacts()
	if err != nil {
		return nil, err
	}
	wait := min(int(c.IdleHold/time.Second)+30, 300)
	var answered atomic.Int64
	for i := range c.IdleWaiters {
		api := rs.apis[i%len(rs.apis)]
		body := fmt.Sprintf(`{"processor":"bench-idle-%d","wait_seconds":%d}`, i+1, wait)
		wg.Go(func() {
			// The wait outlasts the hold: nothing may answer it before the end.
			if _, err := api.pollClaim(wctx, body); wctx.Err() == nil || !errors.Is(err, context.Canceled) {
				answered.Add(1)
			}
		})
	}
	registered, err := xacts()
	if err != nil {
		return nil, err
	}
	var holdStart time.Time
	if err := admin.QueryRow(ctx, "SELECT now()").Scan(&holdStart); err != nil {
		return nil, err
	}
	if err := pause(ctx, c.IdleHold); err != nil {
		return nil, err
	}
	// The sessions of the replicas (the pool's and the LISTEN connections) that ran a
	// statement during the hold: pg_stat_database also counts PostgreSQL's own
	// autovacuum of a new database, which this leaves out.
	var busy int64
	err = admin.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = $1 AND backend_type = 'client backend' AND (state <> 'idle' OR state_change > $2)`,
		name, holdStart).Scan(&busy)
	if err != nil {
		return nil, err
	}
	held, err := xacts()
	if err != nil {
		return nil, err
	}
	if n := answered.Load(); n > 0 {
		return nil, fmt.Errorf("%d of %d idle claims were answered during the hold", n, c.IdleWaiters)
	}
	hold := c.IdleHold.Round(time.Second)
	return []Result{
		{Scenario: "longpoll", Case: fmt.Sprintf("transactions in %s, no claim waiting, %d replicas", hold, c.Replicas),
			Value: float64(quiet - before), Unit: "xacts", Note: "pg_stat_database of the scenario's database"},
		{Scenario: "longpoll", Case: fmt.Sprintf("transactions to register %d waiting claims on %d replicas", c.IdleWaiters, c.Replicas),
			Value: float64(registered - quiet), Unit: "xacts", Note: "their first claims, the replicas' registrations, next-due looks"},
		{Scenario: "longpoll", Case: fmt.Sprintf("transactions in %s while %d claims wait on %d replicas", hold, c.IdleWaiters, c.Replicas),
			Value: float64(held - registered), Unit: "xacts", Note: "as many as with none: PostgreSQL's own (autovacuum)"},
		{Scenario: "longpoll", Case: fmt.Sprintf("replicas' sessions that ran a statement in %s while %d claims wait", hold, c.IdleWaiters),
			Value: float64(busy), Unit: "sessions", Note: "pg_stat_activity; 0: waiting claims cost nothing while nothing happens"},
	}, nil
}

// pause waits d, or until ctx ends: the harness's own waits, for counters to settle.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// longpollDrain: Tasks pre-inserted tasks, RESTWorkers HTTP workers per replica, each
// claiming with wait_seconds and completing at once; from the first claim sent to the
// last completion answered.
func longpollDrain(ctx context.Context, c Config) (Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.RESTWorkers+8))
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	if err := insertMany(ctx, taskstore.NewStore(d.Pool), c.Tasks); err != nil {
		return Result{}, err
	}
	rs, err := startPollReplicas(ctx, d, c.Replicas)
	if err != nil {
		return Result{}, err
	}
	defer rs.Close()
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		first error
		once  sync.Once
	)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	fail := func(err error) { once.Do(func() { first = err; stop() }) }
	start := time.Now()
	for r, api := range rs.apis {
		for w := range c.RESTWorkers {
			processor := fmt.Sprintf("bench-rest-%d-%d", r+1, w+1)
			claim := fmt.Sprintf(`{"processor":%q,"wait_seconds":5}`, processor)
			wg.Go(func() {
				for wctx.Err() == nil && done.Load() < int64(c.Tasks) {
					var t struct {
						ID    int64 `json:"id"`
						Fence int64 `json:"fence"`
					}
					err := api.call(wctx, "POST", "/api/tasks/next", claim, http.StatusOK, &t)
					var status statusError
					switch {
					case errors.As(err, &status) && status.got == http.StatusNoContent:
						continue
					case err != nil:
						if wctx.Err() == nil {
							fail(err)
						}
						return
					}
					body := fmt.Sprintf(`{"processor":%q,"fence":%d,"task_output":null}`, processor, t.Fence)
					if err := api.call(wctx, "PUT", "/api/tasks/"+strconv.FormatInt(t.ID, 10)+"/complete", body, http.StatusAccepted, nil); err != nil {
						if wctx.Err() == nil {
							fail(err)
						}
						return
					}
					if done.Add(1) == int64(c.Tasks) {
						stop() // the others stop waiting
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return Result{}, first
	}
	if n := done.Load(); n != int64(c.Tasks) {
		return Result{}, fmt.Errorf("the HTTP workers completed %d of %d tasks", n, c.Tasks)
	}
	return Result{
		Scenario: "longpoll", Case: fmt.Sprintf("REST drain, %d tasks, %d replicas × %d long-polling HTTP workers", c.Tasks, c.Replicas, c.RESTWorkers),
		Value: float64(c.Tasks) / elapsed.Seconds(), Unit: "tasks/s", Note: "claim with wait_seconds, complete; no work",
	}, nil
}

// longpollWork: Tasks pre-inserted tasks of workKind, one `leasehold work --concurrency
// RESTWorkers -- true` process per replica; from the first claim to the last completion,
// by the database clock, so that the processes' start-up is not counted.
func longpollWork(ctx context.Context, c Config) (Result, error) {
	setup := fmt.Sprintf("REST drain, %d tasks, %d `leasehold work` processes × %d running `true`", c.Tasks, c.Replicas, c.RESTWorkers)
	if c.Work == "" {
		return Result{Scenario: "longpoll", Case: setup, Unit: "tasks/s", Note: "not run: no leasehold binary (Config.Work)"}, nil
	}
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.RESTWorkers+8))
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	if err := insertLike(ctx, taskstore.NewStore(d.Pool), c.Tasks, taskstore.NewTask{TaskData: []byte(`{}`), Kind: workKind}); err != nil {
		return Result{}, err
	}
	rs, err := startPollReplicas(ctx, d, c.Replicas)
	if err != nil {
		return Result{}, err
	}
	defer rs.Close()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	}()
	trueBin, err := exec.LookPath("true")
	if err != nil {
		return Result{}, err
	}
	for _, api := range rs.apis {
		cmd := exec.CommandContext(ctx, c.Work, "work", "--url", api.base, "--kind", workKind,
			"--concurrency", strconv.Itoa(c.RESTWorkers), "--log-level", "warn", "--", trueBin)
		cmd.Env = os.Environ()
		cmd.Stdout, cmd.Stderr = c.Log, c.Log
		if err := cmd.Start(); err != nil {
			return Result{}, fmt.Errorf("start leasehold work: %w", err)
		}
		procs = append(procs, cmd)
	}
	secs, err := drainedIn(ctx, d, c.Tasks, "leasehold work")
	if err != nil {
		return Result{}, err
	}
	return Result{Scenario: "longpoll", Case: setup, Value: float64(c.Tasks) / secs, Unit: "tasks/s",
		Note: "first claim to last completion, by the database clock"}, nil
}
