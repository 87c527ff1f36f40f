package taskstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/schema"
)

// timedRead is one read a replica makes on a timer: the dashboard's feed
// (every second with a page open), the reaper's pass, a dispatcher's
// safety poll, a metrics scrape.
type timedRead struct {
	name string
	run  func(ctx context.Context, s *taskstore.Store, q *db.Queries) error
}

var timedReads = []timedRead{
	{"stats (feed)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error { _, err := s.Stats(ctx); return err }},
	{"pending by kind (feed, metrics)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, err := s.PendingByKind(ctx, 100_000)
		return err
	}},
	{"running tasks (feed)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, err := s.Running(ctx, 50)
		return err
	}},
	{"dead tasks (feed)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, err := s.Dead(ctx, 50)
		return err
	}},
	{"next due (dispatcher)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, _, err := s.NextDue(ctx, nil, nil)
		return err
	}},
	{"next lapse (reaper)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, err := s.NextLapse(ctx)
		return err
	}},
	{"requeue lapsed (reaper)", func(ctx context.Context, s *taskstore.Store, _ *db.Queries) error {
		_, err := s.RequeueLapsed(ctx, 500)
		return err
	}},
	{"gauges (metrics)", func(ctx context.Context, _ *taskstore.Store, q *db.Queries) error {
		_, err := q.MetricsGauges(ctx, 100_000)
		return err
	}},
}

// blocksTouched returns the blocks of user tables and their indexes that
// run read or found in the buffers, as the statistics of its one session
// count them.
func blocksTouched(ctx context.Context, t *testing.T, pool *pgxpool.Pool, run func() error) int64 {
	t.Helper()
	total := func() int64 {
		// Flushed when the session goes idle after this statement: the
		// next one reads the counts of everything before it.
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := pool.QueryRow(ctx, `
			SELECT coalesce(sum(coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0) + coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0)
			                    + coalesce(toast_blks_read, 0) + coalesce(toast_blks_hit, 0)), 0)::bigint
			FROM pg_statio_user_tables`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := total()
	if err := run(); err != nil {
		t.Fatal(err)
	}
	return total() - before
}

// TestTimedReadsDoNotGrowWithTheTable: every read a replica makes on a
// timer touches as many blocks with 100,000 finished tasks more in the
// table as without them: none of them walks the finished tasks, which
// retention keeps by the million.
func TestTimedReadsDoNotGrowWithTheTable(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 100,000 tasks")
	}
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	// One session, whose statistics count only what the reads touch.
	cfg, err := pgxpool.ParseConfig(tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.AfterConnect = schema.PrepareSession
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, q := taskstore.NewStore(pool), db.New(pool)
	workingQueue(ctx, t, s)
	measure := func() map[string]int64 {
		if _, err := tdb.Pool.Exec(ctx, `VACUUM ANALYZE tasks`); err != nil { // as autovacuum would
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, r := range timedReads {
			run := func() error { return r.run(ctx, s, q) }
			_ = blocksTouched(ctx, t, pool, run) // the plan cached, the blocks in the buffers
			got[r.name] = blocksTouched(ctx, t, pool, run)
		}
		return got
	}
	small := measure()
	if _, err := tdb.Pool.Exec(ctx, `
		INSERT INTO tasks (task_data, kind, state, attempts, started_at, processed_at, task_output)
		SELECT '{}', 'k' || (g % 4), 'done', 1, now() - interval '2 days', now() - interval '2 days', '{}'
		FROM generate_series(1, 100000) AS g`); err != nil {
		t.Fatal(err)
	}
	large := measure()
	for _, r := range timedReads {
		a, b := small[r.name], large[r.name]
		t.Logf("%-34s %5d blocks with a working queue, %5d with 100,000 finished tasks more", r.name, a, b)
		// A walk of the finished tasks touches hundreds of blocks more.
		if b > 2*a+20 {
			t.Errorf("%s: %d blocks with 100,000 finished tasks more, %d without; want about the same", r.name, b, a)
		}
	}
}

// workingQueue fills s with a working queue: 1,000 pending tasks of 4 kinds, 6 of them
// claimed, 3 of those dead.
func workingQueue(ctx context.Context, tb testing.TB, s *taskstore.Store) {
	tb.Helper()
	var batch []taskstore.NewTask
	for i := range 1000 {
		batch = append(batch, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Kind: fmt.Sprintf("k%d", i%4), MaxAttempts: 1})
	}
	if _, err := s.Insert(ctx, batch); err != nil {
		tb.Fatal(err)
	}
	claimed, err := s.Claim(ctx, taskstore.ClaimParams{Processors: []string{"r/1", "r/2", "r/3", "r/4", "r/5", "r/6"}, TTL: time.Hour})
	if err != nil || len(claimed) != 6 {
		tb.Fatalf("claim: %d tasks, %v", len(claimed), err)
	}
	for _, c := range claimed[:3] {
		if _, err := s.Fail(ctx, c.ID, c.Processor, c.Fence, "dead on purpose", 0); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkTimedReads times each timed read on a working queue (1,000 tasks of 4 kinds, 6
// running, 3 dead) beside LEASEHOLD_BENCH_FINISHED finished tasks (default 10,000), to set
// the cost at 10⁴ beside the cost at 10⁷:
//
//	LEASEHOLD_BENCH_FINISHED=10000000 go test -run '^$' -bench TimedReads -benchtime 200x ./internal/taskstore
func BenchmarkTimedReads(b *testing.B) {
	finished := 10_000
	if v := os.Getenv("LEASEHOLD_BENCH_FINISHED"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("LEASEHOLD_BENCH_FINISHED=%q: want a count of tasks, e.g. 10000000", v)
		}
		finished = n
	}
	ctx := b.Context()
	tdb := pgtest.New(b)
	s, q := taskstore.NewStore(tdb.Pool), db.New(tdb.Pool)
	workingQueue(ctx, b, s)
	// A million a statement: finished two days ago, as retention keeps them.
	for left := finished; left > 0; left -= 1_000_000 {
		if _, err := tdb.Pool.Exec(ctx, `
			INSERT INTO tasks (task_data, kind, state, attempts, started_at, processed_at, task_output)
			SELECT '{}', 'k' || (g % 4), 'done', 1, now() - interval '2 days', now() - interval '2 days', '{}'
			FROM generate_series(1, $1::integer) AS g`, min(left, 1_000_000)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.FoldCounts(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := tdb.Pool.Exec(ctx, `VACUUM ANALYZE tasks`); err != nil { // as autovacuum would
		b.Fatal(err)
	}
	var rows float64
	if err := tdb.Pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE relname = 'tasks'`).Scan(&rows); err != nil {
		b.Fatal(err)
	}
	for _, r := range timedReads {
		b.Run(r.name, func(b *testing.B) {
			for b.Loop() {
				if err := r.run(ctx, s, q); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(rows, "tasks") // after the loop, which clears what was reported before it
		})
	}
}
