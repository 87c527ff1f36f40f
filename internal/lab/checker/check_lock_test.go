package checker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestCheckLocksAndSchedules runs real lease-gated tasks, on a lock that a
// lease client holds before them, and reads tasks of a schedule: their
// history, as the database records it, keeps every guarantee. Then it
// forges a gated task's completion to come after its lock's release, and
// checks that Check catches it.
func TestCheckLocksAndSchedules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	data := json.RawMessage(`{"sleep_duration_seconds": 0}`)
	claim := func(processor string) []task.Task {
		t.Helper()
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{processor}, TTL: time.Minute, WithLapsed: true})
		if err != nil {
			t.Fatal(err)
		}
		return claimed
	}

	// The lock is a client's when the tasks are inserted: no claim takes them.
	held, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "res:lock", Holder: "client", TTL: time.Minute})
	if err != nil || !held.New {
		t.Fatalf("acquire res:lock: new=%v, %v", held.New, err)
	}
	inserted, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data, Lock: "res:lock"}, {TaskData: data, Lock: "res:lock"}}))
	if err != nil {
		t.Fatal(err)
	}
	a, b := inserted[0], inserted[1]
	if got := claim("w1"); len(got) != 0 {
		t.Fatalf("claimed %v while the lock was held, want nothing", got)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "res:lock", Holder: "client", Fence: held.Lease.Fence}); err != nil {
		t.Fatal(err)
	}

	// a is claimed, renewed and done; b, handed back once, then done.
	got := claim("w1")
	if len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("claimed %v, want task %d", got, a.ID)
	}
	if got2 := claim("w2"); len(got2) != 0 {
		t.Fatalf("claimed %v while task %d held the lock, want nothing", got2, a.ID)
	}
	if _, err := tasks.Heartbeat(ctx, a.ID, "w1", got[0].Fence); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Complete(ctx, a.ID, "w1", got[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		processor string
		end       func(task.Task) error
	}{
		{"w2", func(c task.Task) error {
			_, err := tasks.Requeue(ctx, c.ID, "w2", c.Fence, "shutting down")
			return err
		}},
		{"w3", func(c task.Task) error { _, err := tasks.Complete(ctx, c.ID, "w3", c.Fence, nil); return err }},
	} {
		got := claim(step.processor)
		if len(got) != 1 || got[0].ID != b.ID {
			t.Fatalf("%s claimed %v, want task %d", step.processor, got, b.ID)
		}
		if err := step.end(got[0]); err != nil {
			t.Fatal(err)
		}
	}

	// Two ticks of a schedule, made 1 ms after each fell due (a scheduler's
	// insert, without the scheduler), and cancelled.
	var first time.Time
	if err := tdb.Pool.QueryRow(ctx, `SELECT date_trunc('second', now()) - interval '5 seconds'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	for _, tick := range []time.Time{first, first.Add(2 * time.Second)} {
		var id int64
		if err := tdb.Pool.QueryRow(ctx, `
			INSERT INTO tasks (task_data, schedule, schedule_tick, scheduled_at, created_at)
			VALUES ('{}', 'every-1s', $1::timestamptz, $1::timestamptz, $1::timestamptz + interval '1 millisecond') RETURNING id`, tick).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := tasks.Cancel(ctx, id, "not to be run"); err != nil {
			t.Fatal(err)
		}
	}
	opts := checker.Options{Schedules: []checker.Schedule{{
		Name: "every-1s", Cron: "@every 1s", First: first, Next: first.Add(3 * time.Second), Missed: 1,
		End: first.Add(2500 * time.Millisecond),
	}}}

	rep := check(t, tdb.Pool, opts)
	if !rep.OK() {
		t.Fatalf("violations in a real history: %v", rep.Violations)
	}
	if rep.GatedTasks != 2 || rep.GatedAttempts != 3 {
		t.Errorf("gated tasks %d, attempts %d; want 2 and 3", rep.GatedTasks, rep.GatedAttempts)
	}
	want := []checker.ScheduleTicks{{Name: "every-1s", Cron: "@every 1s", Expected: 3, Made: 2, Missed: 1}}
	if !slices.Equal(rep.Schedules, want) {
		t.Errorf("schedules = %+v, want %+v", rep.Schedules, want)
	}

	// a's completion forged to come 1 s later, when its lock was free.
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET processed_at = processed_at + interval '1 second' WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleLockHeld}) {
		t.Fatalf("violations = %v, want %q", rep.Violations, checker.RuleLockHeld)
	}
	for _, w := range []string{fmt.Sprintf("task:%d by w1", a.ID), "outlived its lock, res:lock by w1"} {
		if d := rep.Violations[0].Detail; !strings.Contains(d, w) {
			t.Errorf("detail %q does not say %q", d, w)
		}
	}
}
