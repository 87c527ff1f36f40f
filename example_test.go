package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// WelcomeEmail is the arguments of a task of the kind "welcome_email".
type WelcomeEmail struct {
	UserID int64 `json:"user_id"`
}

// Kind names what runs the task.
func (WelcomeEmail) Kind() string { return "welcome_email" }

// examplePool stands for the program's own pool, on a database migrated by
// `leasehold migrate` (or leasehold.Migrate).
func examplePool() *pgxpool.Pool { return exampleDB.Pool }

// exampleService stands for a leasehold service's URL, such as
// "http://localhost:8080": a replica of the REST API on the examples'
// database, for the examples' lifetime.
func exampleService() (url string, stop func()) {
	srv := httptest.NewServer(server.NewServer(server.Deps{
		Leases: leasestore.NewStore(exampleDB.Pool), Tasks: taskstore.NewStore(exampleDB.Pool), DefaultTTL: 30 * time.Second,
		Log: zerolog.Nop(), Metrics: server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready: func(context.Context) error { return nil }, Instance: server.Instance{ID: "example"},
	}))
	return srv.URL, srv.Close
}

// A worker for a kind, a client on the program's pool, and an insert: the
// worker runs the task once it commits.
func ExampleNewClient() {
	ctx := context.Background()
	welcomed := make(chan struct{})
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[WelcomeEmail]) error {
		fmt.Printf("welcome, user %d (attempt %d)\n", t.Args.UserID, t.Attempts)
		close(welcomed)
		return nil
	}), leasehold.KindConfig{MaxAttempts: 10})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{
		Workers: workers,
		Queues:  map[string]leasehold.QueueConfig{"default": {MaxWorkers: 20}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck // an example

	if _, err := client.Insert(ctx, WelcomeEmail{UserID: 42}, nil); err != nil {
		log.Print(err)
		return
	}
	<-welcomed
	// Output: welcome, user 42 (attempt 1)
}

// The task and the data it is about, written in one transaction: if the
// transaction rolls back, the task never existed.
func ExampleClient_InsertTx() {
	ctx := context.Background()
	pool := examplePool()
	client, err := leasehold.NewClient(pool, leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_users (id bigint PRIMARY KEY, email text NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	if _, err := tx.Exec(ctx, `INSERT INTO example_users VALUES (7, 'ada@example.com')`); err != nil {
		log.Print(err)
		return
	}
	res, err := client.InsertTx(ctx, tx, signupReport{UserID: 7}, &leasehold.InsertOpts{Queue: "reports"})
	if err != nil {
		log.Print(err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		log.Print(err)
		return
	}
	fmt.Println(res.Task.Kind, res.Task.Queue, res.Task.State)
	// Output: signup_report reports pending
}

type signupReport struct {
	UserID int64 `json:"user_id"`
}

func (signupReport) Kind() string { return "signup_report" }

// A unique key makes an insert safe to retry: a second insert of the key
// finds the first's task.
func ExampleClient_InsertMany() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	key := &leasehold.InsertOpts{UniqueKey: "invoice:2026-12", Priority: -1}
	res, err := client.InsertMany(ctx, []leasehold.InsertParams{
		{Args: invoiceRun{Month: "2026-12"}, Opts: key},
		{Args: invoiceRun{Month: "2026-12"}, Opts: key},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0].Duplicate, res[1].Duplicate, res[0].Task.ID == res[1].Task.ID)
	// Output: false true true
}

type invoiceRun struct {
	Month string `json:"month"`
}

func (invoiceRun) Kind() string { return "invoice_run" }

// Cancel stops a task, running or not; Retry puts it back.
func ExampleClient_Cancel() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := client.Insert(ctx, invoiceRun{Month: "2027-01"}, &leasehold.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	if err != nil {
		log.Fatal(err)
	}
	cancelled, err := client.Cancel(ctx, res.Task.ID, "the month was invoiced by hand")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cancelled.State, cancelled.LastError)
	if _, err := client.Cancel(ctx, res.Task.ID, ""); errors.Is(err, task.ErrNotCancellable) {
		fmt.Println("cancelled already")
	}
	again, err := client.Retry(ctx, res.Task.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.State)
	// Output:
	// cancelled the month was invoiced by hand
	// cancelled already
	// pending
}

// A worker that asks to run again later, and one that gives up for good.
func ExampleSnooze() {
	ctx := context.Background()
	done := make(chan struct{})
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[exportArgs]) error {
		switch {
		case t.Args.Format != "csv":
			defer close(done)
			return leasehold.Cancel(fmt.Errorf("format %q is not supported", t.Args.Format))
		case t.Attempts == 1 && len(t.EarlierAttempts) == 0:
			fmt.Println("the export is not ready; again in a moment")
			return leasehold.Snooze(10 * time.Millisecond)
		}
		fmt.Println("exported, after", len(t.EarlierAttempts), "snooze")
		return leasehold.RecordOutput(ctx, map[string]int{"rows": 3})
	}), leasehold.KindConfig{})
	if err != nil {
		log.Print(err)
		return
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers})
	if err != nil {
		log.Print(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		log.Print(err)
		return
	}
	defer client.Stop(ctx) //nolint:errcheck // an example
	csv, _ := client.Insert(ctx, exportArgs{Format: "csv"}, nil)
	awaitState(ctx, client, csv.Task.ID, task.StateDone)
	xml, _ := client.Insert(ctx, exportArgs{Format: "xml"}, nil)
	<-done
	fmt.Println(awaitState(ctx, client, xml.Task.ID, task.StateCancelled).LastError)
	// Output:
	// the export is not ready; again in a moment
	// exported, after 1 snooze
	// format "xml" is not supported
}

type exportArgs struct {
	Format string `json:"format"`
}

func (exportArgs) Kind() string { return "export" }

// awaitState is the examples' wait for a task to finish in state: WaitTask,
// for at most testkit.Patience; nil when it ran out or the task finished
// otherwise.
func awaitState(ctx context.Context, c *leasehold.Client, id int64, state task.State) *task.Task {
	ctx, cancel := context.WithTimeout(ctx, testkit.Patience)
	defer cancel()
	t, err := c.WaitTask(ctx, id)
	if err != nil || t.State != state {
		return nil
	}
	return t
}

// Run a job only while holding the lease on its resource: the lease is
// renewed in the background and the job's context ends as soon as the lease
// can no longer be counted on.
func ExampleLeases_Hold() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	h, err := client.Leases().Hold(ctx, "report:nightly", "worker-1", lease.KeepConfig{TTL: 30 * time.Second})
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		fmt.Printf("%s holds it until %s; try later\n", held.Lease.Holder, held.Lease.ExpiresAt)
		return
	case err != nil:
		log.Fatal(err)
	}
	// Pass the fence to whatever the lease protects, so that it can refuse
	// a holder that lost the lease without knowing it yet.
	fmt.Println("running the report under a fence:", h.Lease().Fence > 0)
	if err := h.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.Err())
	// Output:
	// running the report under a fence: true
	// lease released by its holder
}

// Acquire, renew and release a lease by hand; a second holder is refused.
func ExampleLeases_Acquire() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	leases := client.Leases()
	acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "printer:3", Holder: "alice", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	_, err = leases.Acquire(ctx, lease.AcquireParams{Resource: "printer:3", Holder: "bob"})
	fmt.Println("bob:", errors.Is(err, lease.ErrHeld))
	if _, err := leases.Renew(ctx, lease.RenewParams{Resource: "printer:3", Holder: "alice", Fence: acq.Lease.Fence}); err != nil {
		log.Fatal(err)
	}
	released, err := leases.Release(ctx, lease.ReleaseParams{Resource: "printer:3", Holder: "alice", Fence: acq.Lease.Fence})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(released.State)
	_, err = leases.Release(ctx, lease.ReleaseParams{Resource: "printer:3", Holder: "alice"})
	fmt.Println("again:", errors.Is(err, lease.ErrNotHeld))
	// Output:
	// bob: true
	// released
	// again: true
}

// One replica of many runs the nightly job: the elected one.
func ExampleClient_NewElector() {
	ctx, stop := context.WithCancel(context.Background())
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{ID: "replica-a"})
	if err != nil {
		log.Fatal(err)
	}
	e, err := client.NewElector(leasehold.ElectorConfig{
		Resource: "leader:nightly",
		Keep:     lease.KeepConfig{TTL: 15 * time.Second},
		Callbacks: leasehold.Callbacks{
			OnStartedLeading: func(ctx context.Context, l lease.Lease) {
				fmt.Println("leading, under a fence:", l.Fence > 0)
				stop() // the job would run here until ctx ends; the example stops at once
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
			OnNewLeader:      func(holder string) { fmt.Println("the leader is", holder) },
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Run(ctx); err != nil { // until ctx ends; it releases the lease then
		log.Fatal(err)
	}
	// Output:
	// leading, under a fence: true
	// stopped leading
}

// A client of a leasehold service over HTTP, for a program with no
// database credentials: the same workers, inserts and leases.
func ExampleNewRemoteClient() {
	ctx := context.Background()
	url, stop := exampleService()
	defer stop()
	client, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: url, Token: ""}, leasehold.Config{ID: "remote-1"})
	if err != nil {
		log.Print(err)
		return
	}
	acq, err := client.Leases().Acquire(ctx, lease.AcquireParams{Resource: "batch:import", Holder: client.ID(), TTL: 10 * time.Second})
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(acq.New, acq.Lease.Holder)
	if _, err := client.InsertTx(ctx, nil, invoiceRun{}, nil); errors.Is(err, leasehold.ErrNoDatabase) {
		fmt.Println("no transaction to join over HTTP")
	}
	// Output:
	// true remote-1
	// no transaction to join over HTTP
}

// A remote client's failures that may pass if the call is made again.
func ExampleIsTransient() {
	client, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "http://127.0.0.1:1"}, leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Get(context.Background(), 1)
	var status *leasehold.StatusError
	fmt.Println(leasehold.IsTransient(err), errors.As(err, &status))
	// Output: true false
}

// Migrate brings a database's leasehold tables up to date: safe to call
// from every replica at start.
func ExampleMigrate() {
	applied, err := leasehold.Migrate(context.Background(), examplePool())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied", len(applied), "migrations") // none: the examples' database is up to date
	// Output: applied 0 migrations
}

// A kind's retry policy: its attempts, a timeout per attempt, and a
// backoff between them.
func ExampleAddWorker() {
	ctx := context.Background()
	finished := make(chan struct{})
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[flakyFetch]) error {
		if t.Attempts < 3 {
			return fmt.Errorf("attempt %d: the upstream answered 503", t.Attempts)
		}
		defer close(finished)
		fmt.Println("fetched on attempt", t.Attempts)
		return nil
	}), leasehold.KindConfig{
		MaxAttempts: 5,
		Timeout:     time.Minute,
		Backoff:     func(attempt int) time.Duration { return time.Duration(attempt) * 10 * time.Millisecond },
	})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx) //nolint:errcheck // an example
	res, err := client.Insert(ctx, flakyFetch{URL: "https://example.com/feed"}, nil)
	if err != nil {
		log.Print(err)
		return
	}
	<-finished
	done := awaitState(ctx, client, res.Task.ID, task.StateDone)
	fmt.Println(done.MaxAttempts, len(done.EarlierAttempts), done.EarlierAttempts[0].Error)
	// Output:
	// fetched on attempt 3
	// 5 2 attempt 1: the upstream answered 503
}

type flakyFetch struct {
	URL string `json:"url"`
}

func (flakyFetch) Kind() string { return "flaky_fetch" }

// Stop lets running tasks finish until its context ends; those still
// running then are handed back to the queue, for another worker.
func ExampleClient_Stop() {
	ctx := context.Background()
	started := make(chan struct{})
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[longRun]) error {
		close(started)
		<-ctx.Done() // a task that honours its context
		return ctx.Err()
	}), leasehold.KindConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := client.Insert(ctx, longRun{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	<-started
	grace, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	fmt.Println(client.Stop(grace))
	back, err := client.Get(ctx, res.Task.ID)
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(back.State, back.Attempts, back.EarlierAttempts[0].Outcome)
	// Output:
	// context deadline exceeded
	// pending 0 requeued
}

type longRun struct{}

func (longRun) Kind() string { return "long_run" }

// The history of a resource's leases: who held it, under which fence.
func ExampleLeases_Events() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	leases := client.Leases()
	for _, holder := range []string{"a", "b"} {
		acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "door:front", Holder: holder, TTL: time.Minute})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "door:front", Holder: holder, Fence: acq.Lease.Fence}); err != nil {
			log.Fatal(err)
		}
	}
	events, err := leases.Events(ctx, lease.EventsParams{Resource: "door:front"})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range events {
		fmt.Println(e.Holder, e.Kind)
	}
	fmt.Println("fences grow:", events[2].Fence > events[0].Fence)
	// Output:
	// a acquired
	// a released
	// b acquired
	// b released
	// fences grow: true
}

// A pool for a database with a standby: every host, the primary chosen by
// target_session_attrs, and leasehold's session settings, which keep
// fences unique across a failover.
func ExamplePrepareSession() {
	cfg, err := pgxpool.ParseConfig("postgres://app@db-a:5432,db-b:5432/app?target_session_attrs=read-write")
	if err != nil {
		log.Fatal(err)
	}
	cfg.AfterConnect = leasehold.PrepareSession
	fmt.Println(cfg.ConnConfig.Fallbacks != nil, cfg.AfterConnect != nil)
	// Output: true true
}
