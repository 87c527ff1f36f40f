package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestOperationsShareCommits: operations that arrive while a group commits
// form the next group, one transaction for all of them; one operation per
// resource in a group; and a statement that fails in a group (a TTL the
// table refuses) fails alone, the group's others done on their own.
func TestOperationsShareCommits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	s := leasestore.NewStore(tdb.Pool)
	first, err := s.Acquire(ctx, lease.AcquireParams{Resource: "g:0", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// A session holds g:0's row, so that the next group (a renewal of g:0)
	// waits while the others queue behind it.
	blocker, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM leases WHERE resource = 'g:0' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make(map[string]error)
	var mu sync.Mutex
	run := func(name string, op func() error) {
		wg.Go(func() {
			err := op()
			mu.Lock()
			results[name] = err
			mu.Unlock()
		})
	}
	run("renew g:0", func() error {
		_, err := s.Renew(ctx, lease.RenewParams{Resource: "g:0", Holder: "h", Fence: first.Lease.Fence})
		return err
	})
	waitFor(t, time.Minute, "the renewal of g:0 waiting for its row", func() bool {
		var waiting bool
		err := tdb.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	})
	const n = 8
	for i := 1; i <= n; i++ {
		run(fmt.Sprintf("acquire g:%d", i), func() error {
			_, err := s.Acquire(ctx, lease.AcquireParams{Resource: fmt.Sprintf("g:%d", i), Holder: "h", TTL: time.Minute})
			return err
		})
	}
	run("acquire g:bad", func() error {
		_, err := s.Acquire(ctx, lease.AcquireParams{Resource: "g:bad", Holder: "h", TTL: 2 * time.Hour})
		return err
	})
	run("acquire g:1 again", func() error { // same resource: the group after
		_, err := s.Acquire(ctx, lease.AcquireParams{Resource: "g:1", Holder: "h", TTL: time.Minute})
		return err
	})
	waitFor(t, time.Minute, "every operation queued", func() bool { return s.Queued() == n+2 })
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	for name, err := range results {
		if name == "acquire g:bad" {
			if err == nil {
				t.Errorf("%s: no error, want the table's refusal of a 2h TTL", name)
			}
			continue
		}
		var held *lease.HeldError
		if err != nil && !errors.As(err, &held) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The eight new leases queued with the bad TTL, in one group; its failed
	// statement rolled the group back, and each ran alone: acquired once each.
	var acquired, txs int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM lease_events
		WHERE kind = 'acquired' AND resource LIKE 'g:%' AND resource <> 'g:0'`).Scan(&acquired, &txs); err != nil {
		t.Fatal(err)
	}
	if acquired != n || txs != n {
		t.Fatalf("%d acquisitions of g:1..g:%d in %d transactions, want %d, each alone after the group failed", acquired, n, txs, n)
	}
}

// TestGroupsWithoutFailureShareOneCommit: the same, with no failing
// statement: the queued acquisitions commit in one transaction.
func TestGroupsWithoutFailureShareOneCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	s := leasestore.NewStore(tdb.Pool)
	first, err := s.Acquire(ctx, lease.AcquireParams{Resource: "g:0", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := tdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background()) //nolint:errcheck // committed below
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM leases WHERE resource = 'g:0' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	wg.Go(func() {
		_, err := s.Renew(ctx, lease.RenewParams{Resource: "g:0", Holder: "h", Fence: first.Lease.Fence})
		errs <- err
	})
	waitFor(t, time.Minute, "the renewal of g:0 waiting for its row", func() bool {
		var waiting bool
		err := tdb.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	})
	const n = 8
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			_, err := s.Acquire(ctx, lease.AcquireParams{Resource: fmt.Sprintf("g:%d", i), Holder: "h", TTL: time.Minute})
			errs <- err
		})
	}
	waitFor(t, time.Minute, "every acquisition queued", func() bool { return s.Queued() == n })
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	var acquired, txs int
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM lease_events
		WHERE kind = 'acquired' AND resource LIKE 'g:%' AND resource <> 'g:0'`).Scan(&acquired, &txs); err != nil {
		t.Fatal(err)
	}
	if acquired != n || txs != 1 {
		t.Fatalf("%d acquisitions in %d transactions, want %d in 1", acquired, txs, n)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
