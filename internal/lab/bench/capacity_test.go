package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/procstat"
)

// TestCapacity runs the capacity scenario small on the test server and checks that every
// figure is there and positive: the rates, the CPU and WAL per operation and what they
// give per core and per GB. The figures themselves are for people (docs/operations/capacity.md).
func TestCapacity(t *testing.T) {
	t.Parallel()
	cfg := Config{
		DatabaseURL: pgtest.ServerURL(t), Scenarios: []string{"capacity"}, Duration: 400 * time.Millisecond,
		CapacityLeases: []int{50, 300}, RenewEvery: 100 * time.Millisecond, Clients: []int{4},
		Tasks: 500, Replicas: 2, Workers: 2, SteadyRate: 300,
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) == 0 || rep.Results[0].Case != "PostgreSQL's CPU" {
		t.Fatalf("the first figure should say where PostgreSQL's CPU was measured: %+v", rep.Results)
	}
	local := strings.HasPrefix(rep.Results[0].Note, "measured:")
	if !local {
		t.Logf("the CPU figures are not checked: %s", rep.Results[0].Note)
	}
	workloads := map[string]int{}
	for _, r := range rep.Results[1:] {
		if r.Scenario != "capacity" {
			t.Errorf("figure of scenario %q, want capacity", r.Scenario)
		}
		name, what, ok := strings.Cut(r.Case, ": ")
		if !ok {
			t.Errorf("case %q has no workload: figure", r.Case)
			continue
		}
		workloads[name]++
		switch {
		case what == "not run": // pgbench is missing, and the note says so
		case strings.HasPrefix(what, "active sessions"):
			if r.Value < 0 {
				t.Errorf("%s: %v sessions, want at least 0", r.Case, r.Value)
			}
		case strings.Contains(what, "CPU") || strings.Contains(what, "per PostgreSQL core"):
			if local && r.Value <= 0 {
				t.Errorf("%s: %v, want above 0 (%s)", r.Case, r.Value, r.Note)
			}
		default:
			if r.Value <= 0 {
				t.Errorf("%s: %v %s, want above 0 (%s)", r.Case, r.Value, r.Unit, r.Note)
			}
		}
	}
	// Two renewal workloads, the heartbeats, the cycles, two drains, the steady tasks and
	// pgbench; eight figures each, or one saying why pgbench did not run.
	_, noPgbench := findPgbench()
	if len(workloads) != 8 {
		t.Errorf("%d workloads, want 8: %v", len(workloads), workloads)
	}
	if n := workloads["heartbeat 50 running tasks, each every 100ms (500/s offered), 2 replicas"]; n == 0 {
		t.Errorf("no heartbeat workload of the 50 tasks: %v", workloads)
	}
	for name, n := range workloads {
		want := 8
		if name == yardstick && noPgbench != nil {
			want = 1
		}
		if n != want {
			t.Errorf("workload %q gave %d figures, want %d", name, n, want)
		}
	}
}

func TestParseProcessed(t *testing.T) {
	t.Parallel()
	out := []byte("transaction type: <builtin: simple update>\nnumber of transactions actually processed: 28000\ntps = 5600.1 (without initial connection time)\n")
	if n, err := parseProcessed(out); err != nil || n != 28000 {
		t.Fatalf("parseProcessed: %v, %v", n, err)
	}
	if _, err := parseProcessed([]byte("pgbench: error: connection refused")); err == nil {
		t.Fatal("parseProcessed found a count where there is none")
	}
}

// TestFindServerElsewhere checks that a backend pid with no process here is said to be
// elsewhere, not measured as whatever runs here.
func TestFindServerElsewhere(t *testing.T) {
	t.Parallel()
	pg, why := findServer(1<<30, "leasehold_bench_x", "")
	if pg != nil || !strings.Contains(why, "not on this machine") {
		t.Errorf("findServer of a pid that does not exist: %+v, %q", pg, why)
	}
}

// TestMeterReadsSessionsWithoutAState feeds the meter's classify the rows pg_stat_activity
// shows for processes with no database and for a client backend that has not reported a
// state yet (one still starting, as other tests' sessions are while the meter samples), by
// a temporary view of that name, which the session finds before pg_catalog's.
func TestMeterReadsSessionsWithoutAState(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, m := testMeter(t)
	if _, err := m.conn.Exec(ctx, `
		CREATE TEMP VIEW pg_stat_activity (pid, datname, backend_type, state) AS VALUES
			(1, NULL::name, 'checkpointer', NULL::text),
			(2, NULL, 'client backend', NULL),
			(3, current_database(), 'client backend', NULL),
			(4, current_database(), 'client backend', 'active'),
			(5, 'elsewhere', 'client backend', 'idle in transaction')`); err != nil {
		t.Fatal(err)
	}
	ours, others, err := m.classify(ctx, map[int]*tracked{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ours != 1 || others != 1 {
		t.Errorf("classify counted %d active sessions of ours and %d of others, want 1 and 1", ours, others)
	}
}

// TestMeterCountsASessionThatExits: a session that works and exits within the window has
// all its CPU time counted, though the meter reads a process's time only now and then.
func TestMeterCountsASessionThatExits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, m := testMeter(t)
	if m.pg == nil {
		t.Skip("the server is not on this machine: " + m.notLocal)
	}
	if err := m.start(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 3000000)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	st, err := procstat.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	used := m.pg.dur(st.CPU())
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Gone once the postmaster has reaped it.
	for {
		if _, err := procstat.Read(pid); err != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("session %d did not exit: %v", pid, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	w, err := m.stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// /proc gives user and system time apart, each rounded down to a tick, and the two
	// readings of the session (its own while it ran, its parent's after it was reaped) can
	// part by a tick or two. Left out, the session's time would be missing whole.
	slack := m.pg.dur(2)
	if used <= slack {
		t.Fatalf("the session used %s of CPU time that /proc shows: too little for the test to show anything", used)
	}
	if w.cpu < used-slack {
		t.Errorf("the window counted %s of CPU, less than the %s the exited session alone used", w.cpu, used)
	}
}

// testDB is a fresh database of the test server, dropped when the test ends.
func testDB(t *testing.T) *freshDB {
	t.Helper()
	d, err := newDB(t.Context(), pgtest.ServerURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// testMeter is a meter, not started, on a fresh database (testDB), closed when the test ends.
func testMeter(t *testing.T) (*freshDB, *meter) {
	t.Helper()
	d := testDB(t)
	m, err := newMeter(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.close(context.Background()) })
	return d, m
}
