package worker_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/worker"
)

// TestNoLostWakeUpWhileRegistering: many inserters, each committing one
// task at a time (some pausing between insert and commit), race a
// dispatcher that keeps registering as a waiter (it unregisters whenever
// its two workers are both busy). The safety poll is off, so a wake-up lost
// between an insert's check for waiters and the dispatcher's registration,
// among the last inserts of a round, would leave a task pending while the
// dispatcher sleeps, and the round would never finish: every task must be
// done, on its first attempt, round after round. (Later inserts' wake-ups
// hide a lost one; TestRegistrationCoversAnInsertInFlight makes the losing
// order happen on purpose.)
func TestNoLostWakeUpWhileRegistering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startPool("p", 2, 30*time.Second, func(p *worker.Pool, _ *replica) { p.WaitLinger = -1 })
	const rounds, inserters, perInserter = 10, 8, 12
	total := 0
	for range rounds {
		// Both workers busy at once: the dispatcher unregisters, and must
		// register again, while the inserts below are in flight, to sleep.
		// The two tasks last a moment, so that the dispatcher finds both
		// workers busy after its claim however slowly it runs: a task
		// done at once could free its worker before the dispatcher looks.
		e.insert(0, sleepTask(0.2), sleepTask(0.2))
		var wg sync.WaitGroup
		for range inserters {
			wg.Go(func() {
				for k := range perInserter {
					if k%2 == 0 {
						if _, err := taskstore.TasksOf(e.tasks.Insert(e.ctx, []taskstore.NewTask{{TaskData: []byte(sleepTask(0))}})); err != nil {
							t.Errorf("insert: %v", err)
							return
						}
						continue
					}
					// An inserter that takes a moment between its insert
					// (where the trigger checks for waiters) and its
					// commit, as a client's transaction may: it widens the
					// window a registration must cover.
					if err := pgx.BeginFunc(e.ctx, e.db.Pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(e.ctx, `INSERT INTO tasks (task_data) VALUES ($1)`, sleepTask(0)); err != nil {
							return err
						}
						_, err := tx.Exec(e.ctx, `SELECT pg_sleep(random() * 0.004)`)
						return err
					}); err != nil {
						t.Errorf("insert: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		total += 2 + inserters*perInserter
		waitUntil(t, "every task inserted so far is done", giveUp, func() bool {
			st, err := e.tasks.Stats(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			// After the last insert nothing but a notification sent by
			// one of them can wake the dispatcher to claim what is left.
			return st.Done == int64(total)
		})
	}
	p.stop(t)

	var doneOnce int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM tasks WHERE state = 'done' AND attempts = 1`).Scan(&doneOnce); err != nil || doneOnce != total {
		t.Fatalf("%d tasks done on their first attempt, %v; want all %d", doneOnce, err, total)
	}
	c := p.Counters()
	// Counted where the dispatcher registers: a registration whose
	// catch-up claim found a task reports no "asleep" event of its own.
	registrations := int(c.Registered)
	caughtUp := len(p.events.all(func(ev worker.Event) bool {
		return ev.Kind == worker.EventClaimed && ev.Wake&worker.WakeRegistered != 0
	}))
	// Each round ends with the pool idle, after it was all busy: it
	// registered again at least once per round.
	if registrations < rounds {
		t.Errorf("%d rounds of claims registered the pool as a waiter, want at least %d", registrations, rounds)
	}
	t.Logf("%d tasks; %d registrations; %d tasks found by the claim right after registering; %d claim statements (%d found nothing)",
		total, registrations, caughtUp, c.Claims, c.Empty)
}

// TestRegistrationCoversAnInsertInFlight is the lost wake-up made to
// happen: an insert checks for waiters while the only pool is busy (there
// are none, so it will not notify), and commits only after the pool went
// idle and registered. The pool must not sleep on notifications until that
// insert has committed, and must then claim its task: were the
// registration's barrier missing, it would sleep with the task pending
// (the safety poll is off) and the test would give up.
func TestRegistrationCoversAnInsertInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	heard := e.observe()
	p := e.startPool("p", 1, 30*time.Second, func(p *worker.Pool, _ *replica) { p.WaitLinger = -1 })
	from := p.events.len()
	busy := e.insert(0, sleepTask(2))[0]
	_, i := p.events.waitFor(t, "the claim of the busy task", from, isTask(worker.EventClaimed, busy.ID))
	p.events.waitFor(t, "the round after the claim", i, isKind(worker.EventAsleep))
	if got := e.waiterPIDs("p/workers"); len(got) != 0 {
		t.Fatalf("waiter rows of the busy pool: %v, want none", got)
	}

	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	var late int64
	if err := tx.QueryRow(e.ctx, `INSERT INTO tasks (task_data) VALUES ($1) RETURNING id`, sleepTask(0)).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if got := e.get(busy.ID); got.State != task.StateRunning {
		t.Fatalf("the busy task is %s before the open insert was made; it must still run for this test to mean anything", got.State)
	}
	// The busy task ends; the pool's claim finds nothing it can see and the
	// pool registers: its row is written, but the open insert holds it back.
	p.events.waitFor(t, "the busy task's completion", i, isTask(worker.EventCompleted, busy.ID))
	waitUntil(t, "the pool has registered", giveUp, func() bool { return len(e.waiterPIDs("p/workers")) == 1 })
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := heard(); len(got) != 1 {
		// The busy task's insert notified; the open one checked while no
		// pool waited, so its commit told nobody.
		t.Fatalf("notifications: %q, want only the first insert's", got)
	}
	claimed, _ := p.events.waitFor(t, "the claim of the open insert's task", i, isTask(worker.EventClaimed, late))
	p.events.waitFor(t, "its completion", i, isTask(worker.EventCompleted, late))
	t.Logf("the open insert's task was claimed woken by %s", claimed.Wake)
	p.stop(t)
}

// TestBusyPoolUnregisters: an idle pool is registered as a waiter; once
// all its workers are busy it unregisters (WaitLinger negative: at once),
// and inserts stop notifying; when it stops it leaves no registration.
func TestBusyPoolUnregisters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	heard := e.observe()
	p := e.startPool("p", 1, 30*time.Second, func(p *worker.Pool, _ *replica) {
		p.WaitLinger = -1
		p.ShutdownGrace = 100 * time.Millisecond
	})
	if got := e.waiterPIDs("p/workers"); len(got) != 1 {
		t.Fatalf("waiter rows of the idle pool: %v, want one", got)
	}
	from := p.events.len()
	tk := e.insert(0, sleepTask(3600))[0]
	if got := heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("an insert while the pool waits sent %q, want %q", got, notify.TasksInserted)
	}
	_, i := p.events.waitFor(t, "the claim", from, isTask(worker.EventClaimed, tk.ID))
	p.events.waitFor(t, "the round after the claim", i, isKind(worker.EventAsleep))
	if got := e.waiterPIDs("p/workers"); len(got) != 0 {
		t.Fatalf("waiter rows of the busy pool: %v, want none", got)
	}
	e.insert(0, sleepTask(0))
	if got := heard(); len(got) != 0 {
		t.Fatalf("an insert while the only pool is busy sent %q, want nothing", got)
	}
	p.stop(t)
	if got := e.waiterPIDs("p/workers"); len(got) != 0 {
		t.Fatalf("waiter rows after the pool stopped: %v, want none", got)
	}
}

// TestReaperPrunesDeadWaiters: a replica that died while it waited leaves
// its registration behind (every insert would notify for nobody); when the
// reaper marks a lease expired (the dead replica's, here) it removes the
// registrations whose LISTEN session has ended.
func TestReaperPrunesDeadWaiters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dead, err := pgx.Connect(e.ctx, e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := dead.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(e.ctx, `SELECT task_waiter_register('crashed/workers', $1, false)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := dead.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the dead replica's session has ended", giveUp, func() bool {
		var alive bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		return !alive
	})
	e.startReaper()
	if got := e.waiterPIDs("crashed/workers"); !slices.Equal(got, []int32{pid}) {
		t.Fatalf("the dead replica's waiter rows before any expiry: %v, want [%d]", got, pid)
	}
	if _, err := leasestore.NewStore(e.db.Pool).Acquire(e.ctx, lease.AcquireParams{Resource: "instance:crashed", Holder: "crashed", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the reaper pruned the dead replica's registration", giveUp, func() bool {
		return len(e.waiterPIDs("crashed/workers")) == 0
	})
	var marked bool
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT expired_at IS NOT NULL FROM leases WHERE resource = 'instance:crashed'`).Scan(&marked); err != nil || !marked {
		t.Fatalf("the dead replica's lease marked expired: %v, %v; want true", marked, err)
	}
}

// observe LISTENs on leasehold_task with a session of the test's and
// returns a function that says which "inserted" notifications arrived
// since its last call (others are left out), ended by a fence notification
// it sends: notifications arrive in commit order.
func (e *env) observe() func() []string {
	e.t.Helper()
	conn, err := pgx.Connect(e.ctx, e.db.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(e.ctx, "LISTEN leasehold_task"); err != nil {
		e.t.Fatal(err)
	}
	return func() []string {
		e.t.Helper()
		if _, err := e.db.Pool.Exec(e.ctx, "SELECT pg_notify('leasehold_task', 'fence')"); err != nil {
			e.t.Fatal(err)
		}
		var got []string
		for {
			wctx, cancel := context.WithTimeout(e.ctx, giveUp)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				e.t.Fatalf("waiting for the fence (have %q): %v", got, err)
			}
			switch n.Payload {
			case "fence":
				return got
			case notify.TasksInserted:
				got = append(got, n.Payload)
			}
		}
	}
}
