package leasehold_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/server"
)

// clientServer is a real leasehold server on a fresh database, behind a
// switch that can make it unreachable or answer every request with one
// status.
type clientServer struct {
	t   *testing.T
	db  pgtest.DB
	srv *httptest.Server
	// down drops every connection unanswered: the server is unreachable.
	down atomic.Bool
	// failWith, when not zero, answers every request with that status.
	failWith atomic.Int32
	// failed counts the requests answered by failWith.
	failed atomic.Int32
}

func startClientServer(t *testing.T, token string) *clientServer {
	t.Helper()
	db := pgtest.New(t)
	h := server.NewServer(server.Deps{
		Leases:     leasestore.NewStore(db.Pool),
		DefaultTTL: 30 * time.Second,
		APIToken:   token,
		Log:        zerolog.Nop(),
		Metrics:    server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready:      func(context.Context) error { return nil },
		Instance:   server.Instance{ID: "test"},
	})
	s := &clientServer{t: t, db: db}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		if status := int(s.failWith.Load()); status != 0 {
			s.failed.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error": "the database is unavailable; retry shortly"}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// client returns the leases of a remote client of the server, with the
// token given (none when omitted).
func (s *clientServer) client(token ...string) *leasehold.Leases {
	s.t.Helper()
	rc := leasehold.RemoteConfig{URL: s.srv.URL, HTTPClient: s.srv.Client()}
	if len(token) > 0 {
		rc.Token = token[0]
	}
	c, err := leasehold.NewRemoteClient(rc, leasehold.Config{})
	if err != nil {
		s.t.Fatalf("NewRemoteClient(%q): %v", s.srv.URL, err)
	}
	return c.Leases()
}

// hold acquires with auto-renew and makes sure the holding is released
// before the server stops.
func hold(t *testing.T, c *leasehold.Leases, resource, holder string, cfg lease.KeepConfig) *leasehold.Holding {
	t.Helper()
	h, err := c.Hold(t.Context(), resource, holder, cfg)
	if err != nil {
		t.Fatalf("Hold(%s, %s): %v", resource, holder, err)
	}
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	return h
}

// renewals counts the renewals of the lease with this fence in the history.
func renewals(t *testing.T, c *leasehold.Leases, resource string, fence int64) int {
	t.Helper()
	events, err := c.Events(t.Context(), lease.EventsParams{Resource: resource})
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	n := 0
	for _, e := range events {
		if e.Kind == "renewed" && e.Fence == fence {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds (testkit.WaitFor).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, what, cond)
}

// waitDone waits for the holding's context to be cancelled and returns when.
func waitDone(t *testing.T, h *leasehold.Holding) time.Time {
	t.Helper()
	testkit.Receive(t, "the holding's context to be cancelled", h.Context().Done())
	return time.Now()
}

// TestClientHold runs the auto-renew tests side by side and then checks
// that none of them left a goroutine behind. It is not parallel itself so
// that no other test's goroutines come and go while goleak looks.
func TestClientHold(t *testing.T) {
	pgtest.ServerURL(t) // a local server brought up here is not a leak
	ignore := goleak.IgnoreCurrent()
	t.Run("group", func(t *testing.T) {
		t.Run("KeepsAlive", testClientHoldKeepsAlive)
		t.Run("ServerDown", testClientHoldServerDown)
		t.Run("RetriesTransient", testClientHoldRetriesTransient)
		t.Run("Taken", testClientHoldTaken)
		t.Run("Release", testClientHoldRelease)
		t.Run("ContextEnd", testClientHoldContextEnd)
		t.Run("Keep", testClientKeep)
	})
	goleak.VerifyNone(t, ignore)
}

// Auto-renew keeps the lease past several TTLs; nobody else gets it.
func testClientHoldKeepsAlive(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	// Long enough that a loaded machine's stall of a second or so is no
	// loss: what is under test is that renewals keep it past several TTLs.
	const ttl = 3 * time.Second
	start := time.Now()
	h := hold(t, c, "job:keep", "a", lease.KeepConfig{TTL: ttl})
	first := h.Lease()
	other := s.client()

	const wantRenewals = 8
	waitFor(t, "8 renewals and 3 TTLs", func() bool {
		if err := h.Err(); err != nil {
			t.Fatalf("the holding ended after %s: %v", time.Since(start), err)
		}
		_, err := other.Acquire(t.Context(), lease.AcquireParams{Resource: "job:keep", Holder: "b", TTL: ttl})
		var held *lease.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("after %s another holder's Acquire: got %v, want a *HeldError", time.Since(start), err)
		}
		if held.Lease.Holder != "a" || held.Lease.Fence != first.Fence {
			t.Fatalf("HeldError names holder %s fence %d, want a fence %d", held.Lease.Holder, held.Lease.Fence, first.Fence)
		}
		return renewals(t, c, "job:keep", first.Fence) >= wantRenewals && time.Since(start) > 3*ttl
	})

	last := h.Lease()
	if last.Fence != first.Fence || last.RenewedAt == nil || !last.ExpiresAt.After(first.ExpiresAt.Add(2*ttl)) {
		t.Errorf("the holding's lease: got fence %d renewed_at %v expires_at %s, want fence %d renewed, expiring well after %s",
			last.Fence, last.RenewedAt, apitime.Format(last.ExpiresAt), first.Fence, apitime.Format(first.ExpiresAt))
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Keep holds a lease acquired beforehand, with no request of its own until
// the first renewal: the lease's events are its acquisition, then only
// renewals by the same fence, until the release.
func testClientKeep(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	cfg := lease.KeepConfig{TTL: 3 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	acq, err := c.Acquire(t.Context(), lease.AcquireParams{Resource: "job:kept", Holder: "a", TTL: cfg.TTL})
	if err != nil || !acq.New {
		t.Fatalf("acquire: %+v, %v", acq, err)
	}
	h, err := c.Keep(t.Context(), acq.Lease, sent, cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 renewals", func() bool {
		if err := h.Err(); err != nil {
			t.Fatalf("the holding ended: %v", err)
		}
		return renewals(t, c, "job:kept", acq.Lease.Fence) >= 3
	})
	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	events, err := c.Events(t.Context(), lease.EventsParams{Resource: "job:kept"})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range events {
		want := "renewed"
		switch i {
		case 0:
			want = "acquired"
		case len(events) - 1:
			want = "released"
		}
		if e.Kind != want || e.Fence != acq.Lease.Fence {
			t.Errorf("event %d: %s with fence %d, want %s with fence %d", i, e.Kind, e.Fence, want, acq.Lease.Fence)
		}
	}
}

// When the server cannot be reached, the holding gives the lease up before
// the server would let anyone else take it.
func testClientHoldServerDown(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	// The holder renews every second and counts a renewal good for 10 s
	// (TTL − Margin): a renewal that a loaded machine slows by seconds still
	// comes back before the deadline, and so does a failed one once the
	// server is down, which the cause must carry. The 10 s of Margin are
	// what the test's own read of the lease, after the cancellation, has
	// before the lease expires on the server.
	h := hold(t, c, "job:down", "a", lease.KeepConfig{TTL: 20 * time.Second, RenewInterval: time.Second, Margin: 10 * time.Second})
	l := h.Lease()
	waitFor(t, "a renewal", func() bool {
		if err := h.Err(); err != nil {
			t.Fatalf("the holding ended while the test waited for its first renewal: %v", err)
		}
		return renewals(t, c, "job:down", l.Fence) >= 1
	})

	s.down.Store(true)
	downAt := time.Now()
	doneAt := waitDone(t, h)
	var (
		dbNow, expiresAt time.Time
		live             bool
	)
	err := s.db.Pool.QueryRow(context.Background(),
		`SELECT now(), expires_at, now() < expires_at AND released_at IS NULL FROM leases WHERE id = $1`, l.ID).
		Scan(&dbNow, &expiresAt, &live)
	if err != nil {
		t.Fatalf("read the lease: %v", err)
	}
	if !live {
		t.Errorf("the holding's context was cancelled at %s by the database clock, not before the lease's expires_at %s",
			apitime.Format(dbNow), apitime.Format(expiresAt))
	}
	t.Logf("cancelled %s after the server went down, %s before the lease expires on the server",
		doneAt.Sub(downAt), expiresAt.Sub(dbNow))
	if got := h.Lease().ExpiresAt; !got.Equal(expiresAt.Truncate(time.Millisecond)) {
		t.Errorf("the holding's last known expires_at: got %s, want the server's %s", apitime.Format(got), apitime.Format(expiresAt))
	}
	cause := h.Err()
	if !errors.Is(cause, lease.ErrDeadline) || !leasehold.IsTransient(cause) {
		t.Errorf("cause: got %v, want ErrDeadline wrapping a transient renewal error", cause)
	}
	if !errors.Is(context.Cause(h.Context()), lease.ErrDeadline) {
		t.Errorf("context.Cause: got %v, want ErrDeadline", context.Cause(h.Context()))
	}
	if err := h.Release(t.Context()); !leasehold.IsTransient(err) {
		t.Errorf("Release while the server is down: got %v, want a transient error", err)
	}
}

// Renewals answered 503 are retried; the holding survives them.
func testClientHoldRetriesTransient(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	// Long enough that the test's own turns (the 503s on, then off) never
	// outlast the holder's deadline on a loaded machine.
	const ttl = 6 * time.Second
	h := hold(t, c, "job:flaky", "a", lease.KeepConfig{TTL: ttl})
	fence := h.Lease().Fence
	waitFor(t, "a renewal", func() bool { return renewals(t, c, "job:flaky", fence) >= 1 })

	s.failWith.Store(http.StatusServiceUnavailable)
	waitFor(t, "two renewals answered 503", func() bool { return s.failed.Load() >= 2 })
	s.failWith.Store(0)
	before := renewals(t, c, "job:flaky", fence)
	waitFor(t, "a renewal after the 503s", func() bool { return renewals(t, c, "job:flaky", fence) > before })
	if err := h.Err(); err != nil {
		t.Fatalf("the holding ended on transient failures: %v", err)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// When the lease is taken over, the next renewal is refused and the holding
// ends with ErrNotHeld.
func testClientHoldTaken(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	// A renewal every second, but a deadline (TTL − Margin, 54 min) no test
	// lasts to: only the refusal can end the holding. With a short TTL a
	// loaded machine's slow renewal lets the deadline pass first, and the
	// holding rightly ends with ErrDeadline instead.
	h := hold(t, c, "job:taken", "a", lease.KeepConfig{TTL: time.Hour, RenewInterval: time.Second})
	mine := h.Lease()

	if _, err := s.db.Pool.Exec(t.Context(), `UPDATE leases SET expires_at = now() WHERE id = $1`, mine.ID); err != nil {
		t.Fatalf("expire the lease: %v", err)
	}
	acq, err := s.client().Acquire(t.Context(), lease.AcquireParams{Resource: "job:taken", Holder: "b", TTL: time.Minute})
	if err != nil {
		t.Fatalf("b's Acquire after the expiry: %v", err)
	}
	if !acq.New || acq.Lease.Fence <= mine.Fence {
		t.Fatalf("b's Acquire: got new=%t fence %d, want a new lease with a fence above %d", acq.New, acq.Lease.Fence, mine.Fence)
	}

	waitDone(t, h)
	if cause := context.Cause(h.Context()); !errors.Is(cause, lease.ErrNotHeld) {
		t.Errorf("context.Cause: got %v, want ErrNotHeld", cause)
	}
	if err := h.Release(t.Context()); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Release of a lost lease: got %v, want ErrNotHeld", err)
	}
	got, err := c.Get(t.Context(), mine.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.Holder != "b" || got.Fence != acq.Lease.Fence || got.State != lease.StateActive {
		t.Errorf("the lease after a's loss: got holder %s fence %d %s, want b's active lease, fence %d", got.Holder, got.Fence, got.State, acq.Lease.Fence)
	}
}

// Release releases, stops renewing, and a second Release says not held.
func testClientHoldRelease(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	h := hold(t, c, "job:release", "a", lease.KeepConfig{TTL: 3 * time.Second})
	id := h.Lease().ID

	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-h.Context().Done():
	default:
		t.Fatal("the holding's context is not done after Release")
	}
	if !errors.Is(h.Err(), lease.ErrReleased) {
		t.Errorf("Err after Release: got %v, want ErrReleased", h.Err())
	}
	got, err := c.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.State != lease.StateReleased || got.ReleasedAt == nil || h.Lease().State != lease.StateReleased {
		t.Errorf("after Release: got the server's lease %s (released_at %v), the holding's %s; want released",
			got.State, got.ReleasedAt, h.Lease().State)
	}
	if err := h.Release(t.Context()); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("second Release: got %v, want ErrNotHeld", err)
	}
	acq, err := c.Acquire(t.Context(), lease.AcquireParams{Resource: "job:release", Holder: "b"})
	if err != nil || !acq.New {
		t.Errorf("b's Acquire after the release: got new=%t, %v; want a new lease", acq.New, err)
	}
}

// When the context given to Hold ends, the holding releases the lease on
// its own.
func testClientHoldContextEnd(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	ctx, cancel := context.WithCancel(t.Context())
	h, err := c.Hold(ctx, "job:ctx", "a", lease.KeepConfig{TTL: 3 * time.Second})
	if err != nil {
		t.Fatalf("Hold: %v", err)
	}
	id := h.Lease().ID
	cancel()
	waitDone(t, h)
	if !errors.Is(h.Err(), context.Canceled) {
		t.Errorf("Err after the context ended: got %v, want context.Canceled", h.Err())
	}
	// Release waits for the holding's own release and reports it.
	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("Release after the context ended: %v", err)
	}
	got, err := c.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.State != lease.StateReleased {
		t.Errorf("the lease after the context ended: got %s, want released", got.State)
	}
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A configuration under which a lease could not be kept is refused before
// anything goes on the wire.
func TestClientHoldConfigValidation(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	offline := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		requests.Add(1)
		return nil, errors.New("no network in this test")
	})}
	rc, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "http://leasehold.invalid", HTTPClient: offline}, leasehold.Config{})
	if err != nil {
		t.Fatalf("NewRemoteClient: %v", err)
	}
	c := rc.Leases()
	tests := []struct {
		name string
		cfg  lease.KeepConfig
		want string
	}{
		{"fractional TTL", lease.KeepConfig{TTL: 1500 * time.Millisecond}, "whole number of seconds"},
		{"renew interval equals TTL", lease.KeepConfig{TTL: 2 * time.Second, RenewInterval: 2 * time.Second}, "renew interval 2s must be positive and shorter than the TTL 2s"},
		{"renew interval over TTL", lease.KeepConfig{TTL: 2 * time.Second, RenewInterval: 3 * time.Second}, "shorter than the TTL"},
		{"negative renew interval", lease.KeepConfig{TTL: 2 * time.Second, RenewInterval: -time.Second}, "renew interval -1s must be positive"},
		{"retry interval equals renew interval", lease.KeepConfig{TTL: 3 * time.Second, RenewInterval: time.Second, RetryInterval: time.Second}, "retry interval 1s must be positive and shorter than the renew interval 1s"},
		{"margin leaves no time", lease.KeepConfig{TTL: 3 * time.Second, RenewInterval: time.Second, Margin: 2 * time.Second}, "margin 2s, grace 0s and renew interval 1s must add up to less than the TTL 3s"},
		{"grace leaves no time", lease.KeepConfig{TTL: 3 * time.Second, RenewInterval: time.Second, Grace: 2 * time.Second}, "margin 300ms, grace 2s and renew interval 1s must add up to less than the TTL 3s"},
		{"negative grace", lease.KeepConfig{TTL: 3 * time.Second, Grace: -time.Second}, "margin 300ms and grace -1s must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := c.Hold(t.Context(), "r", "h", tt.cfg)
			if !errors.Is(err, leasehold.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Hold(%+v): got %v, want ErrInvalidArgument saying %q", tt.cfg, err, tt.want)
			}
			if h != nil {
				t.Errorf("Hold(%+v) returned a holding with its error", tt.cfg)
			}
		})
	}
	if _, err := c.Acquire(t.Context(), lease.AcquireParams{Resource: "r", Holder: "h", TTL: 1500 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "whole number of seconds") {
		t.Errorf("Acquire with TTL 1.5s: got %v, want an error about whole seconds", err)
	}
	if _, err := c.List(t.Context(), lease.ListParams{Filter: "stale"}); err == nil || !errors.Is(err, leasehold.ErrInvalidArgument) {
		t.Errorf("List with filter stale: got %v, want an error naming the filters", err)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("requests sent: got %d, want 0", n)
	}
}

func TestClientNewRemoteClient(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "localhost:8080", "ftp://localhost", "http://", "http://u:p@localhost", "http://localhost?x=1", "http://local host"} {
		if _, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: bad}, leasehold.Config{}); !errors.Is(err, leasehold.ErrInvalidConfig) {
			t.Errorf("NewRemoteClient(%q): got %v, want ErrInvalidConfig", bad, err)
		}
	}
	if _, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: "https://example.com/leasehold/"}, leasehold.Config{}); err != nil {
		t.Fatalf("NewRemoteClient with a path: %v", err)
	}
}

// Acquire answers a *HeldError with the holder's lease on a conflict, and
// the same lease to the same holder.
func TestClientAcquire(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	ctx := t.Context()

	first, err := c.Acquire(ctx, lease.AcquireParams{Resource: "report:nightly", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("a's Acquire: %v", err)
	}
	if !first.New || first.Lease.Holder != "a" || first.Lease.State != lease.StateActive || first.Lease.TTLSeconds != 60 || first.Lease.Fence < 1 {
		t.Fatalf("a's Acquire: got %+v, want a new active lease of a with TTL 60 s", first)
	}

	_, err = c.Acquire(ctx, lease.AcquireParams{Resource: "report:nightly", Holder: "b"})
	var held *lease.HeldError
	if !errors.As(err, &held) || !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("b's Acquire: got %v, want a *HeldError", err)
	}
	if held.Lease.ID != first.Lease.ID || held.Lease.Holder != "a" || held.Lease.Fence != first.Lease.Fence ||
		!held.Lease.ExpiresAt.Equal(first.Lease.ExpiresAt) {
		t.Errorf("HeldError's lease: got %+v, want a's %+v", held.Lease, first.Lease)
	}

	again, err := c.Acquire(ctx, lease.AcquireParams{Resource: "report:nightly", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("a's second Acquire: %v", err)
	}
	if again.New || again.Lease.Fence != first.Lease.Fence || again.Lease.ID != first.Lease.ID {
		t.Errorf("a's second Acquire: got new=%t fence %d, want the same lease (not new) with fence %d", again.New, again.Lease.Fence, first.Lease.Fence)
	}

	// Hold by the holder that already holds it takes the lease over.
	h, err := c.Hold(ctx, "report:nightly", "a", lease.KeepConfig{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("Hold by the holder: %v", err)
	}
	if got := h.Lease(); got.Fence != first.Lease.Fence || got.TTLSeconds != 5 || got.RenewedAt == nil {
		t.Errorf("Hold by the holder: got fence %d ttl %d renewed_at %v, want fence %d, TTL 5 s, renewed", got.Fence, got.TTLSeconds, got.RenewedAt, first.Lease.Fence)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	hb, err := c.Hold(ctx, "report:nightly", "b", lease.KeepConfig{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("b's Hold after a's release: %v", err)
	}
	if _, err := c.Hold(ctx, "report:nightly", "a", lease.KeepConfig{TTL: time.Second}); !errors.As(err, &held) || held.Lease.Holder != "b" {
		t.Errorf("a's Hold while b holds: got %v, want a *HeldError naming b", err)
	}
	if err := hb.Release(ctx); err != nil {
		t.Fatalf("b's Release: %v", err)
	}
}

// Acquire with Wait has the server wait for the holder's lease to run out,
// retries transient failures meanwhile, and gives up with the holder's lease
// when Wait runs out.
func TestClientAcquireWait(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "")
	c := s.client()
	ctx := t.Context()

	if _, err := c.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "a", Wait: -time.Second}); !errors.Is(err, leasehold.ErrInvalidArgument) || !strings.Contains(err.Error(), "between 0 and") {
		t.Errorf("Acquire with a negative Wait: got %v, want ErrInvalidArgument saying so", err)
	}
	first, err := c.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "a", TTL: time.Second})
	if err != nil {
		t.Fatalf("a's Acquire: %v", err)
	}
	// No listener behind this server: its timer at a's expires_at wakes b.
	got, err := c.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "b", TTL: time.Minute, Wait: 30 * time.Second})
	if err != nil {
		t.Fatalf("b's Acquire with Wait: %v", err)
	}
	if !got.New || got.Lease.Holder != "b" || got.Lease.Fence <= first.Lease.Fence || got.Lease.CreatedAt.Before(first.Lease.ExpiresAt) {
		t.Errorf("b's Acquire with Wait: got %+v, want a new lease of b, fence above %d, from a's expiry %s on",
			got, first.Lease.Fence, first.Lease.ExpiresAt)
	}

	_, err = c.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "c", Wait: time.Second})
	var held *lease.HeldError
	if !errors.As(err, &held) || held.Lease.Holder != "b" || held.Lease.Fence != got.Lease.Fence {
		t.Errorf("c's Acquire while b holds for a minute, Wait 1s: got %v, want a *HeldError with b's lease", err)
	}

	s.failWith.Store(http.StatusServiceUnavailable)
	type result struct {
		acq lease.Acquisition
		err error
	}
	done := make(chan result, 1)
	go func() {
		acq, err := c.Acquire(ctx, lease.AcquireParams{Resource: "free", Holder: "d", Wait: 30 * time.Second})
		done <- result{acq, err}
	}()
	waitFor(t, "two tries answered 503", func() bool { return s.failed.Load() >= 2 })
	s.failWith.Store(0)
	if r := <-done; r.err != nil || !r.acq.New || r.acq.Lease.Holder != "d" {
		t.Errorf("d's Acquire with Wait through 503s: got %+v, %v; want d's new lease once the server answers", r.acq, r.err)
	}
}

// The plain methods speak the REST API: renew, release, get, lists, events.
func TestClientMethods(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "secret")
	c := s.client("secret")
	ctx := t.Context()

	acq, err := c.Acquire(ctx, lease.AcquireParams{Resource: "db:primary", Holder: "a", TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	l := acq.Lease
	if _, err := c.Acquire(ctx, lease.AcquireParams{Resource: "db:replica", Holder: "a"}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := c.Acquire(ctx, lease.AcquireParams{Resource: "cache", Holder: "a"}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}

	renewed, err := c.Renew(ctx, lease.RenewParams{Resource: "db:primary", Holder: "a", Fence: l.Fence, TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if renewed.RenewedAt == nil || renewed.TTLSeconds != 10 || renewed.Fence != l.Fence {
		t.Errorf("Renew: got %+v, want renewed with TTL 10 s and fence %d", renewed, l.Fence)
	}
	if _, err := c.Renew(ctx, lease.RenewParams{Resource: "db:primary", Holder: "a", Fence: l.Fence + 100}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Renew with a wrong fence: got %v, want ErrNotHeld", err)
	}
	if _, err := c.Renew(ctx, lease.RenewParams{Resource: "db:primary", Holder: "b"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Renew by another holder: got %v, want ErrNotHeld", err)
	}

	got, err := c.Get(ctx, l.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.ID != l.ID || got.Resource != "db:primary" || got.State != lease.StateActive || !got.ExpiresAt.Equal(renewed.ExpiresAt) {
		t.Errorf("Get: got %+v, want the renewed lease %+v", got, renewed)
	}
	if _, err := c.Get(ctx, 1<<40); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Get of an unknown id: got %v, want ErrNotFound", err)
	}

	all, err := c.List(ctx, lease.ListParams{Prefix: "db:"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(all) != 2 || all[0].Resource != "db:primary" || all[1].Resource != "db:replica" {
		t.Errorf("List with prefix db:: got %+v, want db:primary and db:replica", all)
	}
	page, err := c.List(ctx, lease.ListParams{Filter: lease.FilterAll, AfterID: all[0].ID, Limit: 1})
	if err != nil || len(page) != 1 || page[0].ID != all[1].ID {
		t.Errorf("List after id %d, limit 1: got %+v, %v; want the lease %d", all[0].ID, page, err, all[1].ID)
	}
	onlyRenewed, err := c.List(ctx, lease.ListParams{Filter: lease.FilterRenewed})
	if err != nil || len(onlyRenewed) != 1 || onlyRenewed[0].ID != l.ID {
		t.Errorf("List renewed: got %+v, %v; want the lease %d", onlyRenewed, err, l.ID)
	}

	if _, err := c.Release(ctx, lease.ReleaseParams{Resource: "db:primary", Holder: "a", ID: l.ID + 100}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Release with a wrong id: got %v, want ErrNotHeld", err)
	}
	released, err := c.Release(ctx, lease.ReleaseParams{Resource: "db:primary", Holder: "a", Fence: l.Fence, ID: l.ID})
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if released.State != lease.StateReleased || released.ReleasedAt == nil {
		t.Errorf("Release: got %+v, want released", released)
	}
	if _, err := c.Release(ctx, lease.ReleaseParams{Resource: "db:primary", Holder: "a"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("second Release: got %v, want ErrNotHeld", err)
	}
	active, err := c.List(ctx, lease.ListParams{Filter: string(lease.StateActive), Prefix: "db:"})
	if err != nil || len(active) != 1 || active[0].Resource != "db:replica" {
		t.Errorf("List active db:: got %+v, %v; want db:replica", active, err)
	}
	releasedList, err := c.List(ctx, lease.ListParams{Filter: string(lease.StateReleased)})
	if err != nil || len(releasedList) != 1 || releasedList[0].ID != l.ID {
		t.Errorf("List released: got %+v, %v; want the lease %d", releasedList, err, l.ID)
	}

	events, err := c.Events(ctx, lease.EventsParams{Resource: "db:primary"})
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind)
		if e.Resource != "db:primary" || e.Fence != l.Fence || e.At.IsZero() {
			t.Errorf("event %+v: want db:primary with fence %d and a time", e, l.Fence)
		}
	}
	if got, want := strings.Join(kinds, ","), "acquired,renewed,released"; got != want {
		t.Errorf("events of db:primary: got %s, want %s", got, want)
	}
	later, err := c.Events(ctx, lease.EventsParams{AfterID: events[0].ID, Limit: 1})
	if err != nil || len(later) != 1 || later[0].ID <= events[0].ID {
		t.Errorf("Events after %d, limit 1: got %+v, %v; want one later event", events[0].ID, later, err)
	}
}

// Failures other than refusals are *StatusErrors with the server's message,
// transient or not as their status says.
func TestClientErrors(t *testing.T) {
	t.Parallel()
	s := startClientServer(t, "secret")
	ctx := t.Context()

	_, err := s.client().Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "a"})
	var status *leasehold.StatusError
	if !errors.As(err, &status) || status.StatusCode != http.StatusUnauthorized || !strings.Contains(status.Message, "API token") {
		t.Fatalf("Acquire without the token: got %v, want a 401 *StatusError about the token", err)
	}
	if leasehold.IsTransient(err) {
		t.Errorf("IsTransient(%v): got true, want false", err)
	}
	if _, err := s.client("wrong").List(ctx, lease.ListParams{}); !errors.As(err, &status) || status.StatusCode != http.StatusUnauthorized {
		t.Errorf("List with a wrong token: got %v, want 401", err)
	}

	c := s.client("secret")
	// Bad input is refused before anything is sent, as the service would.
	if _, err := c.Acquire(ctx, lease.AcquireParams{Resource: "bad\x01name", Holder: "a"}); !errors.Is(err, leasehold.ErrInvalidArgument) || !strings.Contains(err.Error(), "control character") {
		t.Errorf("Acquire of a bad name: got %v, want ErrInvalidArgument naming the control character", err)
	}

	s.failWith.Store(http.StatusServiceUnavailable)
	_, err = c.Renew(ctx, lease.RenewParams{Resource: "r", Holder: "a"})
	if !errors.As(err, &status) || status.StatusCode != http.StatusServiceUnavailable || !leasehold.IsTransient(err) {
		t.Errorf("Renew answered 503: got %v, want a transient 503 *StatusError", err)
	}
	s.failWith.Store(0)

	s.down.Store(true)
	if _, err := c.Get(ctx, 1); err == nil || !leasehold.IsTransient(err) {
		t.Errorf("Get while the server is unreachable: got %v, want a transient error", err)
	}
	s.down.Store(false)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Get(cancelled, 1); !errors.Is(err, context.Canceled) || leasehold.IsTransient(err) {
		t.Errorf("Get with a cancelled context: got %v, want context.Canceled, not transient", err)
	}
}
