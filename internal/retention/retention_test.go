package retention_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/retention"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// week is the default retention; rows "8 days old" are past it.
const week = retention.DefaultAge

// owner runs test setup as the tables' owner: it stands in for time passing.
func owner(t *testing.T, tdb pgtest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := tdb.Pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func ids(t *testing.T, tdb pgtest.DB, sql string) []int64 {
	t.Helper()
	rows, err := tdb.Pool.Query(t.Context(), sql)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func strs(t *testing.T, tdb pgtest.DB, sql string) []string {
	t.Helper()
	rows, err := tdb.Pool.Query(t.Context(), sql)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func data(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)) }

// legacyLease writes the lease row task:<id> a task had before its lease
// moved into its row (schema/0009): a database upgraded from before that
// still has them, and they go with their tasks. The row is released
// unless live is set.
func legacyLease(t *testing.T, leases *leasestore.Store, id int64, live bool) {
	t.Helper()
	ctx := t.Context()
	p := lease.AcquireParams{Resource: taskstore.LeaseResource(id), Holder: "w/1", TTL: time.Minute}
	if acq, err := leases.Acquire(ctx, p); err != nil || !acq.New {
		t.Fatalf("acquire %s: %+v, %v", p.Resource, acq, err)
	}
	if live {
		return
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: p.Resource, Holder: p.Holder}); err != nil {
		t.Fatalf("release %s: %v", p.Resource, err)
	}
}

// TestPruneTasks: tasks that ended (done or dead) more than the age ago
// are deleted, with their lease rows where they have one (from before
// schema/0009); a task that ended recently, pending and running tasks
// however old (even with a processed_at set), and finished tasks whose
// lease row is live again or whose expiry is not announced yet, are kept,
// and handed back as kept.
func TestPruneTasks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	leases := leasestore.NewStore(tdb.Pool)

	// One task at a time, so that each claim takes the one just inserted.
	run := func(maxAttempts int32) task.Task {
		t.Helper()
		ins, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data(1), MaxAttempts: maxAttempts}}))
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w/1"}, TTL: time.Minute, WithLapsed: true})
		if err != nil || len(claimed) != 1 || claimed[0].ID != ins[0].ID {
			t.Fatalf("claim: %+v, %v; want task %d", claimed, err, ins[0].ID)
		}
		return claimed[0]
	}
	complete := func(tk task.Task) int64 {
		t.Helper()
		if _, err := tasks.Complete(ctx, tk.ID, "w/1", tk.Fence, json.RawMessage(`{"ok":true}`)); err != nil {
			t.Fatal(err)
		}
		return tk.ID
	}
	oldDone := complete(run(5))
	legacyDone := complete(run(5)) // with a lease row, released
	newDone := complete(run(5))
	dying := run(1)
	if got, err := tasks.Fail(ctx, dying.ID, "w/1", dying.Fence, "boom", -1); err != nil || got.State != "dead" {
		t.Fatalf("fail the last attempt: %+v, %v; want dead", got, err)
	}
	oldDead := dying.ID
	// Its last attempt's lease lapses: the reaper declares it dead.
	lapsedDead := run(1).ID
	owner(t, tdb, `UPDATE tasks SET must_heartbeat_before = now() - interval '1 second', started_at = now() - interval '2 seconds' WHERE id = $1`, lapsedDead)
	if got, err := tasks.RequeueLapsed(ctx, 100); err != nil || len(got) != 1 || got[0].Task.ID != lapsedDead || got[0].Task.State != task.StateDead {
		t.Fatalf("requeue lapsed tasks: %+v, %v; want task %d dead", got, err, lapsedDead)
	}
	legacyLapsed := run(1).ID   // dead, with a lease row whose expiry is not announced
	retaken := complete(run(5)) // with a lease row someone took over
	running := run(5).ID
	ins, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data(2), ScheduledAt: time.Now().Add(-30 * 24 * time.Hour)}}))
	if err != nil {
		t.Fatal(err)
	}
	pending := ins[0].ID
	legacyLease(t, leases, legacyDone, false)
	legacyLease(t, leases, legacyLapsed, true)
	legacyLease(t, leases, retaken, false)

	// A month passes: everything was created thirty days ago, and all but
	// newDone ended, or says so, eight days ago, and so did the lease rows.
	owner(t, tdb, `UPDATE tasks SET created_at = now() - interval '30 days'`)
	owner(t, tdb, `UPDATE tasks SET processed_at = now() - interval '8 days' WHERE id <> $1`, newDone)
	owner(t, tdb, `UPDATE leases SET created_at = now() - interval '30 days',
		released_at = CASE WHEN released_at IS NOT NULL THEN now() - interval '8 days' END,
		expires_at = now() - interval '8 days'`)
	owner(t, tdb, `UPDATE tasks SET state = 'dead', must_heartbeat_before = now() - interval '8 days' WHERE id = $1`, legacyLapsed)
	// Someone took retaken's lease row over since, through the lease API.
	if acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: taskstore.LeaseResource(retaken), Holder: "someone", TTL: time.Hour}); err != nil || !acq.New {
		t.Fatalf("take over %s: %+v, %v", taskstore.LeaseResource(retaken), acq, err)
	}

	store := retention.NewStore(tdb.Pool)
	got, err := store.PruneTasks(ctx, week, 1000, 0)
	kept := []int64{newDone, legacyLapsed, retaken, running, pending}
	slices.Sort(kept)
	if err != nil || got.Pruned != 4 || got.Leases != 1 || !got.Done || got.LastID != pending || !slices.Equal(got.Kept, kept) {
		t.Fatalf("prune tasks: %+v, %v; want 4 tasks (the old done and dead ones) and the 1 lease row among them, done at %d, kept %v",
			got, err, pending, kept)
	}
	if left := ids(t, tdb, `SELECT id FROM tasks ORDER BY id`); !slices.Equal(left, kept) {
		t.Errorf("tasks left: %v, want %v (pruned %d and %d done, %d and %d dead)", left, kept, oldDone, legacyDone, oldDead, lapsedDead)
	}
	wantLeases := []string{taskstore.LeaseResource(legacyLapsed), taskstore.LeaseResource(retaken)}
	slices.Sort(wantLeases)
	if left := strs(t, tdb, `SELECT resource FROM leases ORDER BY resource`); !slices.Equal(left, wantLeases) {
		t.Errorf("lease rows left: %q, want %q", left, wantLeases)
	}

	// Looked at again by id: still kept, until the lapsed lease's expiry
	// is announced and has been for the age.
	if got, err := store.PruneTaskIDs(ctx, week, kept); err != nil || got.Pruned != 0 || !slices.Equal(got.Kept, kept) {
		t.Errorf("prune the kept tasks again: %+v, %v; want nothing pruned, all kept", got, err)
	}
	if marked, err := leases.MarkExpired(ctx, 100); err != nil || len(marked) != 1 || marked[0].Lease.Resource != taskstore.LeaseResource(legacyLapsed) {
		t.Fatalf("mark expired: %+v, %v; want %s", marked, err, taskstore.LeaseResource(legacyLapsed))
	}
	if got, err := store.PruneTaskIDs(ctx, week, []int64{legacyLapsed}); err != nil || got.Pruned != 0 {
		t.Errorf("prune the lapsed task just announced: %+v, %v; want it kept", got, err)
	}
	owner(t, tdb, `UPDATE leases SET expired_at = now() - interval '8 days' WHERE resource = $1`, taskstore.LeaseResource(legacyLapsed))
	if got, err := store.PruneTaskIDs(ctx, week, []int64{legacyLapsed}); err != nil || got.Pruned != 1 || got.Leases != 1 || len(got.Kept) != 0 {
		t.Errorf("prune the lapsed task announced long ago: %+v, %v; want it and its lease row", got, err)
	}

	// The running task is still the worker's to complete, and retaken's
	// lease row the holder's to renew.
	if _, err := tasks.Heartbeat(ctx, running, "w/1", 0); err != nil {
		t.Errorf("heartbeat of the running task after pruning: %v", err)
	}
	if _, err := leases.Renew(ctx, lease.RenewParams{Resource: taskstore.LeaseResource(retaken), Holder: "someone"}); err != nil {
		t.Errorf("renew the lease taken over after pruning: %v", err)
	}
}

// TestPrunedTaskTakesItsLeaseRow: a task's lease row task:<id>, which only
// a database upgraded from before schema/0009 has, goes with the task,
// under the task retention, and never without it: lease pruning leaves it
// alone however long ago it ended. Its lease events are lease history.
func TestPrunedTaskTakesItsLeaseRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	leases := leasestore.NewStore(tdb.Pool)
	ins, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data(1)}}))
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w/1"}, TTL: time.Minute, WithLapsed: true})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	if _, err := tasks.Complete(ctx, ins[0].ID, "w/1", claimed[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	resource := taskstore.LeaseResource(ins[0].ID)
	legacyLease(t, leases, ins[0].ID, false)
	owner(t, tdb, `UPDATE tasks SET created_at = now() - interval '9 days', processed_at = now() - interval '8 days'`)
	owner(t, tdb, `UPDATE leases SET released_at = now() - interval '8 days', expires_at = now() - interval '8 days'`)
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := tdb.Pool.QueryRow(ctx, sql, resource).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	store := retention.NewStore(tdb.Pool)
	if n, err := store.PruneLeases(ctx, week, 1000); err != nil || n != 0 {
		t.Errorf("prune leases: %d, %v; want 0: the task's lease row is the task's", n, err)
	}
	if n := count(`SELECT count(*) FROM leases WHERE resource = $1`); n != 1 {
		t.Fatalf("lease rows of %s after lease pruning: %d, want 1", resource, n)
	}
	got, err := store.PruneTasks(ctx, week, 1000, 0)
	if err != nil || got.Pruned != 1 || got.Leases != 1 {
		t.Fatalf("prune tasks: %+v, %v; want the task and its lease row", got, err)
	}
	if n := count(`SELECT count(*) FROM leases WHERE resource = $1`); n != 0 {
		t.Errorf("lease rows of %s after its task was pruned: %d, want 0", resource, n)
	}
	if n := count(`SELECT count(*) FROM lease_events WHERE resource = $1`); n != 2 {
		t.Errorf("lease events of %s after its task was pruned: %d, want its 2 (acquired, released)", resource, n)
	}
}

// TestTaskLeasesStayOutOfTheEndedIndex: the one index retention adds is
// never written by a task: claims, heartbeats, completions and failures
// leave it empty, and so does a task's lease row (from before
// schema/0009) that ends; a lease of anything else that ends goes in.
func TestTaskLeasesStayOutOfTheEndedIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	size := func() int64 {
		t.Helper()
		var n int64
		if err := tdb.Pool.QueryRow(ctx, `SELECT pg_relation_size('leases_ended_idx')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	empty := size() // the metapage alone

	workers := make([]string, 50)
	batch := make([]taskstore.NewTask, len(workers))
	for i := range workers {
		workers[i] = fmt.Sprintf("w/%d", i)
		batch[i] = taskstore.NewTask{TaskData: data(i), MaxAttempts: 2}
	}
	for range 4 {
		if _, err := taskstore.TasksOf(tasks.Insert(ctx, batch)); err != nil {
			t.Fatal(err)
		}
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: workers, TTL: time.Minute, WithLapsed: true})
		if err != nil || len(claimed) != len(workers) {
			t.Fatalf("claim: %d tasks, %v", len(claimed), err)
		}
		cs := make([]taskstore.Completion, 0, len(claimed))
		for i, tk := range claimed {
			if _, err := tasks.Heartbeat(ctx, tk.ID, tk.Processor, tk.Fence); err != nil {
				t.Fatal(err)
			}
			if i%5 == 0 {
				if _, err := tasks.Fail(ctx, tk.ID, tk.Processor, tk.Fence, "boom", -1); err != nil {
					t.Fatal(err)
				}
				continue
			}
			cs = append(cs, taskstore.Completion{ID: tk.ID, Processor: tk.Processor, Fence: tk.Fence})
		}
		if _, err := tasks.CompleteMany(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	// A lease row task:<id> from before schema/0009 that ends stays out too.
	leases := leasestore.NewStore(tdb.Pool)
	legacyLease(t, leases, 1, false)
	if got := size(); got != empty {
		t.Errorf("leases_ended_idx after 200 tasks ran and a task's lease row ended: %d bytes, want %d (empty): a task lease was written to it", got, empty)
	}

	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "report:nightly", Holder: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "report:nightly", Holder: "h"}); err != nil {
		t.Fatal(err)
	}
	if got := size(); got <= empty {
		t.Errorf("leases_ended_idx after another lease ended: %d bytes, want more than %d", got, empty)
	}
}

// TestPruneLeaseEvents: events recorded more than the age ago are deleted,
// recent ones kept; the walk stops just before the first recent one, where
// the next walk goes on. The leases themselves are another matter.
func TestPruneLeaseEvents(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	for _, r := range []string{"old", "new"} {
		if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: r, Holder: "h", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Renew(ctx, lease.RenewParams{Resource: r, Holder: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "old", Holder: "h"}); err != nil {
		t.Fatal(err)
	}
	owner(t, tdb, `UPDATE lease_events SET at = at - interval '8 days' WHERE resource = 'old'`)

	firstNew := ids(t, tdb, `SELECT min(id) FROM lease_events WHERE resource = 'new'`)[0]
	store := retention.NewStore(tdb.Pool)
	got, err := store.PruneLeaseEvents(ctx, week, 1000, 0)
	if err != nil || got.Pruned != 3 || !got.Done || got.LastID != firstNew-1 {
		t.Fatalf("prune lease events: %+v, %v; want 3 (old's acquired, renewed, released), done just before event %d", got, err, firstNew)
	}
	if got := strs(t, tdb, `SELECT resource || ':' || kind FROM lease_events ORDER BY id`); !slices.Equal(got, []string{"new:acquired", "new:renewed"}) {
		t.Errorf("events left: %q, want new's two", got)
	}
	if again, err := store.PruneLeaseEvents(ctx, week, 1000, got.LastID); err != nil || again.Pruned != 0 || !again.Done || again.LastID != got.LastID {
		t.Errorf("the next walk: %+v, %v; want nothing pruned, still just before event %d", again, err, firstNew)
	}
	if got := strs(t, tdb, `SELECT resource FROM leases ORDER BY resource`); !slices.Equal(got, []string{"new", "old"}) {
		t.Errorf("leases: %q, want both kept by event pruning", got)
	}
}

// TestPruneLeases: the rows of leases released, or announced expired, more
// than the age ago are deleted; live leases (even very old, long-TTL ones,
// or old rows taken over since), recent ends, expiries not yet announced
// and tasks' leases (which go with their tasks) are kept. A pruned resource acquired again gets a greater
// fence than any before: fences come from one sequence.
func TestPruneLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	acquire := func(resource, holder string, ttl time.Duration) lease.Lease {
		t.Helper()
		acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: resource, Holder: holder, TTL: ttl})
		if err != nil || !acq.New {
			t.Fatalf("acquire %s: %+v, %v", resource, acq, err)
		}
		return acq.Lease
	}
	release := func(resource, holder string) {
		t.Helper()
		if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: resource, Holder: holder}); err != nil {
			t.Fatalf("release %s: %v", resource, err)
		}
	}

	released := acquire("released-old", "h", time.Minute)
	release("released-old", "h")
	acquire("released-new", "h", time.Minute)
	release("released-new", "h")
	acquire("expired-old", "h", time.Minute)
	acquire("expired-unannounced", "h", time.Minute)
	acquire("active-old", "h", time.Hour)
	acquire("retaken", "h", time.Minute)
	release("retaken", "h")
	acquire("task:123456", "h", time.Minute) // a task's lease row, from before schema/0009: it goes with its task
	release("task:123456", "h")

	// Eight days pass for all but the recent ones (owner's setup).
	owner(t, tdb, `UPDATE leases SET created_at = created_at - interval '30 days' WHERE resource <> 'released-new'`)
	owner(t, tdb, `UPDATE leases SET released_at = now() - interval '8 days', expires_at = now() - interval '8 days'
		WHERE resource IN ('released-old', 'retaken', 'task:123456')`)
	owner(t, tdb, `UPDATE leases SET expires_at = now() - interval '8 days' - interval '1 minute',
		expired_at = now() - interval '8 days' WHERE resource = 'expired-old'`)
	owner(t, tdb, `UPDATE leases SET expires_at = now() - interval '8 days' WHERE resource = 'expired-unannounced'`)
	// Taken over since: live again, its old end forgotten.
	retaken := acquire("retaken", "other", time.Minute)

	store := retention.NewStore(tdb.Pool)
	n, err := store.PruneLeases(ctx, week, 1000)
	if err != nil || n != 2 {
		t.Fatalf("prune leases: %d, %v; want 2", n, err)
	}
	want := []string{"active-old", "expired-unannounced", "released-new", "retaken", "task:123456"}
	if got := strs(t, tdb, `SELECT resource FROM leases ORDER BY resource`); !slices.Equal(got, want) {
		t.Errorf("leases left: %q, want %q", got, want)
	}
	for _, r := range []string{"active-old", "retaken"} {
		if _, err := leases.Renew(ctx, lease.RenewParams{Resource: r, Holder: map[string]string{"active-old": "h", "retaken": "other"}[r]}); err != nil {
			t.Errorf("renew %s after pruning: %v", r, err)
		}
	}

	// The unannounced expiry is announced now: it is kept for the age from
	// there, so its "expired" event is never lost.
	if marked, err := leases.MarkExpired(ctx, 100); err != nil || len(marked) != 1 {
		t.Fatalf("mark expired: %+v, %v; want expired-unannounced", marked, err)
	}
	if n, err := store.PruneLeases(ctx, week, 1000); err != nil || n != 0 {
		t.Errorf("prune leases after the announcement: %d, %v; want 0", n, err)
	}

	var maxFence int64
	if err := tdb.Pool.QueryRow(ctx, `SELECT max(fence) FROM lease_events`).Scan(&maxFence); err != nil {
		t.Fatal(err)
	}
	again := acquire("released-old", "h2", time.Minute)
	if again.Fence <= released.Fence || again.Fence <= maxFence || again.ID == released.ID {
		t.Errorf("acquisition after its row was pruned: id %d fence %d; want a new row and a fence above %d (its last) and %d (any before)",
			again.ID, again.Fence, released.Fence, maxFence)
	}
	if retaken.Fence <= released.Fence {
		t.Errorf("retaken fence %d, want above %d", retaken.Fence, released.Fence)
	}
}

// TestPruneBatches: each call looks at, and so deletes, at most its
// batch; a round goes on until the walk is over, and a round that reaches
// its bound says there is more, and the next goes on from there.
func TestPruneBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	leases := leasestore.NewStore(tdb.Pool)
	batch := make([]taskstore.NewTask, 25)
	for i := range batch {
		batch[i] = taskstore.NewTask{TaskData: data(i)}
	}
	if _, err := taskstore.TasksOf(tasks.Insert(ctx, batch)); err != nil {
		t.Fatal(err)
	}
	// 25 tasks finished, 25 events recorded, eight days ago.
	owner(t, tdb, `UPDATE tasks SET state = 'done', created_at = now() - interval '9 days', processed_at = now() - interval '8 days'`)
	for i := range 25 {
		if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: fmt.Sprintf("r%d", i), Holder: "h", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	owner(t, tdb, `UPDATE lease_events SET at = at - interval '8 days'`)

	store := retention.NewStore(tdb.Pool)
	var calls []int64
	var after int64
	for {
		got, err := store.PruneLeaseEvents(ctx, week, 10, after)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, got.Pruned)
		if got.LastID <= after && !got.Done {
			t.Fatalf("the walk stood still at %d: %+v", after, got)
		}
		after = got.LastID
		if got.Done || len(calls) > 10 {
			break
		}
	}
	if !slices.Equal(calls, []int64{10, 10, 5}) {
		t.Errorf("events pruned per call of batch 10: %v, want [10 10 5], the last one done", calls)
	}

	p := &retention.Pruner{Store: store, Config: retention.Config{TaskAge: week, Batch: 10, Pause: time.Millisecond}}
	counts, err := p.Round(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Tasks != 25 || counts.Batches != 3 || counts.More || counts.Leases != 0 || counts.LeaseEvents != 0 {
		t.Errorf("round of batch 10 over 25 tasks: %+v; want 25 tasks in 3 batches, nothing more", counts)
	}
	if left := ids(t, tdb, `SELECT id FROM tasks`); len(left) != 0 {
		t.Errorf("tasks left after the round: %v", left)
	}

	// A backlog beyond a round's bound (100 batches): the round says so.
	owner(t, tdb, `INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
		SELECT now() - interval '8 days', 0, 'gone', 'h', g, 'released', now() - interval '8 days'
		FROM generate_series(1, 101) AS g`)
	p.Config = retention.Config{LeaseHistoryAge: week, Batch: 1, Pause: time.Millisecond}
	first, err := p.Round(ctx)
	if err != nil || first.LeaseEvents != 100 || !first.More {
		t.Errorf("round of batch 1 over 101 events: %+v, %v; want 100 and more to do", first, err)
	}
	second, err := p.Round(ctx)
	if err != nil || second.LeaseEvents != 1 || second.More {
		t.Errorf("next round: %+v, %v; want the last event, nothing more", second, err)
	}
	if left := ids(t, tdb, `SELECT id FROM lease_events`); len(left) != 0 {
		t.Errorf("events left after the rounds: %v", left)
	}
}

// TestNoStallBehindKeptTasks: old tasks still pending at the head of the
// table (scheduled far ahead), more than a round looks at, do not keep the
// finished ones behind them from being pruned: the next round goes on
// where the last stopped. The walk after looks at the kept ones again, by
// id, and prunes one that has ended since, then goes on from where the
// last walk stopped.
func TestNoStallBehindKeptTasks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	// 150 tasks created a month ago and scheduled a month ahead, 5 that
	// ended eight days ago, and 3 just created.
	owner(t, tdb, `INSERT INTO tasks (task_data, created_at, scheduled_at)
		SELECT '{}', now() - interval '30 days', now() + interval '30 days' FROM generate_series(1, 150)`)
	owner(t, tdb, `INSERT INTO tasks (task_data, state, created_at, processed_at)
		SELECT '{}', 'done', now() - interval '30 days', now() - interval '8 days' FROM generate_series(1, 5)`)
	owner(t, tdb, `INSERT INTO tasks (task_data) SELECT '{}' FROM generate_series(1, 3)`)
	scheduled := ids(t, tdb, `SELECT id FROM tasks WHERE scheduled_at > now() ORDER BY id`)

	p := &retention.Pruner{Store: retention.NewStore(tdb.Pool), Config: retention.Config{TaskAge: week, Batch: 1, Pause: time.Millisecond}}
	first, err := p.Round(ctx)
	if err != nil || first.Tasks != 0 || first.Batches != 100 || !first.More {
		t.Fatalf("first round of batch 1 over 150 pending tasks: %+v, %v; want 100 batches, none pruned, more to do", first, err)
	}
	// 50 pending, 5 done, and the first new one, where the walk is over.
	second, err := p.Round(ctx)
	if err != nil || second.Tasks != 5 || second.Batches != 56 || second.More {
		t.Fatalf("second round: %+v, %v; want the 5 done tasks in 56 batches, nothing more", second, err)
	}
	if n := len(ids(t, tdb, `SELECT id FROM tasks`)); n != 153 {
		t.Errorf("tasks left: %d, want 153 (150 scheduled ahead, 3 new)", n)
	}

	// One of the scheduled tasks ended eight days ago after all, and the
	// new ones are a month old and ended too.
	owner(t, tdb, `UPDATE tasks SET state = 'dead', processed_at = now() - interval '8 days' WHERE id = $1`, scheduled[75])
	owner(t, tdb, `UPDATE tasks SET state = 'done', created_at = now() - interval '30 days', processed_at = now() - interval '8 days'
		WHERE scheduled_at <= now()`)
	p.Config.Batch = 50
	third, err := p.Round(ctx)
	if err != nil || third.Tasks != 4 || third.Batches != 4 || third.More {
		t.Errorf("third round, batch 50: %+v, %v; want 4 tasks in 4 batches (the 150 kept ones by id, then on)", third, err)
	}
	want := slices.Delete(slices.Clone(scheduled), 75, 76)
	if left := ids(t, tdb, `SELECT id FROM tasks ORDER BY id`); !slices.Equal(left, want) {
		t.Errorf("tasks left: %d (%v), want the 149 still scheduled", len(left), left)
	}
}

// TestRetentionZeroKeepsForever: an age of 0 prunes nothing of its kind.
func TestRetentionZeroKeepsForever(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	if _, err := taskstore.TasksOf(taskstore.NewStore(tdb.Pool).Insert(ctx, []taskstore.NewTask{{TaskData: data(0)}})); err != nil {
		t.Fatal(err)
	}
	leases := leasestore.NewStore(tdb.Pool)
	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "r", Holder: "h"}); err != nil {
		t.Fatal(err)
	}
	// Ended a year ago.
	owner(t, tdb, `UPDATE tasks SET state = 'done', processed_at = now() - interval '365 days'`)
	owner(t, tdb, `UPDATE leases SET released_at = now() - interval '365 days', expires_at = now() - interval '365 days'`)
	owner(t, tdb, `UPDATE lease_events SET at = now() - interval '365 days'`)
	count := func() (tasks, leases, events int) {
		t.Helper()
		if err := tdb.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM leases), (SELECT count(*) FROM lease_events)`).Scan(&tasks, &leases, &events); err != nil {
			t.Fatal(err)
		}
		return
	}
	tasksBefore, leasesBefore, eventsBefore := count()

	store := retention.NewStore(tdb.Pool)
	off := &retention.Pruner{Store: store, Config: retention.Config{}}
	if off.Config.Enabled() {
		t.Error("a config of zero ages says it prunes")
	}
	if counts, err := off.Round(ctx); err != nil || counts != (retention.Counts{}) {
		t.Errorf("round with both ages 0: %+v, %v; want nothing done", counts, err)
	}
	// Run with nothing to do returns at once.
	if err := off.Run(ctx); err != nil {
		t.Errorf("run with both ages 0: %v", err)
	}
	if tk, l, e := count(); tk != tasksBefore || l != leasesBefore || e != eventsBefore {
		t.Errorf("rows after a round keeping everything: %d tasks, %d leases, %d events; want %d, %d, %d", tk, l, e, tasksBefore, leasesBefore, eventsBefore)
	}

	// Tasks kept forever, lease history a week.
	p := &retention.Pruner{Store: store, Config: retention.Config{LeaseHistoryAge: week, Pause: time.Millisecond}}
	counts, err := p.Round(ctx)
	if err != nil || counts.Tasks != 0 || counts.Leases != 1 || counts.LeaseEvents != int64(eventsBefore) {
		t.Errorf("round with task retention 0: %+v, %v; want no tasks, 1 lease, %d events", counts, err, eventsBefore)
	}
	if tk, _, _ := count(); tk != tasksBefore {
		t.Errorf("tasks after a round with task retention 0: %d, want %d", tk, tasksBefore)
	}
}

// TestBadRetention: the configuration and the database both refuse an age
// under a minute, a negative one, and a batch out of range, saying what to
// pass instead.
func TestBadRetention(t *testing.T) {
	t.Parallel()
	for _, c := range []retention.Config{
		{TaskAge: -time.Hour},
		{TaskAge: 30 * time.Second},
		{LeaseHistoryAge: time.Minute - time.Nanosecond},
		{TaskAge: week, Batch: -1},
		{TaskAge: week, Batch: retention.MaxBatch + 1},
		{TaskAge: week, Pause: -time.Second},
		{TaskAge: week, Interval: -time.Second},
	} {
		err := c.Validate()
		if err == nil {
			t.Errorf("%+v: valid, want an error", c)
			continue
		}
		if p := (&retention.Pruner{Config: c}); p.Run(t.Context()) == nil {
			t.Errorf("%+v: Run started, want the error", c)
		}
		t.Logf("%+v: %v", c, err)
	}
	for _, c := range []retention.Config{{}, {TaskAge: time.Minute, LeaseHistoryAge: 365 * 24 * time.Hour, Batch: 1}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v, want valid", c, err)
		}
	}

	// The database's own floor, whatever the caller passes.
	tdb := pgtest.New(t)
	store := retention.NewStore(tdb.Pool)
	for name, prune := range map[string]func(ctx context.Context, age time.Duration, batch int32, after int64) error{
		"tasks": func(ctx context.Context, age time.Duration, batch int32, after int64) error {
			_, err := store.PruneTasks(ctx, age, batch, after)
			return err
		},
		"lease events": func(ctx context.Context, age time.Duration, batch int32, after int64) error {
			_, err := store.PruneLeaseEvents(ctx, age, batch, after)
			return err
		},
		"leases": func(ctx context.Context, age time.Duration, batch int32, _ int64) error {
			_, err := store.PruneLeases(ctx, age, batch)
			return err
		},
	} {
		for _, tc := range []struct {
			age   time.Duration
			batch int32
			after int64
			want  string
		}{
			{30 * time.Second, 10, 0, "below the floor"},
			{-week, 10, 0, "below the floor"},
			{week, 0, 0, "out of range"},
			{week, retention.MaxBatch + 1, 0, "out of range"},
			{week, 10, -1, "out of range"},
		} {
			if tc.after != 0 && name == "leases" {
				continue // leases are pruned oldest first, with no cursor
			}
			err := prune(t.Context(), tc.age, tc.batch, tc.after)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, tc.want) || pgErr.Hint == "" {
				t.Errorf("prune %s (age %s, batch %d, after %d): %v; want invalid_parameter_value (22023) %q with a hint",
					name, tc.age, tc.batch, tc.after, err, tc.want)
			}
		}
	}
	// More ids than the batch: refused by the store, and by the database.
	if _, err := store.PruneTaskIDs(t.Context(), week, make([]int64, retention.MaxBatch+1)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("prune %d task ids: %v; want an error saying to pass at most %d", retention.MaxBatch+1, err, retention.MaxBatch)
	}
	_, err := tdb.Pool.Exec(t.Context(), `SELECT * FROM prune_tasks(interval '7 days', 1, 0, '{1,2}')`)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, "more than the batch") || pgErr.Hint == "" {
		t.Errorf("prune_tasks with 2 ids and a batch of 1: %v; want invalid_parameter_value (22023) with a hint", err)
	}
}

// syncBuffer is a log sink the pruner and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// TestRunLogsOneLinePerRound: Run prunes at once, in batches, and logs the
// round once at info level with its counts, however many batches it took;
// a round that found nothing logs nothing at info.
func TestRunLogsOneLinePerRound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tdb := pgtest.New(t)
	batch := make([]taskstore.NewTask, 12)
	for i := range batch {
		batch[i] = taskstore.NewTask{TaskData: data(i)}
	}
	if _, err := taskstore.TasksOf(taskstore.NewStore(tdb.Pool).Insert(ctx, batch)); err != nil {
		t.Fatal(err)
	}
	owner(t, tdb, `UPDATE tasks SET state = 'dead', created_at = now() - interval '9 days', processed_at = now() - interval '8 days'`)

	var logs syncBuffer
	rounds := make(chan retention.Counts, 10)
	p := &retention.Pruner{
		Store:  retention.NewStore(tdb.Pool),
		Config: retention.Config{TaskAge: week, LeaseHistoryAge: week, Batch: 5, Pause: time.Millisecond, Interval: time.Hour},
		Log:    zerolog.New(&logs).Level(zerolog.InfoLevel),
		Pruned: func(c retention.Counts) { rounds <- c },
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var first retention.Counts
	select {
	case first = <-rounds:
	case <-time.After(30 * time.Second): // keeps a broken test from hanging; asserts no speed
		t.Fatal("no round")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if first.Tasks != 12 || first.Batches != 5 { // tasks 5+5+2, leases 0, events 0
		t.Errorf("first round: %+v, want 12 tasks in 5 batches", first)
	}
	var lines []map[string]any
	for l := range strings.Lines(logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 1 || lines[0]["level"] != "info" || lines[0]["tasks"] != float64(12) || lines[0]["batches"] != float64(5) {
		t.Errorf("logs: %v; want one info line with tasks 12 and batches 5", lines)
	}

	// Nothing left: a round logs nothing at info.
	var quietLogs syncBuffer
	quiet := *p
	quiet.Log = zerolog.New(&quietLogs).Level(zerolog.InfoLevel)
	ctx2, cancel2 := context.WithCancel(t.Context())
	done2 := make(chan error, 1)
	go func() { done2 <- quiet.Run(ctx2) }()
	select {
	case c := <-rounds:
		if c.Total() != 0 {
			t.Errorf("second run: %+v, want nothing pruned", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no round")
	}
	cancel2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if s := quietLogs.String(); s != "" {
		t.Errorf("an empty round logged at info: %s", s)
	}
}
