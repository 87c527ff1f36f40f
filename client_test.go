package leasehold_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// giveUp bounds every wait, only so that a broken test fails instead of
// hanging; no test asserts how fast anything happens unless it says so.
const giveUp = time.Minute

// The task kinds of the tests.
type (
	emailArgs struct {
		To string `json:"to"`
	}
	resizeArgs struct {
		Image string `json:"image"`
	}
	slowArgs  struct{}
	orderArgs struct {
		N int `json:"n"`
	}
)

func (emailArgs) Kind() string  { return "email" }
func (resizeArgs) Kind() string { return "resize" }
func (slowArgs) Kind() string   { return "slow" }
func (orderArgs) Kind() string  { return "order" }

// started makes a client on db with cfg, starts it, and stops it when the
// test ends (before the database is dropped).
func started(t *testing.T, db pgtest.DB, cfg leasehold.Config, configure ...func(*leasehold.Client)) *leasehold.Client {
	t.Helper()
	c, err := leasehold.NewClient(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(c)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

// waitState waits until task id is in state.
func waitState(t *testing.T, c *leasehold.Client, id int64, state task.State) *task.Task {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		got, err := c.Get(t.Context(), id)
		if err == nil && got.State == state {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %d: %+v, %v; waited %s for it to be %s", id, got, err, giveUp, state)
		}
		time.Sleep(20 * time.Millisecond) // a harness's poll of the database, not the product's
	}
}

// TestWorkersRunOnlyTheirKinds: a client claims only the kinds it has a
// worker for; a task of another kind waits, untouched, while the others
// flow, and a client that registers that kind then runs it.
func TestWorkersRunOnlyTheirKinds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	workers := leasehold.NewWorkers()
	var mu sync.Mutex
	var sent []string
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[emailArgs](func(ctx context.Context, tk *leasehold.Task[emailArgs]) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, tk.Args.To)
		return leasehold.RecordOutput(ctx, map[string]string{"sent_to": tk.Args.To})
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c := started(t, db, leasehold.Config{Workers: workers, AllowUnknownKinds: true})
	orphan, err := c.Insert(t.Context(), resizeArgs{Image: "cat.png"}, &leasehold.InsertOpts{ScheduledAt: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var emails []int64
	for i := range 20 {
		r, err := c.Insert(t.Context(), emailArgs{To: fmt.Sprintf("u%d@example.com", i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		emails = append(emails, r.Task.ID)
	}
	for _, id := range emails {
		done := waitState(t, c, id, task.StateDone)
		if !strings.Contains(string(done.TaskOutput), "sent_to") {
			t.Errorf("task %d output %s; want RecordOutput's", id, done.TaskOutput)
		}
	}
	got, err := c.Get(t.Context(), orphan.Task.ID)
	if err != nil || got.State != task.StatePending || got.Attempts != 0 || got.Processor != "" {
		t.Fatalf("the resize task, which nobody here runs: %+v, %v; want it pending, never claimed", got, err)
	}
	// Without AllowUnknownKinds an insert of a kind the client does not run
	// is refused, most likely a typo.
	strict, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Insert(t.Context(), resizeArgs{}, nil); !errors.Is(err, leasehold.ErrUnknownKind) {
		t.Fatalf("insert of an unregistered kind: %v; want ErrUnknownKind", err)
	}
	// A client that has the kind takes the task.
	resizers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(resizers, leasehold.WorkFunc[resizeArgs](func(context.Context, *leasehold.Task[resizeArgs]) error { return nil }), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	started(t, db, leasehold.Config{ID: "resizer", Workers: resizers})
	waitState(t, c, orphan.Task.ID, task.StateDone)
}

// TestInsertTx: a task inserted in a transaction that rolls back never
// runs; one that commits is claimed, woken by NOTIFY (the workers' safety
// poll is off: nothing else could wake them).
func TestInsertTx(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ran := make(chan string, 4)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[emailArgs](func(_ context.Context, tk *leasehold.Task[emailArgs]) error {
		ran <- tk.Args.To
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c := started(t, db, leasehold.Config{Workers: workers}, func(c *leasehold.Client) { leasehold.SetSafetyPoll(c, -1) })
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE users (id bigint PRIMARY KEY, email text)`); err != nil {
		t.Fatal(err)
	}
	signup := func(id int64, email string, commit bool) *leasehold.InsertResult {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // rolled back unless committed
		if _, err := tx.Exec(ctx, `INSERT INTO users VALUES ($1, $2)`, id, email); err != nil {
			t.Fatal(err)
		}
		r, err := c.InsertTx(ctx, tx, emailArgs{To: email}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}
	gone := signup(1, "rolled@back.example", false)
	kept := signup(2, "committed@example.com", true)
	select {
	case to := <-ran:
		if to != "committed@example.com" {
			t.Fatalf("ran the welcome email of %s; want only the committed signup's", to)
		}
	case <-time.After(giveUp):
		t.Fatalf("the committed task was not claimed within %s", giveUp)
	}
	waitState(t, c, kept.Task.ID, task.StateDone)
	if _, err := c.Get(ctx, gone.Task.ID); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("the rolled-back task: %v; want ErrNotFound (it never existed)", err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "http://leasehold.invalid"}, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing in it
	if _, err := remote.InsertTx(ctx, tx, emailArgs{}, nil); !errors.Is(err, leasehold.ErrNoDatabase) {
		t.Fatalf("InsertTx on a remote client: %v; want ErrNoDatabase", err)
	}
}

// TestPriorityOrder: one worker runs the due tasks lowest priority first,
// then oldest schedule, then oldest id.
func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var mu sync.Mutex
	var order []int
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[orderArgs](func(_ context.Context, tk *leasehold.Task[orderArgs]) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, tk.Args.N)
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers, Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Minute)
	var params []leasehold.InsertParams
	for _, p := range []struct {
		n, priority, at int
	}{{1, 5, 0}, {2, -3, 10}, {3, 0, 20}, {4, 0, 5}, {5, -3, 30}, {6, 100, 1}} {
		params = append(params, leasehold.InsertParams{Args: orderArgs{N: p.n},
			Opts: &leasehold.InsertOpts{Priority: int16(p.priority), ScheduledAt: base.Add(time.Duration(p.at) * time.Second)}})
	}
	res, err := c.InsertMany(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck // checked by the tests that stop clients
	for _, r := range res {
		waitState(t, c, r.Task.ID, task.StateDone)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int{2, 5, 4, 3, 1, 6}; !slices.Equal(order, want) {
		t.Fatalf("ran %v; want %v (priority, then schedule)", order, want)
	}
}

// TestUniqueInsert: 50 concurrent inserts of one unique key make one task,
// and every insert answers with it.
func TestUniqueInsert(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ids   = map[int64]int{}
		fresh int
	)
	for range 50 {
		wg.Go(func() {
			r, err := c.Insert(t.Context(), emailArgs{To: "once@example.com"}, &leasehold.InsertOpts{UniqueKey: "welcome:once@example.com"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			ids[r.Task.ID]++
			if !r.Duplicate {
				fresh++
			}
		})
	}
	wg.Wait()
	if len(ids) != 1 || fresh != 1 {
		t.Fatalf("50 inserts of one key: tasks %v, %d said inserted; want one task, inserted once", ids, fresh)
	}
}

// TestBadInputIsAnError: the constructors and calls refuse what cannot
// work with an error a caller can test, never a panic, and do nothing.
func TestBadInputIsAnError(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := leasehold.NewClient(nil, leasehold.Config{}); !errors.Is(err, leasehold.ErrInvalidConfig) {
		t.Errorf("NewClient(nil): %v", err)
	}
	empty := leasehold.NewWorkers()
	for name, cfg := range map[string]leasehold.Config{
		"no kinds":         {Workers: empty},
		"queues, no kinds": {Queues: map[string]leasehold.QueueConfig{"q": {MaxWorkers: 1}}},
		"bad TTL":          {TaskTTL: 1500 * time.Millisecond},
		"TTL over an hour": {LeaseTTL: 2 * time.Hour},
		"bad ID":           {ID: "a\nb"},
		"negative grace":   {ShutdownGrace: -time.Second},
	} {
		if _, err := leasehold.NewClient(db.Pool, cfg); !errors.Is(err, leasehold.ErrInvalidConfig) {
			t.Errorf("NewClient with %s: %v; want ErrInvalidConfig", name, err)
		}
	}
	w := leasehold.NewWorkers()
	ok := leasehold.WorkFunc[emailArgs](func(context.Context, *leasehold.Task[emailArgs]) error { return nil })
	if err := leasehold.AddWorker(w, ok, leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"a second worker of a kind": leasehold.AddWorker(w, ok, leasehold.KindConfig{}),
		"nil workers":               leasehold.AddWorker(nil, ok, leasehold.KindConfig{}),
		"nil worker":                leasehold.AddWorker[emailArgs](w, nil, leasehold.KindConfig{}),
		"a nil WorkFunc":            leasehold.AddWorker(w, leasehold.WorkFunc[emailArgs](nil), leasehold.KindConfig{}),
		"a nil func of its own":     leasehold.AddWorker(leasehold.NewWorkers(), nilWorker(nil), leasehold.KindConfig{}),
		"max attempts over 100":     leasehold.AddWorker(leasehold.NewWorkers(), ok, leasehold.KindConfig{MaxAttempts: 101}),
		"a kind that panics":        leasehold.AddWorker(leasehold.NewWorkers(), leasehold.WorkFunc[*pointerArgs](func(context.Context, *leasehold.Task[*pointerArgs]) error { return nil }), leasehold.KindConfig{}),
		"an empty kind":             leasehold.AddWorker(leasehold.NewWorkers(), leasehold.WorkFunc[noKind](func(context.Context, *leasehold.Task[noKind]) error { return nil }), leasehold.KindConfig{}),
	} {
		if !errors.Is(err, leasehold.ErrInvalidConfig) {
			t.Errorf("AddWorker with %s: %v; want ErrInvalidConfig", name, err)
		}
	}
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: w, AllowUnknownKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]*leasehold.InsertOpts{
		"a bad queue":       {Queue: "a\tb"},
		"a long unique key": {UniqueKey: strings.Repeat("k", 256)},
		"a fractional TTL":  {TTL: 1500 * time.Millisecond},
		"max attempts 101":  {MaxAttempts: 101},
	} {
		if _, err := c.Insert(t.Context(), emailArgs{}, o); !errors.Is(err, leasehold.ErrInvalidArgument) {
			t.Errorf("Insert with %s: %v; want ErrInvalidArgument", name, err)
		}
	}
	if _, err := c.Insert(t.Context(), listArgs{1, 2}, nil); !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("Insert of args that are not a JSON object: %v", err)
	}
	if _, err := c.Insert(t.Context(), nil, nil); !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("Insert of nil args: %v", err)
	}
	if _, err := c.InsertMany(t.Context(), nil); !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("InsertMany of nothing: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM tasks`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d tasks after refused inserts, %v; want none", n, err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); !errors.Is(err, leasehold.ErrStarted) {
		t.Errorf("a second Start: %v; want ErrStarted", err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); !errors.Is(err, leasehold.ErrStopped) {
		t.Errorf("Start after Stop: %v; want ErrStopped", err)
	}
	if _, err := c.NewElector(leasehold.ElectorConfig{Resource: "r"}); !errors.Is(err, leasehold.ErrInvalidConfig) {
		t.Errorf("NewElector without OnStartedLeading: %v", err)
	}
	if _, err := c.NewElector(leasehold.ElectorConfig{Resource: "r", Keep: lease.KeepConfig{TTL: 3 * time.Second, RenewInterval: 5 * time.Second},
		Callbacks: leasehold.Callbacks{OnStartedLeading: func(context.Context, lease.Lease) {}}}); !errors.Is(err, leasehold.ErrInvalidConfig) {
		t.Errorf("NewElector with a renew interval over the TTL: %v", err)
	}
}

// nilWorker is a user's own func type that is a Worker.
type nilWorker func(context.Context, *leasehold.Task[emailArgs]) error

func (f nilWorker) Work(ctx context.Context, t *leasehold.Task[emailArgs]) error { return f(ctx, t) }

type (
	pointerArgs struct{ n int }
	noKind      struct{}
	listArgs    []int
)

func (p *pointerArgs) Kind() string { return fmt.Sprint("p", p.n) } // panics on a nil *pointerArgs
func (noKind) Kind() string         { return "" }
func (listArgs) Kind() string       { return "email" }

// service is a leasehold service (the REST API of internal/server, with
// its LISTEN connection) on a database: "another replica".
type service struct {
	URL   string
	tasks *taskstore.Store
}

func startService(t *testing.T, db pgtest.DB) service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask)
	ready := l.Subscribe(notify.ChannelTask, 1)
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	<-ready.Resync()
	ready.Close()
	stopping := make(chan struct{})
	tasks := taskstore.NewStore(db.Pool)
	h := server.NewServer(server.Deps{
		Leases: leasestore.NewStore(db.Pool), Tasks: tasks, DefaultTTL: 30 * time.Second, Listener: l, Stopping: stopping,
		Log: zerolog.Nop(), Metrics: server.NewMetrics(l.Connected, l.Reconnects),
		Ready: func(context.Context) error { return nil }, Instance: server.Instance{ID: "service"},
	})
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		close(stopping)
		srv.Close()
		cancel()
		wg.Wait()
	})
	return service{URL: srv.URL, tasks: tasks}
}

// TestCancelStopsTheHandler: a task cancelled through the REST API (another
// replica) stops its running handler through NOTIFY, not at its next
// heartbeat (the TTL is a minute: the first heartbeat is 20 s away), and
// nothing the handler's worker reports afterwards is accepted.
func TestCancelStopsTheHandler(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	running := make(chan int64, 1)
	stopped := make(chan error, 1)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[slowArgs](func(ctx context.Context, tk *leasehold.Task[slowArgs]) error {
		running <- tk.ID
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return nil // a completion, which must be refused
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c := started(t, db, leasehold.Config{Workers: workers, TaskTTL: time.Minute})
	r, err := c.Insert(t.Context(), slowArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-running
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, svc.URL+"/api/tasks/"+strconv.FormatInt(r.Task.ID, 10)+"/cancel",
		strings.NewReader(`{"reason": "the user deleted the account"}`))
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel over REST: %d", resp.StatusCode)
	}
	select {
	case cause := <-stopped:
		if !errors.Is(cause, task.ErrCancelled) {
			t.Fatalf("the handler's context ended with %v; want task.ErrCancelled", cause)
		}
		t.Logf("the handler's context ended %s after the cancellation was sent", time.Since(sent).Round(time.Millisecond))
	case <-time.After(giveUp):
		t.Fatal("the cancelled task's handler was not stopped")
	}
	got := waitState(t, c, r.Task.ID, task.StateCancelled)
	if got.LastError != "the user deleted the account" || len(got.TaskOutput) > 0 {
		t.Fatalf("the cancelled task: %+v; want cancelled with the reason, no output", got)
	}
}

// countArgs is a task of TestRemoteAndEmbeddedShareAQueue.
type countArgs struct {
	N int `json:"n"`
}

func (countArgs) Kind() string { return "count" }

// TestRemoteAndEmbeddedShareAQueue: a client on the pool and a remote
// client of a service on the same database work one queue together; every
// task is completed exactly once, by one or the other.
func TestRemoteAndEmbeddedShareAQueue(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	var (
		mu   sync.Mutex
		runs = map[int64][]string{}
	)
	workersOf := func(who string) *leasehold.Workers {
		w := leasehold.NewWorkers()
		if err := leasehold.AddWorker(w, leasehold.WorkFunc[countArgs](func(ctx context.Context, tk *leasehold.Task[countArgs]) error {
			mu.Lock()
			runs[tk.ID] = append(runs[tk.ID], who)
			mu.Unlock()
			return leasehold.RecordOutput(ctx, map[string]any{"by": who, "n": tk.Args.N})
		}), leasehold.KindConfig{}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	queues := map[string]leasehold.QueueConfig{"shared": {MaxWorkers: 4}}
	embedded := started(t, db, leasehold.Config{ID: "embedded", Workers: workersOf("embedded"), Queues: queues})
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: svc.URL}, leasehold.Config{ID: "remote", Workers: workersOf("remote"), Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer remote.Stop(context.Background()) //nolint:errcheck // checked by the tests that stop clients
	const n = 200
	params := make([]leasehold.InsertParams, n)
	for i := range params {
		params[i] = leasehold.InsertParams{Args: countArgs{N: i}, Opts: &leasehold.InsertOpts{Queue: "shared"}}
	}
	// Half through the remote client (one request), half on the pool.
	first, err := remote.InsertMany(t.Context(), params[:n/2])
	if err != nil {
		t.Fatal(err)
	}
	second, err := embedded.InsertMany(t.Context(), params[n/2:])
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]int{}
	for _, r := range append(first, second...) {
		done := waitState(t, embedded, r.Task.ID, task.StateDone)
		var out struct {
			By string `json:"by"`
		}
		if err := json.Unmarshal(done.TaskOutput, &out); err != nil {
			t.Fatalf("task %d output %s: %v", done.ID, done.TaskOutput, err)
		}
		by[out.By]++
		if !strings.HasPrefix(done.Processor, out.By+"/shared/w") {
			t.Errorf("task %d done by %s, its output says %s", done.ID, done.Processor, out.By)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, who := range runs {
		if len(who) != 1 {
			t.Errorf("task %d ran %d times (%v); want once", id, len(who), who)
		}
	}
	if len(runs) != n {
		t.Errorf("%d tasks ran; want %d", len(runs), n)
	}
	t.Logf("completed: %v", by)
	if by["embedded"] == 0 || by["remote"] == 0 {
		t.Errorf("completed by %v; want both clients to have worked the queue", by)
	}
}

// TestKilledWorkerTaskIsDoneByAnother: the process running a task is
// killed (-9) mid-task; once its lease lapses the reaper puts the task back
// and another process completes it, exactly once, under a greater fence.
func TestKilledWorkerTaskIsDoneByAnother(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	doomed := startChild(t, "worker", db.URL, "doomed")
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Insert(t.Context(), slowArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var id, fence int64
	if _, err := fmt.Sscanf(doomed.expect(t, "started"), "started %d %d", &id, &fence); err != nil || id != r.Task.ID {
		t.Fatalf("the child started task %d (%v); want %d", id, err, r.Task.ID)
	}
	doomed.kill(t)

	var ran []int64
	var mu sync.Mutex
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[slowArgs](func(_ context.Context, tk *leasehold.Task[slowArgs]) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, tk.Fence)
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	heir := started(t, db, leasehold.Config{ID: "heir", Workers: workers})
	done := waitState(t, heir, r.Task.ID, task.StateDone)
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 || ran[0] != done.Fence || done.Fence <= fence || done.Attempts != 2 {
		t.Fatalf("after the kill: ran under fences %v, done %+v; want one run under a fence above %d, attempt 2", ran, done, fence)
	}
	if len(done.EarlierAttempts) != 1 || done.EarlierAttempts[0].Fence != fence || done.EarlierAttempts[0].Outcome != task.OutcomeExpired {
		t.Fatalf("history %+v; want the killed attempt, expired, under fence %d", done.EarlierAttempts, fence)
	}
}

// TestElectionHandsOverOnKill: three processes campaign for one lease (TTL
// 2 s); the leader is killed (-9); another leads, under a greater fence,
// never before the dead leader's lease expired, and every process's
// callbacks come in order. (How soon after the kill is logged: a figure of
// the machine's load, not a property of the code.)
func TestElectionHandsOverOnKill(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	children := map[string]*child{}
	for _, id := range []string{"e1", "e2", "e3"} {
		children[id] = startChild(t, "elector", db.URL, id)
	}
	leader, fence := currentLeader(t, db)
	children[leader].expect(t, "leading")
	killed := time.Now()
	children[leader].kill(t)
	delete(children, leader)
	// The first of the others to say it leads is the new leader.
	next := make(chan string, 2)
	for id, ch := range children {
		go func() {
			for line := range ch.lines {
				if strings.HasPrefix(line, "leading ") {
					next <- id + " " + line
					return
				}
			}
		}()
	}
	var (
		heir      string
		heirFence int64
	)
	select {
	case line := <-next:
		if _, err := fmt.Sscanf(line, "%s leading %d", &heir, &heirFence); err != nil {
			t.Fatal(line, err)
		}
	case <-time.After(giveUp):
		t.Fatal("nobody took over")
	}
	took := time.Since(killed)
	t.Logf("%s took over from %s %s after the kill (fence %d → %d)", heir, leader, took.Round(time.Millisecond), fence, heirFence)
	if heirFence <= fence {
		t.Errorf("the new leader's fence %d is not above the old one's %d", heirFence, fence)
	}
	// The holding intervals in the history never overlap.
	events, err := leasestore.NewStore(db.Pool).Events(t.Context(), lease.EventsParams{Resource: "leader:test", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var end time.Time
	for _, e := range events {
		if e.Kind == "acquired" && e.At.Before(end) {
			t.Errorf("fence %d acquired at %s, before the previous holding ended at %s", e.Fence, e.At, end)
		}
		if e.Kind == "acquired" || e.Kind == "renewed" {
			end = e.ExpiresAt
		}
		if e.Kind == "released" || e.Kind == "expired" {
			end = e.At
		}
	}
}

// currentLeader waits for a holder of leader:test and returns it with its
// fence.
func currentLeader(t *testing.T, db pgtest.DB) (string, int64) {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		var holder string
		var fence int64
		err := db.Pool.QueryRow(t.Context(), `SELECT holder, fence FROM leases WHERE resource = 'leader:test'
			AND released_at IS NULL AND expires_at > now()`).Scan(&holder, &fence)
		if err == nil {
			return holder, fence
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader within %s: %v", giveUp, err)
		}
		time.Sleep(20 * time.Millisecond) // a harness's poll of the database
	}
}

// TestClientsOfAProcessHaveTheirOwnIDs: clients made in one process without
// an ID get IDs of their own. A client's ID names its workers, which hold
// their tasks' leases and their keys' slots, and is its electors' default
// holder: two clients of one name would take each other's holdings for
// their own.
func TestClientsOfAProcessHaveTheirOwnIDs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seen := map[string]bool{}
	for range 3 {
		c, err := leasehold.NewClient(db.Pool, leasehold.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if seen[c.ID()] {
			t.Errorf("two clients of one process were both given the ID %q", c.ID())
		}
		seen[c.ID()] = true
		if host, _ := os.Hostname(); !strings.HasPrefix(c.ID(), fmt.Sprintf("%s-%d", host, os.Getpid())) {
			t.Errorf("default ID %q, want <hostname>-<pid> or <hostname>-<pid>-<n>", c.ID())
		}
	}
}
