package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/worker"
)

// TestExactlyOnce drains thousands of tasks, inserted in batches before and
// while they are processed, with three replicas of four workers each: every
// task is done exactly once, on its first attempt, and none is lost. The
// safety poll is off: notifications alone keep the replicas busy.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, shape := range []struct {
		name              string
		replicas, workers int
	}{
		{"3 replicas of 4 workers", 3, 4},
		// Its completer keeps two statements in flight.
		{"a replica of 60 workers", 1, 60},
	} {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			exactlyOnce(t, shape.replicas, shape.workers)
		})
	}
}

// exactlyOnce drains 3,000 zero-work tasks with replicas pools of workers
// each, some inserted before they start, and checks that each was claimed
// and completed once, under one lease and a fence of its own.
func exactlyOnce(t *testing.T, replicas, workers int) {
	e := newEnv(t)
	const batches, perBatch = 30, 100
	const n = batches * perBatch
	batch := make([]string, perBatch)
	for i := range batch {
		batch[i] = sleepTask(0)
	}
	for range batches / 5 { // some wait before any replica runs: the start's catch-up claims them
		e.insert(0, batch...)
	}
	e.startReaper() // should a lease lapse after all, the task is redone and the assertions below say so
	var pools []*replica
	for i := range replicas {
		pools = append(pools, e.startPool(fmt.Sprintf("replica-%d", i), workers, 30*time.Second, nil))
	}
	for range batches - batches/5 {
		e.insert(0, batch...)
	}
	waitUntil(t, "every task is done", 3*giveUp, func() bool {
		st, err := e.tasks.Stats(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dead > 0 {
			t.Fatalf("%d tasks dead in a fault-free run", st.Dead)
		}
		return st.Done == n
	})
	for _, r := range pools {
		r.stop(t)
	}

	var total, doneOnce, byItsProcessor int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*),
		count(*) FILTER (WHERE state = 'done' AND attempts = 1 AND processed_at IS NOT NULL),
		count(*) FILTER (WHERE task_output->>'processor' = processor AND (task_output->>'slept_seconds')::float8 = 0)
		FROM tasks`).Scan(&total, &doneOnce, &byItsProcessor); err != nil {
		t.Fatal(err)
	}
	if total != n || doneOnce != n || byItsProcessor != n {
		t.Fatalf("%d tasks, %d done on their first attempt, %d with their processor's output; want %d each", total, doneOnce, byItsProcessor, n)
	}
	// The lease history: one lease per task, ended by its completion,
	// nothing else (no earlier attempt), and a fence of its own.
	var oneLease, fences int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FILTER (WHERE earlier_attempts = '[]' AND processed_at < must_heartbeat_before),
		count(DISTINCT fence) FROM tasks`).Scan(&oneLease, &fences); err != nil {
		t.Fatal(err)
	}
	if oneLease != n || fences != n {
		t.Fatalf("lease history: %d tasks completed under their one lease, %d fences; want %d", oneLease, fences, n)
	}
	// And from the workers' side: each task claimed and completed once,
	// nothing else went wrong; with a backlog, completions claimed the
	// workers' next tasks in their own statements.
	completed, claimed, chained, overlapped := map[int64]int{}, map[int64]int{}, 0, int64(0)
	for _, r := range pools {
		for _, ev := range r.events.all(func(worker.Event) bool { return true }) {
			switch ev.Kind {
			case worker.EventClaimed:
				claimed[ev.TaskID]++
				if ev.Wake&worker.WakeChained != 0 {
					chained++
				}
			case worker.EventCompleted:
				completed[ev.TaskID]++
			case worker.EventFailed, worker.EventLeaseLost, worker.EventCrashed, worker.EventRequeued:
				t.Errorf("%s: unexpected %+v", ev.Processor, ev)
			}
		}
		c := r.Counters()
		overlapped += c.Overlapped
		t.Logf("%s: %d claim statements (%d found nothing), %d tasks claimed, %d completed, %d completion statements beside another",
			r.Instance, c.Claims, c.Empty, c.Claimed, c.Completed, c.Overlapped)
	}
	for id, k := range completed {
		if k != 1 || claimed[id] != 1 {
			t.Errorf("task %d claimed %d and completed %d times by the workers", id, claimed[id], k)
		}
	}
	if len(completed) != n || len(claimed) != n {
		t.Errorf("workers claimed %d and completed %d tasks, want %d", len(claimed), len(completed), n)
	}
	if chained == 0 {
		t.Errorf("no task was claimed by a completion's statement, though %d tasks waited", n)
	}
	t.Logf("%d of %d tasks claimed by a completion's statement", chained, n)
	if workers >= 50 && overlapped == 0 {
		t.Errorf("no completion statement went beside another, though %d workers drained %d tasks", workers, n)
	}
}

// TestLeaseLostDuringWork pauses a worker's heartbeats past its lease (a
// simulated spike before its first heartbeat): it stops the task at its
// deadline and, its handler returned, hands the task back under its fence
// (the attempt not counted: the lease was still live when it gave it up);
// another replica takes the task and completes it; the first worker's late
// complete is refused.
func TestLeaseLostDuringWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startReaper()
	a := e.startPool("a", 1, 2*time.Second, func(p *worker.Pool, r *replica) {
		spiky, err := demo.SpikyHeartbeats(p.Tasks, 1, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		p.Ops = spiky
		record := p.OnEvent
		p.OnEvent = func(ev worker.Event) {
			record(ev)
			if ev.Kind == worker.EventLeaseLost {
				r.cancel() // "a" plays no further part: it must not take the task again
			}
		}
	})
	tk := e.insert(0, sleepTask(3))[0] // longer than the TTL
	claimed, _ := a.events.waitFor(t, "a's claim", 0, isTask(worker.EventClaimed, tk.ID))
	lost, _ := a.events.waitFor(t, "a's lease loss", 0, isTask(worker.EventLeaseLost, tk.ID))
	if !lost.Interrupted || !errors.Is(lost.Err, lease.ErrDeadline) || lost.Fence != claimed.Fence {
		t.Fatalf("lease lost: %+v; want the run interrupted at the local deadline (%v) of fence %d", lost, lease.ErrDeadline, claimed.Fence)
	}
	a.wait(t)

	b := e.startPool("b", 1, 30*time.Second, nil)
	reclaimed, _ := b.events.waitFor(t, "b's claim", 0, isTask(worker.EventClaimed, tk.ID))
	b.events.waitFor(t, "b's completion", 0, isTask(worker.EventCompleted, tk.ID))
	t.Logf("b claimed the task woken by %s", reclaimed.Wake)

	if evs := a.events.all(func(ev worker.Event) bool {
		return ev.Kind == worker.EventCompleted || ev.Kind == worker.EventFailed || ev.Kind == worker.EventRequeued
	}); len(evs) > 0 {
		t.Fatalf("a finished the task it had lost: %+v", evs)
	}
	if _, err := e.tasks.Complete(e.ctx, tk.ID, "a/w1", claimed.Fence, json.RawMessage(`{}`)); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("a's stale complete: %v, want task.ErrLeaseLost", err)
	}
	got := e.get(tk.ID)
	if got.State != task.StateDone || got.Attempts != 1 || got.Processor != "b/w1" || got.Fence != reclaimed.Fence {
		t.Fatalf("task: %+v; want done by b/w1 on attempt 1 (a's handed back, not counted) with fence %d", got, reclaimed.Fence)
	}
	if len(got.EarlierAttempts) != 1 || got.EarlierAttempts[0].Fence != claimed.Fence || got.EarlierAttempts[0].Outcome != task.OutcomeRequeued {
		t.Fatalf("history %+v; want a's attempt under fence %d handed back", got.EarlierAttempts, claimed.Fence)
	}
	h := e.leaseHistory(tk.ID)
	if contains(h[claimed.Fence], "expired") || !contains(h[reclaimed.Fence], "released") {
		t.Fatalf("lease history by fence: %v; want a's fence %d not expired (handed back), b's %d released", h, claimed.Fence, reclaimed.Fence)
	}
	b.stop(t)
}

// TestPoisonTaskEndsDead: tasks whose task_data no worker can run fail on
// every attempt, are retried after their backoff (the dispatcher's due
// timer wakes it: nobody notifies), and end dead after max_attempts.
func TestPoisonTaskEndsDead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startPool("p", 2, 5*time.Second, nil)
	poison := []struct{ data, says string }{ // task_data, and what the error must say
		{`{"sleep_duration_seconds": "soon"}`, "not valid"},
		{`{"sleep_duration_seconds": 99999}`, "out of range"},
		{`{"nap": 1}`, "no sleep_duration_seconds"},
		{`[1, 2]`, "not valid"},
	}
	ids := make([]int64, len(poison))
	for i, c := range poison {
		ids[i] = e.insert(3, c.data)[0].ID
	}
	for i, c := range poison {
		id := ids[i]
		p.events.waitFor(t, fmt.Sprintf("task %d's third failure", id), 0, func(ev worker.Event) bool {
			return ev.Kind == worker.EventFailed && ev.TaskID == id && ev.Attempts == 3
		})
		got := e.get(id)
		if got.Attempts != 3 || got.LastError == "" || !strings.Contains(got.LastError, c.says) || got.ProcessedAt == nil {
			t.Errorf("task %s: %+v (last error %q); want dead after 3 attempts, the error saying %q", c.data, got, got.LastError, c.says)
		}
		if fails := p.events.all(isTask(worker.EventFailed, id)); len(fails) != 3 {
			t.Errorf("task %s: %d failed attempts recorded by the workers, want 3", c.data, len(fails))
		}
	}
	if evs := p.events.all(isKind(worker.EventCompleted)); len(evs) > 0 {
		t.Errorf("completed a poison task: %+v", evs)
	}
	retries := p.events.all(func(ev worker.Event) bool { return ev.Kind == worker.EventClaimed && ev.Attempts > 1 })
	for _, ev := range retries {
		t.Logf("retry of task %d (attempt %d) woken by %s", ev.TaskID, ev.Attempts, ev.Wake)
	}
	p.stop(t)
}

// TestCrashedWorkerTaskIsRedone: a worker "crashes" mid-task (it abandons
// the task silently, as a killed process would); with a reaper running, the
// lapsed lease's expiry wakes an idle replica, which takes the task and
// completes it; the crashed worker's late complete would be refused.
func TestCrashedWorkerTaskIsRedone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startReaper()
	crashed := make(chan struct{}, 1)
	proceed := make(chan struct{})
	a := e.startPool("a", 1, 4*time.Second, func(p *worker.Pool, _ *replica) {
		p.Handler = sleepHandler(t, 1, func() {
			crashed <- struct{}{}
			<-proceed // meanwhile a's heartbeats go on: the task stays a's until the "crash" completes
		})
	})
	tk := e.insert(0, sleepTask(0.2))[0]
	select {
	case <-crashed:
	case <-time.After(giveUp):
		t.Fatal("a never crashed")
	}
	claimed, _ := a.events.waitFor(t, "a's claim", 0, isTask(worker.EventClaimed, tk.ID))

	// b is idle and listening while the task is still leased to a.
	b := e.startPool("b", 1, 30*time.Second, nil)
	a.cancel() // a's dispatcher stops claiming before the lease can lapse
	close(proceed)
	a.wait(t)
	if evs := a.events.all(isTask(worker.EventCrashed, tk.ID)); len(evs) != 1 {
		t.Fatalf("a's events for the crash: %+v; want one EventCrashed", evs)
	}

	reclaimed, _ := b.events.waitFor(t, "b's claim", 0, isTask(worker.EventClaimed, tk.ID))
	if reclaimed.Wake&worker.WakeRequeued == 0 {
		t.Errorf("b claimed the task woken by %s, want by the lease's expiry", reclaimed.Wake)
	}
	b.events.waitFor(t, "b's completion", 0, isTask(worker.EventCompleted, tk.ID))
	if _, err := e.tasks.Complete(e.ctx, tk.ID, "a/w1", claimed.Fence, json.RawMessage(`{}`)); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("the crashed worker's late complete: %v, want task.ErrLeaseLost", err)
	}
	got := e.get(tk.ID)
	if got.State != task.StateDone || got.Attempts != 2 || got.Processor != "b/w1" {
		t.Fatalf("task: %+v; want done by b/w1 on attempt 2", got)
	}
	h := e.leaseHistory(tk.ID)
	if !contains(h[claimed.Fence], "expired") || contains(h[claimed.Fence], "released") || !contains(h[reclaimed.Fence], "released") {
		t.Fatalf("lease history by fence: %v; want a's fence %d expired, never released, b's %d released", h, claimed.Fence, reclaimed.Fence)
	}
	b.stop(t)
}

// TestIdlePoolWakesOnInsert: with the safety poll off and nothing due, an
// idle replica picks up a newly inserted task, woken by its NOTIFY, with
// one claim statement for its four idle workers.
func TestIdlePoolWakesOnInsert(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startPool("p", 4, 5*time.Second, nil)
	before := p.Counters()
	tk := e.insert(0, sleepTask(0))[0]
	claimed, _ := p.events.waitFor(t, "the claim", 0, isTask(worker.EventClaimed, tk.ID))
	if claimed.Wake&worker.WakeInsert == 0 {
		t.Errorf("claimed the task woken by %s, want by the insert's notification", claimed.Wake)
	}
	p.events.waitFor(t, "the completion", 0, isTask(worker.EventCompleted, tk.ID))
	p.stop(t)
	if got := e.get(tk.ID); got.State != task.StateDone || got.Attempts != 1 {
		t.Fatalf("task: %+v; want done on attempt 1", got)
	}
	after := p.Counters()
	if after.Claimed-before.Claimed != 1 {
		t.Errorf("claimed %d tasks, want 1", after.Claimed-before.Claimed)
	}
	t.Logf("claim statements for one inserted task: %d (%d found nothing)", after.Claims-before.Claims, after.Empty-before.Empty)
}

// TestCatchUpAfterReconnect: a task inserted while the replica's LISTEN
// connection is down is never notified to it; the claim that follows the
// reconnect picks it up, and the pool registers again as a waiter, naming
// its new LISTEN session.
func TestCatchUpAfterReconnect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var cut atomic.Bool
	reconnecting := make(chan struct{}, 1)
	gate := make(chan struct{})
	p := e.startPool("p", 2, 5*time.Second, func(p *worker.Pool, r *replica) {
		p.Listener = e.listenerWith(r.ctx, func(ctx context.Context) (*pgx.Conn, error) {
			if cut.Load() { // held back until the test has inserted
				select {
				case reconnecting <- struct{}{}:
				default:
				}
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return pgx.Connect(ctx, e.db.URL)
		})
	})
	// The idle pool is registered as a waiter under its LISTEN session.
	listening := e.waiterPIDs("p/workers")
	if len(listening) != 1 {
		t.Fatalf("waiter rows of the idle pool: %v, want one", listening)
	}
	cut.Store(true)
	var killed int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(pg_terminate_backend($1))`, listening[0]).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends, %v; want 1", killed, err)
	}
	select {
	case <-reconnecting:
	case <-time.After(giveUp):
		t.Fatal("the listener never tried to reconnect")
	}
	from := p.events.len()
	tk := e.insert(0, sleepTask(0))[0] // nobody listens: its notification is lost
	close(gate)
	claimed, i := p.events.waitFor(t, "the claim", from, isTask(worker.EventClaimed, tk.ID))
	if claimed.Wake&worker.WakeResync == 0 {
		t.Errorf("claimed the task woken by %s, want by the resync after reconnecting", claimed.Wake)
	}
	p.events.waitFor(t, "the completion", 0, isTask(worker.EventCompleted, tk.ID))
	// The claim left a worker idle: the pool registered again, for its new
	// session (the old row went with the old session).
	p.events.waitFor(t, "the round that registered again", i, func(ev worker.Event) bool {
		return ev.Kind == worker.EventAsleep && ev.Wake&worker.WakeRegistered != 0
	})
	if now := e.waiterPIDs("p/workers"); len(now) != 1 || now[0] == listening[0] {
		t.Errorf("waiter rows after the reconnect: %v, want one naming a session other than %d", now, listening[0])
	}
	p.stop(t)
}

// TestExpiredTaskLeaseWakesIdlePool: with the safety poll off, a task whose
// processor died (claimed under a name no pool uses, never heartbeated) is
// picked up by an idle replica after its lease lapses, woken by the
// reaper's expiry notification.
func TestExpiredTaskLeaseWakesIdlePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startReaper()
	p := e.startPool("p", 2, 5*time.Second, nil)

	// Inserted not yet due, so that p, woken by the insert, leaves it to the
	// dead processor; then made due behind p's back (no notification, and
	// p's due timer is an hour away).
	from := p.events.len()
	tk, err := taskstore.TasksOf(e.tasks.Insert(e.ctx, []taskstore.NewTask{{TaskData: json.RawMessage(sleepTask(0)), ScheduledAt: time.Now().Add(time.Hour)}}))
	if err != nil {
		t.Fatal(err)
	}
	id := tk[0].ID
	p.events.waitFor(t, "p's round after the insert", from, func(ev worker.Event) bool {
		return ev.Kind == worker.EventAsleep && ev.Wake&worker.WakeInsert != 0
	})
	// (A millisecond early: a row made due exactly now() is announced as
	// requeued, a retry's way.)
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE tasks SET scheduled_at = now() - interval '1 millisecond' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	dead, err := e.tasks.Claim(e.ctx, taskstore.ClaimParams{Processors: []string{"dead/w1"}, TTL: time.Second, WithLapsed: true})
	if err != nil || len(dead) != 1 || dead[0].ID != id {
		t.Fatalf("the dead processor's claim: %+v, %v", dead, err)
	}

	reclaimed, _ := p.events.waitFor(t, "p's claim", from, isTask(worker.EventClaimed, id))
	if reclaimed.Wake&worker.WakeRequeued == 0 {
		t.Errorf("p claimed the task woken by %s, want by the lease's expiry", reclaimed.Wake)
	}
	p.events.waitFor(t, "p's completion", from, isTask(worker.EventCompleted, id))
	p.stop(t)
	got := e.get(id)
	if got.State != task.StateDone || got.Attempts != 2 {
		t.Fatalf("task: %+v; want done on attempt 2", got)
	}
	if _, err := e.tasks.Complete(e.ctx, id, "dead/w1", dead[0].Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("the dead processor's late complete: %v, want task.ErrLeaseLost", err)
	}
	if h := e.leaseHistory(id); !contains(h[dead[0].Fence], "expired") {
		t.Fatalf("lease history by fence: %v; want the dead processor's lease expired", h)
	}
}

// TestShutdownLetsTasksFinish: when a replica stops, it claims nothing more
// at once, and tasks running within the grace period finish and complete.
func TestShutdownLetsTasksFinish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startPool("p", 2, 5*time.Second, func(p *worker.Pool, _ *replica) { p.ShutdownGrace = giveUp })
	ts := e.insert(0, sleepTask(1), sleepTask(1))
	for _, tk := range ts {
		p.events.waitFor(t, "the claims", 0, isTask(worker.EventClaimed, tk.ID))
	}
	p.cancel()
	late := e.insert(0, sleepTask(0))[0]
	p.wait(t)
	for _, tk := range ts {
		if got := e.get(tk.ID); got.State != task.StateDone || got.Attempts != 1 {
			t.Errorf("task running at shutdown: %+v; want done within the grace", got)
		}
	}
	if got := e.get(late.ID); got.State != task.StatePending || got.Attempts != 0 {
		t.Errorf("task inserted after the shutdown began: %+v; want pending, never attempted", got)
	}
	if evs := p.events.all(isKind(worker.EventRequeued)); len(evs) > 0 {
		t.Errorf("requeued %+v; want none", evs)
	}
}

// TestShutdownRequeuesUnfinishedTasks: tasks still running when the grace
// period is over are cancelled and handed back, pending with their attempt
// uncounted and their leases released, so that another replica can claim
// them at once.
func TestShutdownRequeuesUnfinishedTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startPool("p", 2, 5*time.Second, func(p *worker.Pool, _ *replica) { p.ShutdownGrace = 200 * time.Millisecond })
	ts := e.insert(0, sleepTask(3600), sleepTask(3600))
	fences := map[int64]int64{}
	for _, tk := range ts {
		ev, _ := p.events.waitFor(t, "the claims", 0, isTask(worker.EventClaimed, tk.ID))
		fences[tk.ID] = ev.Fence
	}
	p.stop(t)
	for _, tk := range ts {
		got := e.get(tk.ID)
		if got.State != task.StatePending || got.Attempts != tk.Attempts {
			t.Errorf("task after shutdown: %+v; want pending with attempts %d as before its claim", got, tk.Attempts)
		}
		if evs := p.events.all(isTask(worker.EventRequeued, tk.ID)); len(evs) != 1 {
			t.Errorf("task %d: requeue events %+v, want one", tk.ID, evs)
		}
		if h := e.leaseHistory(tk.ID); !contains(h[fences[tk.ID]], "released") {
			t.Errorf("task %d: lease history %v; want fence %d released", tk.ID, h, fences[tk.ID])
		}
	}
	again, err := e.tasks.Claim(e.ctx, taskstore.ClaimParams{Processors: []string{"other/w1", "other/w2", "other/w3"}, TTL: time.Second, WithLapsed: true})
	if err != nil || len(again) != 2 {
		t.Fatalf("another replica's claim right after the shutdown: %d tasks, %v; want the 2 handed back", len(again), err)
	}
}

// TestRunChecksSettings: a pool that cannot work refuses to start.
func TestRunChecksSettings(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	l := e.listener(e.ctx)
	valid := func() *worker.Pool {
		return &worker.Pool{Tasks: e.tasks, Listener: l, Instance: "x", Workers: 1, TTL: time.Second,
			Kinds: []string{demo.Kind}, Handler: sleepHandler(t, 0, nil)}
	}
	cases := map[string]func(p *worker.Pool){
		"no store":        func(p *worker.Pool) { p.Tasks = nil },
		"no listener":     func(p *worker.Pool) { p.Listener = nil },
		"no instance":     func(p *worker.Pool) { p.Instance = "" },
		"negative":        func(p *worker.Pool) { p.Workers = -1 },
		"ttl fraction":    func(p *worker.Pool) { p.TTL = 1500 * time.Millisecond },
		"ttl zero":        func(p *worker.Pool) { p.TTL = 0 },
		"no kinds":        func(p *worker.Pool) { p.Kinds = nil },
		"no handler":      func(p *worker.Pool) { p.Handler = nil },
		"ttl over a hour": func(p *worker.Pool) { p.TTL = 2 * time.Hour },
	}
	for name, breakIt := range cases {
		p := valid()
		breakIt(p)
		if err := p.Run(e.ctx); err == nil {
			t.Errorf("%s: Run started", name)
		}
	}
	// No workers: Run idles until its context ends.
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	p := valid()
	p.Workers = 0
	wg.Go(func() {
		if err := p.Run(ctx); err != nil {
			t.Errorf("no workers: %v", err)
		}
	})
	cancel()
	wg.Wait()
}

// TestHandedBackTaskWakesIdlePool: a task another replica hands back at its
// shutdown is pending again at once, and its requeue notification wakes an
// idle replica, which takes it with no poll and no lease expiry.
func TestHandedBackTaskWakesIdlePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.startPool("a", 1, 30*time.Second, func(p *worker.Pool, _ *replica) {
		p.ShutdownGrace = 100 * time.Millisecond
		p.SafetyPoll = -1
	})
	tk := e.insert(0, sleepTask(3600))[0]
	a.events.waitFor(t, "a's claim", 0, isTask(worker.EventClaimed, tk.ID))
	b := e.startPool("b", 1, 30*time.Second, func(p *worker.Pool, _ *replica) { p.SafetyPoll = -1 })
	b.events.waitFor(t, "b idle", 0, isKind(worker.EventAsleep))
	a.stop(t)
	reclaimed, _ := b.events.waitFor(t, "b's claim", 0, isTask(worker.EventClaimed, tk.ID))
	if reclaimed.Wake&worker.WakeRequeued == 0 {
		t.Errorf("b claimed the handed-back task woken by %s, want by its requeue notification", reclaimed.Wake)
	}
	b.stop(t)
}

// TestReadyOnceWoken: Ready is called once, and only when the pool can be woken by an
// insert: its first round is over and it is registered as a waiter for inserted tasks.
func TestReadyOnceWoken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	registeredThen := make(chan bool, 2)
	e.startPool("ready", 2, 10*time.Second, func(p *worker.Pool, _ *replica) {
		p.Ready = func() { registeredThen <- len(e.waiterPIDs("ready/workers")) == 1 }
	})
	select {
	case registered := <-registeredThen:
		if !registered {
			t.Fatal("Ready was called before the pool was registered as a waiter: an insert then would not wake it")
		}
	case <-t.Context().Done():
		t.Fatal("Ready was not called")
	}
	// Woken again, by an insert, it says nothing more.
	tk := e.insert(1, sleepTask(0))[0]
	waitUntil(t, "the task to be done", 30*time.Second, func() bool { return e.get(tk.ID).State == task.StateDone })
	if len(registeredThen) != 0 {
		t.Fatal("Ready was called more than once")
	}
}
