package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// DefaultCapacityLeases are the counts of leases capacity holds and renews when
// Config.CapacityLeases is empty.
var DefaultCapacityLeases = []int{1000, 10000}

// DefaultRenewEvery is how often capacity renews each lease it holds when Config.RenewEvery
// is zero: the rate of a lease of TTL 3 s renewed every TTL/3. (The leases themselves get a
// longer TTL, so that a renewal sent late does not find its lease gone.)
const DefaultRenewEvery = time.Second

// Capacity's fixed shapes: the goroutines of each replica that renew its share of the held
// leases on schedule (enough to keep more renewals in flight than a group carries), and the
// clients that insert one task per statement in the steady task workload.
const (
	renewersPerReplica = 64
	steadyInserters    = 8
)

// runCapacity measures what each kind of work costs PostgreSQL, for the capacity model of
// docs/operations/capacity.md: renewals of held leases at a fixed rate, heartbeats of as many running
// tasks as the smallest count of leases, acquire+release cycles, a drain of pre-inserted
// tasks (twice: with statistics taken while tasks were pending, and with those of an empty
// queue), a steady stream of tasks inserted one per statement, and pgbench's simple update
// as a yardstick. For each it reports the rate achieved, the
// server's CPU time, WAL bytes and writing transactions per operation, and how many of the
// scenario's sessions were active at once (what a transaction-mode pooler's server pool must
// cover). Each workload runs on a fresh database of its own.
func runCapacity(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	every := c.RenewEvery
	if every == 0 {
		every = DefaultRenewEvery
	}
	counts := c.CapacityLeases
	if len(counts) == 0 {
		counts = DefaultCapacityLeases
	}
	var out []Result
	where, err := capacityWhere(ctx, c)
	if err != nil {
		return nil, err
	}
	out = append(out, where)
	for _, n := range counts {
		res, err := capacityRenewals(ctx, c, n, every)
		if err != nil {
			return nil, fmt.Errorf("renewals of %d leases: %w", n, err)
		}
		out = append(out, res...)
	}
	// Heartbeats are each a commit of their own: the smallest count is enough to price one.
	res, err := capacityHeartbeats(ctx, c, slices.Min(counts), every)
	if err != nil {
		return nil, fmt.Errorf("heartbeats of %d running tasks: %w", slices.Min(counts), err)
	}
	out = append(out, res...)
	workloads := []func(context.Context, Config) ([]Result, error){
		capacityCycles,
		func(ctx context.Context, c Config) ([]Result, error) { return capacityDrain(ctx, c, true) },
		func(ctx context.Context, c Config) ([]Result, error) { return capacityDrain(ctx, c, false) },
		capacitySteady,
		capacityYardstick,
	}
	for _, w := range workloads {
		res, err := w(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, res...)
	}
	return out, nil
}

// capacityWhere says, as the scenario's first figure, whether PostgreSQL's CPU can be
// measured here, and from which processes.
func capacityWhere(ctx context.Context, c Config) (Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, 1)
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	m, err := newMeter(ctx, d)
	if err != nil {
		return Result{}, err
	}
	defer m.close(ctx)
	r := Result{Scenario: "capacity", Case: "PostgreSQL's CPU"}
	if m.pg == nil {
		r.Note = "not measured: " + m.notLocal
	} else {
		r.Note = fmt.Sprintf("measured: the processes of the postmaster (pid %d) on this machine, %s; each workload counts "+
			"its database's and PostgreSQL's shared ones (WAL writer, checkpointer…), not other databases'", m.pg.pid, m.pg.how)
	}
	return r, nil
}

// capacityRenewals holds n leases, spread over Replicas stores (a store groups the
// operations of one replica), and renews each every interval for Duration, on schedule: lease
// i is due at start + i/n × every, then every interval after. A renewal that falls behind is
// sent at once, and none is sent after Duration: the rate achieved says whether the database
// kept up.
func capacityRenewals(ctx context.Context, c Config, n int, every time.Duration) ([]Result, error) {
	d, stores, err := leaseReplicas(ctx, c)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ttl, err := pacedTTL(every, c.Duration)
	if err != nil {
		return nil, err
	}
	goroutines := min(n, c.Replicas*renewersPerReplica)
	resource := func(i int) string { return fmt.Sprintf("capacity:lease:%d", i) }
	holder := func(i int) string { return fmt.Sprintf("bench-%d", i%c.Replicas+1) }
	fences := make([]int64, n)
	// Untimed: the leases are acquired first, by the same goroutines that renew them.
	_, _, err = timed(ctx, goroutines, 0, func(ctx context.Context, g int, _ func() bool) (int, error) {
		for i := g; i < n; i += goroutines {
			a, err := stores[i%c.Replicas].Acquire(ctx, lease.AcquireParams{Resource: resource(i), Holder: holder(i), TTL: ttl})
			if err != nil {
				return 0, err
			}
			fences[i] = a.Lease.Fence
		}
		return 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire the leases: %w", err)
	}
	// Statistics, as a deployment that has run a while has them (autovacuum's ANALYZE).
	// (Those of an empty table once made the renewal walk every live lease: see
	// TestRenewReadsOneLease.)
	if _, err := d.Pool.Exec(ctx, "ANALYZE leases, lease_events"); err != nil {
		return nil, fmt.Errorf("analyze the leases: %w", err)
	}
	name := fmt.Sprintf("renew %d held, each every %s (%.0f/s offered), %d replicas", n, every, float64(n)/every.Seconds(), c.Replicas)
	return meterPaced(ctx, d, n, every, c.Duration, goroutines, name, "renewal", func(ctx context.Context, i int) error {
		_, err := stores[i%c.Replicas].Renew(ctx, lease.RenewParams{Resource: resource(i), Holder: holder(i), Fence: fences[i]})
		if errors.Is(err, lease.ErrNotHeld) {
			return fmt.Errorf("lease %s lapsed before its renewal (TTL %s): the renewals fell behind by more than the TTL", resource(i), ttl)
		}
		return err
	})
}

// leaseReplicas makes a database of its own for a lease workload, and a store for each of
// Replicas replicas on its pool (a store groups the operations of one replica).
func leaseReplicas(ctx context.Context, c Config) (*freshDB, []*leasestore.Store, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, nil, err
	}
	stores := make([]*leasestore.Store, c.Replicas)
	for i := range stores {
		stores[i] = leasestore.NewStore(d.Pool)
	}
	return d, stores, nil
}

// meterPaced meters paced(op) on d's database and returns its figures, as workload name's
// operations called what.
func meterPaced(ctx context.Context, d *freshDB, n int, every, run time.Duration, goroutines int, name, what string,
	op func(ctx context.Context, i int) error) ([]Result, error) {
	m, err := startMeter(ctx, d)
	if err != nil {
		return nil, err
	}
	defer m.close(ctx)
	ops, maxLag, err := paced(ctx, n, every, run, goroutines, op)
	if err != nil {
		return nil, err
	}
	w, err := m.stop(ctx)
	if err != nil {
		return nil, err
	}
	return w.results(name, what, ops, 0, pacedNote(n, every, ops, maxLag, w.elapsed)), nil
}

// pacedTTL is the TTL of the leases (and tasks) a paced workload renews every interval for
// run: long enough that one outlives a renewal that falls behind by the whole run.
func pacedTTL(every, run time.Duration) (time.Duration, error) {
	ttl := (max(30*time.Second, 3*every) + run).Round(time.Second)
	if ttl > time.Hour {
		return 0, fmt.Errorf("renewing every %s for %s needs a TTL of %s, above the 1h a lease or task may have", every, run, ttl)
	}
	return ttl, nil
}

// paced runs op(i) for each of n items every interval for run, on schedule, from goroutines
// goroutines: item i is due at start + i/n × every, then every interval after. An op that
// falls behind is sent at once, and none is sent after run. It returns the ops done and how
// far behind schedule the latest one was sent.
func paced(ctx context.Context, n int, every, run time.Duration, goroutines int, op func(ctx context.Context, i int) error) (int, time.Duration, error) {
	start := time.Now()
	end := start.Add(run)
	var lagMu sync.Mutex
	var maxLag time.Duration
	ops, _, err := timed(ctx, goroutines, 0, func(ctx context.Context, g int, _ func() bool) (int, error) {
		count := 0
		var lag time.Duration
		defer func() {
			lagMu.Lock()
			maxLag = max(maxLag, lag)
			lagMu.Unlock()
		}()
		for round := 0; ; round++ {
			for i := g; i < n; i += goroutines {
				due := start.Add(time.Duration(round)*every + every*time.Duration(i)/time.Duration(n))
				if !due.Before(end) || !time.Now().Before(end) {
					return count, nil
				}
				if wait := time.Until(due); wait > 0 {
					if err := pause(ctx, wait); err != nil {
						return count, err
					}
				} else {
					lag = max(lag, -wait)
				}
				if err := op(ctx, i); err != nil {
					return count, err
				}
				count++
			}
		}
	})
	return ops, maxLag, err
}

// pacedNote is the note of a paced workload's rate: how far behind it fell, and whether
// the database kept up with the rate offered.
func pacedNote(n int, every time.Duration, ops int, maxLag, elapsed time.Duration) string {
	note := fmt.Sprintf("most behind schedule: %s", maxLag.Round(time.Millisecond))
	if float64(ops)/elapsed.Seconds() < 0.95*float64(n)/every.Seconds() {
		note = "below the rate offered: the database did not keep up; " + note
	}
	return note
}

// capacityHeartbeats has n tasks running, claimed for n processors spread over Replicas
// replicas' names, and heartbeats each every interval for Duration, on schedule as
// capacityRenewals renews: what long-running tasks cost while they run. Each heartbeat is a
// statement and a commit of its own, as a worker sends it.
func capacityHeartbeats(ctx context.Context, c Config, n int, every time.Duration) ([]Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ttl, err := pacedTTL(every, c.Duration)
	if err != nil {
		return nil, err
	}
	tasks := taskstore.NewStore(d.Pool)
	if err := insertLike(ctx, tasks, n, taskstore.NewTask{TaskData: zeroWork, TTL: ttl}); err != nil {
		return nil, err
	}
	type running struct {
		id        int64
		processor string
		fence     int64
	}
	run := make([]running, 0, n)
	for len(run) < n {
		procs := make([]string, min(100, n-len(run)))
		for i := range procs {
			procs[i] = fmt.Sprintf("bench-%d/worker-%d", (len(run)+i)%c.Replicas+1, len(run)+i)
		}
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: procs, TTL: ttl})
		if err != nil {
			return nil, err
		}
		if len(claimed) == 0 {
			return nil, fmt.Errorf("claimed %d of %d tasks, then none", len(run), n)
		}
		for _, t := range claimed {
			run = append(run, running{t.ID, t.Processor, t.Fence})
		}
	}
	if _, err := d.Pool.Exec(ctx, "ANALYZE tasks"); err != nil {
		return nil, fmt.Errorf("analyze the tasks: %w", err)
	}
	name := fmt.Sprintf("heartbeat %d running tasks, each every %s (%.0f/s offered), %d replicas", n, every, float64(n)/every.Seconds(), c.Replicas)
	return meterPaced(ctx, d, n, every, c.Duration, min(n, c.Replicas*renewersPerReplica), name, "heartbeat", func(ctx context.Context, i int) error {
		r := run[i]
		_, err := tasks.Heartbeat(ctx, r.id, r.processor, r.fence)
		if errors.Is(err, task.ErrLeaseLost) {
			return fmt.Errorf("task %d lapsed before its heartbeat (TTL %s): the heartbeats fell behind by more than the TTL", r.id, ttl)
		}
		return err
	})
}

// capacityCycles runs acquire+release cycles on the largest of Clients clients, each on a
// resource of its own, spread over Replicas stores, for Duration, as fast as they go. A
// cycle is two operations (two commits, shared with the other clients' by the store's
// groups).
func capacityCycles(ctx context.Context, c Config) ([]Result, error) {
	clients := slices.Max(c.Clients)
	d, stores, err := leaseReplicas(ctx, c)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	m, err := startMeter(ctx, d)
	if err != nil {
		return nil, err
	}
	defer m.close(ctx)
	cycles, _, err := timed(ctx, clients, c.Duration, func(ctx context.Context, client int, more func() bool) (int, error) {
		ops := storeOps{stores[client%c.Replicas]}
		res := fmt.Sprintf("capacity:cycle:%d", client)
		count := 0
		for more() {
			fence, err := ops.acquire(ctx, res)
			if err != nil {
				return count, err
			}
			if err := ops.release(ctx, res, fence); err != nil {
				return count, err
			}
			count++
		}
		return count, nil
	})
	if err != nil {
		return nil, err
	}
	w, err := m.stop(ctx)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("acquire+release cycles, %d replicas, flat out", c.Replicas)
	return w.results(name, "cycle", cycles, clients, "a cycle is two lease operations"), nil
}

// capacityDrain is the drain path measured whole: Replicas in-process replicas of Workers
// workers each wait, idle, then Tasks zero-work tasks are inserted a thousand to a statement
// and the replicas claim and complete them all. A warm-up drain comes first (warmTasks),
// with the tasks table analyzed while its tasks were pending (backlog) or after they were
// done (an empty queue, as autovacuum finds a quiet one): the sessions plan for those
// statistics, and the claims' plans differ.
func capacityDrain(ctx context.Context, c Config, backlog bool) ([]Result, error) {
	q, err := warmQueue(ctx, c, 0, backlog)
	if err != nil {
		return nil, err
	}
	defer q.close(ctx)
	if err := insertMany(ctx, q.tasks, c.Tasks); err != nil {
		return nil, err
	}
	if err := awaitCompleted(ctx, &q.completed, q.warmed+int64(c.Tasks)); err != nil {
		return nil, err
	}
	w, err := q.m.stop(ctx)
	if err != nil {
		return nil, err
	}
	stats := "statistics taken with a backlog"
	if !backlog {
		stats = "statistics of an empty queue"
	}
	name := fmt.Sprintf("tasks drained, %d inserted 1,000 a statement, %d replicas × %d workers, %s", c.Tasks, c.Replicas, c.Workers, stats)
	return w.results(name, "task", c.Tasks, 0, "from the first insert to the last completion"), nil
}

// capacitySteady offers SteadyRate tasks per second for Duration, each inserted by a
// statement of its own from a few clients (as API requests insert them), while Replicas ×
// Workers complete them, and measures until every inserted task is done.
func capacitySteady(ctx context.Context, c Config) ([]Result, error) {
	q, err := warmQueue(ctx, c, steadyInserters, true)
	if err != nil {
		return nil, err
	}
	defer q.close(ctx)
	tasks := q.tasks
	// The pacer hands out one token per task due; a token the inserters are too busy to
	// take is dropped, so the rate inserted says what the database took.
	tokens := make(chan struct{}, steadyInserters)
	var inserted atomic.Int64
	// Offered for Duration and until one task went in: the figures rest on
	// at least one, however slowly a loaded machine starts.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var insErr error
	var errOnce sync.Once
	for range steadyInserters {
		wg.Go(func() {
			one := []taskstore.NewTask{{TaskData: zeroWork}}
			for range tokens {
				if _, err := tasks.Insert(ctx, one); err != nil {
					errOnce.Do(func() { insErr = err; cancel() })
					continue
				}
				inserted.Add(1)
			}
		})
	}
	const tick = 10 * time.Millisecond
	perTick := float64(c.SteadyRate) * tick.Seconds()
	var owed float64
	t := time.NewTicker(tick)
	start := time.Now()
	for runCtx.Err() == nil {
		if time.Since(start) >= c.Duration && inserted.Load() > 0 {
			break
		}
		select {
		case <-runCtx.Done():
		case <-t.C:
			for owed += perTick; owed >= 1; owed-- {
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}
	t.Stop()
	close(tokens)
	wg.Wait()
	if insErr != nil {
		return nil, insErr
	}
	n := inserted.Load()
	if err := awaitCompleted(ctx, &q.completed, q.warmed+n); err != nil {
		return nil, err
	}
	w, err := q.m.stop(ctx)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("tasks steady, %d/s offered one a statement by %d clients, %d replicas × %d workers",
		c.SteadyRate, steadyInserters, c.Replicas, c.Workers)
	note := fmt.Sprintf("%d tasks, timed until the last was done", n)
	return w.results(name, "task", int(n), 0, note), nil
}

// warmTasks starts the replicas, counting their completions in completed, and has them
// drain min(Tasks, 10000) tasks, untimed, with the tasks table analyzed while those were
// pending (backlog) or once they were done: a running deployment's table has a history and
// statistics, and its sessions plan for them. It returns the replicas and how many tasks
// they drained.
//
// Without statistics, the tasks measured ran plans made for an empty table, cached by each
// session until the first ANALYZE: the claim chained to each completion scanned the whole
// table to update a few rows by id. With those of an empty queue, the claim's look for gated
// tasks walks every pending task (tasks_filter_idx) instead of the empty index of gated
// ones: O(backlog) a claim.
// warmedQueue is a task workload's setup: a database of its own, replicas that have drained
// a warm-up (warmTasks) and count their completions, and a meter started after it.
type warmedQueue struct {
	d         *freshDB
	tasks     *taskstore.Store
	completed atomic.Int64
	r         *replicas
	warmed    int64 // tasks completed before the meter started
	m         *meter
}

// warmQueue sets a task workload up, with extraConns connections in the pool beyond the
// replicas' workers' for the workload's own clients.
func warmQueue(ctx context.Context, c Config, extraConns int, backlog bool) (_ *warmedQueue, err error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8+extraConns))
	if err != nil {
		return nil, err
	}
	q := &warmedQueue{d: d, tasks: taskstore.NewStore(d.Pool)}
	defer func() {
		if err != nil {
			q.close(ctx)
		}
	}()
	if q.r, q.warmed, err = warmTasks(ctx, c, d, q.tasks, &q.completed, backlog); err != nil {
		return nil, err
	}
	if q.m, err = startMeter(ctx, d); err != nil {
		return nil, err
	}
	return q, nil
}

// close stops what warmQueue started, the last first.
func (q *warmedQueue) close(ctx context.Context) {
	if q.m != nil {
		q.m.close(ctx)
	}
	if q.r != nil {
		q.r.Stop()
	}
	q.d.Close()
}

func warmTasks(ctx context.Context, c Config, d *freshDB, tasks *taskstore.Store, completed *atomic.Int64, backlog bool) (*replicas, int64, error) {
	n := min(c.Tasks, 10000)
	analyze := func() error {
		if _, err := d.Pool.Exec(ctx, "ANALYZE tasks"); err != nil {
			return fmt.Errorf("analyze the tasks: %w", err)
		}
		return nil
	}
	if backlog {
		if err := insertMany(ctx, tasks, n); err != nil {
			return nil, 0, err
		}
		if err := analyze(); err != nil {
			return nil, 0, err
		}
	}
	r, err := startReplicas(ctx, d, tasks, c.Replicas, c.Workers, func(ev worker.Event) {
		if ev.Kind == worker.EventCompleted {
			completed.Add(1)
		}
	})
	if err != nil {
		return nil, 0, err
	}
	if !backlog {
		if err := insertMany(ctx, tasks, n); err != nil {
			r.Stop()
			return nil, 0, err
		}
	}
	if err := awaitCompleted(ctx, completed, int64(n)); err != nil {
		r.Stop()
		return nil, 0, err
	}
	if !backlog {
		if err := analyze(); err != nil {
			r.Stop()
			return nil, 0, err
		}
	}
	return r, int64(n), nil
}

// awaitCompleted waits until completed reaches n; 10 minutes is an error. A harness's
// wait, not the product's: the count is read every 5 ms.
func awaitCompleted(ctx context.Context, completed *atomic.Int64, n int64) error {
	for deadline := time.Now().Add(10 * time.Minute); completed.Load() < n; {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks completed in 10 minutes", completed.Load(), n)
		}
		if err := pause(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// yardstick names capacity's pgbench workload.
const yardstick = "pgbench -N, the yardstick"

// capacityYardstick meters Tasks of pgbench's simple-update transactions (-N: an UPDATE, a
// SELECT and an INSERT each; rounded up to a whole number per client) from 8 clients, flat
// out, as the other workloads are metered: what a transaction of the best-known benchmark
// costs this server, against which a reader can scale the other figures to a server of their
// own. It is bound by a count, as the drains are, not by a time: on a busy machine a run of
// pgbench -T can end before its clients have completed a single transaction.
func capacityYardstick(ctx context.Context, c Config) ([]Result, error) {
	const clients = 8
	perClient := max(1, (c.Tasks+clients-1)/clients)
	pgbench, err := findPgbench()
	if err != nil {
		return []Result{{Scenario: "capacity", Case: yardstick + ": not run", Note: err.Error()}}, nil
	}
	d, err := newDB(ctx, c.DatabaseURL, 1)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if out, err := exec.CommandContext(ctx, pgbench, "-i", "-q", "-s", "1", d.URL).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	m, err := startMeter(ctx, d)
	if err != nil {
		return nil, err
	}
	defer m.close(ctx)
	args := []string{"-N", "-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())),
		"-t", strconv.Itoa(perClient), d.URL}
	out, err := exec.CommandContext(ctx, pgbench, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pgbench %s: %w\n%s", strings.Join(args[:len(args)-1], " "), err, out)
	}
	w, err := m.stop(ctx)
	if err != nil {
		return nil, err
	}
	n, err := parseProcessed(out)
	if err != nil {
		return nil, err
	}
	if want := clients * perClient; n != want {
		return nil, fmt.Errorf("pgbench processed %d transactions of the %d it was asked for:\n%s", n, want, out)
	}
	return w.results(yardstick, "transaction", n, clients, "its sessions' start and end counted too"), nil
}

// parseProcessed reads "number of transactions actually processed: 28000" from pgbench's
// output.
func parseProcessed(out []byte) (int, error) {
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(line, "number of transactions actually processed: "); ok {
			num, _, _ := strings.Cut(strings.TrimSpace(rest), "/") // "28000/28000" with -t
			return strconv.Atoi(num)
		}
	}
	return 0, fmt.Errorf("no transaction count in pgbench's output:\n%s", out)
}
