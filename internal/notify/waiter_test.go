package notify_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// bundle is one test's database, a running listener and an observer: a
// LISTEN session of the test's own on leasehold_task.
type bundle struct {
	t        *testing.T
	ctx      context.Context
	db       pgtest.DB
	tasks    *taskstore.Store
	listener *notify.Listener
	observer *pgx.Conn
}

// newBundle starts a listener whose sessions are named app (so that the
// test can find them) and returns once it listens.
func newBundle(t *testing.T, app string) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	cfg, err := pgx.ParseConfig(tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) },
		zerolog.Nop(), notify.ChannelTask)
	ready := l.Subscribe(notify.ChannelTask, 1)
	defer ready.Close()
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitFor(t, ready.Resync(), "the listener's first connect")

	observer, err := pgx.Connect(ctx, tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { observer.Close(context.Background()) })
	if _, err := observer.Exec(ctx, "LISTEN leasehold_task"); err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, ctx: ctx, db: tdb, tasks: taskstore.NewStore(tdb.Pool), listener: l, observer: observer}
}

// heard returns what the observer was told on leasehold_task since the last
// call, ended by a fence notification the test sends now: notifications
// arrive in commit order, so nothing committed before the fence is still
// on its way.
func (b *bundle) heard() []string {
	b.t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, "SELECT pg_notify('leasehold_task', 'fence')"); err != nil {
		b.t.Fatal(err)
	}
	var got []string
	for {
		wctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		n, err := b.observer.WaitForNotification(wctx)
		cancel()
		if err != nil {
			b.t.Fatalf("waiting for the fence (have %q): %v", got, err)
		}
		if n.Payload == "fence" {
			return got
		}
		got = append(got, n.Payload)
	}
}

func (b *bundle) insert(n int) []task.Task {
	b.t.Helper()
	nts := make([]taskstore.NewTask, n)
	for i := range nts {
		nts[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`)}
	}
	ts, err := taskstore.TasksOf(b.tasks.Insert(b.ctx, nts))
	if err != nil {
		b.t.Fatal(err)
	}
	return ts
}

// waiters returns the registered waiters as "name@pid".
func (b *bundle) waiters() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT waiter || '@' || pid FROM task_waiters ORDER BY 1`)
	if err != nil {
		b.t.Fatal(err)
	}
	ws, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return ws
}

// listenPID returns the pid of the listener's LISTEN session, found by its
// application_name and its last statement, a LISTEN (the listener's other
// session, the waiters', never runs one).
func (b *bundle) listenPID(app string) int32 {
	b.t.Helper()
	var pids []int32
	rows, err := b.db.Pool.Query(b.ctx, `SELECT pid FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND query ILIKE 'listen%'`, app)
	if err == nil {
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	}
	if err != nil || len(pids) != 1 {
		b.t.Fatalf("LISTEN sessions named %q: %v, %v; want one", app, pids, err)
	}
	return pids[0]
}

// TestInsertNotifiesOnlyWhileSomeoneWaits: with no waiter registered an
// insert sends no "inserted"; while one is, it does (once per statement);
// after it unregistered, no longer.
func TestInsertNotifiesOnlyWhileSomeoneWaits(t *testing.T) {
	t.Parallel()
	b := newBundle(t, "notify-test-inserts")
	b.insert(1)
	b.insert(3)
	if got := b.heard(); len(got) != 0 {
		t.Fatalf("inserts with nobody waiting sent %q, want nothing", got)
	}

	w := b.listener.Waiter("replica-a/workers")
	if w.Registered() {
		t.Fatal("a new waiter says it is registered")
	}
	if err := w.Register(b.ctx); err != nil {
		t.Fatal(err)
	}
	if !w.Registered() {
		t.Fatal("Registered() is false after Register")
	}
	if got, want := b.waiters(), []string{fmt.Sprintf("replica-a/workers@%d", b.listenPID("notify-test-inserts"))}; !slices.Equal(got, want) {
		t.Fatalf("task_waiters: %q, want %q (the LISTEN session's pid)", got, want)
	}
	b.insert(1)
	b.insert(3)
	if got := b.heard(); !slices.Equal(got, []string{notify.TasksInserted, notify.TasksInserted}) {
		t.Fatalf("two inserts while a waiter is registered sent %q, want %q twice", got, notify.TasksInserted)
	}

	if err := w.Unregister(b.ctx); err != nil {
		t.Fatal(err)
	}
	if w.Registered() || len(b.waiters()) != 0 {
		t.Fatalf("after Unregister: registered %v, task_waiters %q; want neither", w.Registered(), b.waiters())
	}
	b.insert(1)
	if got := b.heard(); len(got) != 0 {
		t.Fatalf("an insert after the waiter unregistered sent %q, want nothing", got)
	}
}

// TestRepeatableReadInsertAlwaysNotifies: an insert in a REPEATABLE READ
// transaction checks for waiters with a snapshot that may predate a
// registration, so it notifies whether or not anyone waits.
func TestRepeatableReadInsertAlwaysNotifies(t *testing.T) {
	t.Parallel()
	b := newBundle(t, "notify-test-rr")
	tx, err := b.db.Pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `INSERT INTO tasks (task_data) VALUES ('{}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("a REPEATABLE READ insert with nobody waiting sent %q, want %q", got, notify.TasksInserted)
	}
}

// TestRegisterWaitsForInsertsInFlight: an insert whose transaction checked
// for waiters before the registration, and commits after it, does not
// notify; Register does not return until such an insert has committed, so
// the catch-up query that follows it sees the task. While the insert stays
// open, Register says so (ErrInsertsInFlight) instead of returning nil;
// other inserts go on, and notify.
func TestRegisterWaitsForInsertsInFlight(t *testing.T) {
	t.Parallel()
	b := newBundle(t, "notify-test-barrier")
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var id int64
	if err := tx.QueryRow(b.ctx, `INSERT INTO tasks (task_data) VALUES ('{}') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}

	w := b.listener.Waiter("replica-a/workers")
	if err := w.Register(b.ctx); !errors.Is(err, notify.ErrInsertsInFlight) {
		t.Fatalf("Register with an insert in flight: %v, want %v", err, notify.ErrInsertsInFlight)
	}
	if w.Registered() {
		t.Fatal("Registered() is true while an insert that may have missed the registration is open")
	}
	// The registration is written: an insert from now on notifies, though
	// the barrier did not pass (and it waits no longer than BarrierWait).
	b.insert(1)
	if got := b.heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("an insert after the registration sent %q, want %q", got, notify.TasksInserted)
	}

	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.heard(); len(got) != 0 {
		t.Fatalf("the insert that checked before the registration sent %q on commit, want nothing: only the barrier covers it", got)
	}
	if err := w.Register(b.ctx); err != nil {
		t.Fatalf("Register once the insert committed: %v", err)
	}
	// The catch-up: the task of the insert that did not notify is there.
	if got, err := b.tasks.Get(b.ctx, id); err != nil || got.State != task.StatePending {
		t.Fatalf("the catch-up read of task %d: %+v, %v; want it pending", id, got, err)
	}
	if !w.Registered() {
		t.Fatal("Registered() is false after Register returned nil")
	}
}

// TestInsertDuringABarrierNotifies: while a barrier holds the waiters' lock
// (a waiter registering), an insert does not wait for it: it notifies
// without looking for waiters, since the one registering will want it.
func TestInsertDuringABarrierNotifies(t *testing.T) {
	t.Parallel()
	b := newBundle(t, "notify-test-during-barrier")
	barrier, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer barrier.Close(context.Background())
	// The lock task_waiters_barrier takes (schema/0008), held as it would be.
	if _, err := barrier.Exec(b.ctx, `SELECT pg_advisory_lock(7810756277295999348)`); err != nil {
		t.Fatal(err)
	}
	b.insert(1)
	if got := b.heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("an insert during a barrier sent %q, want %q", got, notify.TasksInserted)
	}
	if _, err := barrier.Exec(b.ctx, `SELECT pg_advisory_unlock(7810756277295999348)`); err != nil {
		t.Fatal(err)
	}
	b.insert(1)
	if got := b.heard(); len(got) != 0 {
		t.Fatalf("an insert after the barrier, nobody waiting, sent %q, want nothing", got)
	}
}

// TestWaiterFollowsTheListenSession: a registration names the LISTEN
// session; when that session is lost the waiter is no longer registered,
// and registering again names the new session and prunes the old row.
// PruneWaiters removes the rows of ended sessions too.
func TestWaiterFollowsTheListenSession(t *testing.T) {
	t.Parallel()
	const app = "notify-test-session"
	b := newBundle(t, app)
	resync := b.listener.Subscribe(notify.ChannelTask, 1)
	defer resync.Close()
	w := b.listener.Waiter("replica-a/hub")
	if err := w.Register(b.ctx); err != nil {
		t.Fatal(err)
	}
	old := b.listenPID(app)

	var killed int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(pg_terminate_backend($1))`, old).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d LISTEN sessions, %v; want 1", killed, err)
	}
	waitFor(t, resync.Resync(), "the resync after the reconnect")
	b.waitEnded(old)
	if w.Registered() {
		t.Fatal("Registered() is true after the LISTEN session it names was lost")
	}
	if err := w.Register(b.ctx); err != nil {
		t.Fatal(err)
	}
	now := b.listenPID(app)
	if got, want := b.waiters(), []string{fmt.Sprintf("replica-a/hub@%d", now)}; now == old || !slices.Equal(got, want) {
		t.Fatalf("task_waiters after registering again: %q, want %q (old pid %d): the new session only", got, want, old)
	}

	// A row of a session that has ended (its process died) is pruned.
	dead, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var deadPID int32
	if err := dead.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&deadPID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT task_waiter_register('crashed/workers', $1, false)`, deadPID); err != nil {
		t.Fatal(err)
	}
	if err := dead.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitEnded(deadPID)
	if got := b.waiters(); len(got) != 2 {
		t.Fatalf("task_waiters before pruning: %q, want the live waiter and the dead one", got)
	}
	b.insert(1)
	if got := b.heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("an insert sent %q, want %q", got, notify.TasksInserted)
	}
	if n, err := b.listener.PruneWaiters(b.ctx); err != nil || n != 1 {
		t.Fatalf("PruneWaiters: %d, %v; want 1 (the dead session's row)", n, err)
	}
	if got, want := b.waiters(), []string{fmt.Sprintf("replica-a/hub@%d", now)}; !slices.Equal(got, want) {
		t.Fatalf("task_waiters after pruning: %q, want %q", got, want)
	}
	if !w.Registered() {
		t.Fatal("pruning removed a live registration")
	}

	// Registering a session that does not exist is refused, saying why.
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT task_waiter_register('x', $1, false)`, deadPID); err == nil {
		t.Fatal("registered the pid of an ended session")
	}
}

// TestStoppedListenerRemovesItsWaiters: when Run returns, the rows of its
// LISTEN session go with it, and its waiters cannot register.
func TestStoppedListenerRemovesItsWaiters(t *testing.T) {
	t.Parallel()
	tdb := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelTask)
	ready := l.Subscribe(notify.ChannelTask, 1)
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	waitFor(t, ready.Resync(), "the listener's first connect")
	w := l.Waiter("replica-a/workers")
	if err := w.Register(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	var n int
	if err := tdb.Pool.QueryRow(context.Background(), `SELECT count(*) FROM task_waiters`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("task_waiters after the listener stopped: %d rows, %v; want none", n, err)
	}
	if err := w.Register(context.Background()); !errors.Is(err, notify.ErrNotListening) {
		t.Fatalf("Register after the listener stopped: %v, want %v", err, notify.ErrNotListening)
	}
	if err := w.Unregister(context.Background()); err != nil {
		t.Fatalf("Unregister after the listener stopped: %v", err)
	}
}

// waitEnded waits until the server has let the session pid go.
func (b *bundle) waitEnded(pid int32) {
	b.t.Helper()
	waitUntil(b.t, fmt.Sprintf("session %d has ended", pid), func() bool {
		var alive bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil {
			b.t.Fatal(err)
		}
		return !alive
	})
}

// waitUntil checks cond every 10ms until it holds; the bound only keeps a
// broken test from hanging.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
