package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
)

// DefaultBacklog are the backlogs backlog drains when Config.Backlog is empty.
var DefaultBacklog = []int{10000, 100000, 500000}

// runBacklog drains backlogs of growing size, each pre-inserted on a fresh database, with
// one replica of BacklogWorkers workers: the drain rate must not fall as the backlog grows
// (the dead entries a claim walks, the vacuums, the plans). The time is the database's,
// from the first claim to the last completion.
func runBacklog(ctx context.Context, c Config, _ []Result) ([]Result, error) {
	var out []Result
	for _, n := range c.Backlog {
		r, err := drainBacklog(ctx, c, n)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func drainBacklog(ctx context.Context, c Config, n int) (Result, error) {
	d, err := newDB(ctx, c.DatabaseURL, int32(c.BacklogWorkers+8))
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	// One statement per 100,000 tasks: the backlog as a burst of inserts left it.
	for left := n; left > 0; left -= 100000 {
		if _, err := d.Pool.Exec(ctx, `INSERT INTO tasks (task_data) SELECT $1::jsonb FROM generate_series(1, $2::integer)`,
			zeroWork, min(left, 100000)); err != nil {
			return Result{}, fmt.Errorf("insert the backlog: %w", err)
		}
	}
	var completed atomic.Int64
	done := make(chan struct{})
	store := taskstore.NewStore(d.Pool)
	r, err := startReplicas(ctx, d, store, 1, c.BacklogWorkers, func(ev worker.Event) {
		if ev.Kind == worker.EventCompleted && completed.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		return Result{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		r.Stop()
		return Result{}, ctx.Err()
	}
	r.Stop()
	var secs float64
	if err := d.Pool.QueryRow(ctx, `SELECT extract(epoch FROM max(processed_at) - min(started_at)) FROM tasks`).Scan(&secs); err != nil {
		return Result{}, err
	}
	stats, err := store.Stats(ctx)
	if err != nil {
		return Result{}, err
	}
	if stats.Done != int64(n) {
		return Result{}, fmt.Errorf("after the backlog's drain %d tasks are done, want %d (%+v)", stats.Done, n, stats)
	}
	var vacuums int64
	if err := d.Pool.QueryRow(ctx, `SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'tasks'`).Scan(&vacuums); err != nil {
		return Result{}, err
	}
	return Result{
		Scenario: "backlog", Case: fmt.Sprintf("%d pending, 1 replica × %d workers, in-process", n, c.BacklogWorkers),
		Value: float64(n) / secs, Unit: "tasks/s",
		Note: fmt.Sprintf("first claim to last completion, by the database clock; %d autovacuums of tasks since the insert; drained in %s",
			vacuums, (time.Duration(secs * float64(time.Second))).Round(100*time.Millisecond)),
	}, nil
}
