package demo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// giveUp keeps a broken test from hanging; it asserts no speed.
const giveUp = 60 * time.Second

// The kinds of event the generators' hooks record.
const (
	kindObserved = "observed"
	kindInserted = "inserted"
	kindFailed   = "failed"
)

// event is one call of a generator's hook.
type event struct {
	instance string
	kind     string
	status   demo.Status // observed
	task     task.Task   // inserted
	fence    int64       // of the generator lease it was inserted under
	err      error       // failed
}

// recorder keeps every hook call of every generator in a test, in order,
// without ever blocking a generator.
type recorder struct {
	mu   sync.Mutex
	evs  []event
	wake chan struct{} // closed and replaced on every add
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{})} }

func (r *recorder) add(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
	close(r.wake)
	r.wake = make(chan struct{})
}

// mark is the position of the next event to be recorded.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

// between returns a copy of the events in [from, to).
func (r *recorder) between(from, to int) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs[from:to])
}

// await returns the first event at position from or later that matches,
// and the position after it.
func (r *recorder) await(t *testing.T, from int, what string, match func(event) bool) (event, int) {
	t.Helper()
	deadline := time.NewTimer(giveUp)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for ; from < len(r.evs); from++ {
			if e := r.evs[from]; match(e) {
				r.mu.Unlock()
				return e, from + 1
			}
		}
		wake := r.wake
		r.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func inserted(e event) bool { return e.kind == kindInserted }

func insertedNotBy(instance string) func(event) bool {
	return func(e event) bool { return e.kind == kindInserted && e.instance != instance }
}

// cluster is one test database and the replicas running generators on it.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	db     pgtest.DB
	state  *demo.State
	tasks  *taskstore.Store
	leases *leasestore.Store
	rec    *recorder
	wg     sync.WaitGroup
}

// replica is one generator with its own listener, as in one process.
type replica struct {
	name string
	stop context.CancelFunc
	done chan struct{} // closed when the generator and its listener have returned
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	tdb := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{
		t: t, ctx: ctx, db: tdb, rec: newRecorder(),
		state: demo.NewState(tdb.Pool), tasks: taskstore.NewStore(tdb.Pool), leases: leasestore.NewStore(tdb.Pool),
	}
	// Registered after pgtest's: every replica has stopped before the
	// database is dropped.
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return c
}

// start runs a generator named name; configure, if given, changes it
// before it starts.
func (c *cluster) start(name string, configure func(g *demo.Generator)) *replica {
	c.t.Helper()
	ctx, stop := context.WithCancel(c.ctx)
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, c.db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelGenerator)
	g := &demo.Generator{
		State: c.state, Tasks: c.tasks, Leases: c.leases, Listener: listener, Instance: name,
		Keep:     lease.KeepConfig{TTL: 5 * time.Second},
		Rate:     50,
		MinSleep: 1500 * time.Millisecond, MaxSleep: 2500 * time.Millisecond,
		Log:      zerolog.New(zerolog.NewTestWriter(c.t)).Level(zerolog.InfoLevel).With().Str("instance", name).Logger(),
		Observed: func(s demo.Status) { c.rec.add(event{instance: name, kind: kindObserved, status: s}) },
		Inserted: func(tk task.Task, fence int64) {
			c.rec.add(event{instance: name, kind: kindInserted, task: tk, fence: fence})
		},
		InsertFailed: func(err error) {
			c.rec.add(event{instance: name, kind: kindFailed, err: err})
		},
	}
	if configure != nil {
		configure(g)
	}
	r := &replica{name: name, stop: stop, done: make(chan struct{})}
	var rwg sync.WaitGroup
	rwg.Go(func() {
		if err := listener.Run(ctx); err != nil {
			c.t.Errorf("%s: listener: %v", name, err)
		}
	})
	rwg.Go(func() {
		if err := g.Run(ctx); err != nil {
			c.t.Errorf("%s: generator: %v", name, err)
		}
	})
	c.wg.Go(func() { rwg.Wait(); close(r.done) })
	return r
}

// halt stops the replica cleanly (as on SIGTERM) and waits until it has.
func (c *cluster) halt(r *replica) {
	c.t.Helper()
	r.stop()
	select {
	case <-r.done:
	case <-time.After(giveUp):
		c.t.Fatalf("%s did not stop", r.name)
	}
}

func (c *cluster) set(started bool, by string) {
	c.t.Helper()
	if err := c.state.Set(c.ctx, started, by); err != nil {
		c.t.Fatal(err)
	}
}

// countFence counts the tasks inserted under fence.
func (c *cluster) countFence(fence int64) int {
	c.t.Helper()
	var n int
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT count(*) FROM tasks WHERE generator_fence = $1`, fence).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// refuseStale checks that a stale holder's fenced insert is refused and
// inserts nothing, while the generator is started.
func (c *cluster) refuseStale(holder string, fence int64) {
	c.t.Helper()
	before := c.countFence(fence)
	got, err := c.tasks.InsertGenerated(c.ctx, holder, fence, []json.RawMessage{json.RawMessage(`{"sleep_duration_seconds":1}`)})
	if !errors.Is(err, taskstore.ErrNotGenerator) || len(got) != 0 {
		c.t.Errorf("insert by the stale holder %s with fence %d: got %v, %v; want ErrNotGenerator", holder, fence, got, err)
	}
	if after := c.countFence(fence); after != before {
		c.t.Errorf("the refused insert changed the tasks of fence %d: %d, then %d", fence, before, after)
	}
}

// holding is one acquisition of the generator lease, from the history.
type holding struct {
	holder     string
	fence      int64
	start, end time.Time // [acquired, min(released, last expires_at))
	released   bool
	// expiresBeforeRelease is the expires_at of the last acquired or
	// renewed event: when the lease would have run out had it not been released.
	expiresBeforeRelease time.Time
}

// checkGenerated checks the generator's guarantee from the database alone:
// the holding intervals of the generator lease never overlap, and every
// task carries the fence of a generator lease whose holding interval
// contains the task's created_at (both by the database clock). It also
// checks that each task a generator reported inserting carries a fence its
// own instance held. It returns the holdings in order of acquisition.
func checkGenerated(t *testing.T, c *cluster) []holding {
	t.Helper()
	ctx := context.Background()
	var events []lease.Event
	for after := int64(0); ; {
		page, err := c.leases.Events(ctx, lease.EventsParams{Resource: demo.Resource, AfterID: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		events = append(events, page...)
		after = page[len(page)-1].ID
	}
	byFence := map[int64]*holding{}
	var order []*holding
	for _, e := range events {
		h := byFence[e.Fence]
		if e.Kind == "acquired" {
			if h != nil {
				t.Fatalf("fence %d acquired twice", e.Fence)
			}
			h = &holding{holder: e.Holder, fence: e.Fence, start: e.At}
			byFence[e.Fence] = h
			order = append(order, h)
		}
		if h == nil {
			t.Fatalf("event %d (%s) of fence %d before its acquisition", e.ID, e.Kind, e.Fence)
		}
		switch e.Kind {
		case "acquired", "renewed":
			h.expiresBeforeRelease = e.ExpiresAt
		case "released":
			h.released = true
		}
		h.end = e.ExpiresAt // the last expires_at, which a release sets to its time
		if e.Kind == "released" && e.At.Before(h.end) {
			h.end = e.At
		}
	}
	holdings := make([]holding, len(order))
	for i, h := range order {
		holdings[i] = *h
		if i == 0 {
			continue
		}
		prev := order[i-1]
		if h.fence <= prev.fence {
			t.Errorf("fence %d acquired after fence %d", h.fence, prev.fence)
		}
		if h.start.Before(prev.end) {
			t.Errorf("two generators at once: %s (fence %d) held until %s, %s (fence %d) from %s",
				prev.holder, prev.fence, prev.end, h.holder, h.fence, h.start)
		}
	}

	inDB := map[int64]bool{}
	for after := int64(0); ; {
		page, err := c.tasks.List(ctx, taskstore.ListParams{AfterID: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, tk := range page {
			inDB[tk.ID] = true
			fence := c.generatorFence(tk.ID)
			if fence == 0 {
				t.Errorf("task %d has no generator fence", tk.ID)
				continue
			}
			h := byFence[fence]
			switch {
			case h == nil:
				t.Errorf("task %d carries fence %d, which no generator lease had", tk.ID, fence)
			case tk.CreatedAt.Before(h.start) || !tk.CreatedAt.Before(h.end):
				t.Errorf("task %d created at %s, outside the holding [%s, %s) of its fence %d",
					tk.ID, tk.CreatedAt, h.start, h.end, h.fence)
			}
		}
		after = page[len(page)-1].ID
	}

	for _, e := range c.rec.between(0, c.rec.mark()) {
		if e.kind != kindInserted {
			continue
		}
		if !inDB[e.task.ID] {
			t.Errorf("%s reported task %d, which is not in the database", e.instance, e.task.ID)
		}
		if h := byFence[e.fence]; h != nil && h.holder != e.instance {
			t.Errorf("%s inserted task %d under fence %d, which %s held", e.instance, e.task.ID, h.fence, h.holder)
		}
	}
	return holdings
}

// checkSleep checks a generated task's data against the range 1.5s..2.5s
// the tests configure: seconds with at most 3 decimals.
func checkSleep(t *testing.T, tk task.Task) {
	t.Helper()
	var d struct {
		Sleep *float64 `json:"sleep_duration_seconds"`
	}
	if err := json.Unmarshal(tk.TaskData, &d); err != nil || d.Sleep == nil {
		t.Errorf("task %d: task_data %s: want {\"sleep_duration_seconds\": N} (%v)", tk.ID, tk.TaskData, err)
		return
	}
	ms := *d.Sleep * 1000
	if *d.Sleep < 1.5 || *d.Sleep > 2.5 || math.Abs(ms-math.Round(ms)) > 1e-6 {
		t.Errorf("task %d: sleep_duration_seconds %v; want 1.5..2.5 with at most 3 decimals", tk.ID, *d.Sleep)
	}
}

// TestOneGeneratorAtATime: three replicas, generation on; the holder is
// stopped three times and a new replica joins each time. Tasks keep
// coming, and the database shows one generator at a time, each task
// inserted under a generator lease that was live.
func TestOneGeneratorAtATime(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	replicas := map[string]*replica{}
	short := func(g *demo.Generator) { g.Keep.TTL = time.Second }
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i)
		replicas[name] = c.start(name, short)
	}
	c.set(true, "operator")

	at := 0
	fences := map[int64]bool{}
	for round := range 4 {
		var last event
		for range 10 {
			last, at = c.rec.await(t, at, "generated tasks", inserted)
			checkSleep(t, last.task)
			fences[last.fence] = true
		}
		if round == 3 {
			break
		}
		// The latest inserter held the lease; it may have lost it since,
		// which only makes the handover happen sooner.
		c.halt(replicas[last.instance])
		delete(replicas, last.instance)
		name := fmt.Sprintf("replica-%d", 3+round)
		replicas[name] = c.start(name, short)
		at = c.rec.mark()
	}
	for _, r := range replicas {
		c.halt(r)
	}
	holdings := checkGenerated(t, c)
	if len(fences) < 4 {
		t.Errorf("tasks came under %d fences; want at least 4 (one per holder)", len(fences))
	}
	t.Logf("%d holdings of the generator lease", len(holdings))
}

// TestStopFromNonHolder: the switch is turned off from outside the holder
// (as from another replica). Once the holder has seen it, it inserts
// nothing and attempts nothing, even when woken by a (lying) notification;
// turned on again, generation resumes.
func TestStopFromNonHolder(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var replicas []*replica
	for i := range 3 {
		replicas = append(replicas, c.start(fmt.Sprintf("replica-%d", i), nil))
	}
	c.set(true, "operator")
	first, _ := c.rec.await(t, 0, "generated tasks", inserted)

	at := c.rec.mark()
	elsewhere := demo.NewState(c.db.Pool) // another replica's view of the switch
	if err := elsewhere.Set(c.ctx, false, "replica-elsewhere"); err != nil {
		t.Fatal(err)
	}
	stopped := func(e event) bool { return e.kind == kindObserved && !e.status.Started }
	seen, at := c.rec.await(t, at, "the holder to see the stop", stopped)
	if seen.status.ChangedBy != "replica-elsewhere" {
		t.Errorf("stop seen as changed by %q; want replica-elsewhere", seen.status.ChangedBy)
	}
	t.Logf("%s generated first; %s saw the stop", first.instance, seen.instance)
	var maxID int64
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT coalesce(max(id), 0) FROM tasks`).Scan(&maxID); err != nil {
		t.Fatal(err)
	}

	// A notification is a hint, never the data: a lying STARTED wakes the
	// holder, which reads the switch, finds it off and stays idle.
	if _, err := c.db.Pool.Exec(c.ctx, `SELECT pg_notify($1, 'STARTED')`, notify.ChannelGenerator); err != nil {
		t.Fatal(err)
	}
	_, after := c.rec.await(t, at, "the holder to read the switch again", stopped)
	for _, e := range c.rec.between(at, after) {
		if e.kind == kindInserted || e.kind == kindFailed {
			t.Errorf("after seeing the stop, %s: %s %v %v", e.instance, e.kind, e.task.ID, e.err)
		}
	}
	var later int
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT count(*) FROM tasks WHERE id > $1`, maxID).Scan(&later); err != nil {
		t.Fatal(err)
	}
	if later != 0 {
		t.Errorf("%d tasks inserted after the holder saw the stop", later)
	}

	c.set(true, "operator")
	resumed, _ := c.rec.await(t, after, "generation to resume", inserted)
	if resumed.task.ID <= maxID {
		t.Errorf("resumed with task %d; want above %d", resumed.task.ID, maxID)
	}
	for _, r := range replicas {
		c.halt(r)
	}
	checkGenerated(t, c)
}

// TestStoppedHolderHandsOver: the holder stops cleanly (SIGTERM); it
// releases the lease and another replica, woken by the release, takes
// generation over at once, not after the TTL. The old holder's fenced
// insert is refused from then on.
func TestStoppedHolderHandsOver(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	replicas := map[string]*replica{}
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i)
		// The longest TTL: a takeover within the test came through the release.
		replicas[name] = c.start(name, func(g *demo.Generator) { g.Keep.TTL = time.Hour })
	}
	c.set(true, "operator")
	old, at := c.rec.await(t, 0, "generated tasks", inserted)
	oldFence := old.fence
	c.halt(replicas[old.instance])
	delete(replicas, old.instance)

	next, _ := c.rec.await(t, at, "another replica to generate", insertedNotBy(old.instance))
	if next.fence <= oldFence {
		t.Errorf("new generator's fence %d not above the old %d", next.fence, oldFence)
	}
	c.refuseStale(old.instance, oldFence)

	for _, r := range replicas {
		c.halt(r)
	}
	holdings := checkGenerated(t, c)
	i := slices.IndexFunc(holdings, func(h holding) bool { return h.fence == oldFence })
	switch {
	case i < 0 || i+1 >= len(holdings):
		t.Fatalf("no takeover of fence %d in the history: %+v", oldFence, holdings)
	case !holdings[i].released:
		t.Errorf("the stopped holder's lease (fence %d) was not released", oldFence)
	case !holdings[i+1].start.Before(holdings[i].expiresBeforeRelease):
		t.Errorf("taken over at %s, not before the released lease would have expired (%s)",
			holdings[i+1].start, holdings[i].expiresBeforeRelease)
	}
}

// TestCrashedHolderHandsOver: the holder's database connections are cut
// (it can neither renew nor release, as when its process is killed);
// after its lease runs out another replica generates under a higher fence,
// and the crashed holder's fence is refused.
func TestCrashedHolderHandsOver(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	pool, err := pgxpool.New(c.ctx, c.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	doomed := c.start("doomed", func(g *demo.Generator) {
		g.State, g.Tasks, g.Leases = demo.NewState(pool), taskstore.NewStore(pool), leasestore.NewStore(pool)
		g.Keep.TTL = time.Second
	})
	c.set(true, "operator")
	crashed, _ := c.rec.await(t, 0, "the first generator's tasks", inserted)
	crashedFence := crashed.fence
	others := []*replica{c.start("replica-1", nil), c.start("replica-2", nil)}

	at := c.rec.mark()
	pool.Close() // the crash: from here on "doomed" reaches no database
	next, _ := c.rec.await(t, at, "another replica to generate", insertedNotBy("doomed"))
	if next.fence <= crashedFence {
		t.Errorf("new generator's fence %d not above the crashed holder's %d", next.fence, crashedFence)
	}
	c.refuseStale("doomed", crashedFence)

	c.halt(doomed)
	for _, r := range others {
		c.halt(r)
	}
	holdings := checkGenerated(t, c)
	i := slices.IndexFunc(holdings, func(h holding) bool { return h.fence == crashedFence })
	if i < 0 || i+1 >= len(holdings) {
		t.Fatalf("no takeover of fence %d in the history: %+v", crashedFence, holdings)
	}
	if holdings[i].released {
		t.Errorf("the crashed holder's lease (fence %d) was released; want it to run out", crashedFence)
	}
}

// TestPausedHolderIsRefused: a holder that paused past its TTL (here a
// lease taken directly and never renewed) may insert while its lease is
// live, but once the live generators have taken over, its fenced insert is
// refused and inserts nothing.
func TestPausedHolderIsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.set(true, "operator")
	paused, err := c.leases.Acquire(c.ctx, lease.AcquireParams{Resource: demo.Resource, Holder: "paused", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fence := paused.Lease.Fence
	got, err := c.tasks.InsertGenerated(c.ctx, "paused", fence, []json.RawMessage{json.RawMessage(`{"sleep_duration_seconds":2}`)})
	if err != nil || len(got) != 1 || c.generatorFence(got[0].ID) != fence {
		t.Fatalf("insert by the live holder: got %+v, %v; want one task under fence %d", got, err, fence)
	}
	// The pause: a last renewal, down to 1 s, and nothing after it.
	if _, err := c.leases.Renew(c.ctx, lease.RenewParams{Resource: demo.Resource, Holder: "paused", Fence: fence, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	replicas := []*replica{c.start("replica-1", nil), c.start("replica-2", nil)}
	next, _ := c.rec.await(t, 0, "a live generator to take over", inserted)
	if next.fence <= fence {
		t.Errorf("new generator's fence %d not above the paused holder's %d", next.fence, fence)
	}
	c.refuseStale("paused", fence)
	if n := c.countFence(fence); n != 1 {
		t.Errorf("%d tasks under the paused holder's fence; want 1", n)
	}
	for _, r := range replicas {
		c.halt(r)
	}
	checkGenerated(t, c)
}

// TestRevokedLeaseStepsDown: the holder's lease is released behind its
// back (as by DELETE /api/leases/release). Its next insert is refused, or a
// read of the switch it had already been told to make comes first (a NOTIFY
// of the switch still on its way when the lease was revoked): either way it
// sees the lease is not its own and steps down long before its next renewal
// would have told it. It is the only replica, so generation goes on under a
// new fence only because it stepped down and campaigned again.
func TestRevokedLeaseStepsDown(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	// Renewals ~20 min apart: the refused insert is what tells the holder.
	only := c.start("replica-0", func(g *demo.Generator) { g.Keep.TTL = time.Hour })
	c.set(true, "operator")
	holder, _ := c.rec.await(t, 0, "generated tasks", inserted)
	fence := holder.fence

	at := c.rec.mark()
	// leasestore.Store.Release would do, but for when it stamps released_at: at
	// the statement's start (now()), before it waits for the row lock that
	// an insert in flight holds (FOR SHARE), so that an insert serialized
	// before the release can carry a later created_at and the history show
	// a task after its lease ended. Here the row is locked first and
	// stamped after: every insert has either committed before the stamp or
	// waits and is refused.
	err := pgx.BeginFunc(c.ctx, c.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(c.ctx, `SELECT 1 FROM leases WHERE resource = $1 AND fence = $2 FOR UPDATE`, demo.Resource, fence); err != nil {
			return err
		}
		tag, err := tx.Exec(c.ctx, `UPDATE leases SET released_at = clock_timestamp(), expires_at = clock_timestamp()
			WHERE resource = $1 AND fence = $2 AND released_at IS NULL`, demo.Resource, fence)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%d leases revoked; want 1", tag.RowsAffected())
		}
		return err
	})
	if err != nil {
		t.Fatalf("revoke: %v", err)
	}
	revoked := at
	_, at = c.rec.await(t, at, "the holder to see the lease is not its own", func(e event) bool {
		return e.instance == holder.instance && e.kind == kindObserved && !heldBy(e.status, holder.instance, fence)
	})
	refused := 0
	for _, e := range c.rec.between(revoked, at) {
		switch {
		case e.instance != holder.instance:
		case e.kind == kindFailed && !errors.Is(e.err, taskstore.ErrNotGenerator):
			t.Errorf("insert after the revoke failed with %v; want ErrNotGenerator", e.err)
		case e.kind == kindFailed:
			refused++
		}
	}
	t.Logf("the holder learned of the revoke after %d refused inserts", refused)
	next, _ := c.rec.await(t, at, "generation under a new fence", func(e event) bool {
		return e.kind == kindInserted && e.fence > fence
	})
	t.Logf("%s stepped down and generates again under fence %d", holder.instance, next.fence)
	c.refuseStale(holder.instance, fence)
	c.halt(only)
	checkGenerated(t, c)
}

// TestConfigValidation: a configuration the generator cannot run with is
// refused before it touches the database, with an error naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	valid := func() *demo.Generator {
		return &demo.Generator{
			State: demo.NewState(nil), Tasks: taskstore.NewStore(nil), Leases: leasestore.NewStore(nil),
			Listener: notify.New(nil, zerolog.Nop()), Instance: "replica-a",
			Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop(),
		}
	}
	for _, tc := range []struct {
		name   string
		change func(g *demo.Generator)
		want   string // in the error; "" for none
	}{
		{"defaults", func(*demo.Generator) {}, ""},
		{"explicit", func(g *demo.Generator) { g.Rate, g.MinSleep, g.MaxSleep = 0.5, 0, time.Millisecond }, ""},
		{"widest", func(g *demo.Generator) { g.Rate, g.MinSleep, g.MaxSleep = demo.MaxRate, time.Hour, time.Hour }, ""},
		{"negative rate", func(g *demo.Generator) { g.Rate = -1 }, "rate"},
		{"NaN rate", func(g *demo.Generator) { g.Rate = math.NaN() }, "rate"},
		{"rate too high", func(g *demo.Generator) { g.Rate = math.Inf(1) }, "rate"},
		{"negative min sleep", func(g *demo.Generator) { g.MinSleep, g.MaxSleep = -time.Second, time.Second }, "negative"},
		{"min above max", func(g *demo.Generator) { g.MinSleep, g.MaxSleep = 3*time.Second, 2*time.Second }, "above max sleep"},
		{"min without max", func(g *demo.Generator) { g.MinSleep = 2 * time.Second }, "above max sleep"},
		{"max too long", func(g *demo.Generator) { g.MaxSleep = time.Hour + time.Millisecond }, "limit"},
		{"no instance", func(g *demo.Generator) { g.Instance = "" }, "Instance"},
		{"no listener", func(g *demo.Generator) { g.Listener = nil }, "must all be set"},
		{"no state", func(g *demo.Generator) { g.State = nil }, "must all be set"},
		{"no TTL", func(g *demo.Generator) { g.Keep.TTL = 0 }, "generator lease"},
		{"fractional TTL", func(g *demo.Generator) { g.Keep.TTL = 1500 * time.Millisecond }, "generator lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := valid()
			tc.change(g)
			err := g.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v; want nil", err)
			case tc.want == "":
				return
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Validate: %v; want an error about %q", err, tc.want)
			}
			// Run refuses the same configuration at once, without a database.
			if rerr := g.Run(context.Background()); rerr == nil || rerr.Error() != err.Error() {
				t.Fatalf("Run: %v; want %v", rerr, err)
			}
		})
	}
}

// heldBy reports whether the switch's status names holder with fence as the
// generator lease's holder.
func heldBy(s demo.Status, holder string, fence int64) bool {
	return s.Holder != nil && *s.Holder == holder && s.Fence != nil && *s.Fence == fence
}

// generatorFence is the fence of the generator lease task id was inserted
// under, as the database recorded it (0: none).
func (c *cluster) generatorFence(id int64) int64 {
	c.t.Helper()
	var fence *int64
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT generator_fence FROM tasks WHERE id = $1`, id).Scan(&fence); err != nil {
		c.t.Fatal(err)
	}
	if fence == nil {
		return 0
	}
	return *fence
}
