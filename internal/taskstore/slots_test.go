package taskstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
)

// holding is one holding of a lease, by the lease history.
type holding struct {
	resource   string
	fence      int64
	holder     string
	start, end time.Time
}

// slotHoldings returns every holding of the slots 1..span of key, by the
// lease history.
func slotHoldings(t *testing.T, l *leasestore.Store, key string, span int) []holding {
	t.Helper()
	var hs []holding
	for n := 1; n <= span; n++ {
		open := map[int64]int{}
		for _, e := range lockEvents(t, l, lease.SlotName(key, n)) {
			switch e.Kind {
			case "acquired":
				open[e.Fence] = len(hs)
				hs = append(hs, holding{resource: e.Resource, fence: e.Fence, holder: e.Holder, start: e.At, end: e.ExpiresAt})
			case "renewed":
				hs[open[e.Fence]].end = e.ExpiresAt
			case "released", "expired":
				if h := &hs[open[e.Fence]]; e.At.Before(h.end) {
					h.end = e.At
				}
			}
		}
	}
	return hs
}

// mostAtOnce is the largest number of the holdings live at one instant
// (a holding is [start, end)).
func mostAtOnce(hs []holding) int {
	type edge struct {
		at time.Time
		d  int
	}
	var es []edge
	for _, h := range hs {
		es = append(es, edge{h.start, +1}, edge{h.end, -1})
	}
	// Ends before starts at the same instant: [start, end) intervals.
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d
	})
	most, n := 0, 0
	for _, e := range es {
		n += e.d
		most = max(most, n)
	}
	return most
}

// TestSlotsNeverMoreThanTheLimit: tasks on a key of 1 slot and a key of 3,
// claimed by six claimers at once while another holder takes and gives
// back slots of the second key as a leasehold exec --slots would: by the
// lease history, never more holders of a key at once than its limit; every
// task ran inside its slot's holding, under that holding's fence.
func TestSlotsNeverMoreThanTheLimit(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limits := map[string]int{"one": 1, "three": 3}
	var nts []taskstore.NewTask
	for i := range 40 {
		for key, k := range limits {
			nts = append(nts, taskstore.NewTask{Kind: "k", Lock: key, LockLimit: k, TaskData: fmt.Appendf(nil, `{"i":%d}`, i)})
		}
	}
	insert(t, s, nts...)
	var wg sync.WaitGroup
	d := &drainer{want: len(nts)}
	d.claimers(ctx, t, &wg, s, 6, func(w int) []string { return []string{fmt.Sprintf("w%d-a", w), fmt.Sprintf("w%d-b", w)} })
	wg.Go(func() {
		for ctx.Err() == nil && !d.finished() {
			acq, err := l.Acquire(ctx, lease.AcquireParams{Resource: "three", Holder: "script", TTL: time.Minute, Slots: 3})
			if errors.Is(err, lease.ErrHeld) {
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := l.Release(ctx, lease.ReleaseParams{Resource: acq.Lease.Resource, Holder: "script", Fence: acq.Lease.Fence}); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("only %d of %d tasks done", d.done, len(nts))
	}
	for key, k := range limits {
		hs := slotHoldings(t, l, key, k)
		if most := mostAtOnce(hs); most > k {
			t.Errorf("%s: %d holders at once, limit %d", key, most, k)
		}
		byFence := map[int64]holding{}
		for _, h := range hs {
			byFence[h.fence] = h
		}
		rows, err := pdb.Pool.Query(ctx, `SELECT fence, processor, started_at, processed_at FROM tasks WHERE lock_resource = $1`, key)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var (
				fence      int64
				processor  string
				start, end time.Time
			)
			if err := rows.Scan(&fence, &processor, &start, &end); err != nil {
				t.Fatal(err)
			}
			n++
			h, ok := byFence[fence]
			if !ok || h.holder != processor || start.Before(h.start) || end.After(h.end) {
				t.Errorf("%s: task under fence %d by %s ran %s–%s, outside its slot's holding %+v", key, fence, processor, start, end, h)
			}
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		byScript := 0
		for _, h := range hs {
			if h.holder == "script" {
				byScript++
			}
		}
		t.Logf("%s (limit %d): %d tasks, %d holdings in all (%d by the script), at most %d at once",
			key, k, n, len(hs), byScript, mostAtOnce(hs))
	}
}

// TestLoweredLimitLetsHoldersFinish: with 3 slots held, the limit lowered
// to 1 grants nothing until two of them are given back, and the third
// holder's slot is the one live; raised again, it grants at once.
func TestLoweredLimitLetsHoldersFinish(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	l := leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	acquire := func(holder string) (lease.Acquisition, error) {
		return l.Acquire(ctx, lease.AcquireParams{Resource: "api", Holder: holder, TTL: time.Minute, Slots: 3})
	}
	var held []lease.Lease
	for _, h := range []string{"a", "b", "c"} {
		acq, err := acquire(h)
		if err != nil || !acq.New {
			t.Fatalf("%s: %+v, %v; want a new slot", h, acq, err)
		}
		held = append(held, acq.Lease)
	}
	if _, err := acquire("d"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("a fourth holder of 3 slots: %v, want ErrHeld", err)
	}
	if _, err := l.SetLimit(ctx, "api", 1); err != nil {
		t.Fatal(err)
	}
	for i, ls := range held[:2] {
		if _, err := l.Release(ctx, lease.ReleaseParams{Resource: ls.Resource, Holder: ls.Holder, Fence: ls.Fence}); err != nil {
			t.Fatal(err)
		}
		lim, err := l.Limit(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		if lim.Slots != 1 || lim.Held != 2-i {
			t.Fatalf("after %d releases: %+v, want 1 slot, %d held", i+1, lim, 2-i)
		}
		var held *lease.HeldError
		if _, err := acquire("d"); !errors.As(err, &held) || held.Lease.Holder == "a" || (i == 1 && held.Lease.Holder != "c") {
			t.Fatalf("with %d holders over a limit of 1: %v, want a slot of b or c held", 2-i, err)
		}
	}
	if _, err := l.SetLimit(ctx, "api", 2); err != nil {
		t.Fatal(err)
	}
	acq, err := acquire("d")
	if err != nil || !acq.New || acq.Lease.Resource == held[2].Resource {
		t.Fatalf("raised to 2 with 1 held: %+v, %v; want a new slot beside c's", acq, err)
	}
}

// TestFullKeyCostsClaimsNothing: 10,000 tasks wait on a key whose 2 slots
// other holders keep; claims of other tasks (ungated ones, and tasks of a
// second limited key) read one entry of the gated tasks' index per key
// each, never the 10,000, and take every task they may.
func TestFullKeyCostsClaimsNothing(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s, l := taskstore.NewStore(pdb.Pool), leasestore.NewStore(pdb.Pool)
	ctx := context.Background()
	for _, h := range []string{"x", "y"} {
		if _, err := l.Acquire(ctx, lease.AcquireParams{Resource: "full", Holder: h, TTL: time.Hour, Slots: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pdb.Pool.Exec(ctx, `INSERT INTO tasks (task_data, kind, lock_resource) SELECT '{}', 'k', 'full' FROM generate_series(1, 10000)`); err != nil {
		t.Fatal(err)
	}
	const claims, ungated, small = 55, 200, 10
	var nts []taskstore.NewTask
	for range ungated {
		nts = append(nts, taskstore.NewTask{Kind: "k"})
	}
	for range small {
		nts = append(nts, taskstore.NewTask{Kind: "k", Lock: "small", LockLimit: small})
	}
	insert(t, s, nts...)
	if _, err := pdb.Pool.Exec(ctx, `ANALYZE tasks`); err != nil {
		t.Fatal(err)
	}
	tx, err := pdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only what it counted
	q := db.New(tx)
	taken, smallTaken := 0, 0
	for i := range claims {
		rows, err := q.TaskClaim(ctx, db.TaskClaimParams{
			Processors: []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i), fmt.Sprintf("c%d", i), fmt.Sprintf("d%d", i)},
			TTLSeconds: 30, Discover: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			switch lock := r.LockResource; {
			case lock != nil && *lock == "full":
				t.Fatalf("claimed task %d of the full key", r.ID)
			case lock != nil:
				smallTaken++
			}
		}
		taken += len(rows)
	}
	var scans, read int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_numscans('tasks_gated_idx'::regclass), pg_stat_get_xact_tuples_returned('tasks_gated_idx'::regclass)`).Scan(&scans, &read); err != nil {
		t.Fatal(err)
	}
	if taken != ungated+small || smallTaken != small {
		t.Errorf("%d claims took %d tasks (%d of the small key), want all %d (%d)", claims, taken, smallTaken, ungated+small, small)
	}
	// Per claim: the look at each key with pending tasks (2), and the
	// entries of the small key's tasks, which stay in the index (dead)
	// until this transaction ends and each later look passes over.
	if limit := int64(claims * (2 + small)); read > limit {
		t.Errorf("%d claims read %d entries of the gated tasks' index (%d scans); want at most %d, not the 10,000 waiting", claims, read, scans, limit)
	}
	t.Logf("%d claims beside 10,000 tasks on a full key: %d scans of tasks_gated_idx reading %d entries in all", claims, scans, read)
}

// drainer counts the tasks its claimers completed, out of want.
type drainer struct {
	mu         sync.Mutex
	done, want int
}

func (d *drainer) finished() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done == d.want
}

// claimers starts n claimers on wg, claimer w claiming for processors(w)
// and completing what it got, until every task is done or ctx ends.
func (d *drainer) claimers(ctx context.Context, t *testing.T, wg *sync.WaitGroup, s *taskstore.Store, n int, processors func(w int) []string) {
	for w := range n {
		wg.Go(func() {
			for ctx.Err() == nil && !d.finished() {
				got, err := s.Claim(ctx, taskstore.ClaimParams{Processors: processors(w), TTL: 30 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				for _, tk := range got {
					if _, err := s.Complete(ctx, tk.ID, tk.Processor, tk.Fence, nil); err != nil {
						t.Error(err)
						return
					}
					d.mu.Lock()
					d.done++
					d.mu.Unlock()
				}
			}
		})
	}
}

// TestOtherKindsClaimPassesAKeyBy: a claim that can take none of a
// limited key's tasks (it runs other kinds) does not hold the key while
// its transaction is open, so that a claim that can take them, at the same
// moment, is not made to pass the key by.
func TestOtherKindsClaimPassesAKeyBy(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	s := taskstore.NewStore(pdb.Pool)
	ctx := context.Background()
	insert(t, s, taskstore.NewTask{Kind: "import", Lock: "imports", LockLimit: 2}, taskstore.NewTask{Kind: "mail"})
	tx, err := pdb.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only held open
	other, err := db.New(tx).TaskClaim(ctx, db.TaskClaimParams{Processors: []string{"mailer"}, TTLSeconds: 30, WantKinds: []string{"mail"}, Discover: true})
	if err != nil || len(other) != 1 {
		t.Fatalf("the mail claim: %d, %v; want the mail task", len(other), err)
	}
	got := claim(t, s, taskstore.ClaimParams{Processors: []string{"importer"}, Kinds: []string{"import"}})
	if len(got) != 1 || got[0].Lock != "imports" {
		t.Fatalf("while another kind's claim is open, the import claim took %v; want the import task", ids(got))
	}
}
