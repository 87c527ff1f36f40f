package schema_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/pgtest"
	"github.com/leasehold/leasehold/schema"
)

// TestMigrateConcurrently starts migrations from several pools (several
// replicas starting at once) on an empty database: all succeed, the
// migrations are applied exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.NewEmpty(t)
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	const replicas = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int64
	)
	start := make(chan struct{})
	for range replicas {
		pool, err := pgxpool.New(ctx, tdb.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		wg.Go(func() {
			<-start
			vs, err := schema.Migrate(ctx, pool)
			if err != nil {
				t.Errorf("migrate: %v", err)
			}
			mu.Lock()
			applied = append(applied, vs...)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if len(applied) != len(ms) {
		t.Fatalf("applied %v across %d replicas; want each of the %d migrations once", applied, replicas, len(ms))
	}
	latest, _ := schema.Latest()
	got, err := schema.Applied(ctx, tdb.Pool)
	if err != nil || got != latest {
		t.Fatalf("applied version %d, %v; want %d", got, err, latest)
	}
	var rows int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM leasehold_migrations`).Scan(&rows); err != nil || rows != len(ms) {
		t.Fatalf("leasehold_migrations has %d rows, %v; want %d", rows, err, len(ms))
	}
	if again, err := schema.Migrate(ctx, tdb.Pool); err != nil || len(again) != 0 {
		t.Fatalf("second migrate: applied %v, %v; want nothing", again, err)
	}
}

func TestAppliedOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	tdb := pgtest.NewEmpty(t)
	v, err := schema.Applied(context.Background(), tdb.Pool)
	if err != nil || v != 0 {
		t.Fatalf("Applied on an empty database = %d, %v; want 0, nil", v, err)
	}
}
