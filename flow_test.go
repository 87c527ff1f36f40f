package leasehold_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// TestRateAcrossClients: two clients, three workers each, run tasks of a
// key with a rate of 4 starts a second: by the tasks' started_at, no
// second holds more than 4 starts, and all of them ran. Idle workers wake
// when the rate allows the next start, or when another client's claim
// leaves some: no test poll drives them.
func TestRateAcrossClients(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const rate, tasks = 4, 14
	done := make(chan int64, tasks)
	workers := func() *leasehold.Workers {
		w := leasehold.NewWorkers()
		if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[emailArgs]) error {
			done <- tk.ID
			return nil
		}), leasehold.KindConfig{}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	cfg := func() leasehold.Config {
		return leasehold.Config{Workers: workers(), Queues: map[string]leasehold.QueueConfig{task.DefaultQueue: {MaxWorkers: 3}}}
	}
	noPoll := func(c *leasehold.Client) { leasehold.SetSafetyPoll(c, -1) }
	a := started(t, db, cfg(), noPoll)
	started(t, db, cfg(), noPoll)
	if _, err := a.Leases().SetRate(t.Context(), "mail-provider", rate, time.Second); err != nil {
		t.Fatal(err)
	}
	var ps []leasehold.InsertParams
	for range tasks {
		ps = append(ps, leasehold.InsertParams{Args: emailArgs{To: "a@example.com"}, Opts: &leasehold.InsertOpts{Lock: "mail-provider"}})
	}
	if _, err := a.InsertMany(t.Context(), ps); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(giveUp)
	for range tasks {
		select {
		case <-done:
		case <-timeout:
			// What a stall left: the tasks, the key's limit and its spent
			// rate, and the leases of its slots.
			var dump string
			_ = db.Pool.QueryRow(t.Context(), `SELECT now()::text
				|| E'\n' || (SELECT string_agg(format('%s %s attempts=%s processor=%s started=%s done=%s', id, state, attempts,
				                                       processor, started_at, processed_at), E'\n' ORDER BY id) FROM tasks)
				|| E'\n' || (SELECT string_agg(row_to_json(l)::text, E'\n') FROM lease_limits AS l)
				|| E'\n' || coalesce((SELECT string_agg(row_to_json(l)::text, E'\n') FROM leases AS l), 'no leases')`).Scan(&dump)
			t.Fatalf("not every task ran within %s; the database at that moment:\n%s", giveUp, dump)
		}
	}
	rows, err := db.Pool.Query(t.Context(), `SELECT started_at FROM tasks WHERE lock_resource = 'mail-provider' ORDER BY started_at`)
	if err != nil {
		t.Fatal(err)
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	most := 0
	for i := range starts {
		n := 0
		for j := i; j < len(starts) && starts[j].Sub(starts[i]) < time.Second; j++ {
			n++
		}
		most = max(most, n)
	}
	if len(starts) != tasks || most > rate {
		t.Errorf("%d tasks started, at most %d in one second; want %d, at most %d", len(starts), most, tasks, rate)
	}
	t.Logf("%d tasks by two clients over %s, at most %d starts in a second (rate %d/s)", len(starts), starts[len(starts)-1].Sub(starts[0]), most, rate)
}

// TestPauseQueue: a paused queue's task waits while another queue's runs,
// embedded and remote alike; resumed, it runs, its worker woken by the
// resume. A second resume says it was not paused; bad input is refused.
func TestPauseQueue(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ran := make(chan string, 4)
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[emailArgs]) error {
		ran <- tk.Queue
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	worker := started(t, db, leasehold.Config{Workers: w, Queues: map[string]leasehold.QueueConfig{"bulk": {MaxWorkers: 2}, "urgent": {MaxWorkers: 2}}},
		func(c *leasehold.Client) { leasehold.SetSafetyPoll(c, -1) })
	remote := startClientServerOn(t, db)
	for name, c := range map[string]*leasehold.Client{"embedded": worker, "remote": remote} {
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
		p, err := c.PauseQueue(t.Context(), "bulk", until, "a bug in the importer")
		if err != nil || p.Queue != "bulk" || p.Until == nil || !p.Until.Equal(until) {
			t.Fatalf("%s: pause %+v, %v; want bulk until %s", name, p, err, until)
		}
		bulk, err := c.Insert(t.Context(), emailArgs{To: "b@example.com"}, &leasehold.InsertOpts{Queue: "bulk"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Insert(t.Context(), emailArgs{To: "u@example.com"}, &leasehold.InsertOpts{Queue: "urgent"}); err != nil {
			t.Fatal(err)
		}
		if q := recv(t, ran); q != "urgent" {
			t.Fatalf("%s: a task of %s ran while bulk was paused", name, q)
		}
		if got, err := c.Get(t.Context(), bulk.Task.ID); err != nil || got.State != task.StatePending {
			t.Fatalf("%s: the paused queue's task %+v, %v; want pending", name, got, err)
		}
		if ps, err := c.PausedQueues(t.Context()); err != nil || len(ps) != 1 || ps[0].Reason != "a bug in the importer" {
			t.Errorf("%s: paused queues %+v, %v", name, ps, err)
		}
		if resumed, err := c.ResumeQueue(t.Context(), "bulk"); err != nil || !resumed {
			t.Fatalf("%s: resume %v, %v", name, resumed, err)
		}
		if q := recv(t, ran); q != "bulk" {
			t.Fatalf("%s: after the resume a task of %s ran, want bulk's", name, q)
		}
		if resumed, err := c.ResumeQueue(t.Context(), "bulk"); err != nil || resumed {
			t.Errorf("%s: a second resume %v, %v; want false", name, resumed, err)
		}
		if _, err := c.PauseQueue(t.Context(), "bad\x00queue", time.Time{}, ""); err == nil {
			t.Errorf("%s: a bad queue name was paused", name)
		}
	}
}

// startClientServerOn serves the REST API on db and returns a remote
// client of it.
func startClientServerOn(t *testing.T, db pgtest.DB) *leasehold.Client {
	t.Helper()
	h := server.NewServer(server.Deps{
		Leases:     leasestore.NewStore(db.Pool),
		Tasks:      taskstore.NewStore(db.Pool),
		Schedules:  schedulestore.NewStore(db.Pool),
		DefaultTTL: 30 * time.Second,
		Log:        zerolog.Nop(),
		Metrics:    server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready:      func(context.Context) error { return nil },
		Instance:   server.Instance{ID: "test"},
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: srv.URL, HTTPClient: srv.Client()}, leasehold.Config{AllowUnknownKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recv receives from c, failing the test after giveUp.
func recv[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(giveUp):
		t.Fatalf("nothing came within %s", giveUp)
		panic("unreachable")
	}
}

// TestRaisedLimitWakesWorkers: two tasks on a key of one slot, the first
// running (its handler waits), the second pending with a free worker
// asleep (no last-resort poll); raising the limit to two starts the
// second while the first still runs: the raise wakes the workers.
func TestRaisedLimitWakesWorkers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	began, release := make(chan int64, 2), make(chan struct{})
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[emailArgs]) error {
		began <- tk.ID
		<-release
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	// No last-resort poll: only the raise's NOTIFY can wake the workers.
	c := started(t, db, leasehold.Config{Workers: w, Queues: map[string]leasehold.QueueConfig{task.DefaultQueue: {MaxWorkers: 2}}},
		func(c *leasehold.Client) { leasehold.SetSafetyPoll(c, -1) })
	defer close(release)
	opts := &leasehold.InsertOpts{Lock: "mailbox", LockLimit: 1}
	if _, err := c.InsertMany(t.Context(), []leasehold.InsertParams{{Args: emailArgs{To: "a"}, Opts: opts}, {Args: emailArgs{To: "b"}, Opts: opts}}); err != nil {
		t.Fatal(err)
	}
	first := recv(t, began)
	// The second waits on the full key: pending, its key's one slot held.
	lim, err := c.Leases().Limit(t.Context(), "mailbox")
	if err != nil || lim.Held != 1 || lim.Waiting != 1 {
		t.Fatalf("limit %+v, %v; want 1 held, 1 waiting", lim, err)
	}
	if _, err := c.Leases().SetLimit(t.Context(), "mailbox", 2); err != nil {
		t.Fatal(err)
	}
	second := recv(t, began)
	if second == first {
		t.Fatalf("task %d started twice", first)
	}
	if got, err := c.Get(t.Context(), first); err != nil || got.State != task.StateRunning {
		t.Errorf("the first task %+v, %v; want it still running beside the second", got, err)
	}
}

// TestScheduleLockLimit: a schedule whose lock has a limit gives the key
// that limit when it has none, embedded and remote; a key that has one
// keeps it; a limit without a lock is refused.
func TestScheduleLockLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	embedded, err := leasehold.NewClient(db.Pool, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": startClientServerOn(t, db)} {
		key := "reports:" + name
		p, err := leasehold.NewSchedule("nightly-"+name, "0 3 * * *", emailArgs{To: "ops"}, &leasehold.ScheduleOpts{Lock: key, LockLimit: 3})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Schedules().Add(t.Context(), p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if lim, err := c.Leases().Limit(t.Context(), key); err != nil || lim.Slots != 3 {
			t.Errorf("%s: the lock's limit %+v, %v; want 3 slots", name, lim, err)
		}
		p.LockLimit = 5
		if _, err := c.Schedules().Replace(t.Context(), p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if lim, err := c.Leases().Limit(t.Context(), key); err != nil || lim.Slots != 3 {
			t.Errorf("%s: after a replace naming 5: %+v, %v; want the key's 3 kept", name, lim, err)
		}
	}
	if _, err := leasehold.NewSchedule("bad", "0 3 * * *", emailArgs{}, &leasehold.ScheduleOpts{LockLimit: 3}); !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("a lock limit without a lock: %v, want ErrInvalidArgument", err)
	}
}
