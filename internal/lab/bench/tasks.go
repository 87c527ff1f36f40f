package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/worker"
)

// zeroWork is a task that completes at once.
var zeroWork = json.RawMessage(`{"sleep_duration_seconds": 0}`)

// replicas are in-process replicas of the worker role: each has its own LISTEN connection
// and worker pool, as a process has, and all share the database pool.
type replicas struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startReplicas starts n replicas of workers each and returns once every one listens.
func startReplicas(ctx context.Context, d *freshDB, tasks *taskstore.Store, n, workers int, onEvent func(worker.Event)) (*replicas, error) {
	sleep, err := demo.Sleep(0, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &replicas{cancel: cancel}
	for i := range n {
		l, err := d.listen(ctx, &r.wg, notify.ChannelTask)
		if err != nil {
			r.Stop()
			return nil, err
		}
		p := &worker.Pool{Tasks: tasks, Listener: l, Instance: fmt.Sprintf("bench-%d", i+1), Workers: workers,
			TTL: 30 * time.Second, Kinds: []string{demo.Kind}, Handler: sleep,
			Log: zerolog.Nop(), OnEvent: onEvent}
		r.wg.Go(func() { _ = p.Run(ctx) })
	}
	return r, nil
}

// Stop stops the replicas and waits for them.
func (r *replicas) Stop() {
	r.cancel()
	r.wg.Wait()
}

// insertMany inserts n zero-work tasks in batches of 1000.
func insertMany(ctx context.Context, tasks *taskstore.Store, n int) error {
	return insertLike(ctx, tasks, n, taskstore.NewTask{TaskData: zeroWork})
}

// insertLike inserts n copies of nt, a thousand to a statement.
func insertLike(ctx context.Context, tasks *taskstore.Store, n int, nt taskstore.NewTask) error {
	for n > 0 {
		batch := make([]taskstore.NewTask, min(n, 1000))
		for i := range batch {
			batch[i] = nt
		}
		if _, err := tasks.Insert(ctx, batch); err != nil {
			return err
		}
		n -= len(batch)
	}
	return nil
}

// runDrain pre-inserts Tasks zero-work tasks, then Replicas × Workers complete them all.
func runDrain(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	tasks := taskstore.NewStore(d.Pool)
	if err := insertMany(ctx, tasks, c.Tasks); err != nil {
		return nil, err
	}
	var completed atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	r, err := startReplicas(ctx, d, tasks, c.Replicas, c.Workers, func(ev worker.Event) {
		if ev.Kind == worker.EventCompleted && completed.Add(1) == int64(c.Tasks) {
			close(done)
		}
	})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	elapsed := time.Since(start)
	stats, err := tasks.Stats(ctx)
	if err != nil {
		return nil, err
	}
	if stats.Done != int64(c.Tasks) {
		return nil, fmt.Errorf("after the drain %d tasks are done, want %d (%+v)", stats.Done, c.Tasks, stats)
	}
	results := []Result{{
		Scenario: "drain", Case: fmt.Sprintf("%d tasks, %d replicas × %d workers, in-process", c.Tasks, c.Replicas, c.Workers),
		Value: float64(c.Tasks) / elapsed.Seconds(), Unit: "tasks/s",
	}}
	r.Stop()
	lib, err := drainLibrary(ctx, c)
	if err != nil {
		return nil, err
	}
	results = append(results, lib)
	if c.Executable != "" {
		res, err := drainProcesses(ctx, c)
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	return results, nil
}

// drainProcesses is drain with each replica a process of c.Executable on a fresh database.
// The time is the database's, from the first claim to the last completion, so that the
// processes' start-up is not counted.
func drainProcesses(ctx context.Context, c Config) (Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, 4)
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	if err := insertMany(ctx, taskstore.NewStore(d.Pool), c.Tasks); err != nil {
		return Result{}, err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	}()
	for i := range c.Replicas {
		cmd := exec.CommandContext(ctx, c.Executable, "serve", "--addr", "127.0.0.1:0",
			"--instance", fmt.Sprintf("bench-p%d", i+1), "--roles", "worker",
			"--workers", strconv.Itoa(c.Workers), "--log-level", "warn")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+d.URL)
		cmd.Stdout, cmd.Stderr = c.Log, c.Log
		if err := cmd.Start(); err != nil {
			return Result{}, fmt.Errorf("start a replica: %w", err)
		}
		procs = append(procs, cmd)
	}
	secs, err := drainedIn(ctx, d, c.Tasks, "the processes")
	if err != nil {
		return Result{}, err
	}
	return Result{
		Scenario: "drain", Case: fmt.Sprintf("%d tasks, %d replicas × %d workers, processes", c.Tasks, c.Replicas, c.Workers),
		Value: float64(c.Tasks) / secs, Unit: "tasks/s",
		Note: "first claim to last completion, by the database clock",
	}, nil
}

// drainedIn waits until n tasks of d are done, by processes the harness does not see
// into, and returns the seconds from the first claim to the last completion by the
// database clock, so that the processes' start-up is not counted. A task ending dead, or
// 10 minutes, is an error naming who, which ran them.
func drainedIn(ctx context.Context, d *freshDB, n int, who string) (float64, error) {
	store := taskstore.NewStore(d.Pool)
	// A harness's wait, not the product's: the count is read every 50 ms.
	for deadline := time.Now().Add(10 * time.Minute); ; {
		stats, err := store.Stats(ctx)
		if err != nil {
			return 0, err
		}
		if stats.Done == int64(n) {
			break
		}
		if stats.Dead > 0 {
			return 0, fmt.Errorf("%d tasks ended dead under %s", stats.Dead, who)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s finished %d of %d tasks in 10 minutes", who, stats.Done, n)
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
	var secs float64
	err := d.Pool.QueryRow(ctx, `SELECT extract(epoch FROM max(processed_at) - min(started_at)) FROM tasks`).Scan(&secs)
	return secs, err
}

// runSteady inserts SteadyRate tasks per second for Duration while the replicas work, and
// reports the completion rate and the queue depth sampled every 100 ms.
func runSteady(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	tasks := taskstore.NewStore(d.Pool)
	var completed atomic.Int64
	r, err := startReplicas(ctx, d, tasks, c.Replicas, c.Workers, func(ev worker.Event) {
		if ev.Kind == worker.EventCompleted {
			completed.Add(1)
		}
	})
	if err != nil {
		return nil, err
	}
	defer r.Stop()

	const tick = 10 * time.Millisecond
	perTick := float64(c.SteadyRate) * tick.Seconds()
	// The offer lasts Duration and until a task it inserted has been
	// completed: a figure rests on at least one completion, however slowly
	// the replicas started on a loaded machine.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		inserted int
		owed     float64
		depths   []int64
		wg       sync.WaitGroup
		insErr   error
	)
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				var pending int64
				if err := d.Pool.QueryRow(runCtx, "SELECT count(*) FROM tasks WHERE state = 'pending'").Scan(&pending); err == nil {
					depths = append(depths, pending)
				}
			}
		}
	})
	startDone := completed.Load()
	start := time.Now()
	t := time.NewTicker(tick)
	for runCtx.Err() == nil {
		if time.Since(start) >= c.Duration && completed.Load() > startDone {
			cancel()
			break
		}
		select {
		case <-runCtx.Done():
		case <-t.C:
			owed += perTick
			n := int(owed)
			if n == 0 {
				continue
			}
			owed -= float64(n)
			if err := insertMany(runCtx, tasks, n); err != nil {
				if runCtx.Err() == nil {
					insErr = err
					cancel()
				}
				continue
			}
			inserted += n
		}
	}
	t.Stop()
	elapsed := time.Since(start)
	done := completed.Load() - startDone
	wg.Wait()
	if insErr != nil {
		return nil, insErr
	}
	slices.Sort(depths)
	var depthP50, depthMax int64
	if len(depths) > 0 {
		depthP50, depthMax = depths[len(depths)/2], depths[len(depths)-1]
	}
	setup := fmt.Sprintf("%d replicas × %d workers, %d tasks/s offered", c.Replicas, c.Workers, c.SteadyRate)
	return []Result{
		{Scenario: "steady", Case: "inserted, " + setup, Value: float64(inserted) / elapsed.Seconds(), Unit: "tasks/s"},
		{Scenario: "steady", Case: "completed, " + setup, Value: float64(done) / elapsed.Seconds(), Unit: "tasks/s"},
		{Scenario: "steady", Case: "queue depth p50 (pending, every 100 ms)", Value: float64(depthP50), Unit: "tasks"},
		{Scenario: "steady", Case: "queue depth max", Value: float64(depthMax), Unit: "tasks"},
	}, nil
}

// runLatency inserts one task at a time while the workers wait idle, and measures from the
// insert's commit to the claim statement's return. The insert's commit is taken as the
// midpoint of its round trip: the client cannot see the moment itself.
func runLatency(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	tasks := taskstore.NewStore(d.Pool)
	claimed := make(chan int64, 16)
	completed := make(chan int64, 16)
	r, err := startReplicas(ctx, d, tasks, c.Replicas, c.Workers, func(ev worker.Event) {
		switch ev.Kind {
		case worker.EventClaimed:
			claimed <- ev.TaskID
		case worker.EventCompleted:
			completed <- ev.TaskID
		}
	})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	one := []taskstore.NewTask{{TaskData: zeroWork}}
	lat := make([]time.Duration, 0, c.Samples)
	for range c.Samples {
		sent := time.Now()
		ts, err := tasks.Insert(ctx, one)
		if err != nil {
			return nil, err
		}
		from := sent.Add(time.Since(sent) / 2)
		if err := await(ctx, claimed, ts[0].Task.ID); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(from))
		if err := await(ctx, completed, ts[0].Task.ID); err != nil { // idle again before the next insert
			return nil, err
		}
	}
	r.Stop()
	lib, err := latencyLibrary(ctx, c)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, m := range []struct {
		setup string
		lat   []time.Duration
	}{
		{fmt.Sprintf("insert commit → claimed, %d tasks one at a time, %d × %d idle workers", c.Samples, c.Replicas, c.Workers), lat},
		{fmt.Sprintf("Insert's commit → handler running, through the library, %d tasks one at a time, %d clients × %d idle workers",
			c.Samples, c.Replicas, c.Workers), lib},
	} {
		slices.Sort(m.lat)
		for _, p := range []struct {
			name string
			at   float64
		}{{"p50", 50}, {"p95", 95}, {"p99", 99}, {"max", 100}} {
			out = append(out, Result{Scenario: "latency", Case: p.name + ", " + m.setup, Value: ms(percentile(m.lat, p.at)), Unit: "ms"})
		}
	}
	return out, nil
}

// await waits for id on c; another id first is an error (one task at a time).
func await(ctx context.Context, c <-chan int64, id int64) error {
	select {
	case got := <-c:
		if got != id {
			return fmt.Errorf("a worker took task %d, want %d", got, id)
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("task %d was not picked up within 30s", id)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runNotifyCost measures single-task inserts (one commit each) from 8 clients: with the tasks
// table's triggers on while nobody waits for inserted tasks (the insert trigger then sends no
// NOTIFY: the case of replicas whose workers are all busy), with them on while a waiter is
// registered (every insert notifies: the case of a replica sleeping with idle workers), and
// with the triggers off. The three take turns, each a fifth of Duration at a time and each
// turn starting with the next, so that whatever else the machine does, and the table's
// growth, weigh on all three alike.
func runNotifyCost(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	const clients, turns = 8, 5
	d, err := newDB(ctx, c.DatabaseURL, clients+2)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	tasks := taskstore.NewStore(d.Pool)
	slice := max(c.Duration/turns, 50*time.Millisecond)
	insert := func() (int, time.Duration, error) {
		return timed(ctx, clients, slice, func(ctx context.Context, _ int, more func() bool) (int, error) {
			one := []taskstore.NewTask{{TaskData: zeroWork}}
			count := 0
			for more() {
				if _, err := tasks.Insert(ctx, one); err != nil {
					return count, err
				}
				count++
			}
			return count, nil
		})
	}
	// A listener of its own stands in for a replica that sleeps with idle workers: it
	// registers as a waiter for the second case, and receives each notification.
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	l, err := d.listen(lctx, &wg, notify.ChannelTask)
	if err != nil {
		return nil, err
	}
	waiter := l.Waiter("bench/waiting")

	cases := []struct {
		name          string
		before, after func() error
		ops           int
		took          time.Duration
	}{
		{name: "triggers on, nobody waiting (no NOTIFY)"},
		{
			name:   "triggers on, a waiter registered (NOTIFY each)",
			before: func() error { return waiter.Register(ctx) },
			after:  func() error { return waiter.Unregister(ctx) },
		},
		{
			name:   "triggers off",
			before: func() error { _, err := d.Pool.Exec(ctx, "ALTER TABLE tasks DISABLE TRIGGER USER"); return err },
			after:  func() error { _, err := d.Pool.Exec(ctx, "ALTER TABLE tasks ENABLE TRIGGER USER"); return err },
		},
	}
	// Untimed: the pool's sessions are new, and their first statements (catalog look-ups,
	// the trigger function's compilation, plans) are slower than the rest.
	if _, _, err := insert(); err != nil {
		return nil, err
	}
	for turn := range turns {
		for j := range cases {
			k := &cases[(turn+j)%len(cases)] // each turn starts with the next case

			if k.before != nil {
				if err := k.before(); err != nil {
					return nil, fmt.Errorf("notify-cost, %s: %w", k.name, err)
				}
			}
			n, took, err := insert()
			if err != nil {
				return nil, err
			}
			k.ops, k.took = k.ops+n, k.took+took
			if k.after != nil {
				if err := k.after(); err != nil {
					return nil, fmt.Errorf("notify-cost, %s: %w", k.name, err)
				}
			}
		}
	}
	rate := func(i int) float64 { return float64(cases[i].ops) / cases[i].took.Seconds() }
	idle, waiting, off := rate(0), rate(1), rate(2)
	if off == 0 {
		return nil, errors.New("no insert completed with the triggers off")
	}
	var out []Result
	for i, k := range cases {
		out = append(out, Result{Scenario: "notify-cost", Case: "task inserts, " + k.name, Clients: clients, Value: rate(i), Unit: "tasks/s"})
	}
	return append(out,
		Result{Scenario: "notify-cost", Case: "on ÷ off, nobody waiting", Clients: clients, Value: 100 * idle / off, Unit: "%"},
		Result{Scenario: "notify-cost", Case: "on ÷ off, a waiter registered", Clients: clients, Value: 100 * waiting / off, Unit: "%"},
	), nil
}
