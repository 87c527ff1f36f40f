package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/retention"
)

// TestOnlyTheReaperPrunes runs two reapers with retention: only the one
// holding the reaper lease prunes (each round checks, by the database, that
// its reaper holds the lease); the other starts pruning only once it has
// taken over.
func TestOnlyTheReaperPrunes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	tasks := taskstore.NewStore(tdb.Pool)
	var rwg sync.WaitGroup // the reapers and their listeners
	defer func() { cancel(); rwg.Wait() }()

	oldTasks := func(n int) {
		t.Helper()
		batch := make([]taskstore.NewTask, n)
		for i := range batch {
			batch[i] = taskstore.NewTask{TaskData: json.RawMessage(`{}`)}
		}
		if _, err := taskstore.TasksOf(tasks.Insert(ctx, batch)); err != nil {
			t.Fatal(err)
		}
		// Test setup as the owner: they finished eight days ago.
		if _, err := tdb.Pool.Exec(ctx, `UPDATE tasks SET state = 'done', created_at = now() - interval '9 days', processed_at = now() - interval '8 days'
			WHERE state = 'pending'`); err != nil {
			t.Fatal(err)
		}
	}
	oldTasks(3)

	type round struct {
		instance string
		counts   retention.Counts
	}
	rounds := make(chan round, 16)
	var mu sync.Mutex
	pruned := map[string]int{}
	stops := map[string]context.CancelFunc{}
	for _, name := range []string{"reaper-a", "reaper-b"} {
		rctx, stop := context.WithCancel(ctx)
		stops[name] = stop
		r := &reaper.Reaper{
			Store: store, Listener: startListener(rctx, t, &rwg, tdb.URL), Instance: name,
			Keep: lease.KeepConfig{TTL: 30 * time.Second}, Log: zerolog.Nop(),
			Retention: &retention.Pruner{
				Store:  retention.NewStore(tdb.Pool),
				Config: retention.Config{TaskAge: retention.DefaultAge, LeaseHistoryAge: retention.DefaultAge, Interval: time.Hour},
				Log:    zerolog.Nop(),
				Pruned: func(c retention.Counts) {
					var holder string
					err := tdb.Pool.QueryRow(context.Background(), `SELECT holder FROM leases
						WHERE resource = $1 AND released_at IS NULL AND expires_at > now()`, reaper.Resource).Scan(&holder)
					if errors.Is(err, pgx.ErrNoRows) || holder != name {
						t.Errorf("%s pruned while the reaper lease was held by %q (%v)", name, holder, err)
					}
					mu.Lock()
					pruned[name]++
					mu.Unlock()
					rounds <- round{name, c}
				},
			},
		}
		rwg.Go(func() { _ = r.Run(rctx) })
	}
	next := func(what string) round {
		t.Helper()
		select {
		case r := <-rounds:
			return r
		case <-time.After(testkit.Patience): // keeps a broken test from hanging; asserts no speed
			t.Fatalf("gave up waiting for %s", what)
			return round{}
		}
	}

	first := next("the elected reaper's first round")
	if first.counts.Tasks != 3 {
		t.Errorf("%s's first round: %+v, want the 3 old tasks", first.instance, first.counts)
	}
	other := map[string]string{"reaper-a": "reaper-b", "reaper-b": "reaper-a"}[first.instance]
	mu.Lock()
	followerRounds := pruned[other]
	mu.Unlock()
	if followerRounds != 0 {
		t.Errorf("%s, not the reaper, pruned %d times", other, followerRounds)
	}

	// More old tasks; the reaper steps down, the other takes over and
	// prunes them at once.
	oldTasks(2)
	stops[first.instance]()
	second := next("the new reaper's first round")
	if second.instance != other || second.counts.Tasks != 2 {
		t.Errorf("after %s stopped: %s pruned %+v; want %s to prune the 2 new old tasks", first.instance, second.instance, second.counts, other)
	}
	var left int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM tasks`).Scan(&left); err != nil || left != 0 {
		t.Errorf("tasks left: %d, %v; want none", left, err)
	}
}
