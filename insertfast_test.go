package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/task"
)

// TestInsertManyFast: a batch through COPY is inserted whole, with each
// task's options (a later scheduled_at, metadata, a queue), wakes the
// workers and is run; a unique key, or a remote client, is refused with
// nothing inserted.
func TestInsertManyFast(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	done := make(chan int64, 100)
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(_ context.Context, tk *leasehold.Task[emailArgs]) error {
		done <- tk.ID
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c := started(t, db, leasehold.Config{Workers: w})
	later := time.Now().Add(time.Hour)
	params := make([]leasehold.InsertParams, 0, 51)
	for range 50 {
		params = append(params, leasehold.InsertParams{Args: emailArgs{}, Opts: &leasehold.InsertOpts{Metadata: map[string]string{"batch": "b1"}}})
	}
	params = append(params, leasehold.InsertParams{Args: emailArgs{}, Opts: &leasehold.InsertOpts{ScheduledAt: later}})
	n, err := c.InsertManyFast(t.Context(), params)
	if err != nil || n != len(params) {
		t.Fatalf("InsertManyFast: %d, %v; want %d", n, err, len(params))
	}
	ran := map[int64]bool{}
	for len(ran) < 50 {
		ran[testkit.Receive(t, "a task run", done)] = true
	}
	ts, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{Kind: emailArgs{}.Kind(), Limit: 1000})
	if err != nil || len(ts) != len(params) {
		t.Fatalf("%d tasks listed (%v); want %d", len(ts), err, len(params))
	}
	for _, tk := range ts {
		switch {
		case tk.ScheduledAt.After(time.Now()):
			if tk.State != task.StatePending || tk.ScheduledAt.Sub(later).Abs() > time.Millisecond {
				t.Errorf("the later task: %s at %s; want pending at %s", tk.State, tk.ScheduledAt, later)
			}
		case tk.Metadata["batch"] != "b1":
			t.Errorf("task %d's metadata: %v; want batch b1", tk.ID, tk.Metadata)
		}
	}

	before := len(ts)
	if _, err := c.InsertManyFast(t.Context(), []leasehold.InsertParams{{Args: emailArgs{}}, {Args: emailArgs{}, Opts: &leasehold.InsertOpts{UniqueKey: "k"}}}); !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("a unique key through COPY: %v; want ErrInvalidArgument", err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "http://localhost:1"}, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.InsertManyFast(t.Context(), params[:1]); !errors.Is(err, leasehold.ErrNoDatabase) {
		t.Errorf("a remote InsertManyFast: %v; want ErrNoDatabase", err)
	}
	if ts, _ := c.ListTasks(t.Context(), leasehold.ListTasksParams{Limit: 1000}); len(ts) != before {
		t.Errorf("%d tasks after the refusals; want %d", len(ts), before)
	}
}

// Insert a large batch with COPY.
func ExampleClient_InsertManyFast() {
	ctx := context.Background()
	client, err := leasehold.NewClient(examplePool(), leasehold.Config{AllowUnknownKinds: true})
	if err != nil {
		panic(err)
	}
	params := make([]leasehold.InsertParams, 10000)
	for i := range params {
		params[i] = leasehold.InsertParams{Args: WelcomeEmail{UserID: int64(i)}, Opts: &leasehold.InsertOpts{Queue: "backfill"}}
	}
	n, err := client.InsertManyFast(ctx, params)
	if err != nil {
		panic(err)
	}
	fmt.Println(n, "inserted")
	// Output: 10000 inserted
}
