package hub_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
)

// scheduleMsg matches the schedule message of kind about name.
func scheduleMsg(kind, name string) func(message) bool {
	return func(m message) bool {
		return m.Type == "schedule" && m.Kind == kind && m.Name != nil && *m.Name == name
	}
}

// anySchedule matches the schedule message that stands for every schedule.
func anySchedule(m message) bool {
	return m.Type == "schedule" && m.Kind == "changed" && m.Name == nil
}

// runScheduler runs an elected scheduler on r's listener until the test
// ends.
func runScheduler(t *testing.T, db pgtest.DB, r *replica, name string) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&scheduler.Scheduler{
			Store: schedulestore.NewStore(db.Pool), Leases: leasestore.NewStore(db.Pool), Listener: r.listener,
			Instance: name, Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop(),
		}).Run(ctx)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
}

// TestScheduleMessages: a schedule added, ticked and removed is a schedule
// message of each kind with its name, on every replica alike (they come
// from NOTIFY, whichever replica's scheduler made the tick).
func TestScheduleMessages(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	a := startReplica(t, db, "replica-a", options{})
	b := startReplica(t, db, "replica-b", options{})
	connA, _ := connect(t, a)
	connB, _ := connect(t, b)
	both := func(what string, ok func(message) bool) {
		t.Helper()
		for i, conn := range []*websocket.Conn{connA, connB} {
			m := waitFor(t, conn, what, ok)
			var shape map[string]json.RawMessage
			if err := json.Unmarshal(m.raw, &shape); err != nil || len(shape) != 3 {
				t.Errorf("replica %c: %s: %s, want type, kind and name only", 'a'+i, what, m.raw)
			}
		}
	}

	// A name with a colon: the payload is "<kind>:<name>".
	const name = "report:nightly"
	store := schedulestore.NewStore(db.Pool)
	if _, _, err := store.Create(t.Context(), schedule.Params{Name: name, Cron: "@every 1s", Kind: "report.render"}); err != nil {
		t.Fatal(err)
	}
	both("the schedule added", scheduleMsg("changed", name))

	// Only replica b runs a scheduler; a streams its ticks all the same.
	runScheduler(t, db, b, "replica-b")
	both("a tick", scheduleMsg("ticked", name))

	if _, err := store.Delete(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	both("the schedule removed", scheduleMsg("changed", name))
}

// TestScheduleChangeWhileDisconnected: a schedule added while the hub's
// LISTEN connection is down has its notification lost; once the listener
// is back the hub says that any schedule may have changed.
func TestScheduleChangeWhileDisconnected(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var cut atomic.Bool
	reconnect := make(chan struct{})
	r := startReplica(t, db, "replica-a", options{connect: func(ctx context.Context) (*pgx.Conn, error) {
		if cut.Load() {
			select { // held down until the test has made its change
			case <-reconnect:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return pgx.Connect(ctx, db.URL)
	}})
	r.waitListening(t)
	conn, _ := connect(t, r)
	store := schedulestore.NewStore(db.Pool)
	// A change streamed by name: the catch-up after the first connection
	// is behind it.
	if _, _, err := store.Create(t.Context(), schedule.Params{Name: "before", Cron: "@daily", Kind: "report.render"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "the schedule added before the cut", scheduleMsg("changed", "before"))

	// With a client, the hub waits for task changes, registered under its
	// LISTEN session: cut that session.
	cut.Store(true)
	var killed int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM task_waiters
		WHERE waiter = 'replica-a/hub'`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends, %v; want 1", killed, err)
	}
	for deadline := time.Now().Add(30 * time.Second); r.listener.Connected(); {
		if time.Now().After(deadline) {
			t.Fatal("the listener never noticed its connection was cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, _, err := store.Create(t.Context(), schedule.Params{Name: "missed", Cron: "@daily", Kind: "report.render"}); err != nil {
		t.Fatal(err)
	}
	close(reconnect)
	waitFor(t, conn, "a schedule message for any schedule", anySchedule)
}
