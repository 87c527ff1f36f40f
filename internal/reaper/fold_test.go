package reaper_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
)

// TestReaperFoldsTheCounts: the elected reaper folds the log of task count
// changes, so that a read of the counts does not grow with the writes.
func TestReaperFoldsTheCounts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	const inserts = 50
	for range inserts {
		if _, err := tasks.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	rows := func() int {
		var n int
		if err := tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM task_counts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rows(); n < inserts {
		t.Fatalf("%d rows of count changes after %d inserts; want one per insert before a fold", n, inserts)
	}
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	r := &reaper.Reaper{
		Store: leasestore.NewStore(tdb.Pool), Tasks: tasks, Listener: startListener(ctx, t, &wg, tdb.URL),
		Instance: "reaper-1", Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop(),
	}
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("reaper: %v", err)
		}
	})
	// The inserts came within a few seconds: a row per second (and state) once folded.
	testkit.WaitFor(t, "the reaper to fold the counts", func() bool { return rows() < inserts/2 })
	if st, err := tasks.Stats(ctx); err != nil || st.Pending != inserts {
		t.Errorf("Stats after the folds: %+v, %v; want %d pending", st, err, inserts)
	}
}
