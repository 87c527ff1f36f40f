package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// heldAnswer is the answer to one PUT /api/tasks/{id}/heartbeat with
// wait_seconds, and how long it took.
type heldAnswer struct {
	response
	took  time.Duration
	close bool  // the server closes the connection after it
	err   error // the request failed
}

// heartbeatAsync sends a heartbeat of task id with body and delivers its
// answer.
func (b bundle) heartbeatAsync(ctx context.Context, t *testing.T, id int64, body obj) <-chan heldAnswer {
	t.Helper()
	raw := jsonBody(t, body)
	answer := make(chan heldAnswer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, "PUT", fmt.Sprintf("%s/api/tasks/%d/heartbeat", b.srv.URL, id), strings.NewReader(raw))
		if err != nil {
			answer <- heldAnswer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		sent := time.Now()
		res, err := b.srv.Client().Do(req)
		if err != nil {
			answer <- heldAnswer{err: err}
			return
		}
		defer res.Body.Close()
		got, err := io.ReadAll(res.Body)
		answer <- heldAnswer{response: response{status: res.StatusCode, header: res.Header, body: got},
			took: time.Since(sent), close: res.Close, err: err}
	}()
	return answer
}

func receiveHeld(t *testing.T, what string, answer <-chan heldAnswer) heldAnswer {
	t.Helper()
	a := receive(t, what, answer)
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	return a
}

// heartbeatWaits waits until the server logged that processor's heartbeat
// waits: renewed, and subscribed to the cancellations.
func (b waitBundle) heartbeatWaits(t *testing.T, processor string, n int) {
	t.Helper()
	pollUntil(t, processor+"'s heartbeat to wait", func() bool { return b.logged("heartbeat waits", processor) >= n })
}

// runningTask inserts a task with the TTL ttl and claims it for processor.
func (b bundle) runningTask(t *testing.T, processor string, ttl int) taskJSON {
	t.Helper()
	b.createTask(t, fmt.Sprintf(`{"task_data":{},"ttl_seconds":%d}`, ttl))
	return b.claimTask(t, processor)
}

// TestHeartbeatWaitCancelled: a heartbeat held on one replica is answered
// 409, well before its wait, when the task is cancelled through another
// replica, with the error of a heartbeat of a cancelled task; the renewal
// it made had held until then.
func TestHeartbeatWaitCancelled(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	a, b := newWaitReplica(t, db, "replica-a"), newWaitReplica(t, db, "replica-b")
	tk := a.runningTask(t, "w1", 3600)
	answer := a.heartbeatAsync(t.Context(), t, tk.ID, obj{"processor": "w1", "fence": tk.fence(t), "wait_seconds": 300})
	a.heartbeatWaits(t, "w1", 1)
	if got := b.getTask(t, tk.ID); got.State != "running" {
		t.Fatalf("the task while its heartbeat waits: %v, want running", got)
	}

	cancelled := time.Now()
	b.do(t, "POST", fmt.Sprintf("/api/tasks/%d/cancel", tk.ID), `{"reason":"changed my mind"}`).want(t, "cancel on replica-b", http.StatusAccepted)
	got := receiveHeld(t, "the held heartbeat", answer)
	took := time.Since(cancelled)
	t.Logf("the held heartbeat was answered %v after the cancellation", took)
	// Pushed by the cancellation, not the end of its 300 s wait: the bound
	// tells the two apart on any machine, and asserts no speed.
	if took > 150*time.Second {
		t.Errorf("the held heartbeat was answered %v after the cancellation; want well before its 300 s wait was over", took)
	}
	wantConflict(t, "the held heartbeat of a task cancelled meanwhile", got.response)
	// The same answer as a heartbeat of the cancelled task gets now.
	plain := a.taskOp(t, tk.ID, "heartbeat", obj{"processor": "w1", "fence": tk.fence(t)})
	wantConflict(t, "a heartbeat of the cancelled task", plain)
	if !bytes.Equal(got.body, plain.body) {
		t.Errorf("the held heartbeat's 409 %s; want the body of a heartbeat of a cancelled task, %s", got.body, plain.body)
	}
}

// TestHeartbeatWaitPasses: a held heartbeat renews the lease when it
// arrives and is answered 202, with the renewed task, once its wait has
// passed; another task's cancellation meanwhile does not end it. Without a
// listener, it is just as long a wait.
func TestHeartbeatWaitPasses(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 30)
	other := b.runningTask(t, "w2", 30)
	// An expiry that the renewal must move: 5 s from now, not the claim's 30.
	b.sqlExec(t, `UPDATE tasks SET must_heartbeat_before = now() + interval '5 seconds' WHERE id = $1`, tk.ID)
	before := parseTime(t, "must_heartbeat_before", *b.getTask(t, tk.ID).MustHeartbeatBefore)

	answer := b.heartbeatAsync(t.Context(), t, tk.ID, obj{"processor": "w1", "fence": tk.fence(t), "wait_seconds": 1})
	b.heartbeatWaits(t, "w1", 1)
	during := b.getTask(t, tk.ID)
	renewed := parseTime(t, "must_heartbeat_before", *during.MustHeartbeatBefore)
	if !renewed.After(before.Add(20 * time.Second)) {
		t.Errorf("while the heartbeat waits, must_heartbeat_before is %s; want it renewed at once to about 30 s from then, not %s", renewed, before)
	}
	b.do(t, "POST", fmt.Sprintf("/api/tasks/%d/cancel", other.ID), `{}`).want(t, "cancel another task", http.StatusAccepted)

	got := receiveHeld(t, "the held heartbeat", answer)
	answered := got.want(t, "the held heartbeat", http.StatusAccepted).task(t, "the held heartbeat")
	if got.took < time.Second {
		t.Errorf("the heartbeat was answered after %v; want it held for its wait_seconds, 1 s", got.took)
	}
	if answered.ID != tk.ID || answered.State != "running" || deref(answered.Processor) != "w1" ||
		deref(answered.MustHeartbeatBefore) != deref(during.MustHeartbeatBefore) {
		t.Errorf("the held heartbeat answered %v; want the task running for w1 with the lease renewed when it came (%s)",
			answered, deref(during.MustHeartbeatBefore))
	}

	// No listener: the wait is a wait.
	plain := newBundle(t)
	lone := plain.runningTask(t, "w1", 30)
	got = receiveHeld(t, "a held heartbeat without a listener",
		plain.heartbeatAsync(t.Context(), t, lone.ID, obj{"processor": "w1", "wait_seconds": 1}))
	got.want(t, "a held heartbeat without a listener", http.StatusAccepted).task(t, "a held heartbeat without a listener")
	if got.took < time.Second {
		t.Errorf("without a listener the heartbeat was answered after %v; want it held for 1 s", got.took)
	}
}

// TestHeartbeatWaitCappedByLease: a held heartbeat never outlasts the lease
// it renewed: with a TTL of 2 s, wait_seconds 300 is answered 202 once
// TTL − TTL/10 has passed, not after 300 s.
func TestHeartbeatWaitCappedByLease(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 2)
	got := receiveHeld(t, "the held heartbeat",
		b.heartbeatAsync(t.Context(), t, tk.ID, obj{"processor": "w1", "fence": tk.fence(t), "wait_seconds": 300}))
	answered := got.want(t, "the held heartbeat", http.StatusAccepted).task(t, "the held heartbeat")
	if answered.State != "running" || deref(answered.Processor) != "w1" {
		t.Errorf("the held heartbeat answered %v; want the task running for w1", answered)
	}
	t.Logf("a held heartbeat with wait_seconds 300 of a task whose TTL is 2 s was answered after %v", got.took)
	// Capped by the lease (2 s), not answered at the end of its 300 s wait:
	// the bound tells the two apart on any machine, and asserts no speed.
	if got.took > 150*time.Second {
		t.Errorf("answered after %v; want long before its 300 s wait, at the lease's deadline", got.took)
	}
}

// TestHeartbeatWaitBadInput: a wait_seconds that is not an integer from 0
// to 300 is refused with 400, naming the field, and changes nothing: the
// lease is not renewed.
func TestHeartbeatWaitBadInput(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 30)
	before := snapshotAll(t, b.db)
	for _, wait := range []string{"-1", "301", "1.5", `"5"`, "true", "null", "1e9", "9223372036854775808", "[1]"} {
		body := fmt.Sprintf(`{"processor":"w1","fence":%d,"wait_seconds":%s}`, tk.fence(t), wait)
		r := b.do(t, "PUT", fmt.Sprintf("/api/tasks/%d/heartbeat", tk.ID), body).want(t, body, http.StatusBadRequest)
		if !strings.Contains(string(r.body), "wait_seconds") {
			t.Errorf("%s: got %s, want an error naming wait_seconds", body, r)
		}
	}
	if after := snapshotAll(t, b.db); after != before {
		t.Errorf("bad wait_seconds changed the database:\nbefore %s\nafter  %s", before, after)
	}
	if n := b.logged("heartbeat waits", ""); n != 0 {
		t.Errorf("%d heartbeats waited; want none", n)
	}
	// 0 is a heartbeat that does not wait.
	b.taskOp(t, tk.ID, "heartbeat", obj{"processor": "w1", "wait_seconds": 0}).want(t, "wait_seconds 0", http.StatusAccepted)
}

// TestHeartbeatWaitShutdown: a replica that begins to shut down answers a
// held heartbeat at once, 202 with the renewed task, and closes the
// connection: the client's next heartbeat goes to another replica.
func TestHeartbeatWaitShutdown(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 3600)
	answer := b.heartbeatAsync(t.Context(), t, tk.ID, obj{"processor": "w1", "fence": tk.fence(t), "wait_seconds": 300})
	b.heartbeatWaits(t, "w1", 1)
	b.stop()
	got := receiveHeld(t, "the held heartbeat", answer)
	answered := got.want(t, "the held heartbeat during the shutdown", http.StatusAccepted).task(t, "the held heartbeat")
	if answered.ID != tk.ID || answered.State != "running" || answered.MustHeartbeatBefore == nil {
		t.Errorf("the held heartbeat answered %v; want the task running, its lease renewed", answered)
	}
	if !got.close {
		t.Errorf("the answer during the shutdown keeps the connection open; want it closed, for the next heartbeat to go elsewhere")
	}
}

// TestHeartbeatWaitRefusedAtOnce: a held heartbeat that cannot renew the
// lease (another processor, another fence, an unknown task) is answered at
// once as without wait_seconds, and never waits.
func TestHeartbeatWaitRefusedAtOnce(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 3600)
	for _, tc := range []struct {
		what   string
		id     int64
		body   obj // without wait_seconds
		status int
	}{
		{"another processor", tk.ID, obj{"processor": "someone-else"}, http.StatusConflict},
		{"another fence", tk.ID, obj{"processor": "w1", "fence": tk.fence(t) + 1}, http.StatusConflict},
		{"an unknown task", tk.ID + 1000, obj{"processor": "w1"}, http.StatusNotFound},
	} {
		held := obj{"wait_seconds": 300}
		for k, v := range tc.body {
			held[k] = v
		}
		got := receiveHeld(t, tc.what, b.heartbeatAsync(t.Context(), t, tc.id, held))
		got.want(t, tc.what, tc.status)
		plain := b.taskOp(t, tc.id, "heartbeat", tc.body).want(t, tc.what+" without wait_seconds", tc.status)
		if !bytes.Equal(got.body, plain.body) {
			t.Errorf("%s: the held heartbeat got %s; want what a heartbeat without wait_seconds gets, %s", tc.what, got.response, plain)
		}
	}
	if n := b.logged("heartbeat waits", ""); n != 0 {
		t.Errorf("%d refused heartbeats waited; want none", n)
	}
	if got := b.getTask(t, tk.ID); got.State != "running" || deref(got.Processor) != "w1" {
		t.Errorf("the task after the refused heartbeats: %v; want running for w1", got)
	}
}

// TestHeartbeatWaitClientGone: a held heartbeat whose client goes away
// stops waiting (logged as 499); the renewal it made holds.
func TestHeartbeatWaitClientGone(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	tk := b.runningTask(t, "w1", 3600)
	ctx, leave := context.WithCancel(t.Context())
	answer := b.heartbeatAsync(ctx, t, tk.ID, obj{"processor": "w1", "fence": tk.fence(t), "wait_seconds": 300})
	b.heartbeatWaits(t, "w1", 1)
	leave()
	if a := <-answer; a.err == nil {
		t.Fatalf("the abandoned heartbeat got %s; want its context's end", a.response)
	}
	pollUntil(t, "the server to see the client gone", func() bool { return strings.Contains(b.logs.String(), `"status":499`) })
	b.taskOp(t, tk.ID, "heartbeat", obj{"processor": "w1", "fence": tk.fence(t)}).want(t, "the next heartbeat", http.StatusAccepted)
}
