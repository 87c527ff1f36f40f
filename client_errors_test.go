package leasehold_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
	"github.com/leasehold/leasehold/task"
)

// TestUnmigratedDatabaseSaysWhatToRun: on a database nobody migrated, an
// insert and Start fail with ErrNotMigrated, saying to run Migrate; Start
// starts nothing (no worker claims in vain for ever); after Migrate both
// work.
func TestUnmigratedDatabaseSaysWhatToRun(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(context.Context, *leasehold.Task[emailArgs]) error { return nil }), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Insert(t.Context(), emailArgs{}, nil); !errors.Is(err, leasehold.ErrNotMigrated) || !strings.Contains(err.Error(), "leasehold.Migrate") {
		t.Errorf("Insert on an unmigrated database: %v; want ErrNotMigrated naming leasehold.Migrate", err)
	}
	if err := c.Start(t.Context()); !errors.Is(err, leasehold.ErrNotMigrated) || !strings.Contains(err.Error(), "leasehold migrate") {
		t.Errorf("Start on an unmigrated database: %v; want ErrNotMigrated naming leasehold migrate", err)
	}
	if _, err := leasehold.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("Start after Migrate: %v", err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck // the test's end
	res, err := c.Insert(t.Context(), emailArgs{}, nil)
	if err != nil {
		t.Fatalf("Insert after Migrate: %v", err)
	}
	waitState(t, c, res.Task.ID, task.StateDone)
}

// TestLibraryReaperPrunes: a client on a pool that is the elected reaper
// prunes finished tasks older than its Config.TaskRetention, as a replica's
// reaper does, and keeps the younger ones; a retention under a minute is a
// configuration error.
func TestLibraryReaperPrunes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(context.Context, *leasehold.Task[emailArgs]) error { return nil }), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers, TaskRetention: time.Second}); !errors.Is(err, leasehold.ErrInvalidConfig) {
		t.Errorf("TaskRetention 1s: %v; want ErrInvalidConfig", err)
	}
	// The tasks done by a first client, which then stops (its reaper lease
	// released); one of them finished two hours ago.
	first, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers, LeaseHistoryRetention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	old, err := first.Insert(t.Context(), emailArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	young, err := first.Insert(t.Context(), emailArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, first, old.Task.ID, task.StateDone)
	waitState(t, first, young.Task.ID, task.StateDone)
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), `UPDATE tasks SET processed_at = now() - interval '2 hours' WHERE id = $1`, old.Task.ID); err != nil {
		t.Fatal(err)
	}
	// A second client, kept an hour: elected reaper, it prunes the old one.
	c := started(t, db, leasehold.Config{Workers: workers, TaskRetention: time.Hour, LeaseHistoryRetention: -1})
	testkit.WaitFor(t, "the old task pruned", func() bool {
		_, err := c.Get(t.Context(), old.Task.ID)
		return errors.Is(err, task.ErrNotFound)
	})
	if _, err := c.Get(t.Context(), young.Task.ID); err != nil {
		t.Errorf("the young task: %v; want it kept", err)
	}
}

// TestWhatTheClientCanKnow: a schedule of a kind a client with Workers does
// not run is refused (ErrUnknownKind) as an insert of it is, unless
// Config.AllowUnknownKinds; an insert into a queue its workers do not take
// is accepted (another process may serve it), and said in the log, once.
func TestWhatTheClientCanKnow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(context.Context, *leasehold.Task[emailArgs]) error { return nil }), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: workers, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p := schedule.Params{Name: "typo", Cron: "@daily", Kind: "emial"}
	if _, err := c.Schedules().Add(t.Context(), p); !errors.Is(err, leasehold.ErrUnknownKind) {
		t.Errorf("a schedule of a kind the client does not run: %v; want ErrUnknownKind", err)
	}
	typed, err := leasehold.NewSchedule("mail-daily", "@daily", emailArgs{}, &leasehold.ScheduleOpts{Zone: "Europe/Berlin", Queue: "mail"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Schedules().Add(t.Context(), typed)
	if err != nil || got.Kind != (emailArgs{}).Kind() || got.Queue != "mail" || got.Zone != "Europe/Berlin" {
		t.Errorf("a typed schedule: %+v, %v; want kind %q in queue mail, Europe/Berlin", got, err, (emailArgs{}).Kind())
	}
	for range 2 {
		if _, err := c.Insert(t.Context(), emailArgs{}, &leasehold.InsertOpts{Queue: "elsewhere"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "a task went to a queue this client's workers do not take"); n != 1 {
		t.Errorf("the log says %d times that the queue is not the client's; want once:\n%s", n, logs)
	}
}

// lockedBuffer is a buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestErrorsSayTheirThing: a refusal names what it is about, once: a task
// not found names its id; a cancel refused names the task and its state;
// a bad configuration says "invalid configuration" once, not also
// "invalid argument".
func TestErrorsSayTheirThing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c, err := leasehold.NewClient(db.Pool, leasehold.Config{AllowUnknownKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(t.Context(), 424242); !errors.Is(err, task.ErrNotFound) || !strings.Contains(err.Error(), "424242") {
		t.Errorf("Get of no task: %v; want task.ErrNotFound naming the id", err)
	}
	res, err := c.Insert(t.Context(), emailArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(t.Context(), res.Task.ID, ""); err != nil {
		t.Fatal(err)
	}
	_, err = c.Cancel(t.Context(), res.Task.ID, "")
	if !errors.Is(err, task.ErrNotCancellable) || !strings.Contains(err.Error(), "cancelled") || !strings.Contains(err.Error(), strconv.FormatInt(res.Task.ID, 10)) {
		t.Errorf("a second Cancel: %v; want task.ErrNotCancellable naming the task and its state", err)
	}
	for name, mk := range map[string]func() error{
		"Config.ID": func() error { _, err := leasehold.NewClient(db.Pool, leasehold.Config{ID: "a\nb"}); return err },
		"a queue's name": func() error {
			_, err := leasehold.NewClient(db.Pool, leasehold.Config{Workers: oneWorker(t), Queues: map[string]leasehold.QueueConfig{"a\tb": {MaxWorkers: 1}}})
			return err
		},
		"an elector": func() error {
			_, err := c.NewElector(leasehold.ElectorConfig{Resource: "", Callbacks: noCallbacks()})
			return err
		},
	} {
		err := mk()
		if !errors.Is(err, leasehold.ErrInvalidConfig) || strings.Count(err.Error(), "invalid") != 1 {
			t.Errorf("%s: %v; want ErrInvalidConfig, said once", name, err)
		}
	}
}

func oneWorker(t *testing.T) *leasehold.Workers {
	t.Helper()
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(context.Context, *leasehold.Task[emailArgs]) error { return nil }), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	return w
}

func noCallbacks() leasehold.Callbacks {
	return leasehold.Callbacks{OnStartedLeading: func(context.Context, lease.Lease) {}}
}

// flakyArgs fails its first attempt.
type flakyArgs struct{}

func (flakyArgs) Kind() string { return "flaky" }

// TestDoneTaskHasNoEarlierError: a task that failed once and then
// completed is done with no last_error: its own fields describe its
// outcome, and its history keeps the failure.
func TestDoneTaskHasNoEarlierError(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(_ context.Context, tk *leasehold.Task[flakyArgs]) error {
		if tk.Attempts == 1 {
			return errors.New("transient failure #1")
		}
		return nil
	}), leasehold.KindConfig{Backoff: func(int) time.Duration { return time.Millisecond }}); err != nil {
		t.Fatal(err)
	}
	c := started(t, db, leasehold.Config{Workers: w})
	res, err := c.Insert(t.Context(), flakyArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := waitState(t, c, res.Task.ID, task.StateDone)
	if done.LastError != "" || len(done.EarlierAttempts) != 1 || done.EarlierAttempts[0].Error != "transient failure #1" {
		t.Errorf("done after a failure: last_error %q, earlier attempts %+v; want no last_error and the failure in the history", done.LastError, done.EarlierAttempts)
	}
}
