package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestKeys runs keys small, with more workers than the keys have slots, so that the
// limits bind: every drain finishes, no key ever ran more than its limit, and in the rated
// drain every key had its rate and none started more tasks in a second than it allows
// (keys checks each keyed drain against the database and fails the run otherwise; the
// figures it reports say the same).
func TestKeys(t *testing.T) {
	t.Parallel()
	const limit = 2
	// A drain that stalls (a key's tasks never claimed again) would otherwise wait for
	// the test binary's deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{DatabaseURL: pgtest.ServerURL(t), Scenarios: []string{"keys"},
		KeysTasks: 240, KeysRounds: 2, KeysWorkers: 16, KeysCount: 4, KeysLimit: limit})
	if err != nil {
		t.Fatalf("keys, 240 tasks on 4 keys of %d, 16 workers: %v (a deadline here means a drain stalled)", limit, err)
	}
	byCase := map[string]Result{}
	for _, r := range rep.Results {
		if r.Scenario != "keys" {
			t.Errorf("figure of scenario %q in a keys run: %+v", r.Scenario, r)
		}
		byCase[r.Case] = r
	}
	const figures = 30
	if len(rep.Results) != figures || len(byCase) != figures {
		t.Fatalf("keys gave %d figures (%d distinct cases), want %d: %+v", len(rep.Results), len(byCase), figures, rep.Results)
	}
	const rated = "4 keys of 2 with a rate of 1000/1s"
	for _, name := range []string{
		"4 keys of 2, 240 tasks, one Client of 16 workers: drain, median of 2 rounds",
		rated + ", 240 tasks, one Client of 16 workers: drain, median of 2 rounds",
		"no keys, 240 tasks, one Client of 16 workers: drain, median of 2 rounds",
		"4 keys of 2 ÷ no keys, median of 2 rounds",
		rated + " ÷ 4 keys of 2, median of 2 rounds",
		rated + " ÷ no keys, median of 2 rounds",
		"4 keys of 2: WAL per task",
		rated + ": WAL per task",
		rated + ": tasks per claim statement",
		"no keys: transactions that wrote, per task",
	} {
		if r, ok := byCase[name]; !ok || r.Value <= 0 {
			t.Errorf("figure %q: %+v, want one above 0", name, r)
		}
	}
	// The rate's costs are differences of two drains, which noise may make negative;
	// they are there, with each round's in the note.
	for _, what := range []string{"PostgreSQL CPU per claim statement", "a claim statement's mean time"} {
		name := rated + ", less without the rate: " + what
		if r, ok := byCase[name]; !ok || !strings.Contains(r.Note, "rounds: ") {
			t.Errorf("figure %q: %+v, want one with each round's in the note", name, r)
		}
	}
	for _, arm := range []string{"4 keys of 2", rated} {
		peak, ok := byCase[arm+": most tasks of one key running at once"]
		if !ok || peak.Value < 1 || peak.Value > limit {
			t.Errorf("%s: most tasks of one key at once: %+v, want 1 to %d", arm, peak, limit)
		}
	}
	// 60 tasks a key: the rate of 1000 a second cannot have bound.
	starts, ok := byCase[rated+": most starts of one key in any 1s"]
	if !ok || starts.Value < 1 || starts.Value > 60 || !strings.Contains(starts.Note, "never bound") {
		t.Errorf("most starts of one key in a second: %+v, want 1 to 60, with a note that the rate never bound", starts)
	}
}

// TestCheckKeysFindsOverlaps: the check that keys relies on fails a drain whose key ran
// more tasks at once than its limit, and one whose tasks held no slot.
func TestCheckKeysFindsOverlaps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := testDB(t)
	// Three done tasks of key-0, the third started before the first ended.
	_, err := d.Pool.Exec(ctx, `INSERT INTO tasks (task_data, state, attempts, lock_resource, fence, started_at, processed_at)
		SELECT '{}', 'done', 1, 'key-0', nextval('lease_fence_seq'), now() + s * interval '1 second', now() + (s + 2.5) * interval '1 second'
		FROM generate_series(0, 2) AS s`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkKeys(ctx, d, 3, 3); err == nil || !strings.Contains(err.Error(), "ran on no acquisition of a slot") {
		t.Errorf("tasks that held no slot: %v; want an error saying so", err)
	}
	peak, err := checkKeys(ctx, d, 3, 2)
	if err == nil || !strings.Contains(err.Error(), "3 tasks of one key (key-0) ran at once") {
		t.Errorf("three tasks of a key of 2 at once: %v; want an error naming the key", err)
	}
	if peak != 3 {
		t.Errorf("peak %d, want 3", peak)
	}
}

// TestCheckRateFindsExcess: the check that keys relies on for its rated drain fails a
// drain whose key started more tasks in a period than its rate allows, naming the key, and
// one whose key had no rate; starts a period apart or more are in different windows.
func TestCheckRateFindsExcess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := testDB(t)
	// key-0: starts at 0, 0.5, 0.9 and 1.0 s: three in [0, 1 s), and three in
	// [0.5 s, 1.5 s). key-1: starts at 0, 1 and 2 s, one in every second.
	_, err := d.Pool.Exec(ctx, `
		WITH base AS (SELECT date_trunc('second', now()) AS at)
		INSERT INTO tasks (task_data, state, attempts, lock_resource, started_at, processed_at)
		SELECT '{}', 'done', 1, k.key, base.at + k.s * interval '1 second', base.at + k.s * interval '1 second' + interval '1 millisecond'
		FROM base, (VALUES ('key-0', 0), ('key-0', 0.5), ('key-0', 0.9), ('key-0', 1.0), ('key-1', 0), ('key-1', 1), ('key-1', 2)) AS k (key, s)`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkRate(ctx, d, 3, time.Second); err == nil || !strings.Contains(err.Error(), "2 of its keys have no rate of 3 per 1s") {
		t.Errorf("keys without a rate: %v; want an error saying so", err)
	}
	for _, key := range []string{"key-0", "key-1"} {
		if _, err := d.Pool.Exec(ctx, `SELECT lease_rate_set($1, 3, interval '1 second')`, key); err != nil {
			t.Fatal(err)
		}
	}
	most, err := checkRate(ctx, d, 3, time.Second)
	if err != nil || most != 3 {
		t.Errorf("at most 3 starts of a key in a second: %d, %v; want 3 and no error", most, err)
	}
	for _, key := range []string{"key-0", "key-1"} {
		if _, err := d.Pool.Exec(ctx, `SELECT lease_rate_set($1, 2, interval '1 second')`, key); err != nil {
			t.Fatal(err)
		}
	}
	most, err = checkRate(ctx, d, 2, time.Second)
	if err == nil || !strings.Contains(err.Error(), "3 tasks of one key (key-0) started in the 1s from") {
		t.Errorf("3 starts of key-0 in a second, on a rate of 2: %v; want an error naming the key", err)
	}
	if most != 3 {
		t.Errorf("most starts %d, want 3", most)
	}
}
