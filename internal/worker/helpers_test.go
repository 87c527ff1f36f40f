package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// giveUp bounds every wait, only so that a broken test fails instead of
// hanging; no test asserts how fast anything happens.
const giveUp = 2 * time.Minute

// env is one test's database and the goroutines it started, all stopped
// (and waited for) before the database is dropped.
type env struct {
	t     *testing.T
	ctx   context.Context
	db    pgtest.DB
	tasks *taskstore.Store
	wg    sync.WaitGroup
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, ctx: ctx, db: pgtest.New(t)}
	e.tasks = taskstore.NewStore(e.db.Pool)
	// Registered after pgtest's cleanup, so it runs first.
	t.Cleanup(func() { cancel(); e.wg.Wait() })
	return e
}

func (e *env) log() zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(e.t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
}

// listener starts a LISTEN connection, as one replica process has, and
// returns once it is connected and listening, so that nothing notified
// from then on is missed.
func (e *env) listener(ctx context.Context) *notify.Listener {
	e.t.Helper()
	return e.listenerWith(ctx, func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, e.db.URL) })
}

// listenerWith is listener with a connect function of the test's.
func (e *env) listenerWith(ctx context.Context, connect func(ctx context.Context) (*pgx.Conn, error)) *notify.Listener {
	e.t.Helper()
	l := notify.New(connect, e.log(), notify.ChannelTask, notify.ChannelLease)
	ready := l.Subscribe(notify.ChannelTask, 1)
	defer ready.Close()
	e.wg.Go(func() {
		if err := l.Run(ctx); err != nil {
			e.t.Errorf("listener: %v", err)
		}
	})
	select {
	case <-ready.Resync(): // signalled once every channel is LISTENed
	case <-time.After(giveUp):
		e.t.Fatal("the listener never connected")
	}
	return l
}

// startReaper runs a reaper, so that lapsed task leases are announced.
func (e *env) startReaper() {
	e.t.Helper()
	r := &reaper.Reaper{
		Store: leasestore.NewStore(e.db.Pool), Tasks: taskstore.NewStore(e.db.Pool), Listener: e.listener(e.ctx), Instance: "reaper",
		Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: e.log(),
	}
	e.wg.Go(func() {
		if err := r.Run(e.ctx); err != nil {
			e.t.Errorf("reaper: %v", err)
		}
	})
}

// replica is a running Pool with its own listener: one simulated replica.
type replica struct {
	*worker.Pool
	ctx    context.Context // ends when the replica is stopped
	events *recorder
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the replica as SIGTERM would and waits until its Run returned.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	r.wait(t)
}

// wait waits until the replica's Run returned.
func (r *replica) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(giveUp):
		t.Fatalf("%s: Run did not return", r.Instance)
	}
}

// startPool starts a replica's pool (safety poll disabled, so that every
// pickup in these tests is by notification or timer) and returns once its
// dispatcher, listening, has finished its first round of claims. configure
// may change the pool's settings before it starts; when it sets no
// Listener, the replica gets one of its own.
func (e *env) startPool(instance string, workers int, ttl time.Duration, configure func(*worker.Pool, *replica)) *replica {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	r := &replica{ctx: ctx, events: newRecorder(), cancel: cancel, done: make(chan struct{})}
	r.Pool = &worker.Pool{
		Tasks: e.tasks, Instance: instance, Workers: workers, TTL: ttl,
		Kinds: []string{demo.Kind}, Handler: sleepHandler(e.t, 0, nil),
		SafetyPoll: -1, Log: e.log(), OnEvent: r.events.add,
	}
	if configure != nil {
		configure(r.Pool, r)
	}
	if r.Listener == nil {
		r.Listener = e.listener(ctx)
	}
	e.wg.Go(func() {
		defer close(r.done)
		if err := r.Run(ctx); err != nil {
			e.t.Errorf("%s: Run: %v", instance, err)
		}
	})
	r.events.waitFor(e.t, instance+"'s first round of claims", 0, isKind(worker.EventAsleep))
	return r
}

// sleepHandler is the demo's sleep handler (worker.Sleep) with the given
// simulated crash rate and hook.
func sleepHandler(t testing.TB, crashRate float64, crash func()) worker.Handler {
	t.Helper()
	h, err := demo.Sleep(crashRate, crash)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// insert adds tasks with the given task_data in one statement.
func (e *env) insert(maxAttempts int32, data ...string) []task.Task {
	e.t.Helper()
	nts := make([]taskstore.NewTask, len(data))
	for i, d := range data {
		nts[i] = taskstore.NewTask{TaskData: json.RawMessage(d), MaxAttempts: maxAttempts}
	}
	ts, err := taskstore.TasksOf(e.tasks.Insert(e.ctx, nts))
	if err != nil {
		e.t.Fatal(err)
	}
	return ts
}

func (e *env) get(id int64) task.Task {
	e.t.Helper()
	tk, err := e.tasks.Get(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return tk
}

// waitUntil checks cond every 50ms until it holds, giving up after limit.
func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaseHistory returns what happened to a task's lease under each fence,
// in order, as lease events would name it ("acquired", then "released" or
// "expired"), from the task's row: its earlier attempts, then the running
// or completed one.
func (e *env) leaseHistory(id int64) map[int64][]string {
	e.t.Helper()
	var (
		state   string
		fence   *int64
		earlier []byte
	)
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT state, fence, earlier_attempts FROM tasks WHERE id = $1`, id).Scan(&state, &fence, &earlier); err != nil {
		e.t.Fatal(err)
	}
	var attempts []task.Attempt
	if err := json.Unmarshal(earlier, &attempts); err != nil {
		e.t.Fatal(err)
	}
	h := map[int64][]string{}
	for _, a := range attempts {
		end := "released"
		if a.Outcome == task.OutcomeExpired {
			end = "expired"
		}
		h[a.Fence] = []string{"acquired", end}
	}
	switch state {
	case task.StateRunning:
		h[*fence] = []string{"acquired"}
	case task.StateDone:
		h[*fence] = []string{"acquired", "released"}
	}
	return h
}

// waiterPIDs returns the LISTEN session pids under which waiter is
// registered for inserted tasks.
func (e *env) waiterPIDs(waiter string) []int32 {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT pid FROM task_waiters WHERE waiter = $1 ORDER BY pid`, waiter)
	if err != nil {
		e.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		e.t.Fatal(err)
	}
	return pids
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// recorder keeps a pool's events for the test to wait on.
type recorder struct {
	mu     sync.Mutex
	events []worker.Event
	grew   chan struct{} // closed (and replaced) when an event is added
}

func newRecorder() *recorder { return &recorder{grew: make(chan struct{})} }

func (r *recorder) add(ev worker.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	close(r.grew)
	r.grew = make(chan struct{})
}

// len is the number of events so far: a cursor for waitFor.
func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// waitFor returns the first event at or after index from that matches,
// waiting for it, and its index.
func (r *recorder) waitFor(t *testing.T, what string, from int, match func(worker.Event) bool) (worker.Event, int) {
	t.Helper()
	timeout := time.After(giveUp)
	for {
		r.mu.Lock()
		for i := from; i < len(r.events); i++ {
			if match(r.events[i]) {
				ev := r.events[i]
				r.mu.Unlock()
				return ev, i
			}
		}
		from = len(r.events)
		grew := r.grew
		r.mu.Unlock()
		select {
		case <-grew:
		case <-timeout:
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// all returns the events that match.
func (r *recorder) all(match func(worker.Event) bool) []worker.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []worker.Event
	for _, ev := range r.events {
		if match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

func isKind(k worker.EventKind) func(worker.Event) bool {
	return func(ev worker.Event) bool { return ev.Kind == k }
}

func isTask(k worker.EventKind, id int64) func(worker.Event) bool {
	return func(ev worker.Event) bool { return ev.Kind == k && ev.TaskID == id }
}

func sleepTask(secs float64) string { return fmt.Sprintf(`{"sleep_duration_seconds": %v}`, secs) }
