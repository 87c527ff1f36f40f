package leasehold_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// The tests of this file lose the answer to a renewal (a heartbeat, for a
// task) on its way back: the request arrives and renews the lease, and its
// holder, hearing nothing, gives the lease up at its deadline. Each holder
// must then release what it gave up (a task: hand it back) under its fence,
// so that it is free at once instead of at an expiry its holder cannot
// know. Before that, every one of them left the lease to expire.

// giveUpTTL is the TTL of the leases given up: the deadline comes about two
// seconds after the last renewal that was answered.
const giveUpTTL = 3 * time.Second

// lossyPool is a pool on db through a proxy that can lose the server's
// answers: few connections, so that darkening them darkens the holder's.
func lossyPool(t *testing.T, db pgtest.DB, conns int32) (*pgtest.Proxy, *pgxpool.Pool) {
	t.Helper()
	proxy, url := pgtest.NewProxy(t, db.URL)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	// No liveness ping as a connection is taken from the pool: the request
	// whose answer is lost is then the holder's own, not a ping before it.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.AfterConnect = leasehold.PrepareSession
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Every connection open before the loss, so that a statement sent
	// during it finds one idle and reaches the server (its answer lost). A
	// connection opened during the loss never finishes its session's setup
	// (PrepareSession's answers are lost too), and a statement waiting for
	// one is never sent: the holder then gives up without a renewal whose
	// answer was lost, which is not what these tests are about.
	held := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	return proxy, pool
}

// releasedAfterGivingUp waits until the holding of resource under fence
// is over, released or expired, and checks by the lease history that it was
// released: after a renewal later than lastSeen (the one whose answer was
// lost), and before the expiry that renewal gave it. gaveUp is when its
// holder gave it up.
func releasedAfterGivingUp(t *testing.T, db pgtest.DB, resource string, fence int64, lastSeen, gaveUp time.Time) {
	t.Helper()
	var (
		over                  bool
		releasedAt, renewedAt *time.Time
		renewedTo, releasedTo *time.Time
	)
	testkit.WaitFor(t, "the holding given up to be released or to expire", func() bool {
		err := db.Pool.QueryRow(t.Context(), `
			SELECT (SELECT max(at) FROM lease_events WHERE resource = $1 AND fence = $2 AND kind = 'released'),
			       (SELECT max(at) FROM lease_events WHERE resource = $1 AND fence = $2 AND kind = 'renewed'),
			       (SELECT max(expires_at) FROM lease_events WHERE resource = $1 AND fence = $2 AND kind = 'renewed'),
			       (SELECT max(expires_at) FROM lease_events WHERE resource = $1 AND fence = $2),
			       NOT EXISTS (SELECT FROM leases WHERE resource = $1 AND fence = $2 AND released_at IS NULL AND expires_at > now())`,
			resource, fence).Scan(&releasedAt, &renewedAt, &renewedTo, &releasedTo, &over)
		if err != nil {
			t.Fatalf("read the history of %s under fence %d: %v", resource, fence, err)
		}
		return over
	})
	freedAfter := time.Since(gaveUp)
	if renewedAt == nil || !renewedAt.After(lastSeen) {
		t.Fatalf("the lease's last renewal is at %v, not after the last one its holder heard of (%s): no renewal's answer was lost",
			renewedAt, lastSeen)
	}
	if releasedAt == nil {
		t.Fatalf("the holder gave the lease up after a renewal whose answer was lost (renewed at %s) and left it to expire at %s; want it released",
			renewedAt, renewedTo)
	}
	if !releasedAt.Before(*renewedTo) {
		t.Errorf("released at %s, not before the expiry %s the lost renewal gave it", releasedAt, renewedTo)
	}
	t.Logf("the lease was free at most %s after its holder gave it up, %s before the expiry the lost renewal gave it",
		freedAfter.Round(time.Millisecond), renewedTo.Sub(*releasedAt).Round(time.Millisecond))
}

// renewedAt is the lease's renewed_at as the holder last heard it (the
// zero time when it heard of none).
func renewedAt(l lease.Lease) time.Time {
	if l.RenewedAt == nil {
		return time.Time{}
	}
	return *l.RenewedAt
}

// TestHoldReleasesWhatItGaveUp: a Holding whose renewal's answer is lost
// gives the lease up at its deadline and releases it, embedded (the answer
// lost between PostgreSQL and the pool) and remote (between the service and
// the client).
func TestHoldReleasesWhatItGaveUp(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		proxy, pool := lossyPool(t, db, 2)
		c, err := leasehold.NewClient(pool, leasehold.Config{})
		if err != nil {
			t.Fatal(err)
		}
		testHoldGivesUp(t, db, c.Leases(), proxy.DropAllAnswers)
	})
	t.Run("remote", func(t *testing.T) {
		t.Parallel()
		s := startClientServer(t, "")
		front := testkit.NewFront(t, s.srv.URL)
		c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: front.URL}, leasehold.Config{})
		if err != nil {
			t.Fatal(err)
		}
		testHoldGivesUp(t, s.db, c.Leases(), func() func() {
			front.LoseNext(1, testkit.Route(http.MethodPut, "/api/leases/renew"))
			return func() {}
		})
	})
}

func testHoldGivesUp(t *testing.T, db pgtest.DB, leases *leasehold.Leases, loseAnswers func() (restore func())) {
	const resource = "job:lost-answer"
	h, err := leases.Hold(t.Context(), resource, "holder-a", lease.KeepConfig{TTL: giveUpTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background()) //nolint:errcheck // the test's end
	testkit.WaitFor(t, "a renewal answered", func() bool { return h.Lease().RenewedAt != nil })
	lastSeen := renewedAt(h.Lease())
	restore := loseAnswers()
	<-h.Context().Done()
	gaveUp := time.Now()
	restore()
	if err := h.Err(); !errors.Is(err, lease.ErrDeadline) {
		t.Fatalf("the holding ended with %v; want lease.ErrDeadline", err)
	}
	releasedAfterGivingUp(t, db, resource, h.Lease().Fence, lastSeen, gaveUp)
}

// TestElectorReleasesWhatItGaveUp: a leader whose renewal's answer is lost
// steps down at its deadline and releases the lease once its
// OnStartedLeading has returned, embedded and remote.
func TestElectorReleasesWhatItGaveUp(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		proxy, pool := lossyPool(t, db, 2)
		c, err := leasehold.NewClient(pool, leasehold.Config{})
		if err != nil {
			t.Fatal(err)
		}
		testElectorGivesUp(t, db, c, proxy.DropAllAnswers)
	})
	t.Run("remote", func(t *testing.T) {
		t.Parallel()
		s := startClientServer(t, "")
		front := testkit.NewFront(t, s.srv.URL)
		c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: front.URL}, leasehold.Config{})
		if err != nil {
			t.Fatal(err)
		}
		testElectorGivesUp(t, s.db, c, func() func() {
			front.LoseNext(1, testkit.Route(http.MethodPut, "/api/leases/renew"))
			return func() {}
		})
	})
}

func testElectorGivesUp(t *testing.T, db pgtest.DB, c *leasehold.Client, loseAnswers func() (restore func())) {
	const resource = "leader:lost-answer"
	type leadership struct {
		l    lease.Lease
		over chan time.Time
	}
	leads := make(chan leadership, 4)
	e, err := c.NewElector(leasehold.ElectorConfig{
		Resource: resource, Holder: "candidate-a", Keep: lease.KeepConfig{TTL: giveUpTTL},
		Callbacks: leasehold.Callbacks{OnStartedLeading: func(ctx context.Context, l lease.Lease) {
			over := make(chan time.Time, 1)
			leads <- leadership{l, over}
			<-ctx.Done()
			over <- time.Now()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the elector's Run: %v", err)
		}
	}()
	first := testkit.Receive(t, "leadership", leads)
	var lastSeen *time.Time
	testkit.WaitFor(t, "a renewal of the leader's lease", func() bool {
		err := db.Pool.QueryRow(t.Context(), `SELECT max(at) FROM lease_events WHERE resource = $1 AND fence = $2 AND kind = 'renewed'`,
			resource, first.l.Fence).Scan(&lastSeen)
		return err == nil && lastSeen != nil
	})
	restore := loseAnswers()
	gaveUp := testkit.Receive(t, "the leader to step down", first.over)
	restore()
	releasedAfterGivingUp(t, db, resource, first.l.Fence, *lastSeen, gaveUp)
}

// TestWorkersHandBackWhatTheyGaveUp: a worker whose heartbeat's answer is
// lost gives the task's lease up at its deadline, stops its handler and
// hands the task back under its fence, the attempt not counted; the task
// then runs again at once, embedded and remote.
func TestWorkersHandBackWhatTheyGaveUp(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		proxy, pool := lossyPool(t, db, 8)
		testWorkerGivesUp(t, db, func(workers *leasehold.Workers) *leasehold.Client {
			c, err := leasehold.NewClient(pool, leasehold.Config{ID: "giver", Workers: workers})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, func(int64) func() { return proxy.DropAllAnswers() })
	})
	t.Run("remote", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		svc := startService(t, db)
		front := testkit.NewFront(t, svc.URL)
		testWorkerGivesUp(t, db, func(workers *leasehold.Workers) *leasehold.Client {
			c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: front.URL}, leasehold.Config{ID: "giver", Workers: workers})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, func(id int64) func() {
			front.LoseNext(1, testkit.Route(http.MethodPut, "/api/tasks/"+strconv.FormatInt(id, 10)+"/heartbeat"))
			return func() {}
		})
	})
}

// givenUpArgs is the task of TestWorkersHandBackWhatTheyGaveUp: its first
// run waits for its context to end, the others complete.
type givenUpArgs struct{}

func (givenUpArgs) Kind() string { return "given_up" }

func testWorkerGivesUp(t *testing.T, db pgtest.DB, client func(*leasehold.Workers) *leasehold.Client, loseAnswers func(id int64) (restore func())) {
	type run struct {
		fence int64
		over  chan error
	}
	runs := make(chan run, 4)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[givenUpArgs](func(ctx context.Context, tk *leasehold.Task[givenUpArgs]) error {
		over := make(chan error, 1)
		runs <- run{tk.Fence, over}
		if len(tk.EarlierAttempts) > 0 {
			return nil
		}
		<-ctx.Done()
		over <- context.Cause(ctx)
		return context.Cause(ctx)
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c := client(workers)
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	}()
	res, err := c.Insert(t.Context(), givenUpArgs{}, &leasehold.InsertOpts{TTL: giveUpTTL})
	if err != nil {
		t.Fatal(err)
	}
	inserted := res.Task.ID
	first := testkit.Receive(t, "the first run", runs)
	var lastBeat time.Time
	testkit.WaitFor(t, "a heartbeat of the first run", func() bool {
		var started, beat time.Time
		err := db.Pool.QueryRow(t.Context(), `SELECT started_at, last_heartbeat_at FROM tasks WHERE id = $1 AND fence = $2`, inserted, first.fence).
			Scan(&started, &beat)
		lastBeat = beat
		return err == nil && beat.After(started)
	})
	restore := loseAnswers(inserted)
	cause := testkit.Receive(t, "the first run's context to end", first.over)
	restore()
	if !errors.Is(cause, lease.ErrDeadline) {
		t.Fatalf("the first run's context ended with %v; want lease.ErrDeadline", cause)
	}
	// The attempt given up is in the task's history, handed back under its
	// fence after a heartbeat later than the last the worker heard of.
	var history []task.Attempt
	testkit.WaitFor(t, "the attempt given up to end", func() bool {
		var raw []byte
		if err := db.Pool.QueryRow(t.Context(), `SELECT earlier_attempts FROM tasks WHERE id = $1`, inserted).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		history = nil
		_ = json.Unmarshal(raw, &history)
		return len(history) > 0
	})
	h := history[0]
	if renewedTo := h.ExpiresAt.Add(-giveUpTTL); !renewedTo.After(lastBeat) {
		t.Fatalf("the attempt's lease ran to %s, renewed no later than the last heartbeat its worker heard of (%s): no answer was lost",
			h.ExpiresAt, lastBeat)
	}
	if h.Fence != first.fence || h.Outcome != task.OutcomeRequeued {
		t.Fatalf("the attempt given up ended %+v; want fence %d handed back (%s), not left to expire", h, first.fence, task.OutcomeRequeued)
	}
	t.Logf("handed back %s before its lease would have lapsed", h.ExpiresAt.Sub(h.EndedAt).Round(time.Millisecond))
	again := testkit.Receive(t, "the run after the hand-back", runs)
	if again.fence <= first.fence {
		t.Errorf("the second run's fence %d, want one greater than %d", again.fence, first.fence)
	}
	done := waitState(t, c, inserted, task.StateDone)
	if done.Attempts != 1 {
		t.Errorf("the task is done after %d counted attempts; want 1 (the attempt handed back is not counted)", done.Attempts)
	}
}
