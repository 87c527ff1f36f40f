package leasehold_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/task"
)

// TestListAndWaitTasks: ListTasks selects by state, kind and queue and
// pages by id; WaitTask returns a task once it is done or cancelled, woken
// as it finishes, and ctx's error when ctx ends first; embedded and remote
// alike.
func TestListAndWaitTasks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	embedded, err := leasehold.NewClient(db.Pool, leasehold.Config{AllowUnknownKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: svc.URL}, leasehold.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": remote} {
		t.Run(name, func(t *testing.T) {
			queue := "list-" + name
			var ids []int64
			for range 3 {
				res, err := c.Insert(t.Context(), emailArgs{}, &leasehold.InsertOpts{Queue: queue})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, res.Task.ID)
			}
			page, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{Queue: queue, State: task.StatePending, Limit: 2})
			if err != nil || len(page) != 2 || page[0].ID != ids[0] || page[1].ID != ids[1] {
				t.Fatalf("the first page: %v, %v; want tasks %v", page, err, ids[:2])
			}
			rest, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{Queue: queue, AfterID: page[1].ID})
			if err != nil || len(rest) != 1 || rest[0].ID != ids[2] {
				t.Fatalf("the next page: %v, %v; want task %d", rest, err, ids[2])
			}
			if none, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{Queue: queue, Kind: "no-such-kind"}); err != nil || len(none) != 0 {
				t.Errorf("a kind nobody inserted: %v, %v; want nothing", none, err)
			}
			if _, err := c.ListTasks(t.Context(), leasehold.ListTasksParams{State: "finished"}); !errors.Is(err, leasehold.ErrInvalidArgument) {
				t.Errorf("a state that is none: %v; want ErrInvalidArgument", err)
			}

			// A wait that ends with its context first.
			short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := c.WaitTask(short, ids[0]); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("WaitTask of a pending task past its deadline: %v; want context.DeadlineExceeded", err)
			}
			// A wait for a task that is cancelled meanwhile.
			got := make(chan error, 1)
			go func() {
				tk, err := c.WaitTask(t.Context(), ids[1])
				if err == nil && tk.State != task.StateCancelled {
					err = errors.New("returned " + tk.State)
				}
				got <- err
			}()
			if _, err := embedded.Cancel(t.Context(), ids[1], "no longer wanted"); err != nil {
				t.Fatal(err)
			}
			if err := testkit.Receive(t, "the wait to return", got); err != nil {
				t.Errorf("WaitTask of a task cancelled meanwhile: %v", err)
			}
			if _, err := c.WaitTask(t.Context(), 987654321); !errors.Is(err, task.ErrNotFound) {
				t.Errorf("WaitTask of no task: %v; want task.ErrNotFound", err)
			}
		})
	}
}

// TestWaitTaskSeesTheCompletion: waits, many at once, return as a worker
// completes their tasks.
func TestWaitTaskSeesTheCompletion(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := oneWorker(t)
	c := started(t, db, leasehold.Config{Workers: w})
	waiter, err := leasehold.NewClient(db.Pool, leasehold.Config{AllowUnknownKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	done := make(chan error, n)
	for range n {
		res, err := c.Insert(t.Context(), emailArgs{}, &leasehold.InsertOpts{ScheduledAt: time.Now().Add(200 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			tk, err := waiter.WaitTask(t.Context(), res.Task.ID)
			if err == nil && tk.State != task.StateDone {
				err = errors.New("returned " + tk.State)
			}
			done <- err
		}()
	}
	for range n {
		if err := testkit.Receive(t, "a wait to return", done); err != nil {
			t.Error(err)
		}
	}
}
