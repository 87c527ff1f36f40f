package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lease"
	"github.com/leasehold/leasehold/internal/pgtest"
	"github.com/leasehold/leasehold/internal/task"
)

func TestClaimHeartbeatComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	ins, err := s.Insert(ctx, []task.NewTask{{TaskData: json.RawMessage(`{"n":1}`)}, {TaskData: json.RawMessage(`{"n":2}`)}})
	if err != nil || len(ins) != 2 {
		t.Fatalf("insert: %v, %v", ins, err)
	}
	claimed, err := s.Claim(ctx, []string{"r/w1", "r/w2", "r/w3"}, 30*time.Second)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %+v, %v; want both tasks", claimed, err)
	}
	a := claimed[0]
	if a.State != task.StateRunning || a.Fence == nil || a.Attempts != 1 || a.Processor == nil {
		t.Fatalf("claimed task: %+v", a)
	}
	l, err := lease.NewStore(tdb.Pool).List(ctx, lease.ListParams{Filter: "active", Prefix: "task:", Limit: 10})
	if err != nil || len(l) != 2 {
		t.Fatalf("task leases: %+v, %v; want 2 active", l, err)
	}
	if _, err := s.Heartbeat(ctx, a.ID, "someone-else", 0); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat by another processor: %v", err)
	}
	if _, err := s.Heartbeat(ctx, a.ID, *a.Processor, *a.Fence+1); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat with another fence: %v", err)
	}
	if _, err := s.Heartbeat(ctx, 999999, *a.Processor, 0); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("heartbeat of an unknown task: %v", err)
	}
	hb, err := s.Heartbeat(ctx, a.ID, *a.Processor, *a.Fence)
	if err != nil || !hb.MustHeartbeatBefore.After(*a.MustHeartbeatBefore) {
		t.Fatalf("heartbeat: %+v, %v", hb, err)
	}
	done, err := s.Complete(ctx, a.ID, *a.Processor, *a.Fence, json.RawMessage(`{"ok":true}`))
	if err != nil || done.State != task.StateDone || string(done.TaskOutput) != `{"ok": true}` {
		t.Fatalf("complete: %+v (%s), %v", done, done.TaskOutput, err)
	}
	if _, err := s.Complete(ctx, a.ID, *a.Processor, *a.Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("second complete: %v, want ErrLeaseLost", err)
	}
}

func TestLapsedTaskIsReclaimedThenDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	ins, err := s.Insert(ctx, []task.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	id := ins[0].ID
	lapse := func() {
		t.Helper()
		if _, err := tdb.Pool.Exec(ctx, `UPDATE leases SET expires_at = now() WHERE resource = $1`, task.LeaseResource(id)); err != nil {
			t.Fatal(err)
		}
		if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET must_heartbeat_before = now() WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.Claim(ctx, []string{"a"}, 30*time.Second)
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	lapse()
	second, err := s.Claim(ctx, []string{"b"}, 30*time.Second)
	if err != nil || len(second) != 1 || second[0].Attempts != 2 || *second[0].Fence <= *first[0].Fence {
		t.Fatalf("second claim: %+v %v", second, err)
	}
	if _, err := s.Complete(ctx, id, "a", *first[0].Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("stale complete by the first worker: %v, want ErrLeaseLost", err)
	}
	lapse()
	none, err := s.Claim(ctx, []string{"c"}, 30*time.Second)
	if err != nil || len(none) != 0 {
		t.Fatalf("claim after the last attempt lapsed: %+v %v; want nothing", none, err)
	}
	got, _ := s.Get(ctx, id)
	if got.State != task.StateDead || got.LastError == nil {
		t.Fatalf("task after its last attempt lapsed: %+v", got)
	}
}

func TestFailBackoffAndDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	ins, err := s.Insert(ctx, []task.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, []string{"a"}, 30*time.Second)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	failed, err := s.Fail(ctx, c[0].ID, "a", *c[0].Fence, "boom")
	if err != nil || failed.State != task.StatePending || !failed.ScheduledAt.After(ins[0].ScheduledAt) || *failed.LastError != "boom" {
		t.Fatalf("fail: %+v %v", failed, err)
	}
	if again, err := s.Claim(ctx, []string{"a"}, 30*time.Second); err != nil || len(again) != 0 {
		t.Fatalf("claimed during its backoff: %+v, %v", again, err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET scheduled_at = now() WHERE id = $1`, c[0].ID); err != nil {
		t.Fatal(err)
	}
	c2, err := s.Claim(ctx, []string{"a"}, 30*time.Second)
	if err != nil || len(c2) != 1 {
		t.Fatalf("second claim: %v, %v", c2, err)
	}
	dead, err := s.Fail(ctx, c2[0].ID, "a", *c2[0].Fence, "boom again")
	if err != nil || dead.State != task.StateDead || dead.ProcessedAt == nil {
		t.Fatalf("last fail: %+v %v", dead, err)
	}
}

func TestRunningAndDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	if _, err := s.Insert(ctx, []task.NewTask{{TaskData: json.RawMessage(`{}`), MaxAttempts: 1}, {TaskData: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Claim(ctx, []string{"a", "b"}, 30*time.Second)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	if _, err := s.Fail(ctx, claimed[0].ID, *claimed[0].Processor, *claimed[0].Fence, "poison"); err != nil {
		t.Fatal(err)
	}
	running, err := s.Running(ctx, 10)
	if err != nil || len(running) != 1 || running[0].ID != claimed[1].ID {
		t.Fatalf("Running = %+v, %v; want task %d", running, err, claimed[1].ID)
	}
	dead, err := s.Dead(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != claimed[0].ID || *dead[0].LastError != "poison" {
		t.Fatalf("Dead = %+v, %v; want task %d with its error", dead, err, claimed[0].ID)
	}
}

// TestCompleteMany: one statement completes the tasks whose compare-and-set
// holds and leaves the others alone, each judged on its own.
func TestCompleteMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	data := make([]task.NewTask, 5)
	for i := range data {
		data[i] = task.NewTask{TaskData: json.RawMessage(`{}`)}
	}
	if _, err := s.Insert(ctx, data); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Claim(ctx, []string{"r/w1", "r/w2", "r/w3", "r/w4", "r/w5"}, 30*time.Second)
	if err != nil || len(claimed) != 5 {
		t.Fatalf("claim: %d tasks, %v", len(claimed), err)
	}
	c := func(i int) task.Completion {
		return task.Completion{ID: claimed[i].ID, Processor: *claimed[i].Processor, Fence: *claimed[i].Fence,
			Output: json.RawMessage(`{"i":` + string(rune('0'+i)) + `}`)}
	}
	// 0 completed already; 1 right; 2 with a stale fence; 3 by another processor; 4 right, no output.
	if _, err := s.Complete(ctx, claimed[0].ID, *claimed[0].Processor, *claimed[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	stale, other, noOutput := c(2), c(3), c(4)
	stale.Fence--
	other.Processor = "r/w9"
	noOutput.Output = nil
	done, err := s.CompleteMany(ctx, []task.Completion{c(0), c(1), stale, other, noOutput})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 2 || done[claimed[1].ID].State != task.StateDone || done[claimed[4].ID].State != task.StateDone {
		t.Fatalf("completed %+v; want exactly tasks %d and %d", done, claimed[1].ID, claimed[4].ID)
	}
	if got := string(done[claimed[1].ID].TaskOutput); got != `{"i": 1}` {
		t.Errorf("task %d output %s", claimed[1].ID, got)
	}
	for _, i := range []int{2, 3} {
		if got, err := s.Get(ctx, claimed[i].ID); err != nil || got.State != task.StateRunning {
			t.Errorf("task %d refused by the batch: %+v, %v; want it still running", claimed[i].ID, got, err)
		}
	}
	// Its lease released in the same statement, at the completion's time.
	l, err := lease.NewStore(tdb.Pool).List(ctx, lease.ListParams{Filter: "active", Prefix: "task:", Limit: 10})
	if err != nil || len(l) != 2 {
		t.Fatalf("task leases still active: %+v, %v; want the 2 refused ones", l, err)
	}
}
