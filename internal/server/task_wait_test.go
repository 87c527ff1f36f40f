package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/taskstore"
)

// waitClaim is the answer to one POST /api/tasks/next with wait_seconds.
type waitClaim struct {
	status int
	task   taskJSON // when status is 200
	body   string
	err    error // the request failed (its context ended)
}

// claimWaitAsync sends a waiting claim with ctx and delivers its answer.
func (b waitBundle) claimWaitAsync(ctx context.Context, t *testing.T, body obj) <-chan waitClaim {
	t.Helper()
	raw := jsonBody(t, body)
	answer := make(chan waitClaim, 1)
	go func() { answer <- b.claimWait(ctx, raw) }()
	return answer
}

// claimWait sends one waiting claim; it may run on any goroutine.
func (b waitBundle) claimWait(ctx context.Context, body string) waitClaim {
	req, err := http.NewRequestWithContext(ctx, "POST", b.srv.URL+"/api/tasks/next", strings.NewReader(body))
	if err != nil {
		return waitClaim{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := b.srv.Client().Do(req)
	if err != nil {
		return waitClaim{err: err}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return waitClaim{err: err}
	}
	a := waitClaim{status: res.StatusCode, body: string(bytes.TrimSpace(raw))}
	if a.status == http.StatusOK {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a.task); err != nil {
			a.err = fmt.Errorf("decode %s: %w", raw, err)
		}
	}
	return a
}

func receiveClaim(t *testing.T, what string, answer <-chan waitClaim) waitClaim {
	t.Helper()
	a := receive(t, what, answer)
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	return a
}

// logged counts the server's log lines with message msg and, when
// processor is not empty, that processor.
func (b waitBundle) logged(msg, processor string) int {
	n := 0
	for line := range strings.Lines(b.logs.String()) {
		var l struct {
			Message   string `json:"message"`
			Processor string `json:"processor"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == msg && (processor == "" || l.Processor == processor) {
			n++
		}
	}
	return n
}

// claimWaits waits until the server logged that processor's claim waits.
func (b waitBundle) claimWaits(t *testing.T, processor string) {
	t.Helper()
	pollUntil(t, processor+"'s claim to wait", func() bool { return b.logged("claim waits for a task", processor) > 0 })
}

// TestClaimWaitWokenByInsert: a claim waiting on an empty queue is answered
// by the task inserted while it waits, and only by a task of the kinds it
// asked for.
func TestClaimWaitWokenByInsert(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	ctx := t.Context()
	emails := b.claimWaitAsync(ctx, t, obj{"processor": "w-email", "kinds": []string{"email"}, "wait_seconds": 60})
	reports := b.claimWaitAsync(ctx, t, obj{"processor": "w-report", "kinds": []string{"report"}, "wait_seconds": 60})
	b.claimWaits(t, "w-email")
	b.claimWaits(t, "w-report")

	report := b.createTask(t, `{"task_data":{"n":1},"kind":"report"}`)
	a := receiveClaim(t, "the report claim", reports)
	if a.status != http.StatusOK || a.task.ID != report.ID || deref(a.task.Processor) != "w-report" || a.task.State != "running" {
		t.Fatalf("the waiting report claim got %d %s; want task %d, running for w-report", a.status, a.body, report.ID)
	}
	select {
	case a := <-emails:
		t.Fatalf("the email claim was answered by a report task: %d %s", a.status, a.body)
	default:
	}
	email := b.createTask(t, `{"task_data":{"n":2},"kind":"email"}`)
	a = receiveClaim(t, "the email claim", emails)
	if a.status != http.StatusOK || a.task.ID != email.ID || deref(a.task.Processor) != "w-email" {
		t.Fatalf("the waiting email claim got %d %s; want task %d", a.status, a.body, email.ID)
	}
}

// TestClaimWaitWokenByRequeue: a task handed back by its worker goes to the
// claim waiting for it, under a greater fence.
func TestClaimWaitWokenByRequeue(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	created := b.createTask(t, `{"task_data":{}}`)
	first := b.claimTask(t, "w-first")
	if first.ID != created.ID {
		t.Fatalf("claimed task %d; want %d", first.ID, created.ID)
	}
	answer := b.claimWaitAsync(t.Context(), t, obj{"processor": "w-second", "wait_seconds": 60})
	b.claimWaits(t, "w-second")
	b.taskOp(t, first.ID, "requeue", obj{"processor": "w-first", "fence": deref(first.Fence)}).want(t, "requeue", http.StatusAccepted)
	a := receiveClaim(t, "the waiting claim", answer)
	if a.status != http.StatusOK || a.task.ID != first.ID || deref(a.task.Fence) <= deref(first.Fence) {
		t.Fatalf("the waiting claim got %d %s; want task %d with a fence above %d", a.status, a.body, first.ID, deref(first.Fence))
	}
}

// TestClaimWaitWokenByLapse: a task whose worker stopped heartbeating goes,
// once the reaper puts it back, to the claim waiting for it.
func TestClaimWaitWokenByLapse(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	b.createTask(t, `{"task_data":{}}`)
	dead := b.claimTask(t, "w-dead")
	answer := b.claimWaitAsync(t.Context(), t, obj{"processor": "w-alive", "wait_seconds": 60})
	b.claimWaits(t, "w-alive")
	b.expireTaskLease(t, dead.ID)
	lapsed, err := taskstore.NewStore(b.db.Pool).RequeueLapsed(t.Context(), 10) // what the reaper does
	if err != nil || len(lapsed) != 1 {
		t.Fatalf("requeue lapsed: %v, %v; want the one task", lapsed, err)
	}
	a := receiveClaim(t, "the waiting claim", answer)
	if a.status != http.StatusOK || a.task.ID != dead.ID || deref(a.task.Processor) != "w-alive" || deref(a.task.Fence) <= deref(dead.Fence) {
		t.Fatalf("the waiting claim got %d %s; want task %d for w-alive with a fence above %d", a.status, a.body, dead.ID, deref(dead.Fence))
	}
}

// TestClaimWaitManyWaitersManyReplicas: 200 claims waiting on 3 replicas,
// each asking again after every task, and 1,000 tasks inserted in batches
// while they wait: every task is claimed exactly once, each by the waiter
// it was answered to, and nothing is left claimed for a waiter that was
// not told.
func TestClaimWaitManyWaitersManyReplicas(t *testing.T) {
	t.Parallel()
	const (
		replicas = 3
		waiters  = 200
		tasks    = 1000
		batch    = 50
	)
	db := pgtest.New(t)
	var rs []waitBundle
	for i := range replicas {
		rs = append(rs, newWaitReplica(t, db, fmt.Sprintf("replica-%d", i)))
	}

	ctx, stop := context.WithCancel(t.Context())
	var (
		mu      sync.Mutex
		claimed = map[int64]string{} // task → processor it was answered to
		twice   []string
		wg      sync.WaitGroup
	)
	all := make(chan struct{})
	for w := range waiters {
		b := rs[w%replicas]
		processor := fmt.Sprintf("%s/w%d", b.srv.URL, w)
		body := fmt.Sprintf(`{"processor":%q,"wait_seconds":60}`, processor)
		wg.Go(func() {
			for ctx.Err() == nil {
				a := b.claimWait(ctx, body)
				switch {
				case a.err != nil && ctx.Err() != nil:
					return
				case a.err != nil:
					t.Errorf("%s: %v", processor, a.err)
					return
				case a.status == http.StatusNoContent:
					continue
				case a.status != http.StatusOK:
					t.Errorf("%s: %d %s", processor, a.status, a.body)
					return
				}
				if got := deref(a.task.Processor); got != processor {
					t.Errorf("%s was answered task %d claimed for %s", processor, a.task.ID, got)
				}
				mu.Lock()
				if by, ok := claimed[a.task.ID]; ok {
					twice = append(twice, fmt.Sprintf("task %d by %s and %s", a.task.ID, by, processor))
				}
				claimed[a.task.ID] = processor
				if len(claimed) == tasks {
					close(all)
				}
				mu.Unlock()
			}
		})
	}
	for _, b := range rs {
		pollUntil(t, "the waiters to wait", func() bool { return b.logged("claim waits for a task", "") >= waiters/replicas })
	}
	for i := 0; i < tasks; i += batch {
		items := make([]string, batch)
		for j := range items {
			items[j] = fmt.Sprintf(`{"task_data":{"i":%d}}`, i+j)
		}
		rs[i/batch%replicas].do(t, "POST", "/api/tasks", "["+strings.Join(items, ",")+"]").want(t, "insert a batch", http.StatusCreated)
	}
	select {
	case <-all:
	case <-time.After(60 * time.Second): // keeps a broken test from hanging
		mu.Lock()
		n := len(claimed)
		mu.Unlock()
		t.Errorf("after 60s, %d of %d tasks were answered to a waiter", n, tasks)
	}
	stop()
	wg.Wait()

	if len(twice) > 0 {
		t.Errorf("tasks answered twice: %v", twice)
	}
	// The database agrees: every task running, held by the processor it
	// was answered to, in its first attempt.
	rows, err := db.Pool.Query(t.Context(), `SELECT id, state, processor, attempts FROM tasks`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			id        int64
			state     string
			processor *string
			attempts  int32
		)
		if err := rows.Scan(&id, &state, &processor, &attempts); err != nil {
			t.Fatal(err)
		}
		n++
		if want, ok := claimed[id]; !ok || state != "running" || deref(processor) != want || attempts != 1 {
			t.Errorf("task %d is %s for %v after %d attempts; want running for %q (answered: %v) in its first attempt",
				id, state, deref(processor), attempts, want, ok)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != tasks || len(claimed) != tasks {
		t.Errorf("%d tasks in the table, %d claimed; want %d of each", n, len(claimed), tasks)
	}
}

// TestClaimWaitClientGone: a waiting claim whose client goes away stops
// waiting at once and claims nothing: the next task goes to the claim that
// still waits, and the history shows no attempt by the one that left.
func TestClaimWaitClientGone(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	ctx, leave := context.WithCancel(t.Context())
	gone := b.claimWaitAsync(ctx, t, obj{"processor": "w-gone", "wait_seconds": 60})
	b.claimWaits(t, "w-gone")
	leave()
	if a := <-gone; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("the abandoned claim got %d %s, %v; want its context's end", a.status, a.body, a.err)
	}
	pollUntil(t, "the server to see the client gone", func() bool {
		return b.logged("claim stopped waiting: the client went away", "w-gone") > 0
	})

	stays := b.claimWaitAsync(t.Context(), t, obj{"processor": "w-stays", "wait_seconds": 60})
	b.claimWaits(t, "w-stays")
	created := b.createTask(t, `{"task_data":{}}`)
	a := receiveClaim(t, "the claim that stayed", stays)
	if a.status != http.StatusOK || a.task.ID != created.ID || deref(a.task.Processor) != "w-stays" || a.task.Attempts != 1 {
		t.Fatalf("the claim that stayed got %d %s; want task %d in its first attempt", a.status, a.body, created.ID)
	}
	if h := b.earlierAttempts(t, created.ID); len(h) != 0 {
		t.Errorf("the task's history is %+v; want no attempt by the client that left", h)
	}
}

// TestClaimWaitShutdown: a replica shutting down answers every waiting
// claim at once with 503, for the client to ask another replica, and
// claims nothing for them.
func TestClaimWaitShutdown(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	const n = 30
	var answers []<-chan waitClaim
	for i := range n {
		p := fmt.Sprintf("w-%d", i)
		answers = append(answers, b.claimWaitAsync(t.Context(), t, obj{"processor": p, "wait_seconds": 300}))
		b.claimWaits(t, p)
	}
	b.stop()
	for i, ch := range answers {
		a := receiveClaim(t, fmt.Sprintf("waiter %d", i), ch)
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("waiter %d got %d %s; want 503", i, a.status, a.body)
		}
	}
	// A claim that comes after is refused at once too.
	a := receiveClaim(t, "a late claim", b.claimWaitAsync(t.Context(), t, obj{"processor": "late", "wait_seconds": 300}))
	if a.status != http.StatusServiceUnavailable {
		t.Errorf("a claim after the shutdown began got %d %s; want 503", a.status, a.body)
	}
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TestClaimWaitSameProcessorTwice: two claims that wait under one processor
// name (a client reusing its name for parallel requests) each get a task of
// their own.
func TestClaimWaitSameProcessorTwice(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	first := b.claimWaitAsync(t.Context(), t, obj{"processor": "twin", "wait_seconds": 60})
	second := b.claimWaitAsync(t.Context(), t, obj{"processor": "twin", "wait_seconds": 60})
	pollUntil(t, "both claims to wait", func() bool { return b.logged("claim waits for a task", "twin") == 2 })
	b.do(t, "POST", "/api/tasks", `[{"task_data":{"n":1}},{"task_data":{"n":2}}]`).want(t, "insert two", http.StatusCreated)
	a1 := receiveClaim(t, "the first claim", first)
	a2 := receiveClaim(t, "the second claim", second)
	if a1.status != http.StatusOK || a2.status != http.StatusOK || a1.task.ID == a2.task.ID {
		t.Fatalf("the two claims got %d %s and %d %s; want a task each", a1.status, a1.body, a2.status, a2.body)
	}
}

// TestClaimWaitTakesALapsedTask: a task whose lease lapsed, which no reaper
// has put back yet (none runs here), goes to a claim that waits, as it
// would to one that does not.
func TestClaimWaitTakesALapsedTask(t *testing.T) {
	t.Parallel()
	b := newWaitBundle(t)
	b.createTask(t, `{"task_data":{}}`)
	dead := b.claimTask(t, "w-dead")
	b.expireTaskLease(t, dead.ID)
	a := receiveClaim(t, "the waiting claim", b.claimWaitAsync(t.Context(), t, obj{"processor": "w-alive", "wait_seconds": 60}))
	if a.status != http.StatusOK || a.task.ID != dead.ID || deref(a.task.Fence) <= deref(dead.Fence) {
		t.Fatalf("the waiting claim got %d %s; want task %d with a fence above %d", a.status, a.body, dead.ID, deref(dead.Fence))
	}
}
