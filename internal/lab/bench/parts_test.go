package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestClaimParts runs claim-parts small: every way drains every task exactly (claim-parts
// fails the run when a task is left pending or was not completed once), and each way
// reports its figures, with what each part adds to the one before.
func TestClaimParts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{DatabaseURL: pgtest.ServerURL(t), Scenarios: []string{"claim-parts"}, PartsTasks: 700, PartsRounds: 2})
	if err != nil {
		t.Fatalf("claim-parts, 700 tasks, 2 rounds: %v", err)
	}
	byCase := map[string]Result{}
	for _, r := range rep.Results {
		byCase[r.Case] = r
	}
	if want := 5*len(partsVariants) + len(partsVariants) - 1; len(rep.Results) != want || len(byCase) != want {
		t.Fatalf("claim-parts gave %d figures (%d distinct), want %d: %+v", len(rep.Results), len(byCase), want, rep.Results)
	}
	for _, v := range partsVariants {
		for _, what := range []string{"drain", "WAL per task", "statements per task"} {
			if r := byCase[v.name+": "+what]; r.Value <= 0 {
				t.Errorf("%s: %s: %+v, want a figure above 0", v.name, what, r)
			}
		}
		// 700 tasks in batches of 50 by 2 loops: at least 14 statements claim, and each
		// loop ends with one that finds nothing from its hint and one from the start.
		if r := byCase[v.name+": statements per task"]; r.Value < 18.0/700 || !strings.Contains(r.Note, "rounds: ") {
			t.Errorf("%s: statements per task %+v, want at least 18 of 700", v.name, r)
		}
	}
}
