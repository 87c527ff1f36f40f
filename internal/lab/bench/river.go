package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/taskstore"
)

// DefaultRiverTasks are the pending counts river drains each way.
var DefaultRiverTasks = []int{30000, 500000}

// riverWorkers are the workers of every drain river compares: one process (or client)
// of 100.
const riverWorkers = 100

// riverFetchCooldown is River's FetchCooldown in the comparison: its minimum, River at its
// fastest. At its default (100 ms) a client fetches at most once per cooldown, as many jobs
// as it has free workers, so 100 workers drain at most about 1,000 jobs/s.
const riverFetchCooldown = time.Millisecond

// runRiver compares leasehold's drain with River's (the peer program, c.RiverPeer) on the
// same server in the same run, for each of c.RiverTasks pending tasks, three ways:
//
//   - River: no-op jobs inserted with InsertMany in batches of 1000, then drained by one
//     client of 100 workers in a process of its own, at its fastest (riverFetchCooldown);
//   - leasehold from outside, as a user runs it: zero-work tasks inserted over REST in
//     batches of 1000 into an API-only replica (`serve --roles api`), then drained by one
//     `serve --roles worker --workers 100` process;
//   - leasehold's library: no-op tasks inserted with InsertMany, drained by one Client of
//     100 workers in this process.
//
// Each drain is timed by the database clock, from the first claim to the last completion
// (River: the first attempt to the last finalization), so that no process's start is
// counted, and each is metered: PostgreSQL's CPU time, WAL and writing transactions per
// task, the physical view beside the rate.
func runRiver(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	switch {
	case c.RiverPeer == "":
		return nil, errors.New("river needs the River peer program: build it with `go build -C tools/riverpeer -o $PWD/bin/riverpeer .` " +
			"and pass --river-peer bin/riverpeer (or run `go tool task bench-river`)")
	case c.Executable == "":
		return nil, errors.New("river needs a leasehold binary for its replicas (Config.Executable)")
	}
	var out []Result
	for _, n := range c.RiverTasks {
		fmt.Fprintf(c.Log, "river: %d pending: River\n", n)
		river, err := drainRiverPeer(ctx, c, n)
		if err != nil {
			return nil, fmt.Errorf("the River drain of %d: %w", n, err)
		}
		fmt.Fprintf(c.Log, "river: %d pending: leasehold over REST and a worker replica\n", n)
		rest, err := drainRESTReplica(ctx, c, n)
		if err != nil {
			return nil, fmt.Errorf("leasehold's drain of %d from outside: %w", n, err)
		}
		fmt.Fprintf(c.Log, "river: %d pending: leasehold's library\n", n)
		lib, err := drainLibraryOf(ctx, c, n, libraryDrain{workers: riverWorkers})
		if err != nil {
			return nil, fmt.Errorf("the library's drain of %d: %w", n, err)
		}
		out = append(out, river.results(n, "River, InsertMany + one client of 100 workers, FetchCooldown 1ms (peer process)", 0)...)
		out = append(out, rest.results(n, "leasehold, REST insert + one worker replica of 100 workers", river.rate())...)
		out = append(out, lib.results(n, "leasehold, InsertMany + one Client of 100 workers (library)", river.rate())...)
	}
	return out, nil
}

// drained is one metered drain.
type drained struct {
	tasks int
	secs  float64 // by the database clock, first claim to last completion
	w     window
	app   time.Duration // CPU time of the program that worked the tasks (see its note)
	appOf string        // what app counts
	note  string
	// claims are the claim statements of a library drain that counted them.
	claims claimCount
}

func (d drained) rate() float64 { return float64(d.tasks) / d.secs }

// results are d's rate (with its ratio to peer's rate, when peer is not 0) and its costs
// per task.
func (d drained) results(n int, who string, peer float64) []Result {
	r := func(what string, v float64, unit, note string) Result {
		return Result{Scenario: "river", Case: fmt.Sprintf("%d pending: %s: %s", n, who, what), Value: v, Unit: unit, Note: note}
	}
	note := fmt.Sprintf("drained in %.2fs, first claim to last completion by the database clock", d.secs)
	if peer > 0 {
		note = fmt.Sprintf("%.2f× River's; %s", d.rate()/peer, note)
	}
	if d.note != "" {
		note += "; " + d.note
	}
	out := []Result{r("drain", d.rate(), "tasks/s", note)}
	per := float64(d.tasks)
	if d.w.cpu > 0 {
		out = append(out, r("PostgreSQL CPU per task", d.w.cpu.Seconds()*1e6/per, "µs",
			fmt.Sprintf("%.2f CPU-s over the drain's %s (the database's sessions and PostgreSQL's shared processes)", d.w.cpu.Seconds(), d.w.elapsed.Round(time.Millisecond))))
	} else {
		out = append(out, r("PostgreSQL CPU per task", 0, "", "not measured: "+cmpOr(d.w.notLocal, "no CPU time counted")))
	}
	if d.app > 0 {
		out = append(out, r("its own CPU per task", d.app.Seconds()*1e6/per, "µs", fmt.Sprintf("%.2f CPU-s: %s", d.app.Seconds(), d.appOf)))
		if d.w.cpu > 0 {
			both := d.app + d.w.cpu
			out = append(out, r("CPU per task, PostgreSQL and its own", both.Seconds()*1e6/per, "µs",
				fmt.Sprintf("the drain's ceiling on this machine's %d cores, were they all busy: %.0f tasks/s", runtime.NumCPU(),
					float64(runtime.NumCPU())*per/both.Seconds())))
		}
	}
	walNote := fmt.Sprintf("%.1f MB in all", d.w.wal/1e6)
	if d.w.ckpts > 0 {
		walNote += fmt.Sprintf("; %d checkpoint(s) began meanwhile, whose full-page images are counted", d.w.ckpts)
	}
	return append(out,
		r("WAL per task", d.w.wal/per, "B", walNote),
		r("transactions that wrote, per task", float64(d.w.xacts)/per, "xacts", fmt.Sprintf("%d transaction ids given", d.w.xacts)))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// drainRiverPeer has the peer program insert n no-op jobs into a database of its own and
// then drain them with one client of riverWorkers workers, metered.
func drainRiverPeer(ctx context.Context, c Config, n int) (drained, error) {
	d, err := newDB(ctx, c.DatabaseURL, 4)
	if err != nil {
		return drained{}, err
	}
	defer d.Close()
	if _, _, err := runPeer(ctx, c, "insert", "--database-url", d.URL, "--jobs", strconv.Itoa(n)); err != nil {
		return drained{}, err
	}
	m, err := settledMeter(ctx, d)
	if err != nil {
		return drained{}, err
	}
	defer m.close(ctx)
	out, cpu, err := runPeer(ctx, c, "drain", "--database-url", d.URL, "--jobs", strconv.Itoa(n), "--workers", strconv.Itoa(riverWorkers),
		"--fetch-cooldown", riverFetchCooldown.String())
	if err != nil {
		return drained{}, err
	}
	w, err := m.stop(ctx)
	if err != nil {
		return drained{}, err
	}
	res := drained{tasks: n, w: w, app: cpu, appOf: "the peer process, start to exit", note: "the peer said " + strings.TrimSpace(out)}
	var completed int
	err = d.Pool.QueryRow(ctx, `SELECT count(*), extract(epoch FROM max(finalized_at) - min(attempted_at))::float8 FROM river_job WHERE state = 'completed'`).
		Scan(&completed, &res.secs)
	if err != nil {
		return drained{}, fmt.Errorf("read River's jobs: %w", err)
	}
	if completed != n {
		return drained{}, fmt.Errorf("the River peer completed %d of %d jobs", completed, n)
	}
	return res, nil
}

// runPeer runs the River peer program with args and returns what it printed and the CPU
// time it used.
func runPeer(ctx context.Context, c Config, args ...string) (string, time.Duration, error) {
	cmd := exec.CommandContext(ctx, c.RiverPeer, args...)
	var stderr bytes.Buffer
	cmd.Stderr = io.MultiWriter(&stderr, c.Log)
	out, err := cmd.Output()
	if err != nil {
		return "", 0, fmt.Errorf("%s %s: %w\n%s", c.RiverPeer, args[0], err, stderr.String())
	}
	return string(out), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// settledMeter starts a meter on d once the server has settled (settle).
func settledMeter(ctx context.Context, d *freshDB) (*meter, error) {
	settle(ctx, d)
	return startMeter(ctx, d)
}

// settle lets the server finish what the insert left it (autovacuum and analyze of the
// new rows) before a drain is metered, as long as it is still at it, for at most a
// minute: each system's drain then starts from a table as its insert leaves it once
// settled, not from one that autovacuum is still scanning beside the drain.
func settle(ctx context.Context, d *freshDB) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var busy bool
		err := d.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'autovacuum worker')`).Scan(&busy)
		if err != nil || !busy {
			return
		}
		if pause(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
}

// drainRESTReplica is leasehold's drain as a user runs it: n zero-work tasks inserted
// over REST, in batches of 1000, into an API-only replica, then drained by one worker
// replica process of riverWorkers workers, metered from its start to the last completion.
func drainRESTReplica(ctx context.Context, c Config, n int) (drained, error) {
	d, err := newDB(ctx, c.DatabaseURL, 4)
	if err != nil {
		return drained{}, err
	}
	defer d.Close()
	api, err := startServe(ctx, c, d, "bench-api", "api")
	if err != nil {
		return drained{}, err
	}
	defer api.stop()
	if err := insertOverREST(ctx, api.base, n); err != nil {
		return drained{}, err
	}
	m, err := settledMeter(ctx, d)
	if err != nil {
		return drained{}, err
	}
	defer m.close(ctx)
	w, err := startServe(ctx, c, d, "bench-worker", "worker", "--workers", strconv.Itoa(riverWorkers))
	if err != nil {
		return drained{}, err
	}
	defer w.stop()
	secs, err := drainedIn(ctx, d, n, "the worker replica")
	if err != nil {
		return drained{}, err
	}
	win, err := m.stop(ctx)
	if err != nil {
		return drained{}, err
	}
	w.stop()
	return drained{tasks: n, secs: secs, w: win, app: w.cpu(), appOf: "the worker replica's process, start to exit"}, nil
}

// served is a `leasehold serve` process of the bench.
type served struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:port
}

// startServe starts `leasehold serve` with roles on d, on a free port of 127.0.0.1, and
// waits until it is ready.
func startServe(ctx context.Context, c Config, d *freshDB, instance, roles string, more ...string) (*served, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close() // the replica listens on it next; a harness's small race
	args := append([]string{"serve", "--addr", addr, "--instance", instance, "--roles", roles, "--log-level", "warn"}, more...)
	cmd := exec.CommandContext(ctx, c.Executable, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+d.URL)
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start leasehold serve --roles %s: %w", roles, err)
	}
	s := &served{cmd: cmd, base: "http://" + addr}
	// A harness's wait for a process it started: /readyz every 20 ms, for at most a minute.
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(s.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
			err = fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("leasehold serve --roles %s was not ready at %s within a minute (last: %w)", roles, s.base, err)
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			s.stop()
			return nil, err
		}
	}
}

// stop ends the process (SIGTERM) and waits for it; again, it does nothing.
func (s *served) stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
}

// cpu is the CPU time the process used, once it has exited.
func (s *served) cpu() time.Duration {
	if s.cmd.ProcessState == nil {
		return 0
	}
	return s.cmd.ProcessState.UserTime() + s.cmd.ProcessState.SystemTime()
}

// insertOverREST inserts n zero-work tasks through base's POST /api/tasks, 1000 a request.
func insertOverREST(ctx context.Context, base string, n int) error {
	one, err := json.Marshal(map[string]json.RawMessage{"task_data": zeroWork})
	if err != nil {
		return err
	}
	for n > 0 {
		k := min(n, 1000)
		body := append([]byte{'['}, bytes.Repeat(append(one, ','), k)...)
		body[len(body)-1] = ']'
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/tasks", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("POST /api/tasks: %w", err)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("POST /api/tasks of %d: %d %s", k, resp.StatusCode, msg)
		}
		n -= k
	}
	return nil
}

// libraryDrain is how drainLibraryOf drains.
type libraryDrain struct {
	workers int                               // of the one Client
	opts    func(i int) *leasehold.InsertOpts // the i-th task's, when not nil
	// check, when not nil, reads the drained database before it is dropped; its error
	// is the drain's.
	check func(ctx context.Context, d *freshDB) error
	// claims, when not nil, counts the workers' claim statements.
	claims *claimTracer
}

// drainLibraryOf is the library's drain of n no-op tasks by one Client of how.workers
// workers in this process, metered.
func drainLibraryOf(ctx context.Context, c Config, n int, how libraryDrain) (drained, error) {
	var tracer pgx.QueryTracer
	if how.claims != nil {
		tracer = how.claims
	}
	d, err := newTracedDB(ctx, c.DatabaseURL, int32(how.workers+8), tracer)
	if err != nil {
		return drained{}, err
	}
	defer d.Close()
	var handled atomic.Int64
	all := make(chan struct{})
	kinds := leasehold.NewWorkers()
	err = leasehold.AddWorker(kinds, leasehold.WorkFunc[noop](func(context.Context, *leasehold.Task[noop]) error {
		if handled.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		return drained{}, err
	}
	client, err := leasehold.NewClient(d.Pool, leasehold.Config{
		ID: "bench-lib", Workers: kinds, TaskTTL: 30 * time.Second,
		Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: how.workers}},
	})
	if err != nil {
		return drained{}, err
	}
	params := make([]leasehold.InsertParams, 0, 1000)
	for i := 0; i < n; {
		params = params[:0]
		for ; i < n && len(params) < cap(params); i++ {
			p := leasehold.InsertParams{Args: noop{}}
			if how.opts != nil {
				p.Opts = how.opts(i)
			}
			params = append(params, p)
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return drained{}, err
		}
	}
	m, err := settledMeter(ctx, d)
	if err != nil {
		return drained{}, err
	}
	defer m.close(ctx)
	before := selfCPU()
	if err := client.Start(ctx); err != nil {
		return drained{}, err
	}
	select {
	case <-all:
	case <-ctx.Done():
		_ = client.Stop(context.WithoutCancel(ctx))
		return drained{}, ctx.Err()
	}
	if err := client.Stop(ctx); err != nil {
		return drained{}, err
	}
	app := selfCPU() - before
	win, err := m.stop(ctx)
	if err != nil {
		return drained{}, err
	}
	stats, err := taskstore.NewStore(d.Pool).Stats(ctx)
	if err != nil {
		return drained{}, err
	}
	if stats.Done != int64(n) {
		return drained{}, fmt.Errorf("after the library's drain %d tasks are done, want %d (%+v)", stats.Done, n, stats)
	}
	res := drained{tasks: n, w: win, app: app, appOf: "this process from Start to Stop (the meter's sampling too, a small part)"}
	err = d.Pool.QueryRow(ctx, `SELECT extract(epoch FROM max(processed_at) - min(started_at))::float8 FROM tasks`).Scan(&res.secs)
	if err != nil {
		return drained{}, err
	}
	if how.claims != nil {
		res.claims = how.claims.count()
	}
	if how.check != nil {
		if err := how.check(ctx, d); err != nil {
			return drained{}, err
		}
	}
	return res, nil
}

// selfCPU is the CPU time this process has used so far (0 where it cannot be read).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
