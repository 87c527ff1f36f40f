package leasehold_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/task"
)

type tenantKey struct{}

// TestMiddleware: insert middleware sees each insert's tasks and adds to
// their metadata, which travels with the task to the worker; work
// middleware wraps each attempt, in order, the first outermost, and hands
// the worker its context; embedded and remote alike.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	svc := startService(t, db)
	var (
		mu    sync.Mutex
		trail []string
	)
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trail = append(trail, s)
	}
	tenant := leasehold.Middleware{
		Insert: func(ctx context.Context, tasks []*leasehold.InsertingTask, next func(context.Context) error) error {
			for _, tk := range tasks {
				tk.Metadata["tenant"] = ctx.Value(tenantKey{}).(string)
				note("insert " + tk.Kind + " in " + tk.Queue)
			}
			return next(ctx)
		},
		Work: func(ctx context.Context, tk *task.Task, next func(context.Context) error) error {
			note("outer before")
			err := next(context.WithValue(ctx, tenantKey{}, tk.Metadata["tenant"]))
			note("outer after")
			return err
		},
	}
	inner := leasehold.Middleware{Work: func(ctx context.Context, _ *task.Task, next func(context.Context) error) error {
		note("inner")
		return next(ctx)
	}}
	seen := make(chan string, 2)
	w := leasehold.NewWorkers()
	if err := leasehold.AddWorker(w, leasehold.WorkFunc(func(ctx context.Context, tk *leasehold.Task[emailArgs]) error {
		seen <- ctx.Value(tenantKey{}).(string) + "/" + tk.Metadata["tenant"] + "/" + tk.Metadata["request"]
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	cfg := leasehold.Config{Workers: w, Middleware: []leasehold.Middleware{tenant, inner}}
	embedded, err := leasehold.NewClient(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: svc.URL}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*leasehold.Client{"embedded": embedded, "remote": remote} {
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			trail = nil
			mu.Unlock()
			if err := c.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer c.Stop(context.Background()) //nolint:errcheck // the test's end
			ctx := context.WithValue(t.Context(), tenantKey{}, "acme-"+name)
			res, err := c.Insert(ctx, emailArgs{}, &leasehold.InsertOpts{Metadata: map[string]string{"request": "r1"}})
			if err != nil {
				t.Fatal(err)
			}
			if got := <-seen; got != "acme-"+name+"/acme-"+name+"/r1" {
				t.Errorf("the worker saw %q; want the tenant in its context and the metadata, its own and the middleware's", got)
			}
			waitState(t, embedded, res.Task.ID, task.StateDone)
			mu.Lock()
			got := strings.Join(trail, ", ")
			mu.Unlock()
			if want := "insert email in default, outer before, inner, outer after"; got != want {
				t.Errorf("the middleware ran: %s; want %s", got, want)
			}
		})
	}
}
