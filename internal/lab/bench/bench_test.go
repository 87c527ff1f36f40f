package bench

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestEveryScenarioRuns runs each scenario small on the test server and checks that every
// figure it promises is there and plausible; the figures themselves are for people.
func TestEveryScenarioRuns(t *testing.T) {
	// Half a second per timed phase: at 300 ms, steady once completed no
	// task at all while other tests loaded both cores under -race.
	cfg := Config{
		DatabaseURL: pgtest.ServerURL(t), Duration: 500 * time.Millisecond, Clients: []int{2},
		Tasks: 200, Replicas: 2, Workers: 2, Samples: 20, SteadyRate: 200, Fanout: 5,
		// capacity has a test of its own (TestCapacity), with sizes of its own; river needs
		// the River peer, a module of its own (TestRiverNeedsItsPeer).
		Scenarios: slices.DeleteFunc(append(slices.Clone(Scenarios), Optional...), func(s string) bool { return s == "capacity" || s == "river" }),
		Backlog:   []int{100, 300}, BacklogWorkers: 4,
		Waiters: 5, IdleWaiters: 10, IdleHold: 500 * time.Millisecond, RESTWorkers: 2,
		KeysTasks: 60, KeysRounds: 1, KeysWorkers: 4, KeysCount: 3, KeysLimit: 2,
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range rep.Results {
		count[r.Scenario]++
		if r.Note == "" && r.Value <= 0 && !strings.HasPrefix(r.Case, "queue depth") {
			t.Errorf("%s / %s: value %v, want above 0", r.Scenario, r.Case, r.Value)
		}
	}
	want := map[string]int{"leases": 5, "drain": 2, "steady": 4, "latency": 8, "notify-cost": 5, "fanout": 3, "bulk-insert": 2, "backlog": 2, "longpoll": 10,
		"pickup": 7, "keys": 30}
	for s, n := range want {
		if count[s] != n {
			t.Errorf("scenario %s gave %d figures, want %d", s, count[s], n)
		}
	}
	if count["baseline"] == 0 {
		t.Error("no baseline figure (nor a note saying why)")
	}
	for _, r := range rep.Results {
		// Not 100, nor nearly: a renewal can only be HOT when the page has room, and
		// pruning old versions waits for every snapshot that might see them, which the
		// other packages' transactions hold on this shared server, the more so the busier
		// it is. Most renewals are HOT all the same, since they write no indexed column;
		// the figure itself is the bench's, on a server of its own.
		if r.Case == "renewals that were heap-only (HOT) updates" && r.Value < 50 {
			t.Errorf("renewals: %.1f%% heap-only (%s), want most", r.Value, r.Note)
		}
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "synchronous_commit=on") {
		t.Errorf("the table does not say the commits were durable:\n%s", table.String())
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(rep.Results) {
		t.Fatalf("JSON round trip: %d results, %v", len(back.Results), err)
	}
}

// TestRiverNeedsItsPeer: river without the peer program says how to build it, and runs
// nothing.
func TestRiverNeedsItsPeer(t *testing.T) {
	_, err := Run(t.Context(), Config{DatabaseURL: pgtest.ServerURL(t), Scenarios: []string{"river"}, Executable: "leasehold"})
	if err == nil || !strings.Contains(err.Error(), "go build -C tools/riverpeer") {
		t.Fatalf("river without its peer: %v; want an error saying how to build it", err)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{Scenarios: []string{"nope"}}, {Clients: []int{0}}, {Tasks: -1}, {RiverTasks: []int{0}},
		{KeysTasks: -1}, {KeysLimit: 1001}, {KeysRounds: 101}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

func TestParseTPS(t *testing.T) {
	out := []byte("number of transactions actually processed: 28000\nlatency average = 2.857 ms\n" +
		"initial connection time = 10.1 ms\ntps = 2799.123456 (without initial connection time)\n")
	if tps, err := parseTPS(out); err != nil || tps != 2799.123456 {
		t.Fatalf("parseTPS: %v, %v", tps, err)
	}
	if _, err := parseTPS([]byte("pgbench: error: connection refused")); err == nil {
		t.Fatal("parseTPS found a tps where there is none")
	}
}
