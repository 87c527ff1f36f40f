package taskstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// lockEvents returns the lease history of a resource, oldest first.
func lockEvents(t *testing.T, l *leasestore.Store, resource string) []lease.Event {
	t.Helper()
	evs, err := l.Events(context.Background(), lease.EventsParams{Resource: resource, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func leaseOf(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, resource string) (holder string, fence int64, expires time.Time, released *time.Time) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT holder, fence, expires_at, released_at FROM leases WHERE resource = $1`, resource).
		Scan(&holder, &fence, &expires, &released)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// TestGatedTaskHoldsItsLock: the claim of a gated task acquires its lock's
// lease for the processor with the task's fence and expiry; a heartbeat
// renews both; the completion releases both. The lease history says so.
func TestGatedTaskHoldsItsLock(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	tk := insert(t, s, taskstore.NewTask{Kind: "reindex", Lock: "db:index"})[0]
	if tk.Lock != "db:index" {
		t.Fatalf("inserted %+v, want lock db:index", tk)
	}
	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2"}})
	if len(got) != 1 || got[0].ID != tk.ID {
		t.Fatalf("claimed %+v, want the one task", got)
	}
	run := got[0]
	holder, fence, expires, released := leaseOf(t, pdb.Pool, "db:index")
	if holder != run.Processor || fence != run.Fence || released != nil || expires.Before(*run.MustHeartbeatBefore) {
		t.Errorf("lock's lease: holder %s fence %d expires %s released %v; want %s, fence %d, not before the task's %s",
			holder, fence, expires, released, run.Processor, run.Fence, run.MustHeartbeatBefore)
	}
	beat, err := s.Heartbeat(ctx, run.ID, run.Processor, run.Fence)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, expires, _ := leaseOf(t, pdb.Pool, "db:index"); !expires.Equal(*beat.MustHeartbeatBefore) {
		t.Errorf("after a heartbeat the lock expires %s, the task %s; want the same", expires, beat.MustHeartbeatBefore)
	}
	if _, err := s.Complete(ctx, run.ID, run.Processor, run.Fence, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, _, released := leaseOf(t, pdb.Pool, "db:index"); released == nil {
		t.Errorf("the lock is not released after the task completed")
	}
	var kinds []string
	for _, e := range lockEvents(t, l, "db:index") {
		if e.Fence != run.Fence || e.Holder != run.Processor {
			t.Errorf("event %+v not of the task's attempt (fence %d, %s)", e, run.Fence, run.Processor)
		}
		kinds = append(kinds, e.Kind)
	}
	if want := []string{"acquired", "renewed", "released"}; !slices.Equal(kinds, want) {
		t.Errorf("lock history %v, want %v", kinds, want)
	}
}

// TestGatedTaskAndAnotherHolder: in either order, a gated task and another
// holder of its lock (a leasehold exec, a REST client) never hold it at
// once: a held lock keeps the task pending until its release, and a task
// that runs keeps the lock from any other holder.
func TestGatedTaskAndAnotherHolder(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()

	// The other holder first.
	script, err := l.Acquire(ctx, lease.AcquireParams{Resource: "nightly", Holder: "exec-script", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tk := insert(t, s, taskstore.NewTask{Kind: "report", Lock: "nightly"}, taskstore.NewTask{Kind: "other"})
	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2"}})
	if len(got) != 1 || got[0].ID != tk[1].ID {
		t.Fatalf("claimed %v while the lock is held; want only the ungated task %d", ids(got), tk[1].ID)
	}
	if _, err := l.Release(ctx, lease.ReleaseParams{Resource: "nightly", Holder: "exec-script"}); err != nil {
		t.Fatal(err)
	}
	got = claim(t, s, taskstore.ClaimParams{Processors: []string{"w3"}})
	if len(got) != 1 || got[0].ID != tk[0].ID || got[0].Fence <= script.Lease.Fence {
		t.Fatalf("claimed %+v after the release; want task %d with a fence above the script's %d", got, tk[0].ID, script.Lease.Fence)
	}
	run := got[0]

	// The task first: another holder is refused, shown the task's lease.
	_, err = l.Acquire(ctx, lease.AcquireParams{Resource: "nightly", Holder: "exec-script", TTL: time.Minute})
	var held *lease.HeldError
	if !errors.As(err, &held) || held.Lease.Fence != run.Fence || held.Lease.Holder != run.Processor {
		t.Fatalf("acquire while the task runs: %v; want held by %s with fence %d", err, run.Processor, run.Fence)
	}
	// A failure releases the lock, as every end of an attempt does.
	if _, err := s.Fail(ctx, run.ID, run.Processor, run.Fence, "boom", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, lease.AcquireParams{Resource: "nightly", Holder: "exec-script", TTL: time.Minute}); err != nil {
		t.Fatalf("acquire after the task failed: %v", err)
	}
}

// TestGatedHeartbeatNeedsTheLock: when the lock's lease is gone (released
// by someone using the processor's name), the task's heartbeat is refused
// as a lost lease: a gated task never runs on without its lock.
func TestGatedHeartbeatNeedsTheLock(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	insert(t, s, taskstore.NewTask{Kind: "k", Lock: "L"})
	run := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1"}})[0]
	if _, err := l.Release(ctx, lease.ReleaseParams{Resource: "L", Holder: "w1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heartbeat(ctx, run.ID, run.Processor, run.Fence); !errors.Is(err, task.ErrLeaseLost) {
		t.Errorf("heartbeat without the lock: %v; want ErrLeaseLost", err)
	}
}

// TestGatedLapseFreesTheLock: a gated task whose worker died (it claims and
// is never heard of again) leaves its lock free at its lease's expiry,
// within its TTL of the claim: another holder takes it then, and the
// reaper's putting the task back does not touch the new holder's lease.
func TestGatedLapseFreesTheLock(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	insert(t, s, taskstore.NewTask{Kind: "k", Lock: "L", TTL: time.Second})
	run := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1"}})[0]
	_, _, expires, _ := leaseOf(t, pdb.Pool, "L")
	if ttl := expires.Sub(*run.StartedAt); ttl < time.Second || ttl > time.Second+100*time.Millisecond {
		t.Errorf("the lock expires %v after the claim; want the task's TTL, 1s", ttl)
	}
	// Until then it is held.
	var held *lease.HeldError
	if _, err := l.Acquire(ctx, lease.AcquireParams{Resource: "L", Holder: "other", TTL: time.Minute}); !errors.As(err, &held) {
		t.Fatalf("acquire before the expiry: %v; want held", err)
	}
	time.Sleep(time.Until(expires.Add(10 * time.Millisecond))) // the expiry itself is what the test waits for
	acq, err := l.Acquire(ctx, lease.AcquireParams{Resource: "L", Holder: "other", TTL: time.Minute})
	if err != nil {
		t.Fatalf("acquire after the lock's expiry: %v", err)
	}
	freedAfter := acq.Lease.CreatedAt.Sub(*run.StartedAt)
	t.Logf("the lock was taken by another holder %v after the dead worker's claim (TTL 1s)", freedAfter.Round(time.Millisecond))
	if _, err := s.RequeueLapsed(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if holder, fence, _, released := leaseOf(t, pdb.Pool, "L"); holder != "other" || fence != acq.Lease.Fence || released != nil {
		t.Errorf("after the lapsed task was put back the lock is %s/%d released %v; want the new holder's, untouched", holder, fence, released)
	}
	// While the new holder has it, the task waits; released, it runs with
	// a greater fence.
	if got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w2"}}); len(got) != 0 {
		t.Fatalf("claimed %+v while another holds the lock", got)
	}
	if _, err := l.Release(ctx, lease.ReleaseParams{Resource: "L", Holder: "other"}); err != nil {
		t.Fatal(err)
	}
	again := claim(t, s, taskstore.ClaimParams{Processors: []string{"w2"}})
	if len(again) != 1 || again[0].Fence <= acq.Lease.Fence || again[0].Attempts != 2 {
		t.Fatalf("claim after the release: %+v; want the task, attempt 2, fence above %d", again, acq.Lease.Fence)
	}
}

// TestGatedNeverOverlap: many workers claiming at once, gated tasks on two
// locks, and another holder taking the locks between them: the holding
// intervals of each lock never overlap, and each task ran inside its own
// holding of its lock, under its fence.
func TestGatedNeverOverlap(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const perLock = 40
	locks := []string{"L1", "L2"}
	var nts []taskstore.NewTask
	for i := range perLock {
		for _, lk := range locks {
			nts = append(nts, taskstore.NewTask{Kind: "k", Lock: lk, TaskData: []byte(fmt.Sprintf(`{"i":%d}`, i))})
		}
	}
	insert(t, s, nts...)
	var wg sync.WaitGroup
	d := &drainer{want: len(nts)}
	d.claimers(ctx, t, &wg, s, 6, func(w int) []string { return []string{fmt.Sprintf("w%d", w)} })
	// The other holder, as a leasehold exec would, between the tasks.
	wg.Go(func() {
		for i := 0; ctx.Err() == nil && !d.finished(); i++ {
			lk := locks[i%2]
			if _, err := l.Acquire(ctx, lease.AcquireParams{Resource: lk, Holder: "script", TTL: time.Minute}); err == nil {
				if _, err := l.Release(ctx, lease.ReleaseParams{Resource: lk, Holder: "script"}); err != nil {
					t.Error(err)
				}
			}
		}
	})
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("only %d of %d tasks done", d.done, len(nts))
	}
	for _, lk := range locks {
		type holding struct {
			fence      int64
			holder     string
			start, end time.Time
		}
		var hs []holding
		open := map[int64]int{}
		for _, e := range lockEvents(t, l, lk) {
			switch e.Kind {
			case "acquired":
				open[e.Fence] = len(hs)
				hs = append(hs, holding{fence: e.Fence, holder: e.Holder, start: e.At, end: e.ExpiresAt})
			case "renewed":
				hs[open[e.Fence]].end = e.ExpiresAt
			case "released", "expired":
				hs[open[e.Fence]].end = e.At
			}
		}
		script := 0
		for i := 1; i < len(hs); i++ {
			if hs[i].start.Before(hs[i-1].end) {
				t.Errorf("%s: holding %+v began before %+v ended", lk, hs[i], hs[i-1])
			}
			if hs[i].fence <= hs[i-1].fence {
				t.Errorf("%s: fence %d after %d", lk, hs[i].fence, hs[i-1].fence)
			}
			if hs[i].holder == "script" {
				script++
			}
		}
		rows, err := pdb.Pool.Query(ctx, `SELECT fence, processor, started_at, processed_at FROM tasks WHERE lock_resource = $1`, lk)
		if err != nil {
			t.Fatal(err)
		}
		byFence := map[int64]holding{}
		for _, h := range hs {
			byFence[h.fence] = h
		}
		n := 0
		for rows.Next() {
			var (
				fence      int64
				processor  string
				start, end time.Time
			)
			if err := rows.Scan(&fence, &processor, &start, &end); err != nil {
				t.Fatal(err)
			}
			n++
			h, ok := byFence[fence]
			if !ok || h.holder != processor || start.Before(h.start.Add(-time.Millisecond)) || end.After(h.end) {
				t.Errorf("%s: task under fence %d by %s ran %s–%s, outside its holding %+v", lk, fence, processor, start, end, h)
			}
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		t.Logf("%s: %d tasks and %d holdings by the script, %d holdings in all, none overlapping", lk, n, script, len(hs))
	}
}

// TestBusyLockCostsClaimsNothing: 10,000 tasks wait on one lock another
// holder keeps; claims of other tasks read one entry of the gated tasks'
// index each (the look that finds the lock busy), never the 10,000, and
// take every ungated task.
func TestBusyLockCostsClaimsNothing(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	if _, err := l.Acquire(ctx, lease.AcquireParams{Resource: "busy", Holder: "script", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := pdb.Pool.Exec(ctx, `INSERT INTO tasks (task_data, kind, lock_resource) SELECT '{}', 'k', 'busy' FROM generate_series(1, 10000)`); err != nil {
		t.Fatal(err)
	}
	const claims, ungated = 50, 200
	var nts []taskstore.NewTask
	for range ungated {
		nts = append(nts, taskstore.NewTask{Kind: "k"})
	}
	insert(t, s, nts...)
	if _, err := pdb.Pool.Exec(ctx, `ANALYZE tasks`); err != nil {
		t.Fatal(err)
	}

	tx, err := pdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only what it counted
	q := db.New(tx)
	taken := 0
	for i := range claims {
		rows, err := q.TaskClaim(ctx, db.TaskClaimParams{
			Processors: []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i), fmt.Sprintf("c%d", i), fmt.Sprintf("d%d", i)},
			TTLSeconds: 30, Discover: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.LockResource != nil {
				t.Fatalf("claimed gated task %d while its lock is busy", r.ID)
			}
		}
		taken += len(rows)
	}
	var scans, read int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_numscans('tasks_gated_idx'::regclass), pg_stat_get_xact_tuples_returned('tasks_gated_idx'::regclass)`).Scan(&scans, &read); err != nil {
		t.Fatal(err)
	}
	if taken != ungated {
		t.Errorf("%d claims took %d ungated tasks, want all %d", claims, taken, ungated)
	}
	if read > claims {
		t.Errorf("%d claims read %d entries of the gated tasks' index (%d scans); want at most one each, not the 10,000 waiting", claims, read, scans)
	}
	t.Logf("%d claims beside 10,000 tasks on a busy lock: %d scans of tasks_gated_idx reading %d entries in all", claims, scans, read)
}

// TestGatedClaimLeavesNoLockWithoutItsTask: a gated task committed while
// a claim is under way (after the claim's statement began, before it looked
// at that task's lock) is either claimed with its lock or left pending with
// its lock free: never its lock acquired for a processor that did not get
// the task, nor a task running that the claim did not return. Here the claim waits for the lease row of lock A (another
// transaction takes A meanwhile), and the task on lock B, due already, is
// committed while it waits, so the claim reaches B only after. (The chaos
// soak found this: a gated schedule's tick committed during a claim left
// the lock held by a worker without the task, to expire.)
func TestGatedClaimLeavesNoLockWithoutItsTask(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s := taskstore.NewStore(pdb.Pool)
	ctx := context.Background()
	insert(t, s, taskstore.NewTask{Kind: "k", Lock: "A"})
	// A's lease has run out (its holder is gone), so the claim goes for it.
	if _, err := pdb.Pool.Exec(ctx, `INSERT INTO leases (resource, holder, fence, ttl_seconds, expires_at)
		VALUES ('A', 'gone', nextval('lease_fence_seq'), 1, now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	// Another holder takes A in a transaction still open.
	taker, err := pdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taker.Rollback(ctx) }()
	if _, err := taker.Exec(ctx, `UPDATE leases SET holder = 'taker', fence = nextval('lease_fence_seq'),
		created_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 minute' WHERE resource = 'A'`); err != nil {
		t.Fatal(err)
	}

	type result struct {
		ts  []task.Task
		err error
	}
	done := make(chan result, 1)
	go func() {
		ts, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w1", "w2"}, TTL: time.Minute})
		done <- result{ts, err}
	}()
	// pg_blocking_pids says when the claim waits for the taker.
	var takerPID uint32
	if err := taker.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&takerPID); err != nil {
		t.Fatal(err)
	}
	for waiting, giveUp := false, time.Now().Add(testkit.Patience); !waiting; {
		if err := pdb.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND $1::int = ANY (pg_blocking_pids(pid)))`, takerPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(giveUp) {
			t.Fatalf("waited %s for the claim to wait on the taker's lock, in vain", testkit.Patience)
		}
		select {
		case r := <-done:
			t.Fatalf("the claim returned %v, %v before the taker committed; it should wait for A's lease row", ids(r.ts), r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Due before the claim began, as a schedule's tick is (its task is due
	// at the tick), or a task whose insert began before the claim did.
	b := insert(t, s, taskstore.NewTask{Kind: "k", Lock: "B", ScheduledAt: time.Now().Add(-time.Minute)})[0]
	if err := taker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, c := range r.ts {
		if c.ID != b.ID {
			t.Errorf("claimed task %d (lock %s); A is the taker's", c.ID, c.Lock)
		}
	}
	// Every live lease a processor holds is the lock of its running task,
	// under the task's fence.
	rows, err := pdb.Pool.Query(ctx, `SELECT l.resource, l.holder, l.fence FROM leases AS l
		WHERE l.holder IN ('w1', 'w2') AND l.released_at IS NULL AND l.expires_at > now()
		  AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.state = 'running' AND t.lock_resource = l.resource
		                  AND t.processor = l.holder AND t.fence = l.fence)`)
	if err != nil {
		t.Fatal(err)
	}
	orphans, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Resource, Holder string
		Fence            int64
	}])
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) > 0 {
		t.Errorf("leases held by processors without their task: %+v (claimed %v)", orphans, ids(r.ts))
	}
	// And a task running is one the claim returned.
	got, err := s.Get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State == task.StateRunning && !slices.Contains(ids(r.ts), b.ID) {
		t.Errorf("task %d on B runs for %s under fence %d, and the claim returned %v without it", b.ID, got.Processor, got.Fence, ids(r.ts))
	}
	t.Logf("the task on B, committed during the claim: %s", got.State)
}
