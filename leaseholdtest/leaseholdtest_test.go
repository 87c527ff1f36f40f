package leaseholdtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/leaseholdtest"
	"github.com/leasehold/leasehold/task"
)

type greet struct {
	Name string `json:"name"`
}

func (greet) Kind() string { return "greet" }

// TestWorkOutcomes: Work runs a Work as a client would and says what the
// client would make of it: completed with the recorded output, failed,
// snoozed, cancelled, and a panic failed.
func TestWorkOutcomes(t *testing.T) {
	t.Parallel()
	w := leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[greet]) error {
		switch tk.Args.Name {
		case "fail":
			return errors.New("no")
		case "snooze":
			return leasehold.Snooze(time.Minute)
		case "cancel":
			return leasehold.Cancel(errors.New("never"))
		case "panic":
			panic("boom")
		}
		return leasehold.RecordOutput(ctx, map[string]string{"hello": tk.Args.Name, "attempt": fmt.Sprint(tk.Attempts)})
	})
	for name, want := range map[string]leaseholdtest.Outcome{
		"ada": leaseholdtest.Completed, "fail": leaseholdtest.Failed, "snooze": leaseholdtest.Snoozed,
		"cancel": leaseholdtest.Cancelled, "panic": leaseholdtest.Failed,
	} {
		res, err := leaseholdtest.Work(t.Context(), w, greet{Name: name}, &leaseholdtest.WorkOpts{Attempt: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != want {
			t.Errorf("%s: %s (%v); want %s", name, res.Outcome, res.Err, want)
		}
		if name == "ada" && string(res.Output) != `{"attempt":"2","hello":"ada"}` {
			t.Errorf("the output recorded: %s", res.Output)
		}
		if name == "snooze" && res.SnoozedFor != time.Minute {
			t.Errorf("snoozed for %s; want 1m", res.SnoozedFor)
		}
		if name == "panic" && !strings.Contains(fmt.Sprint(res.Err), "boom") {
			t.Errorf("the panic's failure: %v", res.Err)
		}
	}
}

// fakeTB records a Require's failure instead of failing the test.
type fakeTB struct{ failed string }

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

// TestRequireInsertedTx: the task a transaction inserted is found, decoded,
// inside the transaction; none is a failure saying so.
func TestRequireInsertedTx(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // the test's end
	var none fakeTB
	leaseholdtest.RequireInsertedTx[greet](t.Context(), &none, tx, "")
	if !strings.Contains(none.failed, `no task of kind "greet"`) {
		t.Errorf("before the insert: %q; want a failure saying no greet was inserted", none.failed)
	}
	if _, err := c.InsertTx(t.Context(), tx, greet{Name: "ada"}, &leasehold.InsertOpts{Queue: "hellos"}); err != nil {
		t.Fatal(err)
	}
	got := leaseholdtest.RequireInsertedTx[greet](t.Context(), t, tx, "hellos")
	if got.Args.Name != "ada" || got.Queue != "hellos" {
		t.Errorf("found %+v in %s; want ada's greet in hellos", got.Args, got.Queue)
	}
	var present fakeTB
	leaseholdtest.RequireNotInsertedTx[greet](t.Context(), &present, tx, "")
	if present.failed == "" {
		t.Error("RequireNotInsertedTx after the insert: no failure")
	}
}

// TestWaitIdle: WaitIdle returns once the client's workers have done every
// due task, and not before.
func TestWaitIdle(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	release := make(chan struct{})
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(ctx context.Context, _ *leasehold.Task[greet]) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: w})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck // the test's end
	for range 5 {
		if _, err := c.Insert(t.Context(), greet{Name: "x"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := leaseholdtest.WaitIdle(short, c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitIdle with the tasks held up: %v; want it still waiting at its deadline", err)
	}
	close(release)
	ctx, cancel2 := context.WithTimeout(t.Context(), time.Minute)
	defer cancel2()
	if err := leaseholdtest.WaitIdle(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, tk := range mustList(t, c) {
		if tk.State != "done" {
			t.Errorf("task %d is %s after WaitIdle; want done", tk.ID, tk.State)
		}
	}
}

func mustList(t *testing.T, c *leasehold.Client) []*task.Task {
	t.Helper()
	ts, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{Kind: "greet"})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}
