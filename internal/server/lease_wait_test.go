package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
)

// waitBundle is a server whose waiting acquisitions hear of releases
// through a real LISTEN connection, with its log at debug level.
type waitBundle struct {
	bundle
	logs     *syncBuffer
	stopping chan struct{}
	// stop closes stopping, as serve does when it begins to shut down;
	// the test's cleanup calls it too, which ends the server's claim
	// dispatcher.
	stop func()
}

func newWaitBundle(t *testing.T) waitBundle {
	t.Helper()
	return newWaitReplica(t, pgtest.New(t), "test")
}

// newWaitReplica is a waitBundle on db named id (as serve's --instance-id
// names a replica): several of them on one database are replicas of one
// cluster.
func newWaitReplica(t *testing.T, db pgtest.DB, id string) waitBundle {
	t.Helper()
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	testkit.WaitFor(t, "the listener to connect", listener.Connected)

	b := waitBundle{logs: &syncBuffer{}, stopping: make(chan struct{})}
	b.stop = sync.OnceFunc(func() { close(b.stopping) })
	d := testDeps(db, withLog(zerolog.New(b.logs).Level(zerolog.DebugLevel)))
	d.Listener, d.Stopping = listener, b.stopping
	d.Instance.ID = id
	// Bounded as serve bounds every API request: the wait must outlive the
	// budget, each statement not (a second, with the test's slack: a loaded
	// machine's statement may take longer).
	budget := testkit.Bound(time.Second)
	h := server.NewServer(d)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, cancel := server.BoundRequest(r, budget)
		defer cancel()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(b.stop) // before srv.Close: no claim waits past the test
	b.bundle = bundle{db: db, srv: srv}
	return b
}

// pollUntil polls cond until it holds (testkit.WaitFor).
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, what, cond)
}

// waiting waits until the server logged that holder's acquisition waits.
func (b waitBundle) waiting(t *testing.T, holder string) {
	t.Helper()
	pollUntil(t, holder+"'s acquisition to wait", func() bool {
		for line := range strings.Lines(b.logs.String()) {
			var l struct {
				Message string `json:"message"`
				Holder  string `json:"holder"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Message == "acquisition waits for the lease" && l.Holder == holder {
				return true
			}
		}
		return false
	})
}

// acquireAsync sends an acquisition and delivers its answer.
func (b waitBundle) acquireAsync(t *testing.T, body string) <-chan response {
	t.Helper()
	answer := make(chan response, 1)
	go func() { answer <- b.do(t, "POST", "/api/leases", body) }()
	return answer
}

func receiveAnswer(t *testing.T, what string, answer <-chan response) response {
	t.Helper()
	return receive(t, what, answer)
}

// receive returns what comes on answer, failing the test when nothing
// comes within 60 s.
func receive[T any](t *testing.T, what string, answer <-chan T) T {
	t.Helper()
	select {
	case a := <-answer:
		return a
	case <-time.After(60 * time.Second): // keeps a broken test from hanging
		t.Fatalf("%s: no answer within 60s", what)
		var zero T
		return zero
	}
}

// TestAcquireWaitsForRelease: a waiter on a lease held for an hour is
// granted the lease, with a greater fence, once the holder releases it: the
// release NOTIFY woke it.
func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	held := decodeStrict[leaseJSON](t, "acquire by a",
		b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"a","ttl_seconds":3600}`).want(t, "acquire by a", http.StatusCreated))

	answer := b.acquireAsync(t, `{"resource":"job","holder":"b","wait_seconds":60}`)
	b.waiting(t, "b")
	b.do(t, "DELETE", "/api/leases/release", fmt.Sprintf(`{"resource":"job","holder":"a","fence":%d}`, held.Fence)).
		want(t, "release by a", http.StatusOK)

	got := decodeStrict[leaseJSON](t, "waiting acquire by b", receiveAnswer(t, "b", answer).want(t, "waiting acquire by b", http.StatusCreated))
	if got.Holder != "b" || got.State != "active" || got.Fence <= held.Fence {
		t.Errorf("waiting acquire: got %v, want b's active lease with a fence above %d", got, held.Fence)
	}
}

// TestAcquireWaitsForExpiry: with no reaper to announce it, a waiter still
// takes a lease as it expires, by its own timer at expires_at.
func TestAcquireWaitsForExpiry(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	held := decodeStrict[leaseJSON](t, "acquire by a",
		b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"a","ttl_seconds":2}`).want(t, "acquire by a", http.StatusCreated))

	r := b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"b","wait_seconds":30}`)
	got := decodeStrict[leaseJSON](t, "waiting acquire by b", r.want(t, "waiting acquire by b", http.StatusCreated))
	if got.Holder != "b" || got.Fence <= held.Fence {
		t.Errorf("waiting acquire: got %v, want b's lease with a fence above %d", got, held.Fence)
	}
	if created, expired := parseTime(t, "created_at", got.CreatedAt), parseTime(t, "expires_at", held.ExpiresAt); created.Before(expired) {
		t.Errorf("b acquired at %s, before a's lease expired at %s", got.CreatedAt, held.ExpiresAt)
	}
}

// TestAcquireWaitTimesOut: a waiter that is not granted the lease in time
// gets the 409 of an acquisition without wait_seconds, with the holder's
// lease, and the lease stays the holder's.
func TestAcquireWaitTimesOut(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	held := decodeStrict[leaseJSON](t, "acquire by a",
		b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"a","ttl_seconds":3600}`).want(t, "acquire by a", http.StatusCreated))

	// Longer than the request's database budget: the wait outlives it.
	r := b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"b","wait_seconds":2}`).want(t, "waiting acquire by b", http.StatusConflict)
	type conflictJSON struct {
		Error string    `json:"error"`
		Lease leaseJSON `json:"lease"`
	}
	conflict := decodeStrict[conflictJSON](t, "409", r)
	if conflict.Lease.Holder != "a" || conflict.Lease.Fence != held.Fence || !strings.Contains(conflict.Error, "held by a") {
		t.Errorf("409 after the wait: got %s, want a's lease (fence %d) and an error naming a", r, held.Fence)
	}
	b.waiting(t, "b") // it did wait
	b.do(t, "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"job","holder":"a","fence":%d}`, held.Fence)).
		want(t, "a renews after b gave up", http.StatusOK)
}

// TestAcquireWaitBadInput: a wait_seconds that is not an integer from 0 to
// 300 is refused with 400, naming the field, and changes nothing.
func TestAcquireWaitBadInput(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	before := snapshot(t, b.db)
	for _, wait := range []string{"-1", "301", "1.5", `"5"`, "true", "1e9", "9223372036854775808"} {
		body := `{"resource":"job","holder":"b","wait_seconds":` + wait + `}`
		r := b.do(t, "POST", "/api/leases", body).want(t, body, http.StatusBadRequest)
		if !strings.Contains(string(r.body), "wait_seconds") {
			t.Errorf("%s: got %s, want an error naming wait_seconds", body, r)
		}
	}
	if after := snapshot(t, b.db); after != before {
		t.Errorf("bad wait_seconds changed the database:\nbefore %s\nafter  %s", before, after)
	}
	// The bounds themselves are fine: 0 does not wait, 300 is the most.
	b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"b","wait_seconds":0}`).want(t, "wait_seconds 0", http.StatusCreated)
	b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"b","wait_seconds":300}`).want(t, "wait_seconds 300, already held", http.StatusOK)
}

// TestAcquireWaitEndsWithClient: a waiter whose client goes away stops
// waiting (its request is logged as 499) and does not take the lease when
// it is released afterwards.
func TestAcquireWaitEndsWithClient(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	held := decodeStrict[leaseJSON](t, "acquire by a",
		b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"a","ttl_seconds":3600}`).want(t, "acquire by a", http.StatusCreated))

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, "POST", b.srv.URL+"/api/leases",
		strings.NewReader(`{"resource":"job","holder":"b","wait_seconds":60}`))
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		resp, err := b.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		sent <- err
	}()
	b.waiting(t, "b")
	cancel()
	if err := <-sent; err == nil {
		t.Fatal("the cancelled request got an answer; want it cut short")
	}
	pollUntil(t, "the waiting request to end as 499", func() bool {
		return strings.Contains(b.logs.String(), `"status":499`)
	})

	b.do(t, "DELETE", "/api/leases/release", fmt.Sprintf(`{"resource":"job","holder":"a","fence":%d}`, held.Fence)).
		want(t, "release by a", http.StatusOK)
	b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"c"}`).want(t, "acquire by c after b went away", http.StatusCreated)
}

// TestAcquireWaitEndsOnShutdown: when the replica begins to shut down, a
// waiter is answered 503 at once, to be sent again elsewhere.
func TestAcquireWaitEndsOnShutdown(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	b.do(t, "POST", "/api/leases", `{"resource":"job","holder":"a","ttl_seconds":3600}`).want(t, "acquire by a", http.StatusCreated)
	answer := b.acquireAsync(t, `{"resource":"job","holder":"b","wait_seconds":300}`)
	b.waiting(t, "b")
	b.stop()
	r := receiveAnswer(t, "b", answer).want(t, "waiting acquire during shutdown", http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "shutting down") {
		t.Errorf("got %s (Retry-After %q), want a Retry-After and an error saying the replica is shutting down", r, r.header.Get("Retry-After"))
	}
}
