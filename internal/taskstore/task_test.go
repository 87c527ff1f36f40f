package taskstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

func TestClaimHeartbeatComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{"n":1}`)}, {TaskData: json.RawMessage(`{"n":2}`)}}))
	if err != nil || len(ins) != 2 {
		t.Fatalf("insert: %v, %v", ins, err)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/w1", "r/w2", "r/w3"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %+v, %v; want both tasks", claimed, err)
	}
	a := claimed[0]
	if a.State != task.StateRunning || a.Fence == 0 || a.Attempts != 1 || a.Processor == "" {
		t.Fatalf("claimed task: %+v", a)
	}
	// The lease is in the task's row, with a fence from the sequence every
	// lease draws from; no row of leases stands for it.
	if a.MustHeartbeatBefore == nil || a.StartedAt == nil || a.MustHeartbeatBefore.Sub(*a.StartedAt) != 30*time.Second {
		t.Fatalf("claimed task's lease: started %v, must heartbeat before %v; want a 30s lease", a.StartedAt, a.MustHeartbeatBefore)
	}
	if claimed[1].Fence == a.Fence {
		t.Fatalf("two claims share fence %d", a.Fence)
	}
	if l, err := leasestore.NewStore(tdb.Pool).List(ctx, lease.ListParams{Filter: "active", Prefix: "task:", Limit: 10}); err != nil || len(l) != 0 {
		t.Fatalf("leases rows for task leases: %+v, %v; want none", l, err)
	}
	if _, err := s.Heartbeat(ctx, a.ID, "someone-else", 0); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat by another processor: %v", err)
	}
	if _, err := s.Heartbeat(ctx, a.ID, a.Processor, a.Fence+1); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat with another fence: %v", err)
	}
	if _, err := s.Heartbeat(ctx, 999999, a.Processor, 0); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("heartbeat of an unknown task: %v", err)
	}
	hb, err := s.Heartbeat(ctx, a.ID, a.Processor, a.Fence)
	if err != nil || !hb.MustHeartbeatBefore.After(*a.MustHeartbeatBefore) {
		t.Fatalf("heartbeat: %+v, %v", hb, err)
	}
	done, err := s.Complete(ctx, a.ID, a.Processor, a.Fence, json.RawMessage(`{"ok":true}`))
	if err != nil || done.State != task.StateDone || string(done.TaskOutput) != `{"ok": true}` {
		t.Fatalf("complete: %+v (%s), %v", done, done.TaskOutput, err)
	}
	// The completion ends the lease: the task keeps the expiry its lease had.
	if !done.MustHeartbeatBefore.Equal(*hb.MustHeartbeatBefore) || !done.ProcessedAt.Before(*done.MustHeartbeatBefore) {
		t.Errorf("done task: processed at %v, must heartbeat before %v; want the renewed lease's expiry %v, after the completion",
			done.ProcessedAt, done.MustHeartbeatBefore, hb.MustHeartbeatBefore)
	}
	if _, err := s.Heartbeat(ctx, a.ID, a.Processor, a.Fence); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat after the completion: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Complete(ctx, a.ID, a.Processor, a.Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("second complete: %v, want ErrLeaseLost", err)
	}
}

func TestLapsedTaskIsReclaimedThenDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 2}}))
	if err != nil {
		t.Fatal(err)
	}
	id := ins[0].ID
	lapse := func() {
		t.Helper()
		if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET must_heartbeat_before = now() WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	lapse()
	second, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"b"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(second) != 1 || second[0].Attempts != 2 || second[0].Fence <= first[0].Fence {
		t.Fatalf("second claim: %+v %v", second, err)
	}
	if _, err := s.Complete(ctx, id, "a", first[0].Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("stale complete by the first worker: %v, want ErrLeaseLost", err)
	}
	lapse()
	none, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"c"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(none) != 0 {
		t.Fatalf("claim after the last attempt lapsed: %+v %v; want nothing", none, err)
	}
	got, _ := s.Get(ctx, id)
	if got.State != task.StateDead || got.LastError == "" {
		t.Fatalf("task after its last attempt lapsed: %+v", got)
	}
	// Both lapsed attempts are in the history, in order, each with its own fence.
	want := []task.Attempt{
		{Processor: "a", Fence: first[0].Fence, Outcome: task.OutcomeExpired},
		{Processor: "b", Fence: second[0].Fence, Outcome: task.OutcomeExpired},
	}
	checkAttempts(t, earlierAttempts(t, tdb, id), want)
}

// earlierAttempts reads the task's column earlier_attempts.
func earlierAttempts(t *testing.T, tdb pgtest.DB, id int64) []task.Attempt {
	t.Helper()
	var raw []byte
	if err := tdb.Pool.QueryRow(context.Background(), `SELECT earlier_attempts FROM tasks WHERE id = $1`, id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var as []task.Attempt
	if err := json.Unmarshal(raw, &as); err != nil {
		t.Fatalf("earlier_attempts %s: %v", raw, err)
	}
	return as
}

// checkAttempts compares the processor, fence and outcome of each attempt
// with want's, and checks each attempt's times are in order: started,
// then ended; a lapsed one ended at or after its expiry, any other before.
func checkAttempts(t *testing.T, got, want []task.Attempt) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("earlier attempts %+v; want %d", got, len(want))
	}
	for i, a := range got {
		if a.Processor != want[i].Processor || a.Fence != want[i].Fence || a.Outcome != want[i].Outcome {
			t.Errorf("attempt %d: %+v; want processor %s, fence %d, %s", i, a, want[i].Processor, want[i].Fence, want[i].Outcome)
		}
		lapsed := a.Outcome == task.OutcomeExpired
		if a.StartedAt.IsZero() || a.EndedAt.Before(a.StartedAt) || lapsed == a.EndedAt.Before(a.ExpiresAt) {
			t.Errorf("attempt %d: started %v, expires %v, ended %v (%s): out of order", i, a.StartedAt, a.ExpiresAt, a.EndedAt, a.Outcome)
		}
	}
}

// TestRequeueLapsed: the reaper's statement puts a task whose lease lapsed
// back to pending (first in line, its attempt recorded), or dead when it
// has used its attempts, and leaves live leases alone.
func TestRequeueLapsed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{
		{TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`), MaxAttempts: 1}, {TaskData: json.RawMessage(`{}`)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a", "b", "c"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	if none, err := s.RequeueLapsed(ctx, 10); err != nil || len(none) != 0 {
		t.Fatalf("requeued live leases: %+v, %v", none, err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET must_heartbeat_before = now() - interval '1 second' WHERE id = ANY($1)`,
		[]int64{ins[0].ID, ins[1].ID}); err != nil {
		t.Fatal(err)
	}
	lapsed, err := s.RequeueLapsed(ctx, 10)
	if err != nil || len(lapsed) != 2 {
		t.Fatalf("requeue lapsed: %+v, %v; want tasks %d and %d", lapsed, err, ins[0].ID, ins[1].ID)
	}
	states := map[int64]string{}
	for _, l := range lapsed {
		states[l.Task.ID] = l.Task.State
		if l.Lag < time.Second {
			t.Errorf("task %d announced %v after its lease ran out; it ran out over a second before", l.Task.ID, l.Lag)
		}
		if l.Task.MustHeartbeatBefore != nil {
			t.Errorf("task %d still has a lease: %v", l.Task.ID, l.Task.MustHeartbeatBefore)
		}
	}
	if states[ins[0].ID] != task.StatePending || states[ins[1].ID] != task.StateDead {
		t.Fatalf("states after the lapse: %v; want %d pending, %d dead", states, ins[0].ID, ins[1].ID)
	}
	for i, id := range []int64{ins[0].ID, ins[1].ID} {
		checkAttempts(t, earlierAttempts(t, tdb, id), []task.Attempt{{Processor: claimed[i].Processor, Fence: claimed[i].Fence, Outcome: task.OutcomeExpired}})
	}
	if got, err := s.Get(ctx, ins[2].ID); err != nil || got.State != task.StateRunning {
		t.Fatalf("the live task: %+v, %v; want it running", got, err)
	}
	again, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"d"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(again) != 1 || again[0].ID != ins[0].ID || again[0].Attempts != 2 || again[0].Fence <= claimed[0].Fence {
		t.Fatalf("claim after the requeue: %+v, %v; want task %d, second attempt, a greater fence", again, err, ins[0].ID)
	}
}

// TestFailAndRequeueRecordTheAttempt: a failed attempt and one handed back
// are recorded with their outcome, released when they ended.
func TestFailAndRequeueRecordTheAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}}))
	if err != nil {
		t.Fatal(err)
	}
	c1, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(c1) != 1 {
		t.Fatalf("claim: %+v, %v", c1, err)
	}
	if _, err := s.Requeue(ctx, ins[0].ID, "a", c1[0].Fence, "shutting down"); err != nil {
		t.Fatal(err)
	}
	c2, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"b"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(c2) != 1 {
		t.Fatalf("claim after the hand-back: %+v, %v", c2, err)
	}
	if _, err := s.Fail(ctx, ins[0].ID, "b", c2[0].Fence, "boom", -1); err != nil {
		t.Fatal(err)
	}
	checkAttempts(t, earlierAttempts(t, tdb, ins[0].ID), []task.Attempt{
		{Processor: "a", Fence: c1[0].Fence, Outcome: task.OutcomeRequeued},
		{Processor: "b", Fence: c2[0].Fence, Outcome: task.OutcomeFailed},
	})
}

func TestFailBackoffAndDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 2}}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	failed, err := s.Fail(ctx, c[0].ID, "a", c[0].Fence, "boom", -1)
	if err != nil || failed.State != task.StatePending || !failed.ScheduledAt.After(ins[0].ScheduledAt) || failed.LastError != "boom" {
		t.Fatalf("fail: %+v %v", failed, err)
	}
	if again, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: true}); err != nil || len(again) != 0 {
		t.Fatalf("claimed during its backoff: %+v, %v", again, err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET scheduled_at = now() WHERE id = $1`, c[0].ID); err != nil {
		t.Fatal(err)
	}
	c2, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(c2) != 1 {
		t.Fatalf("second claim: %v, %v", c2, err)
	}
	dead, err := s.Fail(ctx, c2[0].ID, "a", c2[0].Fence, "boom again", -1)
	if err != nil || dead.State != task.StateDead || dead.ProcessedAt == nil {
		t.Fatalf("last fail: %+v %v", dead, err)
	}
}

func TestRunningAndDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	if _, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 1}, {TaskData: json.RawMessage(`{}`)}})); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a", "b"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	if _, err := s.Fail(ctx, claimed[0].ID, claimed[0].Processor, claimed[0].Fence, "poison", -1); err != nil {
		t.Fatal(err)
	}
	running, err := s.Running(ctx, 10)
	if err != nil || len(running) != 1 || running[0].ID != claimed[1].ID {
		t.Fatalf("Running = %+v, %v; want task %d", running, err, claimed[1].ID)
	}
	dead, err := s.Dead(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != claimed[0].ID || dead[0].LastError != "poison" {
		t.Fatalf("Dead = %+v, %v; want task %d with its error", dead, err, claimed[0].ID)
	}
}

// TestCompleteMany: one statement completes the tasks whose compare-and-set
// holds and leaves the others alone, each judged on its own.
func TestCompleteMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	data := make([]taskstore.NewTask, 5)
	for i := range data {
		data[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`)}
	}
	if _, err := taskstore.TasksOf(s.Insert(ctx, data)); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/w1", "r/w2", "r/w3", "r/w4", "r/w5"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 5 {
		t.Fatalf("claim: %d tasks, %v", len(claimed), err)
	}
	c := func(i int) taskstore.Completion {
		return taskstore.Completion{ID: claimed[i].ID, Processor: claimed[i].Processor, Fence: claimed[i].Fence,
			Output: json.RawMessage(`{"i":` + string(rune('0'+i)) + `}`)}
	}
	// 0 completed already; 1 right; 2 with a stale fence; 3 by another processor; 4 right, no output.
	if _, err := s.Complete(ctx, claimed[0].ID, claimed[0].Processor, claimed[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	stale, other, noOutput := c(2), c(3), c(4)
	stale.Fence--
	other.Processor = "r/w9"
	noOutput.Output = nil
	done, err := s.CompleteMany(ctx, []taskstore.Completion{c(0), c(1), stale, other, noOutput})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 2 || !done[claimed[1].ID] || !done[claimed[4].ID] {
		t.Fatalf("completed %v; want exactly tasks %d and %d", done, claimed[1].ID, claimed[4].ID)
	}
	for i, want := range map[int]string{1: `{"i": 1}`, 4: `null`} {
		got, err := s.Get(ctx, claimed[i].ID)
		if err != nil || got.State != task.StateDone || string(got.TaskOutput) != want {
			t.Errorf("task %d after the batch: %+v (output %s), %v; want done with output %s", claimed[i].ID, got, got.TaskOutput, err, want)
		}
	}
	for _, i := range []int{2, 3} {
		if got, err := s.Get(ctx, claimed[i].ID); err != nil || got.State != task.StateRunning {
			t.Errorf("task %d refused by the batch: %+v, %v; want it still running", claimed[i].ID, got, err)
		}
	}
	// The completed ones' leases ended with the completion: no heartbeat is
	// accepted after it.
	for _, i := range []int{1, 4} {
		if _, err := s.Heartbeat(ctx, claimed[i].ID, claimed[i].Processor, claimed[i].Fence); !errors.Is(err, task.ErrLeaseLost) {
			t.Errorf("heartbeat of task %d after its batch completion: %v; want ErrLeaseLost", claimed[i].ID, err)
		}
	}
}

// TestClaimWalksThePendingIndexInOrder: on a table never analysed (the
// planner expects a few pending rows: a new queue that just got a burst),
// a claim still reads the pending index in order and stops after the
// tasks it takes, instead of fetching every due task to sort them
// (schema/0010).
func TestClaimWalksThePendingIndexInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	const burst, take = 5000, 10
	if _, err := tdb.Pool.Exec(ctx, `INSERT INTO tasks (task_data) SELECT '{}' FROM generate_series(1, $1)`, burst); err != nil {
		t.Fatal(err)
	}
	tx, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a measurement: nothing to keep
	// The index entries this session's scans read: a counter of its own,
	// not yet flushed to the shared statistics, so the difference across
	// the claim is the claim's.
	returned := func() int64 {
		t.Helper()
		var n int64
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_returned('tasks_claim_idx'::regclass)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	workers := make([]string, take)
	for i := range workers {
		workers[i] = fmt.Sprintf("w%d", i)
	}
	before := returned()
	claimed, err := db.New(tx).TaskClaim(ctx, db.TaskClaimParams{Processors: workers, TTLSeconds: 30, WithLapsed: true})
	if err != nil || len(claimed) != take {
		t.Fatalf("claim: %d tasks, %v; want %d", len(claimed), err, take)
	}
	read := returned() - before
	for i, c := range claimed {
		if c.ID != int64(i+1) {
			t.Fatalf("claim %d took task %d; want the oldest first", i, c.ID)
		}
	}
	if read > 2*take {
		t.Errorf("the claim of %d tasks read %d entries of the pending index (%d pending); want it to stop after those it takes", take, read, burst)
	}
}

// TestClaimPendingLeavesLapsedTasks: the busy dispatcher's claim takes due
// pending tasks only; a running task whose lease lapsed waits for the
// reaper's requeue, or for a full Claim.
func TestClaimPendingLeavesLapsedTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	if _, err := taskstore.TasksOf(s.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}})); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a"}, TTL: 30 * time.Second, WithLapsed: false})
	if err != nil || len(first) != 1 {
		t.Fatalf("claim of the pending task: %+v, %v", first, err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET must_heartbeat_before = now() WHERE id = $1`, first[0].ID); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"b"}, TTL: 30 * time.Second, WithLapsed: false}); err != nil || len(got) != 0 {
		t.Fatalf("a claim without lapsed tasks took %+v, %v; want nothing: the task is running, its lease lapsed", got, err)
	}
	got, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"c"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(got) != 1 || got[0].ID != first[0].ID || got[0].Attempts != 2 {
		t.Fatalf("Claim: %+v, %v; want the lapsed task, second attempt", got, err)
	}
}

// TestCompleteAndClaim: one statement records the completions, each under
// its own compare-and-set, and claims a due pending task for each worker
// named; with nothing left to claim the completions still come back.
func TestCompleteAndClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	data := make([]taskstore.NewTask, 3)
	for i := range data {
		data[i] = taskstore.NewTask{TaskData: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	if _, err := taskstore.TasksOf(s.Insert(ctx, data)); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"a", "b"}, TTL: 30 * time.Second, WithLapsed: false})
	if err != nil || len(first) != 2 {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	stale := taskstore.Completion{ID: first[1].ID, Processor: "b", Fence: first[1].Fence - 1}
	done, claimed, err := s.CompleteAndClaim(ctx,
		[]taskstore.Completion{{ID: first[0].ID, Processor: "a", Fence: first[0].Fence, Output: json.RawMessage(`{"ok":1}`)}, stale},
		taskstore.ClaimParams{Processors: []string{"a", "b"}, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || !done[first[0].ID] {
		t.Fatalf("completed %v; want only task %d (the other's fence is stale)", done, first[0].ID)
	}
	if len(claimed) != 1 || claimed[0].ID != first[1].ID+1 || claimed[0].Processor != "a" ||
		claimed[0].State != task.StateRunning || claimed[0].Fence <= first[1].Fence || claimed[0].Attempts != 1 {
		t.Fatalf("claimed %+v; want the one task left, for a, running under a new fence", claimed)
	}
	got, err := s.Get(ctx, claimed[0].ID)
	if err != nil || got.State != task.StateRunning || got.Fence != claimed[0].Fence || !got.MustHeartbeatBefore.Equal(*claimed[0].MustHeartbeatBefore) {
		t.Fatalf("the claimed task as stored: %+v, %v; want it as returned", got, err)
	}
	if string(claimed[0].TaskData) != `{"i": 2}` {
		t.Errorf("claimed task data %s", claimed[0].TaskData)
	}
	// Nothing left to claim: the completions come back all the same.
	done, claimed, err = s.CompleteAndClaim(ctx,
		[]taskstore.Completion{{ID: first[1].ID, Processor: "b", Fence: first[1].Fence}}, taskstore.ClaimParams{Processors: []string{"b"}, TTL: 30 * time.Second})
	if err != nil || len(done) != 1 || !done[first[1].ID] || len(claimed) != 0 {
		t.Fatalf("complete with nothing to claim: %v, %+v, %v; want task %d completed, nothing claimed", done, claimed, err, first[1].ID)
	}
}
