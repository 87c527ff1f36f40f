package leasestore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestAcquireRace races many holders for one resource, round after round:
// exactly one wins each round, fences strictly increase, and the history
// shows no two holders at once.
func TestAcquireRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	tdb.Pool.Config().MaxConns = 60
	store := leasestore.NewStore(tdb.Pool)
	const holders, rounds = 50, 20

	var lastFence int64
	for round := range rounds {
		var (
			start   = make(chan struct{})
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []lease.Acquisition
			errs    []error
		)
		for h := range holders {
			wg.Go(func() {
				<-start
				acq, err := store.Acquire(ctx, lease.AcquireParams{
					Resource: "race", Holder: fmt.Sprintf("holder-%d", h), TTL: 30 * time.Second,
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && acq.New:
					winners = append(winners, acq)
				case errors.Is(err, lease.ErrHeld):
				default:
					errs = append(errs, fmt.Errorf("holder-%d: acquired=%v: %w", h, acq.New, err))
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: unexpected outcomes: %v", round, errs)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1", round, len(winners))
		}
		w := winners[0].Lease
		if w.Fence <= lastFence {
			t.Fatalf("round %d: fence %d not greater than the previous %d", round, w.Fence, lastFence)
		}
		lastFence = w.Fence
		if _, err := store.Release(ctx, lease.ReleaseParams{Resource: "race", Holder: w.Holder, Fence: w.Fence}); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
	testkit.CheckLeaseHistory(t, tdb.Pool, "race")
}

// TestAcquireRaceManyResources has goroutines acquire and release distinct
// and shared resources at once, then checks every resource's history.
func TestAcquireRaceManyResources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				resource := fmt.Sprintf("shared-%d", i%4)
				holder := fmt.Sprintf("g%d", g)
				acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: resource, Holder: holder, TTL: time.Minute})
				if errors.Is(err, lease.ErrHeld) {
					continue
				}
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if _, err := store.Release(ctx, lease.ReleaseParams{Resource: resource, Holder: holder, Fence: acq.Lease.Fence}); err != nil {
					t.Errorf("release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range 4 {
		testkit.CheckLeaseHistory(t, tdb.Pool, fmt.Sprintf("shared-%d", i))
	}
}

func TestRenewReleaseCompareAndSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: "cas", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Lease

	refused := []struct {
		name string
		op   func() error
	}{
		{"renew by another holder", func() error {
			_, err := store.Renew(ctx, lease.RenewParams{Resource: "cas", Holder: "b"})
			return err
		}},
		{"renew with another fence", func() error {
			_, err := store.Renew(ctx, lease.RenewParams{Resource: "cas", Holder: "a", Fence: l.Fence + 7})
			return err
		}},
		{"renew of another resource", func() error {
			_, err := store.Renew(ctx, lease.RenewParams{Resource: "other", Holder: "a"})
			return err
		}},
		{"release by another holder", func() error {
			_, err := store.Release(ctx, lease.ReleaseParams{Resource: "cas", Holder: "b"})
			return err
		}},
		{"release with another fence", func() error {
			_, err := store.Release(ctx, lease.ReleaseParams{Resource: "cas", Holder: "a", Fence: l.Fence + 1})
			return err
		}},
		{"release with another id", func() error {
			_, err := store.Release(ctx, lease.ReleaseParams{Resource: "cas", Holder: "a", ID: l.ID + 1})
			return err
		}},
	}
	for _, tc := range refused {
		if err := tc.op(); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("%s: got %v, want ErrNotHeld", tc.name, err)
		}
	}
	got, err := store.Get(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder != "a" || got.Fence != l.Fence || got.State != lease.StateActive || got.RenewedAt != nil {
		t.Fatalf("refused operations changed the lease: %+v", got)
	}

	renewed, err := store.Renew(ctx, lease.RenewParams{Resource: "cas", Holder: "a", Fence: l.Fence, TTL: 2 * time.Minute})
	if err != nil {
		t.Fatalf("renew by the holder: %v", err)
	}
	if renewed.RenewedAt == nil || !renewed.ExpiresAt.After(l.ExpiresAt) || renewed.TTLSeconds != 120 {
		t.Fatalf("renewal did not extend the lease: before %+v after %+v", l, renewed)
	}
	again, err := store.Acquire(ctx, lease.AcquireParams{Resource: "cas", Holder: "a", TTL: time.Minute})
	if err != nil || again.New || again.Lease.Fence != l.Fence {
		t.Fatalf("same-holder acquire: got %+v, %v; want the unchanged lease", again, err)
	}
	released, err := store.Release(ctx, lease.ReleaseParams{Resource: "cas", Holder: "a", Fence: l.Fence, ID: l.ID})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if released.State != lease.StateReleased || released.ReleasedAt == nil || !released.ReleasedAt.Equal(released.ExpiresAt) {
		t.Fatalf("released lease: %+v", released)
	}
	if _, err := store.Release(ctx, lease.ReleaseParams{Resource: "cas", Holder: "a"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("double release: got %v, want ErrNotHeld", err)
	}
	if _, err := store.Renew(ctx, lease.RenewParams{Resource: "cas", Holder: "a"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew after release: got %v, want ErrNotHeld", err)
	}
	next, err := store.Acquire(ctx, lease.AcquireParams{Resource: "cas", Holder: "b", TTL: time.Minute})
	if err != nil || !next.New || next.Lease.Fence <= l.Fence || next.Lease.ID != l.ID {
		t.Fatalf("acquire after release: got %+v, %v; want a new fence on the same lease row", next, err)
	}
	if _, err := store.Renew(ctx, lease.RenewParams{Resource: "cas", Holder: "b", Fence: l.Fence}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew with the previous holder's stale fence: got %v, want ErrNotHeld", err)
	}
	var held *lease.HeldError
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "cas", Holder: "c", TTL: time.Minute}); !errors.As(err, &held) || held.Lease.Holder != "b" {
		t.Fatalf("acquire of a held lease: got %v, want HeldError naming b", err)
	}
	testkit.CheckLeaseHistory(t, tdb.Pool, "cas")
}

// TestExpiredLeaseIsFreeWithoutReaper: correctness never depends on the
// reaper. No reaper runs here; the expired lease is taken over all the same.
func TestExpiredLeaseIsFreeWithoutReaper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	first, err := store.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Let it run out by the database clock without waiting a minute.
	if _, err := tdb.Pool.Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 ms' WHERE id = $1`, first.Lease.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Renew(ctx, lease.RenewParams{Resource: "r", Holder: "a"}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew after expiry: got %v, want ErrNotHeld", err)
	}
	got, err := store.Get(ctx, first.Lease.ID)
	if err != nil || got.State != lease.StateExpired {
		t.Fatalf("state after expiry: %+v, %v; want expired", got, err)
	}
	second, err := store.Acquire(ctx, lease.AcquireParams{Resource: "r", Holder: "b", TTL: time.Minute})
	if err != nil || !second.New || second.Lease.Fence <= first.Lease.Fence {
		t.Fatalf("takeover: got %+v, %v", second, err)
	}
	if _, err := store.Release(ctx, lease.ReleaseParams{Resource: "r", Holder: "a", Fence: first.Lease.Fence}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("stale holder's release: got %v, want ErrNotHeld", err)
	}
}

// TestRenewIsHOT: a renewal writes no indexed column, so PostgreSQL
// updates the row in place (heap-only), without touching any index.
func TestRenewIsHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "hot", Holder: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The per-transaction counters show this session's updates at once.
	err := pgx.BeginFunc(ctx, tdb.Pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		const renewals = 5
		params := make([]db.LeaseRenewParams, renewals)
		for i := range params {
			params[i] = db.LeaseRenewParams{Resource: "hot", Holder: "a"}
		}
		var renewErr error
		br := q.LeaseRenew(ctx, params)
		br.QueryRow(func(_ int, _ db.Lease, err error) { renewErr = cmp.Or(renewErr, err) })
		if err := cmp.Or(br.Close(), renewErr); err != nil {
			return err
		}
		var updated, hot int64
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('leases'::regclass),
			pg_stat_get_xact_tuples_hot_updated('leases'::regclass)`).Scan(&updated, &hot); err != nil {
			return err
		}
		if updated != renewals || hot != renewals {
			t.Errorf("renewals: %d updates, %d of them HOT; want %d and %d", updated, hot, renewals, renewals)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestListAndEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	for i := range 5 {
		if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: fmt.Sprintf("job:%d", i), Holder: "a", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Acquire(ctx, lease.AcquireParams{Resource: "other", Holder: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Release(ctx, lease.ReleaseParams{Resource: "job:1", Holder: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Renew(ctx, lease.RenewParams{Resource: "job:2", Holder: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tdb.Pool.Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 s' WHERE resource = 'job:3'`); err != nil {
		t.Fatal(err)
	}
	resources := func(ls []lease.Lease) []string {
		var rs []string
		for _, l := range ls {
			rs = append(rs, l.Resource+"="+string(l.State))
		}
		return rs
	}
	cases := []struct {
		p    lease.ListParams
		want string
	}{
		{lease.ListParams{Filter: lease.FilterAll, Limit: 100}, "[job:0=active job:1=released job:2=active job:3=expired job:4=active other=active]"},
		{lease.ListParams{Filter: string(lease.StateActive), Prefix: "job:", Limit: 100}, "[job:0=active job:2=active job:4=active]"},
		{lease.ListParams{Filter: string(lease.StateExpired), Limit: 100}, "[job:3=expired]"},
		{lease.ListParams{Filter: string(lease.StateReleased), Limit: 100}, "[job:1=released]"},
		{lease.ListParams{Filter: lease.FilterRenewed, Limit: 100}, "[job:2=active]"},
		{lease.ListParams{Filter: lease.FilterAll, Prefix: "job:", Limit: 2}, "[job:0=active job:1=released]"},
	}
	for _, tc := range cases {
		got, err := store.List(ctx, tc.p)
		if err != nil {
			t.Fatal(err)
		}
		if s := fmt.Sprint(resources(got)); s != tc.want {
			t.Errorf("List(%+v) = %s, want %s", tc.p, s, tc.want)
		}
	}
	first, _ := store.List(ctx, lease.ListParams{Filter: lease.FilterAll, Limit: 2})
	page, _ := store.List(ctx, lease.ListParams{Filter: lease.FilterAll, AfterID: first[1].ID, Limit: 2})
	if s := fmt.Sprint(resources(page)); s != "[job:2=active job:3=expired]" {
		t.Errorf("second page = %s", s)
	}

	events, err := store.Events(ctx, lease.EventsParams{Resource: "job:2", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	if s := fmt.Sprint(kinds); s != "[acquired renewed]" {
		t.Errorf("events of job:2 = %s, want [acquired renewed]", s)
	}
	all, _ := store.Events(ctx, lease.EventsParams{Limit: 100})
	rest, _ := store.Events(ctx, lease.EventsParams{AfterID: all[2].ID, Limit: 100})
	if len(all) != 8 || len(rest) != 5 {
		t.Errorf("events: %d in all, %d after the third; want 8 and 5", len(all), len(rest))
	}
}

func TestGetManyAndNewest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := pgtest.New(t)
	store := leasestore.NewStore(tdb.Pool)
	var ids []int64
	for _, r := range []string{"a", "task:1", "b", "c"} {
		acq, err := store.Acquire(ctx, lease.AcquireParams{Resource: r, Holder: "h", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, acq.Lease.ID)
	}
	if _, err := store.Release(ctx, lease.ReleaseParams{Resource: "b", Holder: "h"}); err != nil {
		t.Fatal(err)
	}
	got, err := store.GetMany(ctx, []int64{ids[2], ids[0], 999999})
	if err != nil || len(got) != 2 || got[0].Resource != "a" || got[1].Resource != "b" || got[1].State != lease.StateReleased {
		t.Fatalf("GetMany = %+v, %v; want a (active) then b (released)", got, err)
	}
	newest, err := store.Newest(ctx, 2)
	if err != nil || len(newest) != 2 || newest[0].Resource != "c" || newest[1].Resource != "b" {
		t.Fatalf("Newest(2) = %+v, %v; want c, b (task leases left out)", newest, err)
	}
}
