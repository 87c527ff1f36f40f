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
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/pgtest"
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
	inserted, err := svc.tasks.Insert(t.Context(), []taskstore.NewTask{{Kind: countArgs{}.Kind(), Queue: "shared", TaskData: []byte(`{"n":1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	id := inserted[0].Task.ID
	if claimed, err := svc.tasks.Claim(t.Context(), taskstore.ClaimParams{Processors: []string{processor}, Queues: []string{"shared"}, TTL: 30 * time.Second}); err != nil || len(claimed) != 1 || claimed[0].ID != id {
		t.Fatalf("claim for %s: %v, %v; want task %d", processor, claimed, err, id)
	}

	// A proxy that says when the worker's claim reaches the service.
	waiting := make(chan struct{})
	target, err := url.Parse(svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var once sync.Once
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		var body struct {
			Processor string `json:"processor"`
		}
		if r.URL.Path == "/api/tasks/next" && json.Unmarshal(raw, &body) == nil && body.Processor == processor {
			once.Do(func() { close(waiting) })
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[countArgs](func(context.Context, *leasehold.Task[countArgs]) error {
		t.Error("the handler ran: the task held for the cut claim was claimed again")
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: front.URL},
		leasehold.Config{ID: "cutter", Workers: workers, Queues: map[string]leasehold.QueueConfig{"shared": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
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
