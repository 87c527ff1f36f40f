package leasehold_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/task"
)

// blobArgs carries a payload of any size.
type blobArgs struct {
	Blob string `json:"blob"`
}

func (blobArgs) Kind() string { return "blob" }

// TestOnePayloadBoundForBothPaths: task_data and task_output hold at most
// task.MaxPayloadBytes, embedded and remote alike. An insert of more is
// refused before anything is written; a handler's output of more fails its
// attempt with the reason, once, rather than be retried until its lease
// lapses and run again; and a remote InsertMany larger than one request
// goes in several.
func TestOnePayloadBoundForBothPaths(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	var runs atomic.Int32
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[blobArgs]) error {
		runs.Add(1)
		return leasehold.RecordOutput(ctx, strings.Repeat("x", 2<<20)) // 2 MiB
	}), leasehold.KindConfig{MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	embedded, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: svc.URL}, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}

	huge := blobArgs{Blob: strings.Repeat("y", 20<<20)} // 20 MiB
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": remote} {
		if _, err := c.Insert(t.Context(), huge, nil); !errors.Is(err, leasehold.ErrInvalidArgument) || !strings.Contains(err.Error(), "task.MaxPayloadBytes") {
			t.Errorf("%s: an insert of 20 MiB: %v; want ErrInvalidArgument naming the bound", name, err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM tasks`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tasks after the refused inserts (%v); want none", n, err)
	}

	// A remote batch of more than one request's body: inserted whole.
	third := strings.Repeat("z", task.MaxPayloadBytes/3)
	batch := []leasehold.InsertParams{{Args: blobArgs{third}}, {Args: blobArgs{third}}, {Args: blobArgs{third}}, {Args: blobArgs{third}}}
	ins, err := remote.InsertMany(t.Context(), batch)
	if err != nil || len(ins) != len(batch) {
		t.Fatalf("a remote InsertMany of %d tasks of %d bytes: %d inserted, %v", len(batch), len(third), len(ins), err)
	}

	// Each client runs one task whose output is 2 MiB: the attempt fails,
	// saying why, and the handler runs once.
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": remote} {
		t.Run(name, func(t *testing.T) {
			runs.Store(0)
			if _, err := db.Pool.Exec(t.Context(), `DELETE FROM tasks`); err != nil {
				t.Fatal(err)
			}
			res, err := c.Insert(t.Context(), blobArgs{Blob: "small"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			dead := waitState(t, embedded, res.Task.ID, task.StateDead)
			if err := c.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(dead.LastError, "task_output holds at most") || dead.Attempts != 1 {
				t.Errorf("the task is dead after %d attempts with %q; want one attempt failed for its output's size", dead.Attempts, dead.LastError)
			}
			if got := runs.Load(); got != 1 {
				t.Errorf("the handler ran %d times; want once", got)
			}
		})
	}
}
