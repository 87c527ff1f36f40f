package checker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/reaper"
)

// TestCheck runs real lease and task operations, checks that their history
// keeps every guarantee, then forges an overlapping acquisition into the
// lease history and an overlapping attempt into a task's row, and checks
// that Check catches both.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	data := json.RawMessage(`{"sleep_duration_seconds": 0}`)

	acquire := func(resource, holder string, ttl time.Duration) lease.Lease {
		t.Helper()
		acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: resource, Holder: holder, TTL: ttl})
		if err != nil || !acq.New {
			t.Fatalf("acquire %s for %s: new=%v, %v", resource, holder, acq.New, err)
		}
		return acq.Lease
	}
	claim := func(processor string, ttl time.Duration) []task.Task {
		t.Helper()
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{processor}, TTL: ttl, WithLapsed: true})
		if err != nil {
			t.Fatal(err)
		}
		return claimed
	}

	// A reaper term that outlasts the test. Its holder never renews, so the
	// checker judges no expiry: that the reaper keeps time is tested elsewhere.
	acquire(reaper.Resource, "reaper-1", time.Hour)

	// res:a is acquired, renewed and released by a, then taken by b, whose
	// lease runs out; so does z's on res:z.
	a := acquire("res:a", "a", time.Minute)
	if _, err := leases.Renew(ctx, lease.RenewParams{Resource: "res:a", Holder: "a", Fence: a.Fence}); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "res:a", Holder: "a", Fence: a.Fence}); err != nil {
		t.Fatal(err)
	}
	b := acquire("res:a", "b", time.Second)
	z := acquire("res:z", "z", time.Second)

	// Tasks x and u are claimed by w1 and w3, whose leases on them run out
	// too: x's first, so that a claim can only take x.
	inserted, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data}, {TaskData: data}}))
	if err != nil {
		t.Fatal(err)
	}
	x, u := inserted[0], inserted[1]
	first := claim("w1", time.Second)
	if len(first) != 1 || first[0].ID != x.ID {
		t.Fatalf("claimed %v, want task %d", first, x.ID)
	}
	lapsing := claim("w3", 2*time.Second)
	if len(lapsing) != 1 || lapsing[0].ID != u.ID {
		t.Fatalf("claimed %v, want task %d", lapsing, u.ID)
	}
	waitForDatabaseClock(t, tdb.Pool, b.ExpiresAt, z.ExpiresAt, *first[0].MustHeartbeatBefore)

	// c takes res:a over before anyone announces b's expiry, and w9 takes
	// the lapsed x straight from w1 (the claim announces that lapse); w1's
	// completion with its old fence is refused.
	acquire("res:a", "c", time.Hour)
	again := claim("w9", time.Minute)
	if len(again) != 1 || again[0].ID != x.ID {
		t.Fatalf("claimed %v, want task %d again", again, x.ID)
	}
	if _, err := tasks.Complete(ctx, x.ID, "w1", first[0].Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want ErrLeaseLost", err)
	}
	if _, err := tasks.Complete(ctx, x.ID, "w9", again[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	// What a reaper's pass does once u's lease has lapsed: announce z's
	// expiry, the only lease one due, and put u back to pending.
	waitForDatabaseClock(t, tdb.Pool, *lapsing[0].MustHeartbeatBefore)
	expired, err := leases.MarkExpired(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(expired) != 1 || expired[0].Lease.Resource != "res:z" {
		t.Fatalf("announced %v, want res:z's expiry", expired)
	}
	lapsed, err := tasks.RequeueLapsed(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(lapsed) != 1 || lapsed[0].Task.ID != u.ID || lapsed[0].Task.State != task.StatePending {
		t.Fatalf("put back %v, want task %d pending", lapsed, u.ID)
	}

	// The generator inserts two tasks under its lease.
	gen := acquire(demo.Resource, "g1", time.Hour)
	if err := demo.NewState(tdb.Pool).Set(ctx, true, "test"); err != nil {
		t.Fatal(err)
	}
	generated, err := tasks.InsertGenerated(ctx, "g1", gen.Fence, []json.RawMessage{data, data})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: demo.Resource, Holder: "g1", Fence: gen.Fence}); err != nil {
		t.Fatal(err)
	}

	// Three more tasks: y is handed back once before it is done, doomed
	// fails its only attempt; the rest, u included, are done.
	inserted, err = taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: data}, {TaskData: data}, {TaskData: data, MaxAttempts: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	y, doomed := inserted[0], inserted[2]
	requeued := false
	for claimed := claim("w2", time.Minute); len(claimed) > 0; claimed = claim("w2", time.Minute) {
		c := claimed[0]
		switch {
		case c.ID == doomed.ID:
			_, err = tasks.Fail(ctx, c.ID, "w2", c.Fence, "it broke", -1)
		case c.ID == y.ID && !requeued:
			_, err = tasks.Requeue(ctx, c.ID, "w2", c.Fence, "shutting down")
			requeued = true
		default:
			_, err = tasks.Complete(ctx, c.ID, "w2", c.Fence, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	expected := []int64{x.ID, u.ID}
	for _, tk := range slices.Concat(generated, inserted) {
		expected = append(expected, tk.ID)
	}
	opts := checker.Options{ExpectedTasks: expected}
	rep := check(t, tdb.Pool, opts)
	if !rep.OK() {
		t.Fatalf("violations in a real history: %v", rep.Violations)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"resources", rep.Resources, 11},        // reaper, res:a, res:z, generator, 7 tasks
		{"acquisitions", rep.Acquisitions, 16},  // 6 of leases, 10 of tasks
		{"task attempts", rep.TaskAttempts, 10}, // x, u and y were claimed twice
		{"expiries", rep.Expiries, 4},           // b's, z's, w1's on x and w3's on u
		{"done", rep.TasksDone, 6},
		{"dead", rep.TasksDead, 1},
		{"generated", rep.Generated, 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}

	// A forged acquisition of res:a by "forger" 1 ms into b's interval,
	// with a fence from the sequence, as a broken acquire would record it.
	if _, err := tdb.Pool.Exec(ctx, `
		INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
		SELECT at + interval '1 millisecond', lease_id, resource, 'forger', nextval('lease_fence_seq'), 'acquired', expires_at
		FROM lease_events
		WHERE resource = 'res:a' AND holder = 'b' AND kind = 'acquired'`); err != nil {
		t.Fatal(err)
	}
	// y's hand-back forged to end at its completion, inside the attempt
	// that completed it.
	if _, err := tdb.Pool.Exec(ctx, `
		UPDATE tasks SET earlier_attempts = jsonb_set(earlier_attempts, '{0,ended_at}', to_jsonb(processed_at))
		WHERE id = $1`, y.ID); err != nil {
		t.Fatal(err)
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleOverlap}) || len(rep.Violations) != 2 {
		t.Fatalf("violations = %v, want two %q", rep.Violations, checker.RuleOverlap)
	}
	for i, want := range [][]string{
		{"res:a by forger", "res:a by b "},
		{fmt.Sprintf("task:%d by w2", y.ID), "(attempt 1)", "(attempt 2)"},
	} {
		for _, w := range want {
			if d := rep.Violations[i].Detail; !strings.Contains(d, w) {
				t.Errorf("detail %q does not name %q", d, w)
			}
		}
	}
}

// check runs Check and logs its report.
func check(t *testing.T, pool *pgxpool.Pool, opts checker.Options) *checker.Report {
	t.Helper()
	rep, err := checker.Check(context.Background(), pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Log(b.String())
	return rep
}

// waitForDatabaseClock returns once the database clock has passed every
// one of times: what a lease's expiry waits for. The database clock gives
// no signal, so this sleeps for as long as it says is left, then asks again.
func waitForDatabaseClock(t *testing.T, pool *pgxpool.Pool, times ...time.Time) {
	t.Helper()
	until := slices.MaxFunc(times, time.Time.Compare)
	for {
		var left float64 // seconds
		if err := pool.QueryRow(context.Background(),
			`SELECT extract(epoch FROM $1::timestamptz - clock_timestamp())::float8`, until).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left < 0 {
			return
		}
		time.Sleep(time.Duration(left*float64(time.Second)) + time.Millisecond)
	}
}
