package taskstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

var emptyData = json.RawMessage(`{}`)

func insert(t *testing.T, s *taskstore.Store, nts ...taskstore.NewTask) []task.Task {
	t.Helper()
	for i := range nts {
		if nts[i].TaskData == nil {
			nts[i].TaskData = emptyData
		}
	}
	ts, err := taskstore.TasksOf(s.Insert(context.Background(), nts))
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func claim(t *testing.T, s *taskstore.Store, p taskstore.ClaimParams) []task.Task {
	t.Helper()
	if p.TTL == 0 {
		p.TTL = 30 * time.Second
	}
	ts, err := s.Claim(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func ids(ts []task.Task) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	slices.Sort(out)
	return out
}

// TestClaimTakesOnlyItsKindsAndQueues: a claim that names kinds and queues
// never takes a task of another, however long that one has waited; a claim
// that names none takes any.
func TestClaimTakesOnlyItsKindsAndQueues(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	old := time.Now().Add(-time.Hour)
	foreign := insert(t, s, taskstore.NewTask{Kind: "resize", ScheduledAt: old}, taskstore.NewTask{Kind: "email", Queue: "bulk", ScheduledAt: old})
	mine := insert(t, s, taskstore.NewTask{Kind: "email"}, taskstore.NewTask{Kind: "email"})

	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"a", "b", "c"}, Kinds: []string{"email"}, Queues: []string{task.DefaultQueue}})
	if !slices.Equal(ids(got), ids(mine)) {
		t.Fatalf("claim of email in the default queue took %v; want only %v", ids(got), ids(mine))
	}
	for _, tk := range got {
		if tk.Kind != "email" || tk.Queue != task.DefaultQueue || tk.State != task.StateRunning || tk.Fence == 0 {
			t.Errorf("claimed %+v", tk)
		}
	}
	if got := claim(t, s, taskstore.ClaimParams{Processors: []string{"d"}, Kinds: []string{"email", "report"}, Queues: []string{task.DefaultQueue}}); len(got) != 0 {
		t.Fatalf("took %+v; nothing of those kinds is left in the queue", got)
	}
	got = claim(t, s, taskstore.ClaimParams{Processors: []string{"e", "f", "g"}})
	if !slices.Equal(ids(got), ids(foreign)) {
		t.Fatalf("a claim of every kind and queue took %v; want %v", ids(got), ids(foreign))
	}
}

// TestClaimOrder: among the due tasks of the kinds and queues asked for, a
// claim takes the lowest (priority, scheduled_at, id), across kinds and
// queues; a task scheduled for later waits, whatever its priority.
func TestClaimOrder(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	base := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	at := func(sec int) time.Time { return base.Add(time.Duration(sec) * time.Second) }
	ts := insert(t, s,
		taskstore.NewTask{Kind: "a", Priority: 5, ScheduledAt: at(0)},                      // 0
		taskstore.NewTask{Kind: "b", Priority: -1, ScheduledAt: at(30)},                    // 1
		taskstore.NewTask{Kind: "a", Priority: 0, ScheduledAt: at(20)},                     // 2
		taskstore.NewTask{Kind: "b", Queue: "q", Priority: 0, ScheduledAt: at(10)},         // 3
		taskstore.NewTask{Kind: "a", Priority: 0, ScheduledAt: at(20)},                     // 4: same key as 2, greater id
		taskstore.NewTask{Kind: "a", Priority: -9, ScheduledAt: time.Now().Add(time.Hour)}, // 5: not due
		taskstore.NewTask{Kind: "b", Priority: 0, ScheduledAt: at(15)},                     // 6
	)
	want := []int64{ts[1].ID, ts[3].ID, ts[6].ID, ts[2].ID, ts[4].ID, ts[0].ID}
	var got []int64
	for i := range len(want) + 1 {
		c := claim(t, s, taskstore.ClaimParams{Processors: []string{fmt.Sprintf("w%d", i)}, Kinds: []string{"a", "b"}, Queues: []string{task.DefaultQueue, "q"}})
		if len(c) == 1 {
			got = append(got, c[0].ID)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claims took %v; want %v (lowest priority, then schedule, then id)", got, want)
	}
}

// TestClaimBatchTakesTheBest: a claim for n workers from several branches
// takes the n best tasks of them all, not n of each.
func TestClaimBatchTakesTheBest(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	base := time.Now().Add(-time.Hour)
	var nts []taskstore.NewTask
	for i := range 30 {
		// Kinds interleave in schedule order: a0 b1 c2 a3 b4 c5 ...
		nts = append(nts, taskstore.NewTask{Kind: string(rune('a' + i%3)), ScheduledAt: base.Add(time.Duration(i) * time.Second)})
	}
	ts := insert(t, s, nts...)
	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"1", "2", "3", "4", "5", "6", "7"}, Kinds: []string{"a", "b", "c"}})
	if want := ids(ts[:7]); !slices.Equal(ids(got), want) {
		t.Fatalf("claim of 7 from 3 kinds took %v; want the 7 oldest, %v", ids(got), want)
	}
	// The workers get them in order: processor i the i-th best.
	for i, tk := range got {
		if i > 0 && tk.ScheduledAt.Before(got[i-1].ScheduledAt) {
			t.Errorf("task %d (for %s) is older than task %d before it", tk.ID, tk.Processor, got[i-1].ID)
		}
	}
}

// TestUniqueKey: 50 concurrent inserts of one (kind, key) make one task,
// and every one of them answers with it; another kind may use the key; a
// cancelled task frees it.
func TestUniqueKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t).Pool
	s := taskstore.NewStore(pool)
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []taskstore.Inserted
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			ins, err := s.Insert(context.Background(), []taskstore.NewTask{{TaskData: emptyData, Kind: "invoice", UniqueKey: "2026-12"}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			results = append(results, ins...)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	inserted := 0
	for _, r := range results {
		if !r.Duplicate {
			inserted++
		}
		if r.Task.ID != results[0].Task.ID || r.Task.UniqueKey != "2026-12" {
			t.Errorf("an insert answered %+v; want task %d", r, results[0].Task.ID)
		}
	}
	var count int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM tasks`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if inserted != 1 || count != 1 || len(results) != n {
		t.Fatalf("%d inserts, %d said inserted, %d tasks in the table; want 1 task", len(results), inserted, count)
	}
	// Same key, another kind; and a batch that names the key twice.
	ins, err := s.Insert(context.Background(), []taskstore.NewTask{
		{TaskData: emptyData, Kind: "receipt", UniqueKey: "2026-12"},
		{TaskData: emptyData, Kind: "receipt", UniqueKey: "2026-12"},
		{TaskData: emptyData, Kind: "invoice", UniqueKey: "2026-12"},
		{TaskData: emptyData},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ins[0].Duplicate || !ins[1].Duplicate || ins[1].Task.ID != ins[0].Task.ID || !ins[2].Duplicate ||
		ins[2].Task.ID != results[0].Task.ID || ins[3].Duplicate || ins[3].Task.ID == 0 {
		t.Fatalf("batch: %+v", ins)
	}
	// A cancelled task frees its key; retrying it while another holds the
	// key is refused.
	if _, err := s.Cancel(context.Background(), results[0].Task.ID, "wrong month"); err != nil {
		t.Fatal(err)
	}
	again, err := s.Insert(context.Background(), []taskstore.NewTask{{TaskData: emptyData, Kind: "invoice", UniqueKey: "2026-12"}})
	if err != nil || again[0].Duplicate || again[0].Task.ID == results[0].Task.ID {
		t.Fatalf("insert after the cancellation: %+v, %v; want a new task", again, err)
	}
	if _, err := s.Retry(context.Background(), results[0].Task.ID); !errors.Is(err, task.ErrUniqueKeyTaken) {
		t.Fatalf("retry of the cancelled task whose key is taken: %v; want ErrUniqueKeyTaken", err)
	}
}

// TestCancelAndRetry: cancel takes pending and running tasks (a running
// one's lease is revoked, and its cancellation NOTIFYed with its id);
// retry puts dead and cancelled ones back with a fresh budget; each refuses
// the other states.
func TestCancelAndRetry(t *testing.T) {
	t.Parallel()
	tdb := pgtest.New(t)
	ctx := context.Background()
	s := taskstore.NewStore(tdb.Pool)
	listen, err := pgx.Connect(ctx, tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(ctx)
	if _, err := listen.Exec(ctx, "LISTEN leasehold_task"); err != nil {
		t.Fatal(err)
	}
	ts := insert(t, s, taskstore.NewTask{}, taskstore.NewTask{MaxAttempts: 1}, taskstore.NewTask{})
	pending, dying, running := ts[0], ts[1], ts[2]

	got, err := s.Cancel(ctx, pending.ID, "not needed")
	if err != nil || got.State != task.StateCancelled || got.LastError != "not needed" || got.ProcessedAt == nil {
		t.Fatalf("cancel of a pending task: %+v, %v", got, err)
	}
	if _, err := s.Cancel(ctx, pending.ID, "again"); !errors.Is(err, task.ErrNotCancellable) {
		t.Fatalf("cancel of a cancelled task: %v; want ErrNotCancellable", err)
	}
	if _, err := s.Cancel(ctx, 1<<40, "x"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("cancel of no task: %v; want ErrNotFound", err)
	}

	c := claim(t, s, taskstore.ClaimParams{Processors: []string{"w1", "w2"}})
	byID := map[int64]task.Task{}
	for _, tk := range c {
		byID[tk.ID] = tk
	}
	run := byID[running.ID]
	if _, err := s.Cancel(ctx, run.ID, "stop it"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heartbeat(ctx, run.ID, run.Processor, run.Fence); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("heartbeat of a cancelled task: %v; want ErrLeaseLost", err)
	}
	if _, err := s.Complete(ctx, run.ID, run.Processor, run.Fence, nil); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("completion of a cancelled task: %v; want ErrLeaseLost", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := listen.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no cancelled:%d notification: %v", run.ID, err)
		}
		if n.Payload == fmt.Sprintf("cancelled:%d", run.ID) {
			break
		}
	}
	stored, err := s.Get(ctx, run.ID)
	if err != nil || len(stored.EarlierAttempts) != 1 || stored.EarlierAttempts[0].Outcome != task.OutcomeCancelled ||
		stored.EarlierAttempts[0].Error != "stop it" || stored.EarlierAttempts[0].Fence != run.Fence {
		t.Fatalf("the cancelled task's history: %+v, %v", stored.EarlierAttempts, err)
	}

	dead := byID[dying.ID]
	if f, err := s.Fail(ctx, dead.ID, dead.Processor, dead.Fence, "boom", -1); err != nil || f.State != task.StateDead {
		t.Fatalf("fail of the last attempt: %+v, %v", f, err)
	}
	for _, id := range []int64{dead.ID, run.ID} {
		r, err := s.Retry(ctx, id)
		if err != nil || r.State != task.StatePending || r.Attempts != 0 || r.ProcessedAt != nil || r.ScheduledAt.After(time.Now().Add(time.Minute)) {
			t.Fatalf("retry of task %d: %+v, %v", id, r, err)
		}
	}
	if _, err := s.Retry(ctx, dead.ID); !errors.Is(err, task.ErrNotRetryable) {
		t.Fatalf("retry of a pending task: %v; want ErrNotRetryable", err)
	}
	if _, err := s.Retry(ctx, 1<<40); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("retry of no task: %v; want ErrNotFound", err)
	}
	again := claim(t, s, taskstore.ClaimParams{Processors: []string{"w3", "w4"}})
	if !slices.Equal(ids(again), []int64{dying.ID, running.ID}) {
		t.Fatalf("after the retries the claim took %v", ids(again))
	}
	for _, tk := range again {
		if tk.Attempts != 1 || tk.Fence <= run.Fence {
			t.Errorf("retried task claimed as %+v; want attempt 1 under a greater fence", tk)
		}
	}
}

// TestSnooze: a snoozed task goes back to pending, due after the delay,
// without counting the attempt; its history keeps it.
func TestSnooze(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	ctx := context.Background()
	insert(t, s, taskstore.NewTask{MaxAttempts: 1})
	c := claim(t, s, taskstore.ClaimParams{Processors: []string{"w"}})[0]
	got, err := s.Snooze(ctx, c.ID, c.Processor, c.Fence, time.Hour)
	if err != nil || got.State != task.StatePending || got.Attempts != 0 || got.ScheduledAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("snooze: %+v, %v", got, err)
	}
	if len(claim(t, s, taskstore.ClaimParams{Processors: []string{"w"}})) != 0 {
		t.Fatal("a snoozed task was claimed before its delay")
	}
	if _, err := s.Snooze(ctx, c.ID, c.Processor, c.Fence, time.Second); !errors.Is(err, task.ErrLeaseLost) {
		t.Fatalf("second snooze: %v; want ErrLeaseLost", err)
	}
	stored, _ := s.Get(ctx, c.ID)
	if len(stored.EarlierAttempts) != 1 || stored.EarlierAttempts[0].Outcome != task.OutcomeSnoozed {
		t.Fatalf("history %+v", stored.EarlierAttempts)
	}
}

// TestHints: a claim with a hint reads its branch from after the hint, so a
// task that sits before it (put back at its old schedule) waits for a claim
// without hints, which takes it.
func TestHints(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t).Pool
	s := taskstore.NewStore(pool)
	ts := insert(t, s, taskstore.NewTask{}, taskstore.NewTask{}, taskstore.NewTask{})
	first := claim(t, s, taskstore.ClaimParams{Processors: []string{"a", "b"}})
	hint := taskstore.HintOf(first[1])
	if first[0].ID != ts[0].ID || first[1].ID != ts[1].ID {
		t.Fatalf("claimed %v", ids(first))
	}
	// The first task's lease lapses, and it goes back to pending at its old
	// schedule, before the hint.
	if _, err := pool.Exec(context.Background(), `UPDATE tasks SET must_heartbeat_before = now() WHERE id = $1`, ts[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequeueLapsed(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	hinted := claim(t, s, taskstore.ClaimParams{Processors: []string{"c", "d"}, Hints: []taskstore.Hint{hint}})
	if !slices.Equal(ids(hinted), []int64{ts[2].ID}) {
		t.Fatalf("hinted claim took %v; want only the task after the hint, %d", ids(hinted), ts[2].ID)
	}
	full := claim(t, s, taskstore.ClaimParams{Processors: []string{"e"}})
	if !slices.Equal(ids(full), []int64{ts[0].ID}) {
		t.Fatalf("claim without hints took %v; want the task before the hint, %d", ids(full), ts[0].ID)
	}
}

// TestListFilters: the lists filter by state, kind and queue, in any
// combination, paged by id.
func TestListFilters(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	ctx := context.Background()
	ts := insert(t, s,
		taskstore.NewTask{Kind: "a"}, taskstore.NewTask{Kind: "b"}, taskstore.NewTask{Kind: "a", Queue: "q"},
		taskstore.NewTask{Kind: "b", Queue: "q"}, taskstore.NewTask{Kind: "a"})
	if _, err := s.Cancel(ctx, ts[4].ID, "x"); err != nil {
		t.Fatal(err)
	}
	list := func(p taskstore.ListParams) []int64 {
		t.Helper()
		if p.Limit == 0 {
			p.Limit = 100
		}
		got, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int64, len(got))
		for i, tk := range got {
			out[i] = tk.ID
		}
		return out
	}
	for name, c := range map[string]struct {
		p    taskstore.ListParams
		want []task.Task
	}{
		"all":              {taskstore.ListParams{}, ts},
		"kind":             {taskstore.ListParams{Kinds: []string{"a"}}, []task.Task{ts[0], ts[2], ts[4]}},
		"queue":            {taskstore.ListParams{Queues: []string{"q"}}, []task.Task{ts[2], ts[3]}},
		"state":            {taskstore.ListParams{States: []string{task.StateCancelled}}, []task.Task{ts[4]}},
		"kind and state":   {taskstore.ListParams{Kinds: []string{"a"}, States: []string{task.StatePending}}, []task.Task{ts[0], ts[2]}},
		"all three":        {taskstore.ListParams{Kinds: []string{"b"}, Queues: []string{"q"}, States: []string{task.StatePending}}, []task.Task{ts[3]}},
		"paged":            {taskstore.ListParams{Kinds: []string{"a"}, AfterID: ts[0].ID, Limit: 1}, []task.Task{ts[2]}},
		"no match":         {taskstore.ListParams{Kinds: []string{"zzz"}}, nil},
		"started, kind":    {taskstore.ListParams{Kinds: []string{"a"}, Started: true}, nil},
		"two states, kind": {taskstore.ListParams{Kinds: []string{"a"}, States: []string{task.StatePending, task.StateCancelled}}, []task.Task{ts[0], ts[2], ts[4]}},
	} {
		want := make([]int64, len(c.want))
		for i, tk := range c.want {
			want[i] = tk.ID
		}
		if got := list(c.p); !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", name, got, want)
		}
	}
}

// TestPendingByKind counts the pending tasks of each (queue, kind) with the
// oldest wait among the due ones.
func TestPendingByKind(t *testing.T) {
	t.Parallel()
	s := taskstore.NewStore(pgtest.New(t).Pool)
	insert(t, s, taskstore.NewTask{Kind: "a", ScheduledAt: time.Now().Add(-time.Hour)}, taskstore.NewTask{Kind: "a", Priority: 3},
		taskstore.NewTask{Kind: "b", Queue: "q", ScheduledAt: time.Now().Add(time.Hour)})
	got, err := s.PendingByKind(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Queue != task.DefaultQueue || got[0].Kind != "a" || got[0].Count != 2 ||
		got[0].OldestWait < 59*time.Minute || got[1].Kind != "b" || got[1].Count != 1 || got[1].OldestWait != 0 {
		t.Fatalf("pending by kind: %+v", got)
	}
}

// TestClaimIsIndexBound: with 10⁵ pending tasks of 20 kinds, a claim of
// one kind, of two, and of every kind reads a few entries of the claim
// index per task it takes, not the tasks of other kinds; a list of one kind
// reads its range of the filter index. (The bounds do not depend on the
// backlog: 10⁵ tells an index-bound claim from a scan as well as 10⁶ did,
// in a tenth of the time; the bench's backlog scenario runs millions.)
func TestClaimIsIndexBound(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 100,000 tasks")
	}
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	if _, err := tdb.Pool.Exec(ctx, `INSERT INTO tasks (task_data, kind, priority)
		SELECT '{}', 'kind' || (g % 20), (g % 3)::smallint FROM generate_series(1, 100000) AS g`); err != nil {
		t.Fatal(err)
	}
	tx, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a measurement: nothing to keep
	// The index entries this session's scans read (see
	// TestClaimWalksThePendingIndexInOrder).
	read := func(index string) int64 {
		t.Helper()
		var n int64
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_returned($1::regclass)`, index).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const take = 10
	workers := make([]string, take)
	for i := range workers {
		workers[i] = fmt.Sprintf("w%d", i)
	}
	for _, kinds := range [][]string{{"kind7"}, {"kind3", "kind7"}, nil} {
		before := read("tasks_claim_idx")
		claimed, err := db.New(tx).TaskClaim(ctx, db.TaskClaimParams{Processors: workers, TTLSeconds: 30, WantKinds: kinds})
		if err != nil || len(claimed) != take {
			t.Fatalf("claim of %v: %d tasks, %v", kinds, len(claimed), err)
		}
		n := read("tasks_claim_idx") - before
		for _, c := range claimed {
			if c.Priority != 0 || (kinds != nil && !slices.Contains(kinds, c.Kind)) {
				t.Fatalf("claim of %v took %+v; want priority 0 of those kinds", kinds, c)
			}
		}
		// Each branch (kind, priority) costs a probe or two to find, each
		// task taken an entry or two; merging the branches of one priority
		// reads up to take entries of each ahead, without locks.
		merged := max(len(kinds), 20*boolInt(kinds == nil))
		branches := 3 * merged
		if limit := int64(2*take + 4*branches + take*merged*boolInt(merged > 1)); n > limit {
			t.Errorf("the claim of %d tasks of %v read %d entries of the claim index (10⁵ pending); want at most %d", take, kinds, n, limit)
		}
		t.Logf("claim of %v: %d index entries read", kinds, n)
	}
	before := read("tasks_filter_idx")
	listed, err := db.New(tx).TaskList(ctx, db.TaskListParams{Kinds: []string{"kind11"}, RowLimit: 100})
	if err != nil || len(listed) != 100 {
		t.Fatalf("list: %d, %v", len(listed), err)
	}
	if n := read("tasks_filter_idx") - before; n > 300 {
		t.Errorf("a list of 100 tasks of one kind read %d entries of the filter index; want at most 300", n)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
