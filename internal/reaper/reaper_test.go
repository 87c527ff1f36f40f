package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startListener(ctx context.Context, t *testing.T, wg *sync.WaitGroup, url string) *notify.Listener {
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) },
		zerolog.Nop(), notify.ChannelLease)
	wg.Go(func() {
		if err := l.Run(ctx); err != nil {
			t.Errorf("listener: %v", err)
		}
	})
	return l
}

// observe returns the lease notifications an outside observer receives
// from the moment it returns: it waits until its LISTEN is in place.
func observe(ctx context.Context, t *testing.T, wg *sync.WaitGroup, url string) <-chan leasestore.Change {
	t.Helper()
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) },
		zerolog.Nop(), notify.ChannelLease)
	sub := l.Subscribe(notify.ChannelLease, 1024)
	wg.Go(func() { _ = l.Run(ctx) })
	select {
	case <-sub.Resync(): // connected and listening
	case <-time.After(testkit.Patience):
		t.Fatal("the observer never connected")
	}
	out := make(chan leasestore.Change, 1024)
	wg.Go(func() {
		defer sub.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case n := <-sub.C():
				c, err := leasestore.ParseChange(n.Payload)
				if err != nil {
					t.Errorf("bad payload: %v", err)
					return
				}
				out <- c
			}
		}
	})
	return out
}

func waitChange(t *testing.T, c <-chan leasestore.Change, match func(leasestore.Change) bool, what string) leasestore.Change {
	t.Helper()
	deadline := time.After(testkit.Patience) // keeps a broken test from hanging; asserts no speed
	for {
		select {
		case ch := <-c:
			if match(ch) {
				return ch
			}
		case <-deadline:
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestExpiryIsAnnounced: with a reaper running, every lease that runs out
// is announced by NOTIFY and recorded as an "expired" event within 1 s of
// its expires_at; a renewed lease is not announced; the expired lease can
// be taken over with a higher fence and cannot be renewed by its old holder.
func TestExpiryIsAnnounced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	got := observe(ctx, t, &wg, tdb.URL)

	var lagMu sync.Mutex
	var lags []time.Duration
	r := &reaper.Reaper{
		Store: store, Listener: startListener(ctx, t, &wg, tdb.URL), Instance: "reaper-1",
		Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop(),
		Marked: func(_ string, lag time.Duration) { lagMu.Lock(); lags = append(lags, lag); lagMu.Unlock() },
	}
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("reaper: %v", err)
		}
	})
	waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == reaper.Resource && c.Kind == "acquired" }, "the reaper's election")

	// Leases with staggered TTLs; "kept" is renewed and must not expire.
	const n = 6
	for i := range n {
		if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: fmt.Sprintf("job:%d", i), Holder: "w", TTL: time.Duration(1+i%3) * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	// Renewed after each expiry, which come within 3 s of each other: a TTL
	// a loaded machine's stall does not outlast.
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "kept", Holder: "w", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	expired := map[string]bool{}
	for len(expired) < n {
		c := waitChange(t, got, func(c leasestore.Change) bool { return c.Kind == "expired" }, "expiries")
		if c.Resource == "kept" {
			t.Fatal("the renewed lease was announced expired")
		}
		// How late was it announced, by the database clock (the expired
		// event's own time, not this test's read)?
		var late time.Duration
		if err := tdb.Pool.QueryRow(ctx, `SELECT at - expires_at FROM lease_events WHERE lease_id = $1 AND kind = 'expired' ORDER BY id DESC LIMIT 1`, c.ID).Scan(&late); err != nil {
			t.Fatal(err)
		}
		if late >= testkit.Bound(time.Second) || late < 0 {
			t.Errorf("%s: announced %s after its expires_at; want within %s (1 s, with the test's slack)", c.Resource, late, testkit.Bound(time.Second))
		}
		expired[c.Resource] = true
		if _, err := store.Renew(ctx, lease.RenewParams{Resource: "kept", Holder: "w"}); err != nil {
			t.Fatalf("renew kept: %v", err)
		}
	}
	var worst time.Duration
	if err := tdb.Pool.QueryRow(ctx, `SELECT max(at - expires_at) FROM lease_events WHERE kind = 'expired'`).Scan(&worst); err != nil {
		t.Fatal(err)
	}
	if worst >= testkit.Bound(time.Second) {
		t.Errorf("an expired event was recorded %s after its expires_at; want within %s (1 s, with the test's slack)", worst, testkit.Bound(time.Second))
	}
	lagMu.Lock()
	t.Logf("announce lags by the database clock: %v", lags)
	lagMu.Unlock()

	if _, err := store.Renew(ctx, lease.RenewParams{Resource: "job:0", Holder: "w"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew after expiry: got %v, want ErrNotHeld", err)
	}
	acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: "job:0", Holder: "x", TTL: time.Minute})
	if err != nil || !acq.New {
		t.Fatalf("takeover after expiry: %+v, %v", acq, err)
	}
}

// TestOneReaperAtATime runs three reapers: one is elected; when it stops,
// it releases its lease and another takes over without waiting for a TTL.
func TestOneReaperAtATime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	got := observe(ctx, t, &wg, tdb.URL)

	stops := map[string]context.CancelFunc{}
	var rwg sync.WaitGroup
	for i := range 3 {
		rctx, stop := context.WithCancel(ctx)
		name := fmt.Sprintf("reaper-%d", i)
		stops[name] = stop
		r := &reaper.Reaper{
			Store: store, Listener: startListener(rctx, t, &rwg, tdb.URL), Instance: name,
			Keep: lease.KeepConfig{TTL: 30 * time.Second}, Log: zerolog.Nop(),
		}
		rwg.Go(func() { _ = r.Run(rctx) })
	}
	isReaper := func(kind string) func(leasestore.Change) bool {
		return func(c leasestore.Change) bool { return c.Resource == reaper.Resource && c.Kind == kind }
	}
	first := waitChange(t, got, isReaper("acquired"), "the first election")
	l, err := store.Get(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	stops[l.Holder]()
	waitChange(t, got, isReaper("released"), "the first reaper's release")
	second := waitChange(t, got, isReaper("acquired"), "the second election")
	if second.Fence <= first.Fence {
		t.Fatalf("second reaper's fence %d not above %d", second.Fence, first.Fence)
	}
	l2, err := store.Get(ctx, second.ID)
	if err != nil || l2.Holder == l.Holder {
		t.Fatalf("second reaper is %q (%v); want another than %q", l2.Holder, err, l.Holder)
	}
	cancel()
	rwg.Wait()
	// Every reaper stopped: none holds the lease, and the history never
	// shows two at once.
	final, _ := store.Get(context.Background(), second.ID)
	if final.State == lease.StateActive {
		t.Fatalf("reaper lease still active after every reaper stopped: %+v", final)
	}
	events, _ := store.Events(context.Background(), lease.EventsParams{Resource: reaper.Resource, Limit: 1000})
	var holding int
	for _, e := range events {
		switch e.Kind {
		case "acquired":
			holding++
		case "released", "expired":
			holding--
		}
		if holding > 1 {
			t.Fatalf("two reapers held the lease at event %d", e.ID)
		}
	}
}

// TestClaimedTaskLeaseExpiryIsAnnounced: a task's lease lives in its row,
// and claims announce only their earliest expiry, once per statement, on
// leasehold_task. A reaper asleep until a far expiry must wake for a
// claimed task's lease that runs out sooner, told by that notification
// alone, and put the task back to pending: which NOTIFYs "requeued", the
// workers' wake-up.
func TestClaimedTaskLeaseExpiryIsAnnounced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	got := observe(ctx, t, &wg, tdb.URL)
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, tdb.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask)
	taskSub := l.Subscribe(notify.ChannelTask, 64)
	defer taskSub.Close()
	wg.Go(func() { _ = l.Run(ctx) })
	marked := make(chan string, 16)
	r := &reaper.Reaper{
		Store: store, Tasks: tasks, Listener: l, Instance: "reaper-1", Keep: lease.KeepConfig{TTL: time.Hour}, Log: zerolog.Nop(),
		Marked: func(resource string, _ time.Duration) { marked <- resource },
	}
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("reaper: %v", err)
		}
	})
	// The reaper's own lease (an hour) is the only one due: it sleeps until
	// about then after its first pass.
	waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == reaper.Resource && c.Kind == "acquired" }, "the reaper's election")
	if _, err := taskstore.TasksOf(tasks.Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}})); err != nil {
		t.Fatal(err)
	}
	claimed, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"w/1"}, TTL: time.Second, WithLapsed: true})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	for requeued := false; !requeued; {
		select {
		case n := <-taskSub.C():
			requeued = n.Payload == notify.TasksRequeued
		case <-time.After(testkit.Patience):
			t.Fatal("no requeued notification for the task whose lease lapsed")
		}
	}
	got1, err := tasks.Get(ctx, claimed[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got1.State != task.StatePending || got1.MustHeartbeatBefore != nil {
		t.Fatalf("after its lease lapsed the task is %s (must_heartbeat_before %v); want pending, no lease", got1.State, got1.MustHeartbeatBefore)
	}
	if m := <-marked; m != taskstore.LeaseResource(claimed[0].ID) {
		t.Errorf("the reaper reported %q as announced; want %q", m, taskstore.LeaseResource(claimed[0].ID))
	}
	var late time.Duration
	var outcome string
	if err := tdb.Pool.QueryRow(ctx, `
		SELECT (a->>'ended_at')::timestamptz - (a->>'expires_at')::timestamptz, a->>'outcome'
		FROM tasks, jsonb_array_elements(earlier_attempts) AS a WHERE id = $1`, claimed[0].ID).Scan(&late, &outcome); err != nil {
		t.Fatal(err)
	}
	if outcome != task.OutcomeExpired {
		t.Errorf("the lapsed attempt is recorded as %q; want %q", outcome, task.OutcomeExpired)
	}
	if late >= testkit.Bound(time.Second) || late < 0 {
		t.Errorf("the task lease's lapse was announced %s after it ran out; want within %s (1 s, with the test's slack)", late, testkit.Bound(time.Second))
	}
}

// TestExpiryIsAnnouncedWhileDeaf: a reaper whose LISTEN connection is
// down hears of no new lease, yet announces one that expires long before
// anything it knew of (its own lease) within 1 s of its expires_at.
func TestExpiryIsAnnouncedWhileDeaf(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	got := observe(ctx, t, &wg, tdb.URL)
	deaf := notify.New(func(context.Context) (*pgx.Conn, error) {
		return nil, errors.New("the database cannot be reached (on purpose)")
	},
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask)
	wg.Go(func() { _ = deaf.Run(ctx) })
	r := &reaper.Reaper{
		Store: store, Listener: deaf, Instance: "reaper-1",
		// Its own lease is the earliest expiry it knows of, renewed long
		// before it is due.
		Keep: lease.KeepConfig{TTL: time.Minute}, Log: zerolog.Nop(),
	}
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("reaper: %v", err)
		}
	})
	waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == reaper.Resource && c.Kind == "acquired" }, "the reaper's election")
	// Once a first lease is announced, the reaper has passed with nothing
	// due before its own lease's expiry.
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "first", Holder: "w", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == "first" && c.Kind == "expired" }, "the expiry of the first lease")
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "unheard", Holder: "w", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	c := waitChange(t, got, func(c leasestore.Change) bool { return c.Resource == "unheard" && c.Kind == "expired" }, "the expiry of the unheard lease")
	var late time.Duration
	if err := tdb.Pool.QueryRow(ctx, `SELECT at - expires_at FROM lease_events WHERE lease_id = $1 AND kind = 'expired'`, c.ID).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if late >= testkit.Bound(time.Second) || late < 0 {
		t.Errorf("announced %s after its expires_at; want within %s (1 s, with the test's slack)", late, testkit.Bound(time.Second))
	}
}
