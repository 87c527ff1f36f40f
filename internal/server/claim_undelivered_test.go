package server_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/task"
)

// brokenConn is a ResponseWriter whose connection breaks under the answer: the body is
// buffered, and the flush that would send it fails, as it does once the server has seen the
// client's connection closed.
type brokenConn struct{ *httptest.ResponseRecorder }

func (b brokenConn) FlushError() error { return errors.New("write tcp: broken pipe") }

// TestClaimAnswerUndelivered: a claim whose answer cannot be sent (the client's connection
// broke under it) hands the task back: pending again, the attempt not counted, the history
// saying why; so the task is not held, unrun, for its TTL. The next claim gets it.
func TestClaimAnswerUndelivered(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := server.NewServer(testDeps(db))
	b := bundle{db: db}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b.srv = srv
	created := b.createTask(t, `{"task_data":{}}`)

	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/api/tasks/next", strings.NewReader(`{"processor":"w-broken"}`))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(brokenConn{httptest.NewRecorder()}, req)

	got := b.do(t, "GET", "/api/tasks/"+strconv.FormatInt(created.ID, 10), "").want(t, "the task", http.StatusOK).task(t, "the task")
	if got.State != task.StatePending || got.Attempts != 0 {
		t.Errorf("after a claim whose answer was not delivered the task is %s after %d attempts; want pending, none counted", got.State, got.Attempts)
	}
	if h := b.earlierAttempts(t, created.ID); len(h) != 1 || h[0].Outcome != task.OutcomeRequeued || h[0].Processor != "w-broken" {
		t.Errorf("its history: %+v; want the undelivered attempt, requeued", h)
	}
	next := b.claimTask(t, "w-next")
	if next.ID != created.ID || next.Attempts != 1 {
		t.Errorf("the next claim got task %d in attempt %d; want task %d in its first", next.ID, next.Attempts, created.ID)
	}
}

// TestClaimWaitAnsweredPastTheBudget: a waiting claim answered after the API's database
// budget has run out (the wait bundle's 1 s) gets its task: the budget ending is not the
// client going away, and the task is not handed back.
func TestClaimWaitAnsweredPastTheBudget(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	answer := b.claimWaitAsync(t.Context(), t, obj{"processor": "w-patient", "wait_seconds": 30})
	b.claimWaits(t, "w-patient")
	time.Sleep(1500 * time.Millisecond) // the budget (1 s) runs out: time itself is the condition
	created := b.createTask(t, `{"task_data":{}}`)
	a := receiveClaim(t, "the patient claim", answer)
	if a.err != nil || a.status != http.StatusOK || a.task.ID != created.ID {
		t.Fatalf("the claim answered past the budget got %d %q, %v; want task %d", a.status, a.body, a.err, created.ID)
	}
	if got := b.do(t, "GET", "/api/tasks/"+strconv.FormatInt(created.ID, 10), "").want(t, "the task", http.StatusOK).task(t, "the task"); got.State != task.StateRunning {
		t.Errorf("the task answered to the claim is %s; want running, not handed back", got.State)
	}
}

// TestAcquireAnswerUndelivered: an acquisition whose answer cannot be sent releases the
// holding it made, which its holder never learned of, so the next holder need not wait out
// its TTL; an acquisition of a lease the holder already held leaves it held.
func TestAcquireAnswerUndelivered(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := server.NewServer(testDeps(db))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b := bundle{db: db, srv: srv}
	acquireBroken := func(resource, holder string) {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/api/leases",
			strings.NewReader(`{"resource":"`+resource+`","holder":"`+holder+`","ttl_seconds":3600}`))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(brokenConn{httptest.NewRecorder()}, req)
	}

	acquireBroken("lost-answer", "a")
	if got := b.acquire(t, "lost-answer", "b", 60); got.Holder != "b" {
		t.Errorf("after an acquisition whose answer was lost, b got the lease of %s; want b's own at once", got.Holder)
	}

	kept := b.acquire(t, "kept", "a", 60)
	acquireBroken("kept", "a") // a again: it holds the lease and knows its fence
	r := b.do(t, "POST", "/api/leases", `{"resource":"kept","holder":"b","ttl_seconds":60}`)
	if r.status != http.StatusConflict {
		t.Fatalf("b's acquisition of the lease a holds: %s; want 409", r)
	}
	var held struct {
		Lease leaseJSON `json:"lease"`
	}
	if err := json.Unmarshal(r.body, &held); err != nil {
		t.Fatalf("the 409's body %s: %v", r.body, err)
	}
	if got := held.Lease; got.Holder != "a" || got.Fence != kept.Fence {
		t.Errorf("the lease is %s's under fence %d; want a's under %d", got.Holder, got.Fence, kept.Fence)
	}
}
