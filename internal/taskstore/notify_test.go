package taskstore_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// TestTaskNotifications: what each statement announces on leasehold_task,
// once per statement, and that task leases, which live in the task rows
// (schema/0009), send nothing to leasehold_lease.
func TestTaskNotifications(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	// Inserts notify only while someone waits for them (schema/0008), and
	// completions only while someone waits for every change (0009): this
	// session does.
	next := listen(t, tdb, true)

	data := []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`), MaxAttempts: 1}}
	if _, err := taskstore.TasksOf(s.Insert(ctx, data)); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("insert of 3: %q, want one %q", got, notify.TasksInserted)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/w1", "r/w2", "r/w3"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	got := next()
	if len(got) != 1 {
		t.Fatalf("claim of 3: %q, want one claimed:<ms> and no lease notification", got)
	}
	first := *claimed[0].MustHeartbeatBefore
	for _, c := range claimed {
		if c.MustHeartbeatBefore.Before(first) {
			first = *c.MustHeartbeatBefore
		}
	}
	if earliest, ok := notify.ParseClaimed(got[0]); !ok || earliest.After(first) || first.Sub(earliest) >= time.Millisecond {
		t.Fatalf("claim payload %q: earliest %v, want the earliest lease expiry %v to the millisecond", got[0], earliest, first)
	}
	if _, err := s.Heartbeat(ctx, claimed[0].ID, claimed[0].Processor, claimed[0].Fence); err != nil {
		t.Fatal(err)
	}
	if got := next(); len(got) != 0 {
		t.Fatalf("heartbeat: %q, want nothing", got)
	}
	if _, err := s.CompleteMany(ctx, []taskstore.Completion{
		{ID: claimed[0].ID, Processor: claimed[0].Processor, Fence: claimed[0].Fence},
		{ID: claimed[1].ID, Processor: claimed[1].Processor, Fence: claimed[1].Fence},
	}); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksFinished}) {
		t.Fatalf("completion of 2: %q, want one %q", got, notify.TasksFinished)
	}
	if _, err := s.Fail(ctx, claimed[2].ID, claimed[2].Processor, claimed[2].Fence, "boom", -1); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksFinished}) {
		t.Fatalf("a failure on the last attempt: %q, want %q", got, notify.TasksFinished)
	}
	more, err := taskstore.TasksOf(s.Insert(ctx, data[:1]))
	if err != nil {
		t.Fatal(err)
	}
	next()
	c, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/w1"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(c) != 1 || c[0].ID != more[0].ID {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	next()
	if _, err := s.Requeue(ctx, c[0].ID, c[0].Processor, c[0].Fence, "shutting down"); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksRequeued}) {
		t.Fatalf("requeue: %q, want %q", got, notify.TasksRequeued)
	}
	// A task lease's lapse, once the reaper's statement announces it, is a
	// requeue; nothing goes to the lease channel.
	if c, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/w1"}, TTL: 30 * time.Second, WithLapsed: true}); err != nil || len(c) != 1 {
		t.Fatalf("claim of the requeued task: %+v, %v", c, err)
	}
	next()
	if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET must_heartbeat_before = now() WHERE state = 'running'`); err != nil {
		t.Fatal(err)
	}
	next()
	if lapsed, err := s.RequeueLapsed(ctx, 10); err != nil || len(lapsed) != 1 {
		t.Fatalf("requeue lapsed: %+v, %v", lapsed, err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksRequeued}) {
		t.Fatalf("a task lease's lapse announced: %q, want %q", got, notify.TasksRequeued)
	}
}

// listen LISTENs on the task and lease channels on a session of its own,
// registered as a waiter for inserted tasks (for all changes with
// allChanges), and returns a function that returns the notifications of
// one statement, ended by a marker it sends after it. A lease
// notification is "lease".
func listen(t *testing.T, tdb pgtest.DB, allChanges bool) func() []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, "LISTEN leasehold_task; LISTEN leasehold_lease"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT task_waiter_register('task-notify-test', pg_backend_pid(), $1)", allChanges); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		t.Helper()
		if _, err := tdb.Pool.Exec(ctx, "SELECT pg_notify('leasehold_task', 'marker')"); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for notifications (have %q): %v", got, err)
			}
			if n.Payload == "marker" {
				return got
			}
			payload := n.Payload
			if n.Channel == notify.ChannelLease {
				payload = "lease"
			}
			got = append(got, payload)
		}
	}
}

// TestQuietClaimsAndCompletions: with no waiter for all changes (no
// dashboard), a claim announces its expiry only when no running task's
// lease runs out sooner (the reaper sleeps until that one), a completion
// announces nothing, and a requeue is always announced (schema/0009).
func TestQuietClaimsAndCompletions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := taskstore.NewStore(tdb.Pool)
	next := listen(t, tdb, false)
	data := make([]taskstore.NewTask, 4)
	for i := range data {
		data[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`)}
	}
	if _, err := taskstore.TasksOf(s.Insert(ctx, data)); err != nil {
		t.Fatal(err)
	}
	next()
	claimed := func(processor string, ttl time.Duration) task.Task {
		t.Helper()
		c, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{processor}, TTL: ttl, WithLapsed: true})
		if err != nil || len(c) != 1 {
			t.Fatalf("claim by %s: %+v, %v", processor, c, err)
		}
		return c[0]
	}
	isClaimed := func(p string) bool { _, ok := notify.ParseClaimed(p); return ok }

	first := claimed("r/w1", 30*time.Second)
	if got := next(); len(got) != 1 || !isClaimed(got[0]) {
		t.Fatalf("the first claim, nothing running: %q; want its expiry announced", got)
	}
	claimed("r/w2", 30*time.Second)
	if got := next(); len(got) != 0 {
		t.Fatalf("a claim that expires after a running task: %q; want nothing", got)
	}
	claimed("r/w3", 5*time.Second)
	if got := next(); len(got) != 1 || !isClaimed(got[0]) {
		t.Fatalf("a claim that expires before every running task: %q; want its expiry announced", got)
	}
	if _, err := s.Complete(ctx, first.ID, "r/w1", first.Fence, nil); err != nil {
		t.Fatal(err)
	}
	if got := next(); len(got) != 0 {
		t.Fatalf("a completion with no dashboard waiting: %q; want nothing", got)
	}

	// A claim in flight holds the lock K shared until it commits, and
	// NextLapse (the reaper) reads only after it: until then it says "look
	// again now".
	tx, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below; a failed test leaves it to roll back
	var late int64
	if err := tx.QueryRow(ctx, `
		WITH c AS (
			UPDATE tasks SET state = 'running', processor = 'r/w4', fence = nextval('lease_fence_seq'), ttl_seconds = 3600,
			                 attempts = attempts + 1, started_at = now(), must_heartbeat_before = now() + interval '1 hour'
			WHERE id = (SELECT id FROM tasks WHERE state = 'pending' ORDER BY id LIMIT 1)
			RETURNING id)
		SELECT id FROM c`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	var dbNow time.Time
	if err := tdb.Pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	lapse, err := s.NextLapse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lapse.After(dbNow.Add(5 * time.Second)) {
		t.Fatalf("NextLapse with a claim in flight: %v; want about now (%v), the claim not yet seen", lapse, dbNow)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := next(); len(got) != 0 {
		t.Fatalf("a claim expiring after running tasks: %q; want nothing", got)
	}
	lapse, err = s.NextLapse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	running, err := s.Running(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	earliest := *running[0].MustHeartbeatBefore
	for _, r := range running {
		if r.MustHeartbeatBefore.Before(earliest) {
			earliest = *r.MustHeartbeatBefore
		}
	}
	if !lapse.Equal(earliest) {
		t.Fatalf("NextLapse: %v; want the earliest running expiry %v", lapse, earliest)
	}

	r3 := running[slices.IndexFunc(running, func(r task.Task) bool { return r.Processor == "r/w3" })]
	if _, err := s.Requeue(ctx, r3.ID, "r/w3", r3.Fence, "shutting down"); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksRequeued}) {
		t.Fatalf("a requeue: %q; want %q", got, notify.TasksRequeued)
	}
}
