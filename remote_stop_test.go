package leasehold_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// TestRemoteStopHandsBackACutClaim: a remote client's Stop cuts off its workers' waiting
// claims, and the service may have claimed a task for one just then, an answer that never
// arrives. The client looks for such tasks as it stops and hands each back. Here the task is
// claimed for the worker's name before the client starts (as the service would have claimed
// it for the cut claim), and the client is stopped while that worker's claim waits.
func TestRemoteStopHandsBackACutClaim(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	const processor = "cutter/shared/w1"
	id := insertShared(t, svc, 0)
	if claimed, err := svc.tasks.Claim(t.Context(), taskstore.ClaimParams{Processors: []string{processor}, Queues: []string{"shared"}, TTL: 30 * time.Second}); err != nil || len(claimed) != 1 || claimed[0].ID != id {
		t.Fatalf("claim for %s: %v, %v; want task %d", processor, claimed, err, id)
	}

	// A proxy that says when the worker's claim reaches the service.
	waiting := make(chan struct{})
	var once sync.Once
	front := startFront(t, svc.URL, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		if r.URL.Path == "/api/tasks/next" && claimsFor(r) == processor {
			once.Do(func() { close(waiting) })
		}
		proxy.ServeHTTP(w, r)
	})

	c := startIdleRemote(t, front, "cutter", 1)
	<-waiting
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	got, err := svc.tasks.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != task.StatePending || got.Attempts != 0 {
		t.Errorf("the task claimed for the cut claim is %s after %d attempts; want pending, the attempt not counted", got.State, got.Attempts)
	}
	if len(got.EarlierAttempts) != 1 || got.EarlierAttempts[0].Outcome != task.OutcomeRequeued || got.EarlierAttempts[0].Processor != processor {
		t.Errorf("its history: %+v; want the attempt of %s requeued", got.EarlierAttempts, processor)
	}
}

// TestRemoteStopDuringTheHeartbeatAfterAClaim: a claim that waited sends a heartbeat before
// the task runs (the lease counted from the claim's sending). The stop comes while that
// heartbeat is on its way: the task is handed back, not left to its lease as a heartbeat
// cut off by the stop would leave it (the chaos soak's app-remote did). The proxy holds the
// heartbeat until the stop has cut off the other worker's waiting claim.
func TestRemoteStopDuringTheHeartbeatAfterAClaim(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	var (
		mu                sync.Mutex
		claiming          = map[string]bool{}
		bothWait          = make(chan struct{})
		cut, heartbeating = make(chan struct{}), make(chan struct{})
		cutOnce, hbOnce   sync.Once
	)
	front := startFront(t, svc.URL, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		switch {
		case r.URL.Path == "/api/tasks/next":
			mu.Lock()
			if claiming[claimsFor(r)] = true; len(claiming) == 2 {
				select {
				case <-bothWait:
				default:
					close(bothWait)
				}
			}
			mu.Unlock()
			proxy.ServeHTTP(w, r)
			if r.Context().Err() != nil {
				cutOnce.Do(func() { close(cut) })
			}
			return
		case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/heartbeat"):
			hbOnce.Do(func() { close(heartbeating) })
			select {
			case <-cut:
			case <-t.Context().Done():
			}
		}
		proxy.ServeHTTP(w, r)
	})

	c := startIdleRemote(t, front, "stopper", 2)
	<-bothWait
	// The claims must have waited a tenth of the task's TTL (2 s) for the heartbeat to be
	// sent: time itself is the condition.
	time.Sleep(300 * time.Millisecond)
	id := insertShared(t, svc, 2*time.Second)
	<-heartbeating
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	got, err := svc.tasks.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != task.StatePending || got.Attempts != 0 || len(got.EarlierAttempts) != 1 || got.EarlierAttempts[0].Outcome != task.OutcomeRequeued {
		t.Errorf("the task claimed as the client stopped is %s after %d attempts, history %+v; want pending, handed back, the attempt not counted",
			got.State, got.Attempts, got.EarlierAttempts)
	}
}

// startIdleRemote starts a remote client of url named id, with workers count tasks of queue
// "shared"; the tests stop it before any task is theirs, and a handler that runs fails them.
func startIdleRemote(t *testing.T, url, id string, workers int) *leasehold.Client {
	t.Helper()
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc[countArgs](func(context.Context, *leasehold.Task[countArgs]) error {
		t.Error("the handler ran: a task claimed as the client stopped was run, not handed back")
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: url},
		leasehold.Config{ID: id, Workers: w, Queues: map[string]leasehold.QueueConfig{"shared": {MaxWorkers: workers}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRemoteHandsBackWhenTheHeartbeatAfterAClaimFails: a remote worker's heartbeat after a
// claim that waited fails with an answer that says nothing (a 502): the task goes back at once,
// not counted, rather than wait out its lease, and is claimed again and run.
func TestRemoteHandsBackWhenTheHeartbeatAfterAClaimFails(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	var (
		failOnce sync.Once
		claiming = make(chan struct{})
		seen     sync.Once
	)
	front := startFront(t, svc.URL, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		if r.URL.Path == "/api/tasks/next" {
			seen.Do(func() { close(claiming) })
		}
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/heartbeat") {
			failed := false
			failOnce.Do(func() { failed = true })
			if failed {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadGateway)
				_, _ = io.WriteString(w, `{"error":"the replica failed before it answered"}`)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})
	ran := make(chan int64, 1)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[countArgs](func(_ context.Context, tk *leasehold.Task[countArgs]) error {
		ran <- tk.ID
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: front},
		leasehold.Config{ID: "hb", Workers: workers, Queues: map[string]leasehold.QueueConfig{"shared": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck // the test's checks are above it
	<-claiming
	// The claim must have waited a tenth of the task's TTL (2 s) for the heartbeat to be sent:
	// time itself is the condition.
	time.Sleep(300 * time.Millisecond)
	id := insertShared(t, svc, 2*time.Second)
	if got := <-ran; got != id {
		t.Fatalf("the handler ran task %d, want %d", got, id)
	}
	done := waitState(t, c, id, task.StateDone)
	if done.Attempts != 1 || len(done.EarlierAttempts) != 1 || done.EarlierAttempts[0].Outcome != task.OutcomeRequeued {
		t.Errorf("the task: done after %d attempts, earlier %+v; want 1, the one whose heartbeat failed handed back and not counted",
			done.Attempts, done.EarlierAttempts)
	}
}

// startFront starts a front door to the service at target for the test: serve answers each
// request, sending it on through proxy or not.
func startFront(t *testing.T, target string, serve func(w http.ResponseWriter, r *http.Request, proxy http.Handler)) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(w, r, proxy) }))
	t.Cleanup(front.Close)
	return front.URL
}

// claimsFor is the processor a claim's body names; the body stays readable for the proxy.
func claimsFor(r *http.Request) string {
	raw, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	var body struct {
		Processor string `json:"processor"`
	}
	_ = json.Unmarshal(raw, &body)
	return body.Processor
}

// insertShared inserts a count task of queue "shared" on the service's store, with ttl (0:
// none), and returns its id.
func insertShared(t *testing.T, svc service, ttl time.Duration) int64 {
	t.Helper()
	inserted, err := svc.tasks.Insert(t.Context(), []taskstore.NewTask{{Kind: countArgs{}.Kind(), Queue: "shared", TaskData: []byte(`{"n":1}`), TTL: ttl}})
	if err != nil {
		t.Fatal(err)
	}
	return inserted[0].Task.ID
}
