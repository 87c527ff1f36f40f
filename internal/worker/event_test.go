package worker_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/worker"
)

// TestEventsCarryWhatMetricsNeed: a claim says how long its task waited,
// from the later of its insert and its schedule to the claim, by the
// database's own timestamps; a write says the state it left the task in;
// a refused heartbeat is an event of its own before the lease is lost.
func TestEventsCarryWhatMetricsNeed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.startPool("m", 4, 3*time.Second, nil)

	insert := func(data string, scheduled time.Time, maxAttempts int32) task.Task {
		t.Helper()
		ts, err := taskstore.TasksOf(e.tasks.Insert(e.ctx, []taskstore.NewTask{{TaskData: json.RawMessage(data), ScheduledAt: scheduled, MaxAttempts: maxAttempts}}))
		if err != nil {
			t.Fatal(err)
		}
		return ts[0]
	}
	late := insert(sleepTask(0), time.Now().Add(-time.Hour), 0)            // due before its insert: waits from the insert
	early := insert(sleepTask(0), time.Now().Add(300*time.Millisecond), 0) // due after its insert: waits from its schedule
	dead := insert(`{"no": "sleep"}`, time.Time{}, 1)                      // fails with no attempt left
	retried := insert(`{"no": "sleep"}`, time.Time{}, 2)                   // fails with a retry due
	stolen := insert(sleepTask(60), time.Time{}, 0)                        // its lease is taken from its worker

	for _, tk := range []task.Task{late, early} {
		claimed, _ := r.events.waitFor(t, "the claim", 0, isTask(worker.EventClaimed, tk.ID))
		r.events.waitFor(t, "the completion", 0, isTask(worker.EventCompleted, tk.ID))
		got := e.get(tk.ID)
		ready := got.CreatedAt
		if got.ScheduledAt.After(ready) {
			ready = got.ScheduledAt
		}
		if want := got.StartedAt.Sub(ready); claimed.Waited != want {
			t.Errorf("task %d (created %s, scheduled %s, claimed %s): waited %s, want %s",
				tk.ID, got.CreatedAt, got.ScheduledAt, got.StartedAt, claimed.Waited, want)
		}
	}
	if done, _ := r.events.waitFor(t, "a completion", 0, isTask(worker.EventCompleted, late.ID)); done.State != task.StateDone {
		t.Errorf("completed: state %q, want %q", done.State, task.StateDone)
	}
	for tk, want := range map[int64]string{dead.ID: task.StateDead, retried.ID: task.StatePending} {
		if failed, _ := r.events.waitFor(t, "the failure", 0, isTask(worker.EventFailed, tk)); failed.State != want {
			t.Errorf("task %d failed: state %q, want %q", tk, failed.State, want)
		}
	}

	claimed, _ := r.events.waitFor(t, "the claim", 0, isTask(worker.EventClaimed, stolen.ID))
	if _, err := e.db.Pool.Exec(e.ctx, `UPDATE tasks SET must_heartbeat_before = now() WHERE id = $1 AND fence = $2`,
		stolen.ID, claimed.Fence); err != nil {
		t.Fatal(err)
	}
	refused, i := r.events.waitFor(t, "the refused heartbeat", 0, isTask(worker.EventHeartbeatFailed, stolen.ID))
	if !errors.Is(refused.Err, task.ErrLeaseLost) || refused.Fence != claimed.Fence {
		t.Errorf("heartbeat failed: %+v; want the refusal (%v) of fence %d", refused, task.ErrLeaseLost, claimed.Fence)
	}
	r.events.waitFor(t, "the lease loss after the refused heartbeat", i, isTask(worker.EventLeaseLost, stolen.ID))
}
