package hub_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// findLimit is the limit of key among ls, and whether there is one.
func findLimit(ls []lease.Limit, key string) (lease.Limit, bool) {
	i := slices.IndexFunc(ls, func(l lease.Limit) bool { return l.Resource == key })
	if i < 0 {
		return lease.Limit{}, false
	}
	return ls[i], true
}

// pausedNames is the queues of ps, in the message's order.
func pausedNames(ps []task.QueuePause) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Queue
	}
	return names
}

// TestFlowControlInTasks: the snapshot and the tasks messages carry each
// limited key (its slots, the slots held, the tasks waiting, its rate,
// spent and next) and the queues paused now; the messages follow a resume
// (which notifies), a pause and a limit set while no task waits (which do
// not: the tasks message is refreshed while clients watch), and a slot
// freed by a holder that is not a task.
func TestFlowControlInTasks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	leases, tasks := leasestore.NewStore(db.Pool), taskstore.NewStore(db.Pool)
	const key, queue = "imports:acme", "imports"
	if _, err := leases.SetLimit(ctx, key, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.SetRate(ctx, key, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.SetLimit(ctx, "exports", 2); err != nil {
		t.Fatal(err)
	}
	var nts []taskstore.NewTask
	for range 3 {
		nts = append(nts, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Kind: "import", Queue: queue, Lock: key, LockLimit: 3})
	}
	if _, err := taskstore.TasksOf(tasks.Insert(ctx, nts)); err != nil {
		t.Fatal(err)
	}
	// One slot held by a program, one by a running task, whose start
	// spends the rate of one an hour.
	held, err := leases.Acquire(ctx, lease.AcquireParams{Resource: key, Holder: "exec-1", TTL: time.Minute, Slots: 3})
	if err != nil {
		t.Fatal(err)
	}
	beforeStart := time.Now()
	claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w1"}, TTL: time.Minute, Kinds: []string{"import"}})
	afterStart := time.Now()
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d tasks, %v; want one", len(claimed), err)
	}
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := tasks.PauseQueue(ctx, queue, until, "importer bug"); err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.PauseQueue(ctx, "reports", time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	// A pause whose until has passed is over.
	if _, err := tasks.PauseQueue(ctx, "over", time.Now().Add(-time.Minute), "done with"); err != nil {
		t.Fatal(err)
	}

	r := startReplica(t, db, "replica-a", options{})
	conn, snap := connect(t, r)
	var shape struct{ Tasks map[string]json.RawMessage }
	if err := json.Unmarshal(snap.raw, &shape); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"limits", "paused_queues"} {
		if _, ok := shape.Tasks[k]; !ok {
			t.Errorf("snapshot tasks has no %q: %s", k, snap.raw)
		}
	}
	ls := snap.Tasks.Limits
	if got := len(ls); got != 2 || ls[0].Resource != "exports" || ls[1].Resource != key {
		t.Fatalf("snapshot limits %+v, want exports and %s in name order", ls, key)
	}
	if l := ls[0]; l.Slots != 2 || l.Held != 0 || l.Waiting != 0 || l.RateStarts != 0 || l.RatePeriod != 0 || l.RateNextAt != nil {
		t.Errorf("exports %+v, want 2 slots, none held, none waiting, no rate", l)
	}
	l := ls[1]
	if l.Slots != 3 || l.Held != 2 || l.Waiting != 2 || l.RateStarts != 1 || l.RatePeriod != time.Hour || l.RateSpent != 1 {
		t.Errorf("%s %+v, want 3 slots, 2 held, 2 waiting, a rate of 1 an hour spent", key, l)
	}
	// The next start is an hour after the one start, which the database
	// stamped between two readings of the clock it shares with this test
	// (to the millisecond, as the API writes times).
	lo, hi := beforeStart.Add(time.Hour-time.Millisecond), afterStart.Add(time.Hour+time.Millisecond)
	if l.RateNextAt == nil || l.RateNextAt.Before(lo) || l.RateNextAt.After(hi) {
		t.Errorf("%s next start %v, want between %v and %v", key, l.RateNextAt, lo, hi)
	}
	ps := snap.Tasks.PausedQueues
	if got := pausedNames(ps); !slices.Equal(got, []string{queue, "reports"}) {
		t.Fatalf("snapshot paused_queues %v, want [%s reports] (the pause that is over left out)", got, queue)
	}
	if p := ps[0]; p.Reason != "importer bug" || p.Until == nil || !p.Until.Equal(until) || p.PausedAt.IsZero() {
		t.Errorf("pause of %s %+v, want the reason and until %v", queue, p, until)
	}
	if p := ps[1]; p.Reason != "" || p.Until != nil {
		t.Errorf("pause of reports %+v, want no reason and no until", p)
	}

	// Resuming notifies; the tasks message shows the queue resumed.
	if ok, err := tasks.ResumeQueue(ctx, queue); err != nil || !ok {
		t.Fatalf("resume %s: %v, %v", queue, ok, err)
	}
	waitFor(t, conn, "a tasks message without the resumed queue", func(m message) bool {
		return m.Type == "tasks" && slices.Equal(pausedNames(m.PausedQueues), []string{"reports"})
	})
	// Pausing notifies nothing, nor does a limit set while no task waits
	// on its key: the refresh brings them.
	if _, err := tasks.PauseQueue(ctx, "mail", time.Time{}, "bounces"); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.SetLimit(ctx, "exports", 5); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "a tasks message with the paused mail queue and the raised limit", func(m message) bool {
		l, ok := findLimit(m.Limits, "exports")
		return m.Type == "tasks" && slices.Equal(pausedNames(m.PausedQueues), []string{"mail", "reports"}) && ok && l.Slots == 5
	})
	// A slot freed by its holder.
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: held.Lease.Resource, Holder: "exec-1", Fence: held.Lease.Fence}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "a tasks message with one slot held", func(m message) bool {
		l, ok := findLimit(m.Limits, key)
		return m.Type == "tasks" && ok && l.Held == 1 && l.Waiting == 2
	})
}

// TestFlowControlBounded: a snapshot carries the first 100 limited keys
// and the first 100 paused queues by name, however many there are.
func TestFlowControlBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	leases, tasks := leasestore.NewStore(db.Pool), taskstore.NewStore(db.Pool)
	const n = 101
	for i := range n {
		if _, err := leases.SetLimit(ctx, fmt.Sprintf("key-%03d", i), 1); err != nil {
			t.Fatal(err)
		}
		if _, err := tasks.PauseQueue(ctx, fmt.Sprintf("queue-%03d", i), time.Time{}, ""); err != nil {
			t.Fatal(err)
		}
	}
	r := startReplica(t, db, "replica-a", options{})
	_, snap := connect(t, r)
	ls, ps := snap.Tasks.Limits, snap.Tasks.PausedQueues
	if len(ls) != 100 || ls[0].Resource != "key-000" || ls[99].Resource != "key-099" {
		t.Errorf("snapshot limits: %d from %v, want 100 from key-000 to key-099", len(ls), ls[:min(len(ls), 1)])
	}
	if len(ps) != 100 || ps[0].Queue != "queue-000" || ps[99].Queue != "queue-099" {
		t.Errorf("snapshot paused_queues: %d, want 100 from queue-000 to queue-099", len(ps))
	}
}
