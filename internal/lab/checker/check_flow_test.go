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

// TestCheckRate runs four tasks on a key of 3 starts an hour: one claim
// for four workers starts three, and the fourth, left pending, is
// cancelled. The history keeps every guarantee, judged by the rate
// lease_limits holds. Then it plants a claim that ignored the rate: an
// attempt of the fourth task, a moment after the third start, in a slot of
// its own, and checks that Check reports the window with its four starts,
// and nothing else.
func TestCheckRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	leases := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	const key = "partner:api"
	if _, err := leases.SetRate(ctx, key, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	var nts []taskstore.NewTask
	for range 4 {
		nts = append(nts, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Lock: key})
	}
	inserted, err := taskstore.TasksOf(tasks.Insert(ctx, nts))
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w1", "w2", "w3", "w4"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 3 {
		t.Fatalf("claimed %d task(s) of a key of 3 starts an hour, want 3", len(claimed))
	}
	for _, c := range claimed {
		if _, err := tasks.Complete(ctx, c.ID, c.Processor, c.Fence, nil); err != nil {
			t.Fatalf("complete task %d: %v", c.ID, err)
		}
	}
	var left task.Task
	for _, tk := range inserted {
		if !slices.ContainsFunc(claimed, func(c task.Task) bool { return c.ID == tk.ID }) {
			left = tk
		}
	}
	if _, err := tasks.Cancel(ctx, left.ID, "the rate is spent"); err != nil {
		t.Fatal(err)
	}

	var expected []int64
	for _, tk := range inserted {
		expected = append(expected, tk.ID)
	}
	opts := checker.Options{ExpectedTasks: expected}
	rep := check(t, tdb.Pool, opts)
	if !rep.OK() {
		t.Fatalf("violations in a real history: %v", rep.Violations)
	}
	starts := make([]time.Time, len(claimed))
	for i, c := range claimed {
		starts[i] = *c.StartedAt
	}
	slices.SortFunc(starts, time.Time.Compare)
	want := []checker.RateKey{{Key: key, Rate: checker.Rate{Starts: 3, Period: time.Hour}, Tasks: 3, Starts: 3,
		MostInWindow: 3, BusiestAt: starts[0]}}
	if !slices.Equal(rep.RateKeys, want) {
		t.Errorf("rate keys = %+v, want %+v", rep.RateKeys, want)
	}

	// The fourth task started by a claim that ignored the rate, a
	// millisecond after the third start, for a millisecond, in a slot no
	// other holder took: every rule but the rate's is kept.
	var fence int64
	err = tdb.Pool.QueryRow(ctx, `
		WITH f AS (SELECT nextval('lease_fence_seq') AS fence),
		attempt AS (
			UPDATE tasks AS t
			SET earlier_attempts = jsonb_build_array(jsonb_build_object(
				'processor', 'intruder', 'fence', f.fence, 'started_at', $2::timestamptz + interval '1 millisecond',
				'expires_at', $2::timestamptz + interval '1 minute', 'ended_at', $2::timestamptz + interval '2 milliseconds',
				'outcome', 'cancelled'))
			FROM f WHERE t.id = $1
			RETURNING f.fence
		),
		slot AS (
			INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
			SELECT $2::timestamptz + interval '1 millisecond', 0, $3, 'intruder', fence, 'acquired', $2::timestamptz + interval '1 minute'
			FROM attempt
			UNION ALL
			SELECT $2::timestamptz + interval '2 milliseconds', 0, $3, 'intruder', fence, 'released', $2::timestamptz + interval '2 milliseconds'
			FROM attempt
		)
		SELECT fence FROM attempt`, left.ID, starts[2], lease.SlotName(key, 999)).Scan(&fence)
	if err != nil {
		t.Fatalf("plant a start of task %d: %v", left.ID, err)
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleRateLimit}) || len(rep.Violations) != 1 {
		t.Fatalf("violations = %v, want one %q", rep.Violations, checker.RuleRateLimit)
	}
	wantDetail := []string{key + ", a key of 3 start(s) per 1h0m0s: 4 starts in [",
		fmt.Sprintf("task:%d attempt 1 by intruder at ", left.ID)}
	for _, c := range claimed {
		wantDetail = append(wantDetail, fmt.Sprintf("task:%d attempt 1 by %s at ", c.ID, c.Processor))
	}
	for _, w := range wantDetail {
		if d := rep.Violations[0].Detail; !strings.Contains(d, w) {
			t.Errorf("detail %q does not say %q", d, w)
		}
	}
	if got := rep.RateKeys[0]; got.Starts != 4 || got.MostInWindow != 4 {
		t.Errorf("%s: %+v; want the planted start counted: 4 starts, 4 in a window", key, got)
	}
}

// TestCheckQueuePaused pauses a queue between the claims of its tasks:
// first until resumed, then until a time that passes on its own, each
// recorded by PauseMade and PauseEnded. A claim during the first pause
// takes nothing, and a task inserted then is held back until the resume;
// the history keeps every guarantee. Then it plants a start of a task
// inside the first pause, which Check reports, and moves a start to the
// second pause's paused_at, the instant a claim under way at its commit may
// start one, which it counts but does not judge.
func TestCheckQueuePaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	tasks := taskstore.NewStore(tdb.Pool)
	const queue = "imports"
	var expected []int64
	insert := func(n int) {
		t.Helper()
		nts := make([]taskstore.NewTask, n)
		for i := range nts {
			nts[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`), Queue: queue}
		}
		inserted, err := taskstore.TasksOf(tasks.Insert(ctx, nts))
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range inserted {
			expected = append(expected, tk.ID)
		}
	}
	claim := func(processors ...string) []task.Task {
		t.Helper()
		claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: processors, TTL: time.Minute, Queues: []string{queue}})
		if err != nil {
			t.Fatal(err)
		}
		return claimed
	}
	complete := func(cs ...task.Task) {
		t.Helper()
		for _, c := range cs {
			if _, err := tasks.Complete(ctx, c.ID, c.Processor, c.Fence, nil); err != nil {
				t.Fatalf("complete task %d: %v", c.ID, err)
			}
		}
	}
	made := func() checker.Pause {
		t.Helper()
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		p, err := checker.PauseMade(waitCtx, tdb.Pool, queue)
		if err != nil {
			t.Fatal(err)
		}
		if p.From.Before(p.At) {
			t.Fatalf("%s: binding before it was made", p)
		}
		return p
	}

	insert(1)
	a := claim("w1")
	if len(a) != 1 {
		t.Fatalf("claimed %d task(s), want the one", len(a))
	}
	made0, err := tasks.PauseQueue(ctx, queue, time.Time{}, "the importer is broken")
	if err != nil {
		t.Fatal(err)
	}
	first := made()
	if !first.At.Equal(made0.PausedAt) || !first.Until.IsZero() {
		t.Fatalf("%s; the pause answered %+v", first, made0)
	}
	insert(1)
	if got := claim("w2", "w3"); len(got) != 0 {
		t.Fatalf("claimed %d task(s) of the paused queue, want none", len(got))
	}
	complete(a...) // a running task finishes during the pause
	if resumed, err := tasks.ResumeQueue(ctx, queue); err != nil || !resumed {
		t.Fatalf("resume: %v, %v", resumed, err)
	}
	if first, err = checker.PauseEnded(ctx, tdb.Pool, first); err != nil {
		t.Fatal(err)
	}
	b := claim("w2")
	if len(b) != 1 {
		t.Fatalf("claimed %d task(s) after the resume, want the one held back", len(b))
	}
	complete(b...)

	insert(2)
	var now time.Time
	if err := tdb.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.PauseQueue(ctx, queue, now.Add(time.Second), "a short break"); err != nil {
		t.Fatal(err)
	}
	second := made()
	if !second.Until.Equal(now.Add(time.Second)) {
		t.Fatalf("%s, want it until %s", second, now.Add(time.Second))
	}
	// A claim during the pause takes nothing, unless this machine stalled
	// past its until; whatever it takes starts after the pause ended.
	cd := claim("w3", "w4")
	waitForDatabaseClock(t, tdb.Pool, second.Until)
	cd = append(cd, claim([]string{"w3", "w4"}[len(cd):]...)...)
	for _, c := range cd {
		if c.StartedAt.Before(second.Until) {
			t.Fatalf("task %d started at %s, during %s", c.ID, c.StartedAt, second)
		}
	}
	complete(cd...)
	if len(cd) != 2 {
		t.Fatalf("claimed %d task(s) once the pause ended, want 2", len(cd))
	}
	if ended, err := checker.PauseEnded(ctx, tdb.Pool, second); err != nil || !ended.Until.Equal(second.Until) {
		t.Fatalf("the end of %s: %s, %v", second, ended, err)
	}

	opts := checker.Options{ExpectedTasks: expected, Pauses: []checker.Pause{first, second}}
	rep := check(t, tdb.Pool, opts)
	if !rep.OK() {
		t.Fatalf("violations in a real history: %v", rep.Violations)
	}
	want := []checker.PausedQueue{{Queue: queue, Pauses: 2, Judged: 2,
		Paused: first.Until.Sub(first.From) + second.Until.Sub(second.From), Tasks: 4, Starts: 4, HeldBack: 1, Outside: 4}}
	if !slices.Equal(rep.PausedQueues, want) {
		t.Errorf("paused queues = %+v, want %+v", rep.PausedQueues, want)
	}

	// b started a microsecond after the first pause bound every claim; c
	// at the instant the second was made.
	for _, move := range []struct {
		id int64
		at time.Time
	}{{b[0].ID, first.From.Add(time.Microsecond)}, {cd[0].ID, second.At}} {
		if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET started_at = $2 WHERE id = $1`, move.id, move.at); err != nil {
			t.Fatal(err)
		}
	}
	rep = check(t, tdb.Pool, opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleQueuePaused}) || len(rep.Violations) != 1 {
		t.Fatalf("violations = %v, want one %q", rep.Violations, checker.RuleQueuePaused)
	}
	for _, w := range []string{fmt.Sprintf("task:%d attempt 1 by w2 at ", b[0].ID),
		"started in the paused queue imports, 1µs after the pause bound every claim: the pause of imports at " + first.At.UTC().Format("2006-01-02T15:04:05.000000Z")} {
		if d := rep.Violations[0].Detail; !strings.Contains(d, w) {
			t.Errorf("detail %q does not say %q", d, w)
		}
	}
	if got := rep.PausedQueues[0]; got.InFlight != 1 || got.Outside != 2 || got.HeldBack != 0 {
		t.Errorf("%+v; want c's start counted as in flight at the second pause, 2 outside, b no longer held back", got)
	}
}
