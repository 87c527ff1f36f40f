package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestHeldLeasesFree checks the SIGTERM measurement's reads on real leases and tasks: which
// leases a replica's current process holds, its task leases among them, and when each one
// became free, by each way a task's lease ends (completed, handed back, failed, lapsed
// while still the task's, lapsed and put back by a reaper).
func TestHeldLeasesFree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := &soak{pool: tdb.Pool}
	leases := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	data := json.RawMessage(`{"sleep_duration_seconds": 0}`)

	inserted, err := taskstore.TasksOf(tasks.Insert(ctx, slices.Repeat([]taskstore.NewTask{{TaskData: data}}, 7)))
	if err != nil {
		t.Fatal(err)
	}
	// A task of an earlier process of replica-a: not the current one's.
	if _, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-a/w0"}, TTL: time.Minute, WithLapsed: true}); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: "replica-a"}
	if err := tdb.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&r.started); err != nil {
		t.Fatal(err)
	}
	acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "res:r", Holder: "replica-a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "res:b", Holder: "replica-b", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-a/w1", "replica-a/w2", "replica-a/w3", "replica-a/w4", "replica-a/w5", "replica-b/w1"}, TTL: time.Minute, WithLapsed: true})
	if err != nil || len(claimed) != 6 {
		t.Fatalf("claimed %d tasks (%v), want 6", len(claimed), err)
	}
	// By id, the processors' order: the oldest due task goes to the first named.
	slices.SortFunc(claimed, func(a, b task.Task) int { return cmp.Compare(a.ID, b.ID) })
	if p := claimed[5].Processor; p != "replica-b/w1" {
		t.Fatalf("the last task claimed went to %s, want replica-b/w1", p)
	}
	done, requeued, failed, lapsed, putBack := claimed[0], claimed[1], claimed[2], claimed[3], claimed[4]

	at, held, err := s.heldBy(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	want := []heldLease{{resource: "res:r", fence: acq.Lease.Fence}}
	for _, c := range claimed[:5] {
		want = append(want, heldLease{resource: taskstore.LeaseResource(c.ID), task: c.ID, fence: c.Fence})
	}
	if !slices.Equal(held, want) || at.Before(r.started) {
		t.Fatalf("held at %v: %v; want %v after %v", at, held, want, r.started)
	}
	if held[1].task != inserted[1].ID {
		t.Errorf("the first task held is %d, want %d (task %d is the earlier process's)", held[1].task, inserted[1].ID, inserted[0].ID)
	}

	free := func() map[string]leaseEnd {
		t.Helper()
		ends := map[string]leaseEnd{}
		if err := s.addFree(ctx, held, ends); err != nil {
			t.Fatal(err)
		}
		return ends
	}
	if ends := free(); len(ends) != 0 {
		t.Fatalf("live leases found free: %v", ends)
	}

	released, err := leases.Release(ctx, lease.ReleaseParams{Resource: "res:r", Holder: "replica-a", Fence: acq.Lease.Fence})
	if err != nil {
		t.Fatal(err)
	}
	completed, err := tasks.Complete(ctx, done.ID, done.Processor, done.Fence, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Requeue(ctx, requeued.ID, requeued.Processor, requeued.Fence, "shutting down"); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Fail(ctx, failed.ID, failed.Processor, failed.Fence, "it broke", -1); err != nil {
		t.Fatal(err)
	}
	// Two leases lapse (forged, rather than waited for); a reaper's pass puts one back.
	lapse := func(id int64) time.Time {
		t.Helper()
		var expires time.Time
		if err := tdb.Pool.QueryRow(ctx, `
			UPDATE tasks SET must_heartbeat_before = clock_timestamp() - interval '1 millisecond'
			WHERE id = $1 RETURNING must_heartbeat_before`, id).Scan(&expires); err != nil {
			t.Fatal(err)
		}
		return expires
	}
	putBackExpiry := lapse(putBack.ID)
	if back, err := tasks.RequeueLapsed(ctx, 10); err != nil || len(back) != 1 || back[0].Task.ID != putBack.ID {
		t.Fatalf("put back %v (%v), want task %d", back, err, putBack.ID)
	}
	lapsedExpiry := lapse(lapsed.ID)

	got := free()
	var requeuedTask, failedTask task.Task
	for id, into := range map[int64]*task.Task{requeued.ID: &requeuedTask, failed.ID: &failedTask} {
		if *into, err = tasks.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	ended := func(tk task.Task) time.Time {
		t.Helper()
		var a []task.Attempt
		if err := tdb.Pool.QueryRow(ctx, `SELECT earlier_attempts FROM tasks WHERE id = $1`, tk.ID).Scan(&a); err != nil || len(a) != 1 {
			t.Fatalf("task %d: earlier_attempts %v (%v), want one", tk.ID, a, err)
		}
		return a[0].EndedAt
	}
	wantEnds := map[string]leaseEnd{
		"res:r":                              {at: *released.ReleasedAt, released: true},
		taskstore.LeaseResource(done.ID):     {at: *completed.ProcessedAt, released: true},
		taskstore.LeaseResource(requeued.ID): {at: ended(requeuedTask), released: true},
		taskstore.LeaseResource(failed.ID):   {at: ended(failedTask), released: true},
		taskstore.LeaseResource(lapsed.ID):   {at: lapsedExpiry},
		taskstore.LeaseResource(putBack.ID):  {at: putBackExpiry},
	}
	if !maps.EqualFunc(got, wantEnds, func(a, b leaseEnd) bool { return a.at.Equal(b.at) && a.released == b.released }) {
		t.Errorf("ends:\n got %s\nwant %s", showEnds(got), showEnds(wantEnds))
	}
}

// showEnds formats ends for a failure message, by lease.
func showEnds(ends map[string]leaseEnd) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(ends)) {
		e := ends[name]
		fmt.Fprintf(&b, "%s: at %s released %v; ", name, e.at.UTC().Format(time.RFC3339Nano), e.released)
	}
	return b.String()
}
