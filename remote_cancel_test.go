package leasehold_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/task"
)

// TestRemoteCancelIsPushed: a task cancelled through one replica stops the
// handler of a remote client working it through another, with
// task.ErrCancelled, at once: its held heartbeat is answered the moment the
// cancellation commits. With a TTL of a minute the next plain heartbeat
// would be 18 s away, so an answer within a second (with the test's slack)
// can only have been pushed.
func TestRemoteCancelIsPushed(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	worked, elsewhere := startService(t, db), startService(t, db)
	running := make(chan int64, 1)
	stopped := make(chan error, 1)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[slowArgs](func(ctx context.Context, tk *leasehold.Task[slowArgs]) error {
		running <- tk.ID
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	c, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: worked.URL}, leasehold.Config{ID: "remote", Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	}()
	r, err := c.Insert(t.Context(), slowArgs{}, &leasehold.InsertOpts{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Receive(t, "the handler to run", running)
	// The first held heartbeat goes a quarter of a second after the claim;
	// the cancellation comes once it waits on the service.
	testkit.WaitFor(t, "the first heartbeat", func() bool {
		got, err := c.Get(t.Context(), r.Task.ID)
		return err == nil && got.LastHeartbeatAt != nil && got.StartedAt != nil && got.LastHeartbeatAt.After(*got.StartedAt)
	})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, elsewhere.URL+"/api/tasks/"+strconv.FormatInt(r.Task.ID, 10)+"/cancel",
		strings.NewReader(`{"reason": "the user changed their mind"}`))
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel through the other replica: %d", resp.StatusCode)
	}
	cause := testkit.Receive(t, "the handler's context to end", stopped)
	took := time.Since(sent)
	if !errors.Is(cause, task.ErrCancelled) {
		t.Fatalf("the handler's context ended with %v; want task.ErrCancelled", cause)
	}
	if took > testkit.Bound(time.Second) {
		t.Errorf("the handler heard of the cancellation %v after it was sent; want within %v: pushed, not at the next heartbeat (18 s away)", took, testkit.Bound(time.Second))
	}
	t.Logf("the remote handler's context ended with task.ErrCancelled %v after the cancellation was sent to another replica", took.Round(time.Millisecond))
}
