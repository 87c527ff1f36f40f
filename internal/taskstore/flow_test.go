package taskstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// TestPausedQueueIsNotClaimed: a paused queue's pending tasks, gated or
// not, are passed by every kind of claim (discovering, hinted, with lapsed
// tasks); its running task finishes; an idle claimer of it is told to wake
// when a timed pause ends; resuming announces it (a NOTIFY the claimers
// wake on) and the tasks are claimed.
func TestPausedQueueIsNotClaimed(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s := taskstore.NewStore(pdb.Pool)
	ctx := context.Background()
	running := insert(t, s, taskstore.NewTask{Kind: "k", Queue: "imports"})[0]
	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w0"}, Queues: []string{"imports"}})
	if len(got) != 1 || got[0].ID != running.ID {
		t.Fatalf("claimed %v, want task %d", ids(got), running.ID)
	}
	var nts []taskstore.NewTask
	for range 3 {
		nts = append(nts, taskstore.NewTask{Kind: "k", Queue: "imports"}, taskstore.NewTask{Kind: "k", Queue: "mail"},
			taskstore.NewTask{Kind: "k", Queue: "imports", Lock: "db"})
	}
	insert(t, s, nts...)
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := s.PauseQueue(ctx, "imports", until, "a bug"); err != nil {
		t.Fatal(err)
	}
	notes := listen(t, pdb, false)
	queues := func(ts []task.Task) []string {
		var qs []string
		for _, tk := range ts {
			qs = append(qs, tk.Queue)
		}
		return qs
	}
	for name, p := range map[string]taskstore.ClaimParams{
		"discovering": {Processors: []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"}},
		"hinted":      {Processors: []string{"b1", "b2"}, Queues: []string{"imports"}, Hints: []taskstore.Hint{{Queue: "imports", Kind: "k", ScheduledAt: time.Unix(0, 0)}}, Known: true},
		"with lapsed": {Processors: []string{"c1", "c2"}, WithLapsed: true},
	} {
		if got := claim(t, s, p); slices.Contains(queues(got), "imports") {
			t.Errorf("%s claim during the pause took tasks of the paused queue: %v", name, queues(got))
		}
	}
	if _, err := s.Complete(ctx, running.ID, "w0", got[0].Fence, nil); err != nil {
		t.Errorf("the running task of a paused queue could not finish: %v", err)
	}
	due, _, err := s.NextDue(ctx, []string{"imports"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !due.Equal(until) {
		t.Errorf("an idle claimer of the paused queue is told to look again at %s, want the pause's end %s", due, until)
	}
	if ps, err := s.PausedQueues(ctx); err != nil || len(ps) != 1 || ps[0].Queue != "imports" || ps[0].Reason != "a bug" {
		t.Errorf("paused queues %+v, %v; want imports, a bug", ps, err)
	}
	notes() // what the claims said
	if resumed, err := s.ResumeQueue(ctx, "imports"); err != nil || !resumed {
		t.Fatalf("resume: %v, %v", resumed, err)
	}
	if said := notes(); !slices.Contains(said, notify.TasksRequeued) {
		t.Errorf("the resume said %q, want %q: the claimers wake on it", said, notify.TasksRequeued)
	}
	if resumed, err := s.ResumeQueue(ctx, "imports"); err != nil || resumed {
		t.Errorf("a second resume: %v, %v; want false", resumed, err)
	}
	got = claim(t, s, taskstore.ClaimParams{Processors: []string{"d1", "d2", "d3", "d4", "d5", "d6"}, Queues: []string{"imports"}})
	if len(got) != 4 { // three ungated, one of the gated (one lock)
		t.Errorf("after the resume a claim took %d tasks of imports, want 4", len(got))
	}
}

// TestRateNeverOverspent: tasks on a key with a rate of 4 starts per
// second, claimed by one claimer that waits, when it finds none, until the
// time the store says (as the workers do): by the tasks' own started_at,
// no window of a second holds more than 4 starts, and every task ran.
// (Claimers at once, woken by NOTIFY: the library's TestRateAcrossClients.)
func TestRateNeverOverspent(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const rate, tasks = 4, 14
	if _, err := l.SetRate(ctx, "partner-api", rate, time.Second); err != nil {
		t.Fatal(err)
	}
	var nts []taskstore.NewTask
	for range tasks {
		nts = append(nts, taskstore.NewTask{Kind: "k", Lock: "partner-api"})
	}
	insert(t, s, nts...)
	for done := 0; done < tasks; {
		got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2", "w3"}, TTL: 30 * time.Second})
		for _, tk := range got {
			if _, err := s.Complete(ctx, tk.ID, tk.Processor, tk.Fence, nil); err != nil {
				t.Fatal(err)
			}
			done++
		}
		if len(got) > 0 {
			continue
		}
		due, dbNow, err := s.NextDue(ctx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wait := due.Sub(dbNow)
		if wait > time.Second {
			t.Fatalf("an idle claimer is told to wait %s with %d tasks waiting on a rate of %d/s", wait, tasks-done, rate)
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			t.Fatalf("only %d of %d tasks done", done, tasks)
		}
	}
	starts := startTimes(t, pdb, "partner-api")
	if most := mostInWindow(starts, time.Second); len(starts) != tasks || most != rate {
		t.Errorf("%d tasks started, at most %d in one second; want %d, and %d (the rate, spent)", len(starts), most, tasks, rate)
	}
	lim, err := l.Limit(ctx, "partner-api")
	if err != nil || lim.RateStarts != rate || lim.RatePeriod != time.Second {
		t.Errorf("limit %+v, %v; want a rate of %d per second", lim, err, rate)
	}
	t.Logf("%d tasks over %s, at most %d starts in any second (rate %d/s)", len(starts), starts[len(starts)-1].Sub(starts[0]), mostInWindow(starts, time.Second), rate)
}

// TestRateWakesTheIdleWhenItAllows: an idle claimer asks when to look
// again. A key whose rate lets a task start now, with a free slot and a
// task the claimer could take, is due now: the claimer may have found the
// rate spent a moment ago (or read before another's claim committed), and
// nothing else would wake it. A key whose slots are all held is not (the
// slot's release wakes the claimers), nor is it for a claimer of other
// kinds.
func TestRateWakesTheIdleWhenItAllows(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := l.SetLimit(ctx, "partner-api", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetRate(ctx, "partner-api", 2, time.Second); err != nil {
		t.Fatal(err)
	}
	insert(t, s, taskstore.NewTask{Kind: "k", Lock: "partner-api"}, taskstore.NewTask{Kind: "k", Lock: "partner-api"},
		taskstore.NewTask{Kind: "k", Lock: "partner-api"})
	lookAgain := func(kinds []string) time.Duration {
		t.Helper()
		due, dbNow, err := s.NextDue(ctx, nil, kinds)
		if err != nil {
			t.Fatal(err)
		}
		return due.Sub(dbNow)
	}
	run := func(spent bool) {
		t.Helper()
		got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2"}, TTL: 30 * time.Second})
		if len(got) != 1 {
			t.Fatalf("claimed %d tasks of a key of one slot, want 1", len(got))
		}
		if wait := lookAgain(nil); !spent && wait < 30*time.Minute {
			t.Errorf("while the key's one slot is held and its rate allows a start, an idle claimer is told to look again in %s; "+
				"want no sooner than the slot's release wakes it", wait)
		}
		if _, err := s.Complete(ctx, got[0].ID, got[0].Processor, got[0].Fence, nil); err != nil {
			t.Fatal(err)
		}
	}
	run(false)
	run(true)
	wait := lookAgain(nil)
	if wait <= 0 || wait > time.Second {
		t.Fatalf("with the rate spent, an idle claimer is told to look again in %s; want within the second", wait)
	}
	timer := time.NewTimer(wait)
	select {
	case <-timer.C:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if wait := lookAgain(nil); wait > 0 {
		t.Errorf("the rate lets a task start, a slot is free, and an idle claimer is told to look again in %s; want now", wait)
	}
	if wait := lookAgain([]string{"other"}); wait < 30*time.Minute {
		t.Errorf("a claimer of another kind is told to look again in %s for a key it cannot serve", wait)
	}
	if got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1"}, TTL: 30 * time.Second}); len(got) != 1 {
		t.Errorf("claimed %d tasks, want the third", len(got))
	}
}

// startTimes returns the started_at of the tasks of lock, in order.
func startTimes(t *testing.T, pdb pgtest.DB, lock string) []time.Time {
	t.Helper()
	rows, err := pdb.Pool.Query(context.Background(), `SELECT started_at FROM tasks WHERE lock_resource = $1 AND started_at IS NOT NULL ORDER BY started_at`, lock)
	if err != nil {
		t.Fatal(err)
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	return starts
}

// mostInWindow is the most of the sorted times that lie in one window
// [t, t+period).
func mostInWindow(times []time.Time, period time.Duration) int {
	most := 0
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < period; j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// TestKeysServedInTurn: a tenant with 1,000 tasks on a key early in name
// order and one with 10 on a key late in it, each of limit 5, claimed five
// at a time: the small tenant's tasks all start while the large tenant's
// backlog is still pending, claims taking the keys in turn rather than the
// first key's backlog first.
func TestKeysServedInTurn(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s := taskstore.NewStore(pdb.Pool)
	ctx := context.Background()
	if _, err := pdb.Pool.Exec(ctx, `INSERT INTO tasks (task_data, kind, lock_resource) SELECT '{}', 'k', 'tenant:a-large' FROM generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	var nts []taskstore.NewTask
	for range 10 {
		nts = append(nts, taskstore.NewTask{Kind: "k", Lock: "tenant:z-small", LockLimit: 5})
	}
	insert(t, s, nts...)
	l := leasestore.NewStore(pdb.Pool)
	if _, err := l.SetLimit(ctx, "tenant:a-large", 5); err != nil {
		t.Fatal(err)
	}
	small, claims := 0, 0
	for small < 10 && claims < 100 {
		got := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2", "w3", "w4", "w5"}, TTL: 30 * time.Second})
		claims++
		for _, tk := range got {
			if tk.Lock == "tenant:z-small" {
				small++
			}
			if _, err := s.Complete(ctx, tk.ID, tk.Processor, tk.Fence, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	var pending int
	if err := pdb.Pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state = 'pending' AND lock_resource = 'tenant:a-large'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if small != 10 || pending < 900 {
		t.Errorf("after %d claims of 5: %d of the small tenant's 10 tasks ran, %d of the large one's 1,000 pending; want all 10 with at least 900 pending", claims, small, pending)
	}
	t.Logf("the small tenant's 10 tasks ran in %d claims of 5, with %d of the large tenant's tasks still pending", claims, pending)
}
