package taskstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// countsByScan counts the tasks by state the slow way, reading every row.
func countsByScan(t *testing.T, tdb pgtest.DB) task.Stats {
	t.Helper()
	var s task.Stats
	err := tdb.Pool.QueryRow(t.Context(), `
		SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'running'),
		       count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead'),
		       count(*) FILTER (WHERE state = 'cancelled'),
		       count(*) FILTER (WHERE state = 'done' AND processed_at > now() - interval '1 minute')
		FROM tasks`).Scan(&s.Pending, &s.Running, &s.Done, &s.Dead, &s.Cancelled, &s.DoneLastMinute)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStatsAreExact: the counts by state, kept by the writes that change
// them, equal a count of the table after inserts, claims, completions,
// failures, cancellations and deletions made at once by several writers
// while folds run beside them.
func TestStatsAreExact(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	folds := 0
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.FoldCounts(ctx); err != nil {
				t.Errorf("fold: %v", err)
				return
			}
			folds++
		}
	})
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for round := range 15 {
				var batch []taskstore.NewTask
				for i := range 20 {
					batch = append(batch, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Kind: "count", MaxAttempts: 1,
						Queue: fmt.Sprintf("q%d", (w+i)%2)})
				}
				if _, err := s.Insert(ctx, batch); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				procs := []string{fmt.Sprintf("w%d/a", w), fmt.Sprintf("w%d/b", w), fmt.Sprintf("w%d/c", w), fmt.Sprintf("w%d/d", w)}
				claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: procs, TTL: time.Minute, Kinds: []string{"count"}})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				for i, c := range claimed {
					switch i {
					case 0:
						_, err = s.Complete(ctx, c.ID, c.Processor, c.Fence, nil)
					case 1:
						_, err = s.Fail(ctx, c.ID, c.Processor, c.Fence, "counted", 0) // one attempt: dead
					case 2:
						_, err = s.Cancel(ctx, c.ID, "counted")
					}
					if err != nil {
						t.Errorf("task %d (%d of round %d): %v", c.ID, i, round, err)
						return
					}
				}
			}
		})
	}
	writers.Wait()
	// A deletion, as retention makes (of dead tasks: one done in the last
	// minute is never old enough), and a change that moves no state.
	if _, err := tdb.Pool.Exec(ctx, `DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE state = 'dead' ORDER BY id LIMIT 7)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET priority = priority WHERE state = 'pending'`); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()

	want := countsByScan(t, tdb)
	got, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Stats after %d folds: %+v; counting the table: %+v", folds, got, want)
	}
	if want.Pending == 0 || want.Running == 0 || want.Done == 0 || want.Dead == 0 || want.Cancelled == 0 {
		t.Errorf("the mix left %+v; want tasks in every state", want)
	}
	// Folded once more, it reads a row per state and second, not per change.
	if _, err := s.FoldCounts(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM task_counts`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Stats(ctx); err != nil || got != want {
		t.Errorf("Stats after the last fold: %+v, %v; want %+v", got, err, want)
	}
	if rows > 5*60 {
		t.Errorf("%d rows of counts after a fold; want at most a row per state and second", rows)
	}
	// Folded already, with nothing new, a fold writes nothing.
	if n, err := s.FoldCounts(ctx); err != nil || n != 0 {
		t.Errorf("a fold with nothing to fold: %d rows folded, %v; want 0", n, err)
	}
	t.Logf("%+v, %d folds beside the writes, %d rows after the last", want, folds, rows)

	if _, err := tdb.Pool.Exec(ctx, `TRUNCATE tasks`); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Stats(ctx); err != nil || got != (task.Stats{}) {
		t.Errorf("Stats after TRUNCATE: %+v, %v; want all zero", got, err)
	}
}

// TestStatsReadNoTaskRow: the counts are not a count of the tasks table,
// whose cost grows with it: with the table locked against any reader, they
// are still read.
func TestStatsReadNoTaskRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	if _, err := s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	tx, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	if _, err := tx.Exec(ctx, `LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// A read of tasks would wait for the lock until this ends: not a
	// measure of speed, a bound on a wait that must not happen.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := s.Stats(sctx)
	if err != nil {
		t.Fatalf("Stats with the tasks table locked: %v; want the counts, read without touching it", err)
	}
	if got.Pending != 2 {
		t.Errorf("Stats: %+v; want 2 pending", got)
	}
}
