package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/bench"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// TestBenchDrainProcesses runs `leasehold bench --processes` as a user
// would: drain's replicas are processes of the binary too, and both figures
// come back in the JSON.
func TestBenchDrainProcesses(t *testing.T) {
	t.Parallel()
	rep := runBenchJSON(t, pgtest.ServerURL(t), "--scenarios", "drain", "--processes",
		"--tasks", "60", "--replicas", "2", "--workers", "2")
	var inProcess, processes bool
	for _, r := range rep.Results {
		if r.Scenario != "drain" || r.Value <= 0 {
			t.Errorf("unexpected figure %+v", r)
		}
		inProcess = inProcess || strings.HasSuffix(r.Case, "in-process")
		processes = processes || strings.HasSuffix(r.Case, "processes")
	}
	if !inProcess || !processes {
		t.Fatalf("drain figures %+v; want one in-process and one with processes", rep.Results)
	}
}

// TestBenchKeys runs `leasehold bench --scenarios keys` small as a user would: the --keys-*
// flags shape both drains, and no key ran more tasks at once than its limit.
func TestBenchKeys(t *testing.T) {
	t.Parallel()
	rep := runBenchJSON(t, pgtest.ServerURL(t), "--scenarios", "keys", "--keys-tasks", "120", "--keys-rounds", "1",
		"--keys-workers", "6", "--keys-count", "3", "--keys-limit", "2")
	want := map[string]bool{
		"3 keys of 2, 120 tasks, one Client of 6 workers: drain, 1 round": false,
		"no keys, 120 tasks, one Client of 6 workers: drain, 1 round":     false,
		"3 keys of 2 ÷ no keys, 1 round":                                  false,
	}
	peak := "3 keys of 2: most tasks of one key running at once"
	want[peak] = false
	for _, r := range rep.Results {
		if _, ok := want[r.Case]; ok {
			want[r.Case] = r.Value > 0
		}
		if r.Case == peak && r.Value > 2 {
			t.Errorf("%s: %v, the limit is 2", r.Case, r.Value)
		}
	}
	for c, ok := range want {
		if !ok {
			t.Errorf("no figure above 0 for %q in %+v", c, rep.Results)
		}
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--standby", "maybe"},
		{"bench", "--standby", "sync", "--database-url", "postgres://127.0.0.1:1/x"},
		{"bench", "--tasks", "0"},
		{"bench", "--clients", "1,many"},
		{"bench", "--capacity-leases", "lots"},
		{"bench", "--river-tasks", "30000,half a million"},
		{"bench", "--river-tasks", "0"},
		{"bench", "--backlog", "x"},
		{"bench", "--keys-tasks", "0"},
		{"bench", "--keys-rounds", "-1"},
		{"bench", "--keys-limit", "1001"},
		{"bench", "--parts-tasks", "0"},
		{"bench", "--parts-rounds", "101"},
		{"bench", "--parts-loops", "0"},
		{"bench", "--parts-batch", "1001"},
	} {
		err := run(t.Context(), args, env(), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q: got %v, want a usage error", args, err)
		}
	}
}

// TestBenchOnAStandbyPair runs `leasehold bench --standby sync` as a user would: the bench
// builds a primary with a synchronous standby of its own, the figures come from it, and the
// report says the commits waited for a standby.
func TestBenchOnAStandbyPair(t *testing.T) {
	t.Parallel()
	rep := runBenchJSON(t, "", "--standby", "sync", "--scenarios", "leases", "--clients", "2", "--duration", "300ms")
	if rep.Machine.Standbys != 1 || rep.Machine.SynchronousStandbys == "" || rep.Machine.SynchronousCommit != "on" {
		t.Errorf("machine %+v: want 1 streaming standby named in synchronous_standby_names, synchronous_commit on", rep.Machine)
	}
	if len(rep.Results) == 0 {
		t.Fatal("no figures")
	}
	for _, r := range rep.Results {
		if r.Scenario != "leases" || r.Value <= 0 {
			t.Errorf("unexpected figure %+v", r)
		}
	}
}

// runBenchJSON runs the built binary's `leasehold bench --json` with args and DATABASE_URL set
// to databaseURL, and returns its report.
func runBenchJSON(t *testing.T, databaseURL string, args ...string) bench.Report {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), testkit.Leasehold(t), append(append([]string{"bench"}, args...), "--json")...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("leasehold bench: %v\n%s", err, stderr.String())
	}
	var rep bench.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout.String())
	}
	return rep
}
