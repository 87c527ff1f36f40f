package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestKeys runs keys small, with more workers than the keys have slots, so that the
// limits bind: every drain finishes, and no key ever ran more than its limit (keys checks
// each keyed drain against the database and fails the run otherwise; the figure it
// reports says the same).
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
	if len(rep.Results) != 16 || len(byCase) != 16 {
		t.Fatalf("keys gave %d figures (%d distinct cases), want 16: %+v", len(rep.Results), len(byCase), rep.Results)
	}
	for _, name := range []string{
		"4 keys of 2, 240 tasks, one Client of 16 workers: drain, median of 2 rounds",
		"no keys, 240 tasks, one Client of 16 workers: drain, median of 2 rounds",
		"4 keys of 2 ÷ no keys, median of 2 rounds",
		"4 keys of 2: WAL per task",
		"no keys: transactions that wrote, per task",
	} {
		if r, ok := byCase[name]; !ok || r.Value <= 0 {
			t.Errorf("figure %q: %+v, want one above 0", name, r)
		}
	}
	peak, ok := byCase["4 keys of 2: most tasks of one key running at once"]
	if !ok || peak.Value < 1 || peak.Value > limit {
		t.Errorf("most tasks of one key at once: %+v, want 1 to %d", peak, limit)
	}
}

// TestCheckKeysFindsOverlaps: the check that keys relies on fails a drain whose key ran
// more tasks at once than its limit, and one whose tasks held no slot.
func TestCheckKeysFindsOverlaps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := newDB(ctx, pgtest.ServerURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Three done tasks of key-0, the third started before the first ended.
	_, err = d.Pool.Exec(ctx, `INSERT INTO tasks (task_data, state, attempts, lock_resource, fence, started_at, processed_at)
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
