package localpg

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSyncPairFailsOverAndBack builds a synchronous pair, fails it over with the primary
// crashed (immediate mode), rebuilds the old primary as the new standby, and fails back with
// the new primary killed (SIGKILL): every committed row survives both failovers, and every
// promotion starts a greater timeline.
func TestSyncPairFailsOverAndBack(t *testing.T) {
	t.Parallel()
	ctx, p := newTestPair(t, PairConfig{Synchronous: true})
	a, b := p.Primary(), p.Standby()
	if a == b {
		t.Fatalf("Primary and Standby are the same node %s", a.Name())
	}
	wantRole(ctx, t, a, false)
	wantRole(ctx, t, b, true)
	if got := syncState(ctx, t, a, b); got != "sync" {
		t.Errorf("sync_state of %s on %s: got %q, want sync", b.Name(), a.Name(), got)
	}
	mustExec(ctx, t, a.URL(), `CREATE TABLE survivor (v int); INSERT INTO survivor VALUES (1)`)
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, b, 1)
	wantPrimaryBehindURL(ctx, t, p, a)
	tl := timeline(ctx, t, a)

	// Over (the primary crashed) and back (the primary killed).
	for i, hard := range []struct {
		name string
		stop func(*Node, context.Context) error
	}{{"crash", (*Node).Crash}, {"kill", (*Node).Kill}} {
		old, next := p.Primary(), p.Standby()
		if err := hard.stop(old, ctx); err != nil {
			t.Fatalf("%s %s: %v", hard.name, old.Name(), err)
		}
		if err := p.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		if p.Primary() != next || p.Standby() != old {
			t.Fatalf("after Promote: primary %s, standby %s; want %s, %s",
				p.Primary().Name(), p.Standby().Name(), next.Name(), old.Name())
		}
		wantRole(ctx, t, next, false)
		// Synchronous, yet alone: the new primary must not wait for a standby that is down.
		mustExec(ctx, t, next.URL(), `INSERT INTO survivor VALUES ($1)`, 2*i+2)
		if got := timeline(ctx, t, next); got <= tl {
			t.Errorf("after promoting %s: timeline %d, want more than %d", next.Name(), got, tl)
		} else {
			tl = got
		}
		wantPrimaryBehindURL(ctx, t, p, next)

		rewound, err := p.Rebuild(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !rewound {
			t.Errorf("rebuilding %s: pg_rewind failed and a fresh copy was made instead (see the log)", old.Name())
		}
		wantRole(ctx, t, old, true)
		if got := syncState(ctx, t, next, old); got != "sync" {
			t.Errorf("sync_state of %s on %s: got %q, want sync", old.Name(), next.Name(), got)
		}
		mustExec(ctx, t, next.URL(), `INSERT INTO survivor VALUES ($1)`, 2*i+3)
		if err := p.WaitReplayed(ctx); err != nil {
			t.Fatal(err)
		}
		if got := timeline(ctx, t, old); got != tl {
			t.Errorf("rebuilt standby %s: timeline %d, want its primary's %d", old.Name(), got, tl)
		}
		wantRows(ctx, t, old, []int{1, 2, 3, 4, 5}[:2*i+3]...)
	}
}

// TestAsyncPairLosesWhatItDidNotReceive builds an asynchronous pair, pauses replay and
// streaming and resumes them, then cuts the standby off and fails over: the row committed on the primary
// after the cut is lost, and pg_rewind takes it off the old primary when it becomes the
// standby.
func TestAsyncPairLosesWhatItDidNotReceive(t *testing.T) {
	t.Parallel()
	ctx, p := newTestPair(t, PairConfig{})
	a, b := p.Primary(), p.Standby()
	if got := syncState(ctx, t, a, b); got != "async" {
		t.Errorf("sync_state of %s on %s: got %q, want async", b.Name(), a.Name(), got)
	}
	mustExec(ctx, t, a.URL(), `CREATE TABLE survivor (v int); INSERT INTO survivor VALUES (1)`)
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, b, 1)

	// Replay paused: the standby receives but does not show.
	if err := p.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, a.URL(), `INSERT INTO survivor VALUES (2)`)
	wantRows(ctx, t, b, 1)
	if err := p.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, b, 1, 2)

	// Streaming paused, then resumed: the standby catches up.
	if err := p.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, a.URL(), `INSERT INTO survivor VALUES (3)`)
	if err := p.ResumeStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, b, 1, 2, 3)

	// Streaming paused: what the primary commits now never reaches the standby.
	if err := p.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, a.URL(), `INSERT INTO survivor VALUES (4)`)
	tl := timeline(ctx, t, a)
	if err := a.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	wantRole(ctx, t, b, false)
	if got := timeline(ctx, t, b); got <= tl {
		t.Errorf("after promoting %s: timeline %d, want more than %d", b.Name(), got, tl)
	}
	wantRows(ctx, t, b, 1, 2, 3) // 4 is lost
	mustExec(ctx, t, b.URL(), `INSERT INTO survivor VALUES (5)`)

	// The old primary, reopened on its own, still has what it committed
	// alone, and takes no write, so that no client of the pair's URL uses it.
	if err := p.ReopenOld(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, a, 1, 2, 3, 4)
	conn, err := pgx.Connect(ctx, a.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO survivor VALUES (6)`); err == nil {
		t.Errorf("an insert into the reopened old primary %s succeeded; want it refused (read-only)", a.Name())
	}
	_ = conn.Close(ctx)
	if got := p.Primary(); got != b {
		t.Errorf("after ReopenOld the pair's primary is %s, want %s", got.Name(), b.Name())
	}

	rewound, err := p.Rebuild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rewound {
		t.Errorf("rebuilding %s: pg_rewind failed and a fresh copy was made instead (see the log)", a.Name())
	}
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(ctx, t, a, 1, 2, 3, 5) // rewound: 4 is gone from the old primary too
}

// newTestPair builds a pair that the test's cleanup closes, and a context that bounds the test.
func newTestPair(t *testing.T, cfg PairConfig) (context.Context, *Pair) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	cfg.Log = testLog{t}
	p, err := NewPair(ctx, cfg)
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close the pair: %v", err)
		}
	})
	return ctx, p
}

func mustExec(ctx context.Context, t *testing.T, url, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// wantRows checks that table survivor on n holds want, in order.
func wantRows(ctx context.Context, t *testing.T, n *Node, want ...int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, `SELECT v FROM survivor ORDER BY v`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows on %s: got %v, want %v", n.Name(), got, want)
	}
}

func wantRole(ctx context.Context, t *testing.T, n *Node, standby bool) {
	t.Helper()
	got, err := n.InRecovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != standby {
		t.Errorf("%s in recovery: got %v, want %v", n.Name(), got, standby)
	}
}

func timeline(ctx context.Context, t *testing.T, n *Node) uint32 {
	t.Helper()
	tl, err := n.Timeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// syncState is the sync_state of standby in pg_stat_replication on primary.
func syncState(ctx context.Context, t *testing.T, primary, standby *Node) string {
	t.Helper()
	var state string
	if err := primary.queryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`,
		[]any{standby.Name()}, &state); err != nil {
		t.Fatalf("sync_state of %s on %s: %v", standby.Name(), primary.Name(), err)
	}
	return state
}

// wantPrimaryBehindURL checks that the pair's multi-host URL leads to primary.
func wantPrimaryBehindURL(ctx context.Context, t *testing.T, p *Pair, primary *Node) {
	t.Helper()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var port int
	if err := conn.QueryRow(ctx, `SELECT current_setting('port')::int`).Scan(&port); err != nil {
		t.Fatal(err)
	}
	if port != primary.Port() {
		t.Errorf("the pair's URL leads to port %d, want the primary %s's %d", port, primary.Name(), primary.Port())
	}
}
