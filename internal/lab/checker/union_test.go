package checker_test

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// diverged returns the histories of an old and a new primary that share
// what was made before the failover (two acquisitions, a task's first
// attempt) and then went apart: the old one made an acquisition and a
// task attempt the new one never received, and the new one made its own
// after the failover, with the fences given.
func diverged(newLease, newAttempt int64) (before, after checker.History) {
	shared := func() *history {
		h := &history{readAt: 9000}
		h.acquire("res:a", "a", 10, 0, 1000).release(500)
		h.acquire("res:b", "b", 11, 100, 1000)
		h.tasks = []checker.Task{{ID: 1, State: task.StateRunning, Processor: "w1", Fence: 12,
			StartedAt: ms(200), ExpiresAt: ms(3200), CreatedAt: ms(0)}}
		return h
	}
	o := shared()
	o.acquire("res:a", "c", 13, 1000, 1000) // lost with the old primary
	tk := &o.tasks[0]
	tk.Attempts = []task.Attempt{attempt("w1", 12, 200, 3200, 900, task.OutcomeRequeued)}
	tk.Processor, tk.Fence, tk.StartedAt = "w2", 14, ms(950) // lost too

	n := shared()
	n.acquire("res:a", "d", newLease, 5000, 1000)
	tk = &n.tasks[0]
	tk.Attempts = []task.Attempt{attempt("w1", 12, 200, 3200, 3200, task.OutcomeExpired)}
	tk.Processor, tk.Fence, tk.StartedAt = "w3", newAttempt, ms(5100)
	return o.History(), n.History()
}

// TestVerifyFencesAcrossAFailover: over the union of two diverged
// histories, what they share counts once, and a fence the new primary
// handed out again (its sequence had not seen the old one's last) is
// caught, for a lease and for a task attempt alike.
func TestVerifyFencesAcrossAFailover(t *testing.T) {
	old, cur := diverged(1_000_000_013, 1_000_000_014)
	rep := checker.VerifyFences(old, cur)
	if len(rep.Violations) != 0 {
		t.Errorf("fences advanced past the old primary's: %v; want no violation", rep.Violations)
	}
	// res:a ×3 (a, c, d), res:b, and the task's attempts 12, 14 and the new one.
	if rep.Acquisitions != 7 || rep.TaskAttempts != 3 {
		t.Errorf("%d acquisitions (%d task attempts), want 7 (3): each shared one once", rep.Acquisitions, rep.TaskAttempts)
	}
	if got := checker.Verify(old, checker.Options{AllowUnfinished: true}).Violations; len(got) != 0 {
		t.Fatalf("the old history alone breaks rules: %v", got)
	}

	for _, c := range []struct {
		name           string
		lease, attempt int64
		want           string
	}{
		{"a lease's fence again", 13, 1_000_000_014, "fence 13 given twice: res:a"},
		{"a task attempt's fence again", 1_000_000_013, 14, "fence 14 given twice: task:1 (attempt 2) and task:1 (attempt 2)"},
	} {
		old, cur := diverged(c.lease, c.attempt)
		rep := checker.VerifyFences(old, cur)
		if len(rep.Violations) != 1 || rep.Violations[0].Rule != checker.RuleFenceReused || !strings.Contains(rep.Violations[0].Detail, c.want) {
			t.Errorf("%s: %v; want one %s violation with %q", c.name, rep.Violations, checker.RuleFenceReused, c.want)
		}
	}
}
