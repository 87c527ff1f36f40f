package scheduler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// giveUp keeps a broken test from hanging; it asserts no speed.
const giveUp = 60 * time.Second

// made is one tick a scheduler made a task, as its hook saw it.
type made struct {
	instance string
	name     string
	tick     time.Time
	taskID   int64
	missed   int64
	at       time.Time // when the hook ran (local clock: for the figures only)
}

// cluster is a test database and the schedulers running on it, each with
// its own listener, as in one process each.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	db     pgtest.DB
	store  *schedulestore.Store
	leases *leasestore.Store
	wg     sync.WaitGroup

	mu   sync.Mutex
	made []made
	wake chan struct{}
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{t: t, ctx: ctx, db: db, store: schedulestore.NewStore(db.Pool), leases: leasestore.NewStore(db.Pool), wake: make(chan struct{})}
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return c
}

// start runs a scheduler named name until the returned stop is called.
func (c *cluster) start(name string) (stop func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, c.db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelSchedule)
	s := &scheduler.Scheduler{
		Store: c.store, Leases: c.leases, Listener: listener, Instance: name,
		// Long enough that a loaded machine's stall does not pass the
		// lease to the other scheduler: who holds it is not under test here
		// (scheduler_failover_test in cmd/leasehold is about that).
		Keep: lease.KeepConfig{TTL: 10 * time.Second},
		Log:  zerolog.New(zerolog.NewTestWriter(c.t)).Level(zerolog.InfoLevel).With().Str("instance", name).Logger(),
		Enqueued: func(sched string, tick time.Time, taskID, missed int64) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.made = append(c.made, made{instance: name, name: sched, tick: tick, taskID: taskID, missed: missed, at: time.Now()})
			close(c.wake)
			c.wake = make(chan struct{})
		},
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })
	wg.Go(func() {
		if err := s.Run(ctx); err != nil {
			c.t.Errorf("%s: %v", name, err)
		}
	})
	done := make(chan struct{})
	c.wg.Go(func() { wg.Wait(); close(done) })
	return func() { cancel(); <-done }
}

// await waits until n ticks of the schedule name were made, and returns
// them.
func (c *cluster) await(name string, n int) []made {
	c.t.Helper()
	deadline := time.NewTimer(giveUp)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		var got []made
		for _, m := range c.made {
			if m.name == name {
				got = append(got, m)
			}
		}
		wake := c.wake
		c.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-wake:
		case <-deadline.C:
			c.t.Fatalf("gave up waiting for %d ticks of %s (have %d)", n, name, len(got))
		}
	}
}

// accounted checks that the ticks made, in tick order, account for every
// tick of a schedule ticking every interval from first on: each made
// tick's missed count is the ticks skipped since the one before (a
// scheduler running late makes the latest due tick and counts the others
// missed, which a loaded machine may make happen at any tick), and each is
// made once.
func accounted(t *testing.T, got []made, first time.Time, interval time.Duration) {
	t.Helper()
	want := first
	for i, m := range got {
		want = want.Add(time.Duration(m.missed) * interval)
		if !m.tick.Equal(want) {
			t.Errorf("tick %d made for %s (%d missed before it); want %s: every tick made once or counted missed", i, m.tick, m.missed, want)
			return
		}
		want = want.Add(interval)
	}
}

type tickRow struct {
	id          int64
	tick        time.Time
	scheduledAt time.Time
	kind        string
}

// tasks returns the tasks of a schedule in tick order.
func (c *cluster) tasks(name string) []tickRow {
	c.t.Helper()
	rows, err := c.db.Pool.Query(c.ctx, `SELECT id, schedule_tick, scheduled_at, kind FROM tasks WHERE schedule = $1 ORDER BY schedule_tick`, name)
	if err != nil {
		c.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tickRow, error) {
		var t tickRow
		return t, r.Scan(&t.id, &t.tick, &t.scheduledAt, &t.kind)
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

func (c *cluster) add(p schedule.Params) schedule.Schedule {
	c.t.Helper()
	s, created, err := c.store.Create(c.ctx, p)
	if err != nil || !created {
		c.t.Fatalf("create %+v: %v (created %v)", p, err, created)
	}
	return s
}

// TestEachTickOnce: two schedulers, a schedule ticking every second: every
// tick is one task, due at its tick, made by the holder of the lease; the
// other scheduler makes none.
func TestEachTickOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	defer c.start("a")()
	defer c.start("b")()
	s := c.add(schedule.Params{Name: "every-second", Cron: "@every 1s", Kind: "tick", TaskData: []byte(`{"n":1}`)})
	got := c.await(s.Name, 4)
	rows := c.tasks(s.Name)
	if len(rows) < len(got) {
		t.Fatalf("%d tasks, want at least the %d ticks made", len(rows), len(got))
	}
	accounted(t, got, s.NextTick, time.Second)
	var missed int64
	for i, r := range rows[:len(got)] {
		if !r.tick.Equal(got[i].tick) || !r.scheduledAt.Equal(r.tick) || r.id != got[i].taskID {
			t.Errorf("task %d: tick %s, scheduled_at %s; want task %d of tick %s, due at it (one task per tick, in order)",
				r.id, r.tick, r.scheduledAt, got[i].taskID, got[i].tick)
		}
		if r.kind != "tick" {
			t.Errorf("task %d: kind %q", r.id, r.kind)
		}
		missed += got[i].missed
	}
	for _, m := range got {
		if m.instance != got[0].instance {
			t.Errorf("ticks made by %s and %s: two schedulers at once", got[0].instance, m.instance)
		}
		if m.taskID == 0 {
			t.Errorf("tick %s: no task", m.tick)
		}
	}
	cur, err := c.store.Get(c.ctx, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cur.LastTask == nil || cur.LastTick == nil || cur.MissedTicks < missed {
		t.Errorf("schedule after ticks: last task %+v, last tick %v, missed %d; want at least the %d the ticks made counted",
			cur.LastTask, cur.LastTick, cur.MissedTicks, missed)
	}
	for _, m := range got {
		t.Logf("tick %s made by %s %v after it", m.tick.Format(time.TimeOnly), m.instance, m.at.Sub(m.tick).Round(time.Millisecond))
	}
}

// TestMissedTicksOnce: ten ticks fell due while no scheduler ran; the
// scheduler that starts makes one task for them (the latest), counts
// them missed, and then each tick again.
func TestMissedTicksOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := c.add(schedule.Params{Name: "was-down", Cron: "@every 1s", Kind: "tick"})
	// Ten ticks ago, as if every scheduler had been down since: the
	// schedule's next tick, moved back (by the database clock).
	if _, err := c.db.Pool.Exec(c.ctx, `UPDATE schedules SET next_tick_at = date_trunc('second', now()) - interval '10 seconds' WHERE name = $1`, s.Name); err != nil {
		t.Fatal(err)
	}
	defer c.start("a")()
	got := c.await(s.Name, 3)
	first := got[0]
	if first.missed < 10 || first.taskID == 0 {
		t.Errorf("first tick on return: task %d standing for %d missed ticks; want one task for at least 10", first.taskID, first.missed)
	}
	rows := c.tasks(s.Name)
	if len(rows) < 3 || !rows[0].tick.Equal(first.tick) {
		t.Fatalf("tasks %+v; want the first for the latest missed tick %s", rows, first.tick)
	}
	// After the return, each tick is a task (or, should the scheduler run
	// late on a loaded machine, counted missed by the next).
	accounted(t, got[1:], first.tick.Add(time.Second), time.Second)
	var missed int64
	for _, m := range got {
		missed += m.missed
	}
	cur, err := c.store.Get(c.ctx, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cur.MissedTicks < missed {
		t.Errorf("missed_ticks %d, want at least the %d the ticks made counted", cur.MissedTicks, missed)
	}
	t.Logf("on return: one task for tick %s, standing for %d missed ticks", first.tick.Format(time.TimeOnly), first.missed)
}

// TestChangesWakeTheScheduler: the scheduler sleeps until the next tick (an
// hour away), so a schedule added, replaced or removed meanwhile is seen
// only because its NOTIFY wakes it.
func TestChangesWakeTheScheduler(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.add(schedule.Params{Name: "hourly", Cron: "0 * * * *", Kind: "tick"})
	defer c.start("a")()
	// The scheduler holds the lease and sleeps: its first round is over
	// once the lease is held (no tick is due).
	waitHeld(t, c)

	added := time.Now()
	s := c.add(schedule.Params{Name: "new", Cron: "@every 1s", Kind: "tick"})
	first := c.await(s.Name, 1)[0]
	t.Logf("a schedule added: its first tick (%s, %v after the add) made %v after it",
		first.tick.Format(time.TimeOnly), first.tick.Sub(added).Round(time.Millisecond), first.at.Sub(first.tick).Round(time.Millisecond))

	// Replaced by one that ticks every 2 s: the ticks from then on are 2 s
	// apart.
	if _, _, err := c.store.Replace(c.ctx, schedule.Params{Name: "new", Cron: "@every 2s", Kind: "tock"}); err != nil {
		t.Fatal(err)
	}
	var mark time.Time
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT now()`).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	n := len(c.await(s.Name, 1))
	got := c.await(s.Name, n+2)
	rows := c.tasks(s.Name)
	var tocks []tickRow
	for _, r := range rows {
		if r.kind == "tock" {
			tocks = append(tocks, r)
		}
	}
	if len(tocks) < 2 {
		t.Fatalf("after the replace: %d tasks of the new kind; want the new definition's ticks (%+v)", len(tocks), got)
	}
	var tockMade []made
	for _, m := range got {
		for _, r := range tocks {
			if r.id == m.taskID {
				tockMade = append(tockMade, m)
			}
		}
	}
	if len(tockMade) >= 2 {
		accounted(t, tockMade, tockMade[0].tick.Add(-time.Duration(tockMade[0].missed)*2*time.Second), 2*time.Second)
	}
	for _, r := range rows {
		if r.kind == "tick" && r.tick.After(mark) {
			t.Errorf("task %d of the old definition for tick %s, after the replace at %s", r.id, r.tick, mark)
		}
	}

	// Removed: no tick of it after the removal; a probe schedule's ticks
	// show the scheduler went on.
	if _, err := c.store.Delete(c.ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT now()`).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	probe := c.add(schedule.Params{Name: "probe", Cron: "@every 1s", Kind: "tick"})
	c.await(probe.Name, 3)
	for _, r := range c.tasks(s.Name) {
		if r.tick.After(mark.Add(time.Second)) {
			t.Errorf("task %d for tick %s of the schedule removed at %s", r.id, r.tick, mark)
		}
	}
}

func waitHeld(t *testing.T, c *cluster) lease.Lease {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		ls, err := c.leases.List(c.ctx, lease.ListParams{Prefix: scheduler.Resource, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.Resource == scheduler.Resource && l.State == lease.StateActive {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody took the scheduler lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFencedEnqueue: an enqueue under a lease that is not live, or for a
// tick that is not the schedule's next, or of a tick made already, makes
// no task.
func TestFencedEnqueue(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := c.add(schedule.Params{Name: "fenced", Cron: "@every 1s", Kind: "tick"})
	acq, err := c.leases.Acquire(c.ctx, lease.AcquireParams{Resource: scheduler.Resource, Holder: "a", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Lease
	next := s.NextTick.Add(time.Second)
	for _, c2 := range []struct {
		what   string
		holder string
		fence  int64
		expect time.Time
	}{
		{"another holder's name", "b", l.Fence, s.NextTick},
		{"an older fence", "a", l.Fence - 1, s.NextTick},
		{"a tick that is not the next", "a", l.Fence, s.NextTick.Add(-time.Second)},
	} {
		ok, err := c.enqueue(c2.holder, c2.fence, s.Name, c2.expect, c2.expect, next)
		if err != nil || ok {
			t.Errorf("enqueue with %s: ok %v, %v; want refused", c2.what, ok, err)
		}
	}
	if n := len(c.tasks(s.Name)); n != 0 {
		t.Fatalf("%d tasks after refused enqueues", n)
	}
	if ok, err := c.enqueue("a", l.Fence, s.Name, s.NextTick, s.NextTick, next); err != nil || !ok {
		t.Fatalf("enqueue under the live lease: %v, %v", ok, err)
	}
	// The same tick again, as a second enqueuer that read the schedule
	// before the first moved it on: the compare-and-set refuses it.
	if ok, err := c.enqueue("a", l.Fence, s.Name, s.NextTick, s.NextTick, next); err != nil || ok {
		t.Errorf("the same tick twice: %v, %v; want refused", ok, err)
	}
	// And a tick made already inserts nothing even past the
	// compare-and-set: (schedule, tick) is unique.
	_, err = c.db.Pool.Exec(c.ctx, `INSERT INTO tasks (task_data, kind, schedule, schedule_tick) VALUES ('{}', 'tick', $1, $2)`, s.Name, s.NextTick)
	if !isUniqueViolation(err) {
		t.Errorf("a second task for tick %s: %v; want a unique violation", s.NextTick, err)
	}
	if n := len(c.tasks(s.Name)); n != 1 {
		t.Errorf("%d tasks; want the one tick's", n)
	}
	// Released: the lease is no longer live.
	if _, err := c.leases.Release(c.ctx, lease.ReleaseParams{Resource: scheduler.Resource, Holder: "a"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.enqueue("a", l.Fence, s.Name, next, next, next.Add(time.Second)); err != nil || ok {
		t.Errorf("enqueue under a released lease: %v, %v; want refused", ok, err)
	}
}

// TestUniqueSkipsWhileBusy: a unique schedule makes no task while its last
// is pending, and counts the tick skipped.
func TestUniqueSkipsWhileBusy(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := c.add(schedule.Params{Name: "one-at-a-time", Cron: "@every 1s", Kind: "tick", Unique: true})
	defer c.start("a")()
	got := c.await(s.Name, 3)
	if got[0].taskID == 0 {
		t.Fatalf("first tick made no task")
	}
	for _, m := range got[1:] {
		if m.taskID != 0 {
			t.Errorf("tick %s made task %d while the first (%d) is pending", m.tick, m.taskID, got[0].taskID)
		}
	}
	cur, err := c.store.Get(c.ctx, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cur.SkippedTicks < 2 || cur.LastTask == nil || cur.LastTask.ID != got[0].taskID {
		t.Errorf("skipped %d, last task %+v; want at least 2 skipped and the first task last", cur.SkippedTicks, cur.LastTask)
	}
}

// TestCreateRefuses: a bad definition, and a name taken with another
// definition, change nothing; the same definition again is a retry.
func TestCreateRefuses(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	s := c.add(schedule.Params{Name: "taken", Cron: "@hourly", Kind: "tick"})
	for _, p := range []schedule.Params{
		{Name: "bad-cron", Cron: "61 * * * *", Kind: "tick"},
		{Name: "bad-zone", Cron: "@hourly", Zone: "Mars/Olympus", Kind: "tick"},
	} {
		if _, _, err := c.store.Create(c.ctx, p); !errors.Is(err, schedule.ErrInvalid) {
			t.Errorf("create %+v: %v; want ErrInvalid", p, err)
		}
	}
	_, _, err := c.store.Create(c.ctx, schedule.Params{Name: "taken", Cron: "@daily", Kind: "tick"})
	var exists *schedule.ExistsError
	if !errors.As(err, &exists) || exists.Schedule.Cron != "@hourly" {
		t.Errorf("create over a taken name: %v; want an ExistsError with the schedule", err)
	}
	again, created, err := c.store.Create(c.ctx, schedule.Params{Name: "taken", Cron: "@hourly", Kind: "tick"})
	if err != nil || created || !again.CreatedAt.Equal(s.CreatedAt) {
		t.Errorf("the same definition again: %+v, created %v, %v; want the existing one", again, created, err)
	}
	list, err := c.store.List(c.ctx, "", 100)
	if err != nil || len(list) != 1 || list[0].Cron != "@hourly" {
		t.Errorf("schedules after the refusals: %+v, %v; want only the first, unchanged", list, err)
	}
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// enqueue is the scheduler's fenced enqueue of one tick of the schedule
// name: ok reports whether the compare-and-set held.
func (c *cluster) enqueue(holder string, fence int64, name string, expect, tick, next time.Time) (bool, error) {
	var id int64
	if err := c.db.Pool.QueryRow(c.ctx, `SELECT id FROM schedules WHERE name = $1`, name).Scan(&id); err != nil {
		return false, err
	}
	res, err := c.store.Enqueue(c.ctx, holder, fence, id, expect, tick, next, 0)
	return res.OK, err
}
