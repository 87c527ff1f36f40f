package checker_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// slotted is a history of a key of 3 slots, k3, that keeps every
// guarantee, read at 20 s, without a reaper:
//
//	k3#1  a [0, 1000)
//	k3#2  b [100, 600)   task 1 by w1 [600, 1200), claimed as b released
//	k3#3  c [200, 900) lapsed, announced at 1500
//	k3#3  d [1300, 1400)
//
// Three at once from 200 to 900; b's end and task 1's start are the same
// instant, which is not four.
func slotted() (*history, map[string]int, checker.Options) {
	h := &history{readAt: 20000}
	a := h.acquire("k3#1", "a", 10, 0, 1000)
	a.release(1000)
	b := h.acquire("k3#2", "b", 20, 100, 1000)
	b.release(600)
	c := h.acquire("k3#3", "c", 30, 200, 700)
	c.expire(1500)
	d := h.acquire("k3#3", "d", 50, 1300, 1000)
	d.release(1400)

	w := h.acquire("k3#2", "w1", 40, 600, 300)
	w.renew(800, 500)
	w.release(1200)
	h.tasks = append(h.tasks, checker.Task{ID: 1, State: task.StateDone, Lock: "k3",
		Processor: "w1", Fence: 40, StartedAt: ms(600), ExpiresAt: ms(1300), CreatedAt: ms(50), ProcessedAt: ms(1200)})
	return h, map[string]int{"k3": 3}, checker.Options{ExpectedTasks: []int64{1}}
}

func TestVerifySlotsClean(t *testing.T) {
	t.Parallel()
	h, limits, opts := slotted()
	hist := h.History()
	hist.Limits = limits
	rep := checker.Verify(hist, opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	want := []checker.SlotKey{{Key: "k3", Limit: 3, Slots: 3, Holdings: 5, MostAtOnce: 3, Attempts: 1}}
	if !slices.Equal(rep.SlotKeys, want) {
		t.Errorf("slot keys = %+v, want %+v", rep.SlotKeys, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if w := "slots of k3 (limit 3): 5 holding(s) of 3 slot(s), at most 3 at once; 1 gated task attempt(s) in them"; !strings.Contains(b.String(), w) {
		t.Errorf("report lacks %q:\n%s", w, b.String())
	}
}

// TestVerifySlots breaks the slotted history one way at a time.
func TestVerifySlots(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, h *history, limits map[string]int, opts *checker.Options)
		want   []string
		of     string   // the rule whose first violation says detail
		detail []string // what it says
	}{{
		name: "a fourth holder, of a slot above the limit",
		mutate: func(t *testing.T, h *history, _ map[string]int, _ *checker.Options) {
			x := h.acquire("k3#4", "x", 35, 300, 1000)
			x.release(400)
		},
		want: []string{checker.RuleSlotLimit},
		of:   checker.RuleSlotLimit,
		detail: []string{"k3, a key of 3 slot(s): 4 holders at 2026-03-01T12:00:00.300000Z, when k3#4 by x with fence 35 took hold",
			"k3#1 by a with fence 10", "k3#2 by b with fence 20", "k3#3 by c with fence 30", "k3#4 by x with fence 35"},
	}, {
		name: "a holding that lapsed counts until its expires_at, not its announcement",
		mutate: func(t *testing.T, h *history, _ map[string]int, _ *checker.Options) {
			// c lapsed at 900, announced at 1500: x, from 950, is the third.
			x := h.acquire("k3#4", "x", 35, 950, 100)
			x.release(1000)
		},
	}, {
		name: "a holder too many on a key of one slot",
		mutate: func(t *testing.T, h *history, limits map[string]int, _ *checker.Options) {
			limits["k1"] = 1
			y := h.acquire("k1#1", "y", 60, 2000, 1000)
			y.release(2500)
			z := h.acquire("k1#2", "z", 70, 2499, 1000)
			z.release(2600)
		},
		want:   []string{checker.RuleSlotLimit},
		of:     checker.RuleSlotLimit,
		detail: []string{"k1, a key of 1 slot(s): 2 holders at 2026-03-01T12:00:02.499000Z", "k1#1 by y with fence 60", "k1#2 by z with fence 70"},
	}, {
		name: "a limit lowered since: judged by the highest the caller set",
		mutate: func(t *testing.T, _ *history, limits map[string]int, opts *checker.Options) {
			limits["k3"] = 2
			opts.Limits = map[string]int{"k3": 3}
		},
	}, {
		name: "a limit lowered since, the caller silent: judged by the lower",
		mutate: func(t *testing.T, _ *history, limits map[string]int, _ *checker.Options) {
			limits["k3"] = 2
		},
		want:   []string{checker.RuleSlotLimit},
		of:     checker.RuleSlotLimit,
		detail: []string{"k3, a key of 2 slot(s): 3 holders at 2026-03-01T12:00:00.200000Z"},
	}, {
		name: "a key the caller names that lease_limits lacks",
		mutate: func(t *testing.T, h *history, limits map[string]int, opts *checker.Options) {
			delete(limits, "k3")
			opts.Limits = map[string]int{"k3": 2}
		},
		want: []string{checker.RuleSlotLimit},
	}, {
		name: "a slotted task that outlived its slot",
		mutate: func(t *testing.T, h *history, _ map[string]int, _ *checker.Options) {
			e := h.event(t, "k3#2", "w1", "released") // task 1 was done at 1200
			e.At, e.ExpiresAt = ms(1100), ms(1100)
		},
		want:   []string{checker.RuleLockHeld},
		of:     checker.RuleLockHeld,
		detail: []string{"task:1 by w1 with fence 40", "outlived its slot, k3#2 by w1 with fence 40"},
	}, {
		name: "a slotted task run under a fence no slot was acquired with",
		mutate: func(t *testing.T, h *history, _ map[string]int, _ *checker.Options) {
			h.tasks = append(h.tasks, checker.Task{ID: 2, State: task.StateDone, Lock: "k3",
				Processor: "w2", Fence: 80, StartedAt: ms(3000), ExpiresAt: ms(4000), CreatedAt: ms(50), ProcessedAt: ms(3100)})
		},
		want:   []string{checker.RuleLockHeld},
		of:     checker.RuleLockHeld,
		detail: []string{"task:2 by w2 with fence 80", "k3, a key of 3 slot(s): no slot of k3 was acquired with fence 80"},
	}, {
		name: "a slotted task whose slot another held meanwhile",
		mutate: func(t *testing.T, h *history, _ map[string]int, _ *checker.Options) {
			e := h.event(t, "k3#2", "b", "released") // after task 1's claim at 600
			e.At, e.ExpiresAt = ms(700), ms(700)
		},
		// With a, b, c and w1 at 600, the key had four holders too.
		want:   []string{checker.RuleLockHeld, checker.RuleOverlap, checker.RuleSlotLimit},
		of:     checker.RuleLockHeld,
		detail: []string{"task:1 by w1 with fence 40", "holding k3#2, meets k3#2 by b with fence 20"},
	}, {
		name: "a slotted task's fence also given to a slot of another key",
		mutate: func(t *testing.T, h *history, limits map[string]int, _ *checker.Options) {
			limits["k9"] = 1
			z := h.acquire("k9#1", "z", 40, 5000, 1000)
			z.release(5100)
		},
		want: []string{checker.RuleFenceReused},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, limits, opts := slotted()
			tc.mutate(t, h, limits, &opts)
			hist := h.History()
			hist.Limits = limits
			rep := checker.Verify(hist, opts)
			if got := rules(rep); !slices.Equal(got, tc.want) {
				t.Fatalf("rules = %v, want %v; violations: %v", got, tc.want, rep.Violations)
			}
			if tc.of == "" {
				return
			}
			i := slices.IndexFunc(rep.Violations, func(v checker.Violation) bool { return v.Rule == tc.of })
			for _, want := range tc.detail {
				if d := rep.Violations[i].Detail; !strings.Contains(d, want) {
					t.Errorf("detail %q does not say %q", d, want)
				}
			}
		})
	}
}
