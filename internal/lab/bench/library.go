package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/taskstore"
)

// noop is the library drain's task: its handler does nothing.
type noop struct{}

// Kind names the kind.
func (noop) Kind() string { return "bench_noop" }

// drainLibrary is drain through the public Go API: Replicas clients on the scenario's pool,
// each with a queue of Workers, run a no-op handler registered with AddWorker for Tasks
// tasks inserted with InsertMany. The time runs from the first Start to the return of
// the last Stop, which waits for the completions of the last tasks to commit.
func drainLibrary(ctx context.Context, c Config) (Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	var handled atomic.Int64
	all := make(chan struct{})
	workers := leasehold.NewWorkers()
	err = leasehold.AddWorker(workers, leasehold.WorkFunc[noop](func(context.Context, *leasehold.Task[noop]) error {
		if handled.Add(1) == int64(c.Tasks) {
			close(all)
		}
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		return Result{}, err
	}
	clients := make([]*leasehold.Client, c.Replicas)
	for i := range clients {
		clients[i], err = leasehold.NewClient(d.Pool, leasehold.Config{
			ID: fmt.Sprintf("bench-lib-%d", i+1), Workers: workers, TaskTTL: 30 * time.Second,
			Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: c.Workers}},
		})
		if err != nil {
			return Result{}, err
		}
	}
	params := make([]leasehold.InsertParams, 1000)
	for i := range params {
		params[i] = leasehold.InsertParams{Args: noop{}}
	}
	for n := c.Tasks; n > 0; n -= len(params) {
		if _, err := clients[0].InsertMany(ctx, params[:min(n, len(params))]); err != nil {
			return Result{}, err
		}
	}
	start := time.Now()
	for _, cl := range clients {
		if err := cl.Start(ctx); err != nil {
			return Result{}, err
		}
	}
	stopAll := func() error {
		var errs []error
		for _, cl := range clients {
			errs = append(errs, cl.Stop(ctx))
		}
		return errors.Join(errs...)
	}
	select {
	case <-all:
	case <-ctx.Done():
		_ = stopAll()
		return Result{}, ctx.Err()
	}
	if err := stopAll(); err != nil {
		return Result{}, err
	}
	elapsed := time.Since(start)
	stats, err := taskstore.NewStore(d.Pool).Stats(ctx)
	if err != nil {
		return Result{}, err
	}
	if stats.Done != int64(c.Tasks) {
		return Result{}, fmt.Errorf("after the library's drain %d tasks are done, want %d (%+v)", stats.Done, c.Tasks, stats)
	}
	return Result{
		Scenario: "drain", Case: fmt.Sprintf("%d tasks, %d clients × %d workers, through the library", c.Tasks, c.Replicas, c.Workers),
		Value: float64(c.Tasks) / elapsed.Seconds(), Unit: "tasks/s",
		Note: "leasehold.NewClient per replica, a no-op WorkFunc; Start to the last Stop",
	}, nil
}

// latencyLibrary is latency through the public Go API: Replicas clients of Workers idle
// workers each; Samples tasks inserted one at a time with Insert, from the insert's commit
// (the midpoint of its round trip) to the start of the no-op handler's run.
func latencyLibrary(ctx context.Context, c Config) ([]time.Duration, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.Replicas*c.Workers+8))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	started := make(chan int64, 16)
	workers := leasehold.NewWorkers()
	err = leasehold.AddWorker(workers, leasehold.WorkFunc[noop](func(_ context.Context, t *leasehold.Task[noop]) error {
		started <- t.ID
		return nil
	}), leasehold.KindConfig{})
	if err != nil {
		return nil, err
	}
	var clients []*leasehold.Client
	defer func() {
		for _, cl := range clients {
			_ = cl.Stop(context.WithoutCancel(ctx)) // the figures are taken
		}
	}()
	for i := range c.Replicas {
		cl, err := leasehold.NewClient(d.Pool, leasehold.Config{
			ID: fmt.Sprintf("bench-lib-%d", i+1), Workers: workers,
			Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: c.Workers}},
		})
		if err != nil {
			return nil, err
		}
		if err := cl.Start(ctx); err != nil {
			return nil, err
		}
		clients = append(clients, cl)
	}
	lat := make([]time.Duration, 0, c.Samples)
	for range c.Samples {
		sent := time.Now()
		res, err := clients[0].Insert(ctx, noop{}, nil)
		if err != nil {
			return nil, err
		}
		from := sent.Add(time.Since(sent) / 2)
		if err := await(ctx, started, res.Task.ID); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(from))
	}
	return lat, nil
}

// runBulkInsert inserts Tasks tasks through the public API twice, each into a database
// of its own: with InsertMany in batches of 1000 (one INSERT ... SELECT unnest each), and
// with InsertManyFast (COPY, in one transaction). Nobody works them: what is measured is
// the insert alone, in tasks per second, the two in the same run.
func runBulkInsert(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	n := c.Tasks
	measure := func(name string, insert func(ctx context.Context, client *leasehold.Client, params []leasehold.InsertParams) error) (Result, error) {
		d, err := newDB(ctx, c.DatabaseURL, 8)
		if err != nil {
			return Result{}, err
		}
		defer d.Close()
		client, err := leasehold.NewClient(d.Pool, leasehold.Config{ID: "bench-bulk", AllowUnknownKinds: true})
		if err != nil {
			return Result{}, err
		}
		params := make([]leasehold.InsertParams, n)
		for i := range params {
			params[i] = leasehold.InsertParams{Args: noop{}}
		}
		start := time.Now()
		if err := insert(ctx, client, params); err != nil {
			return Result{}, fmt.Errorf("%s: %w", name, err)
		}
		took := time.Since(start)
		return Result{Scenario: "bulk-insert", Case: name, Value: float64(n) / took.Seconds(), Unit: "tasks/s",
			Note: fmt.Sprintf("%d tasks in %s", n, took.Round(time.Millisecond))}, nil
	}
	many, err := measure("InsertMany, batches of 1000", func(ctx context.Context, client *leasehold.Client, params []leasehold.InsertParams) error {
		for len(params) > 0 {
			k := min(len(params), 1000)
			if _, err := client.InsertMany(ctx, params[:k]); err != nil {
				return err
			}
			params = params[k:]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fast, err := measure("InsertManyFast (COPY), one batch", func(ctx context.Context, client *leasehold.Client, params []leasehold.InsertParams) error {
		_, err := client.InsertManyFast(ctx, params)
		return err
	})
	if err != nil {
		return nil, err
	}
	return []Result{many, fast}, nil
}
