package task_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/pgtest"
	"github.com/leasehold/leasehold/internal/task"
)

// TestTaskNotifications: what each statement announces on leasehold_task,
// once per statement, and that task leases announce only their expiry on
// leasehold_lease (schema/0006).
func TestTaskNotifications(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	s := task.NewStore(tdb.Pool)
	conn, err := pgx.Connect(ctx, tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN leasehold_task; LISTEN leasehold_lease"); err != nil {
		t.Fatal(err)
	}
	// Inserts notify only while someone waits for them (schema/0008): this
	// session does.
	if _, err := conn.Exec(ctx, "SELECT task_waiter_register('task-notify-test', pg_backend_pid())"); err != nil {
		t.Fatal(err)
	}
	// next returns the notifications of one statement, ended by a marker
	// sent after it.
	next := func() []string {
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

	data := []task.NewTask{{TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`)}, {TaskData: json.RawMessage(`{}`), MaxAttempts: 1}}
	if _, err := s.Insert(ctx, data); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("insert of 3: %q, want one %q", got, notify.TasksInserted)
	}
	claimed, err := s.Claim(ctx, []string{"r/w1", "r/w2", "r/w3"}, 30*time.Second)
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
	if _, err := s.Heartbeat(ctx, claimed[0].ID, *claimed[0].Processor, *claimed[0].Fence); err != nil {
		t.Fatal(err)
	}
	if got := next(); len(got) != 0 {
		t.Fatalf("heartbeat: %q, want nothing", got)
	}
	if _, err := s.CompleteMany(ctx, []task.Completion{
		{ID: claimed[0].ID, Processor: *claimed[0].Processor, Fence: *claimed[0].Fence},
		{ID: claimed[1].ID, Processor: *claimed[1].Processor, Fence: *claimed[1].Fence},
	}); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksFinished}) {
		t.Fatalf("completion of 2: %q, want one %q", got, notify.TasksFinished)
	}
	if _, err := s.Fail(ctx, claimed[2].ID, *claimed[2].Processor, *claimed[2].Fence, "boom"); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksFinished}) {
		t.Fatalf("a failure on the last attempt: %q, want %q", got, notify.TasksFinished)
	}
	more, err := s.Insert(ctx, data[:1])
	if err != nil {
		t.Fatal(err)
	}
	next()
	c, err := s.Claim(ctx, []string{"r/w1"}, 30*time.Second)
	if err != nil || len(c) != 1 || c[0].ID != more[0].ID {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	next()
	if _, err := s.Requeue(ctx, c[0].ID, *c[0].Processor, *c[0].Fence, "shutting down"); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{notify.TasksRequeued}) {
		t.Fatalf("requeue: %q, want %q", got, notify.TasksRequeued)
	}
	// An expiry of a task lease is announced on the lease channel.
	if c, err := s.Claim(ctx, []string{"r/w1"}, 30*time.Second); err != nil || len(c) != 1 {
		t.Fatalf("claim of the requeued task: %+v, %v", c, err)
	}
	next()
	if _, err := tdb.Pool.Exec(ctx, `UPDATE leases SET expired_at = now() WHERE resource LIKE 'task:%' AND expired_at IS NULL AND released_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	if got := next(); len(got) == 0 || !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "lease") }) {
		t.Fatalf("a task lease's expiry marked: %q, want a lease notification", got)
	}
}
