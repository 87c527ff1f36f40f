package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// Wait for a task to finish, woken as it does: no polling.
func ExampleClient_WaitTask() {
	ctx := context.Background()
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[WelcomeEmail]) error {
		return leasehold.RecordOutput(ctx, map[string]int64{"sent_to": t.Args.UserID})
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
	defer client.Stop(ctx) //nolint:errcheck // an example
	res, err := client.Insert(ctx, WelcomeEmail{UserID: 7}, nil)
	if err != nil {
		log.Print(err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done, err := client.WaitTask(wctx, res.Task.ID)
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(done.State, string(done.TaskOutput))
	// Output: done {"sent_to": 7}
}

// List the dead tasks of a kind, a page at a time.
func ExampleClient_ListTasks() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	for after := int64(0); ; {
		page, err := client.ListTasks(ctx, leasehold.ListTasksParams{Kind: "welcome_email", State: task.StateDead, AfterID: after, Limit: 100})
		if err != nil {
			log.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, t := range page {
			fmt.Println(t.ID, t.LastError)
		}
		after = page[len(page)-1].ID
	}
	fmt.Println("listed")
	// Output: listed
}

// Count what becomes of the tasks a client runs, for the program's own
// metrics.
func ExampleClient_Subscribe() {
	ctx := context.Background()
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(context.Context, *leasehold.Task[WelcomeEmail]) error {
		return errors.New("the mail server is down")
	}), leasehold.KindConfig{MaxAttempts: 1})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers})
	if err != nil {
		log.Fatal(err)
	}
	deaths, stop := client.Subscribe(leasehold.EventDead)
	defer stop()
	if err := client.Start(ctx); err != nil {
		log.Print(err)
		return
	}
	defer client.Stop(ctx) //nolint:errcheck // an example
	if _, err := client.Insert(ctx, WelcomeEmail{UserID: 8}, nil); err != nil {
		log.Print(err)
		return
	}
	ev := <-deaths
	fmt.Println(ev.Kind, ev.TaskKind, ev.Err)
	// Output: dead welcome_email the mail server is down
}

// A schedule of typed task args: the kind and the task_data follow from
// them.
func ExampleNewSchedule() {
	p, err := leasehold.NewSchedule("weekly-digest", "0 9 * * MON", WelcomeEmail{UserID: 1},
		&leasehold.ScheduleOpts{Zone: "Europe/Berlin", Queue: "mail", Unique: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p.Kind, string(p.TaskData), p.Zone, p.Queue)
	// Then: client.Schedules().Add(ctx, p)
	// Output: welcome_email {"user_id":1} Europe/Berlin mail
}

// Wait for a lease another holder has, then hold it.
func ExampleLeases_HoldWait() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	h, err := client.Leases().HoldWait(ctx, "import:orders", client.ID()+"/importer", 10*time.Minute, lease.KeepConfig{})
	if errors.Is(err, lease.ErrHeld) {
		fmt.Println("still held after ten minutes")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(ctx) //nolint:errcheck // an example
	fmt.Println("holding, fence", h.Lease().Fence > 0)
	// Output: holding, fence true
}

// A function is a worker; its type argument follows from the function's.
func ExampleWorkFunc() {
	workers := leasehold.NewWorkers()
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[WelcomeEmail]) error {
		fmt.Println("welcome,", t.Args.UserID)
		return nil
	}), leasehold.KindConfig{})
	fmt.Println(err)
	// Output: <nil>
}

// Middleware that carries the tenant of each insert to the workers of its
// tasks, through the tasks' metadata.
func ExampleMiddleware() {
	type tenantKey struct{}
	tenant := leasehold.Middleware{
		Insert: func(ctx context.Context, tasks []*leasehold.InsertingTask, next func(context.Context) error) error {
			if id, ok := ctx.Value(tenantKey{}).(string); ok {
				for _, t := range tasks {
					t.Metadata["tenant"] = id
				}
			}
			return next(ctx)
		},
		Work: func(ctx context.Context, t *task.Task, next func(context.Context) error) error {
			return next(context.WithValue(ctx, tenantKey{}, t.Metadata["tenant"]))
		},
	}
	workers := leasehold.NewWorkers()
	done := make(chan string, 1)
	err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, _ *leasehold.Task[WelcomeEmail]) error {
		done <- ctx.Value(tenantKey{}).(string)
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{Workers: workers, Middleware: []leasehold.Middleware{tenant}})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(context.Background()) //nolint:errcheck // an example
	if _, err := client.Insert(context.WithValue(context.Background(), tenantKey{}, "acme"), WelcomeEmail{UserID: 9}, nil); err != nil {
		log.Print(err)
		return
	}
	fmt.Println("worked for", <-done)
	// Output: worked for acme
}

// A key of slots lets a few holders in at once: here at most two imports
// run together, however many processes try. Each holds a slot's lease with
// its own fence; a third is refused until a slot is freed.
func ExampleLeases_HoldSlot() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	var holdings []*leasehold.Holding
	for _, who := range []string{"importer-1", "importer-2", "importer-3"} {
		h, err := client.Leases().HoldSlot(ctx, "example:imports", client.ID()+"/"+who, 2, 0, lease.KeepConfig{})
		if errors.Is(err, lease.ErrHeld) {
			fmt.Println(who, "waits: both slots are held")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		holdings = append(holdings, h)
		fmt.Println(who, "holds a slot with a fence of its own:", h.Lease().Fence > 0)
	}
	for _, h := range holdings {
		_ = h.Release(ctx)
	}
	// Output:
	// importer-1 holds a slot with a fence of its own: true
	// importer-2 holds a slot with a fence of its own: true
	// importer-3 waits: both slots are held
}

// A key's limit changes at run time: raised, the tasks waiting on it start
// at once; lowered, its holders finish and no slot is granted until fewer
// hold it than the new limit.
func ExampleLeases_SetLimit() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	l, err := client.Leases().SetLimit(ctx, "example:partner-api", 5)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Resource, "slots:", l.Slots)
	// Output: example:partner-api slots: 5
}

// A rate on a key: at most 50 of its tasks start in any minute, however
// many processes claim them. Tasks name the key as their Lock.
func ExampleLeases_SetRate() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	l, err := client.Leases().SetRate(ctx, "example:mail-provider", 50, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Resource, "starts", l.RateStarts, "per", l.RatePeriod)
	// Output: example:mail-provider starts 50 per 1m0s
}

// A paused queue's pending tasks wait, in every process, until it is
// resumed (or until the time given); its running tasks finish.
func ExampleClient_PauseQueue() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{})
	if err != nil {
		log.Fatal(err)
	}
	p, err := client.PauseQueue(ctx, "example-imports", time.Time{}, "a bug in the importer")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("paused", p.Queue, "until resumed:", p.Until == nil)
	resumed, err := client.ResumeQueue(ctx, "example-imports")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("resumed:", resumed)
	// Output:
	// paused example-imports until resumed: true
	// resumed: true
}
