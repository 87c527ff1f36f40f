package hub_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

// TestHubWaitsWhileItHasClients: inserts notify only while someone waits
// (schema/0008). A hub without clients does not wait, so an insert tells
// nobody; with a client it is registered (under its LISTEN session) before
// the snapshot, and an insert reaches the client as a tasks message; once
// the last client has gone it unregisters.
func TestHubWaitsWhileItHasClients(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	r := startReplica(t, db, "replica-a", options{})
	r.waitListening(t)
	heard := observe(t, db)
	tasks := taskstore.NewStore(db.Pool)
	insert := func() {
		t.Helper()
		if _, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}})); err != nil {
			t.Fatal(err)
		}
	}
	hubRows := func() []int32 {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT pid FROM task_waiters WHERE waiter = 'replica-a/hub'`)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}

	insert()
	if got := heard(); len(got) != 0 || len(hubRows()) != 0 {
		t.Fatalf("with no client: the hub is registered %v, an insert sent %q; want neither", hubRows(), got)
	}

	conn, snap := connect(t, r)
	if snap.Tasks.Pending != 1 {
		t.Fatalf("snapshot pending %d, want 1", snap.Tasks.Pending)
	}
	pids := hubRows()
	if len(pids) != 1 {
		t.Fatalf("with a client: hub waiter rows %v, want one", pids)
	}
	var listening bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND query ILIKE 'listen%')`, pids[0]).Scan(&listening); err != nil || !listening {
		t.Fatalf("the hub's row names pid %d: a LISTEN session %v, %v; want the listener's", pids[0], listening, err)
	}
	insert()
	if got := heard(); !slices.Equal(got, []string{notify.TasksInserted}) {
		t.Fatalf("an insert while a client watches sent %q, want %q", got, notify.TasksInserted)
	}
	waitFor(t, conn, "a tasks message with the new task", func(m message) bool { return m.Type == "tasks" && m.Pending == 2 })

	conn.Close()
	for deadline := time.Now().Add(30 * time.Second); r.hub.Clients() > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the hub kept its client")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Still registered until its next read of the task state, which the
	// next insert brings about; then it unregisters.
	insert()
	for deadline := time.Now().Add(30 * time.Second); len(hubRows()) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the hub without clients stayed registered")
		}
		time.Sleep(5 * time.Millisecond)
	}
	heard()
	insert()
	if got := heard(); len(got) != 0 {
		t.Fatalf("an insert after the last client left sent %q, want nothing", got)
	}
}

// observe LISTENs on leasehold_task with a session of the test's and
// returns a function that gives the "inserted" notifications that arrived
// since its last call, ended by a fence notification it sends:
// notifications arrive in commit order.
func observe(t *testing.T, db pgtest.DB) func() []string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(t.Context(), "LISTEN leasehold_task"); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		t.Helper()
		if _, err := db.Pool.Exec(t.Context(), "SELECT pg_notify('leasehold_task', 'fence')"); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for the fence (have %q): %v", got, err)
			}
			switch n.Payload {
			case "fence":
				return got
			case notify.TasksInserted:
				got = append(got, n.Payload)
			}
		}
	}
}
