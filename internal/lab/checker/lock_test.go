package checker_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// gated is a history of lease-gated tasks that keeps every guarantee, read
// at 20 s, without a reaper (no expiry is judged). The lock lock:a is also
// taken by a lease client, before and after the tasks gated by it:
//
//	lock:a  client [0, 500)   w1 [600, 1200)   w2 [1300, 2300) lapsed, w3 [2400, 2500)   client [2600, 2700)
//	lock:b  w4 [3000, 3100)   w5 [3200, 3300)
//
// Task 1 is done by w1 (its lock renewed with it); task 2's first attempt,
// w2's, lapsed and w3's claim took it over; task 3 failed on w4's attempt
// and was done by w5. Each lock acquisition's fence is its attempt's.
func gated() (*history, checker.Options) {
	h := &history{readAt: 20000}
	c := h.acquire("lock:a", "client", 10, 0, 1000)
	c.release(500)

	l := h.acquire("lock:a", "w1", 20, 600, 1000)
	l.renew(1000, 1000)
	l.release(1200)
	h.tasks = append(h.tasks, checker.Task{ID: 1, State: task.StateDone, Lock: "lock:a",
		Processor: "w1", Fence: 20, StartedAt: ms(600), ExpiresAt: ms(2000), CreatedAt: ms(100), ProcessedAt: ms(1200)})

	h.acquire("lock:a", "w2", 30, 1300, 1000) // lapses at 2300
	l = h.acquire("lock:a", "w3", 40, 2400, 1000)
	l.release(2500)
	h.tasks = append(h.tasks, checker.Task{ID: 2, State: task.StateDone, Lock: "lock:a",
		Processor: "w3", Fence: 40, StartedAt: ms(2400), ExpiresAt: ms(3400), CreatedAt: ms(200), ProcessedAt: ms(2500),
		Attempts: []task.Attempt{attempt("w2", 30, 1300, 2300, 2400, task.OutcomeExpired)}})

	c = h.acquire("lock:a", "client", 50, 2600, 1000)
	c.release(2700)

	l = h.acquire("lock:b", "w4", 60, 3000, 1000)
	l.release(3100)
	l = h.acquire("lock:b", "w5", 70, 3200, 1000)
	l.release(3300)
	h.tasks = append(h.tasks, checker.Task{ID: 3, State: task.StateDone, Lock: "lock:b",
		Processor: "w5", Fence: 70, StartedAt: ms(3200), ExpiresAt: ms(4200), CreatedAt: ms(2900), ProcessedAt: ms(3300),
		Attempts: []task.Attempt{attempt("w4", 60, 3000, 4000, 3100, task.OutcomeFailed)}})

	return h, checker.Options{ExpectedTasks: []int64{1, 2, 3}}
}

func TestVerifyLocksClean(t *testing.T) {
	t.Parallel()
	h, opts := gated()
	rep := checker.Verify(h.History(), opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	if rep.GatedTasks != 3 || rep.GatedAttempts != 5 {
		t.Errorf("gated tasks %d, attempts %d; want 3 and 5", rep.GatedTasks, rep.GatedAttempts)
	}
	// Every fence is counted twice (the lock's acquisition and the attempt)
	// but for the lease client's two.
	if rep.Acquisitions != 12 {
		t.Errorf("acquisitions = %d, want 12", rep.Acquisitions)
	}
}

// TestVerifyLocks breaks the gated history one way at a time: each bad
// history must fail RuleLockHeld (and only the other rules it also
// breaks).
func TestVerifyLocks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, h *history)
		want   []string
		detail []string // in the first violation of RuleLockHeld
	}{{
		name: "a lease client granted the lock while a gated task held it",
		mutate: func(t *testing.T, h *history) {
			e := h.event(t, "lock:a", "client", "acquired") // the second grant, at 2600
			e.At, e.ExpiresAt = ms(2450), ms(3450)          // inside w3's [2400, 2500)
		},
		want:   []string{checker.RuleLockHeld, checker.RuleOverlap},
		detail: []string{"task:2 by w3 with fence 40", "meets lock:a by client with fence 50"},
	}, {
		name: "a gated task claimed while a lease client held the lock",
		mutate: func(t *testing.T, h *history) {
			h.events[1].At, h.events[1].ExpiresAt = ms(800), ms(800) // the client's first release, after w1's claim at 600
		},
		want:   []string{checker.RuleLockHeld, checker.RuleOverlap},
		detail: []string{"task:1 by w1 with fence 20", "meets lock:a by client with fence 10"},
	}, {
		name: "a gated task run without taking its lock",
		mutate: func(t *testing.T, h *history) {
			// Task 4 ran inside w1's holding of lock:a, under a fence of its own.
			h.tasks = append(h.tasks, checker.Task{ID: 4, State: task.StateDone, Lock: "lock:a",
				Processor: "w6", Fence: 80, StartedAt: ms(650), ExpiresAt: ms(1650), CreatedAt: ms(50), ProcessedAt: ms(700)})
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:4 by w6 with fence 80", "lock:a was never acquired with fence 80"},
	}, {
		name: "a gated attempt whose lock's acquisition is another holder's",
		mutate: func(t *testing.T, h *history) {
			for i := range h.events {
				if h.events[i].Fence == 60 {
					h.events[i].Holder = "w9"
				}
			}
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:3 by w4 with fence 60", "another holder's, lock:b by w9"},
	}, {
		name: "a gated attempt whose lock was acquired before its claim",
		mutate: func(t *testing.T, h *history) {
			h.event(t, "lock:b", "w5", "acquired").At = ms(3150) // claimed at 3200
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:3 by w5 with fence 70", "not acquired at the claim but at 2026-03-01T12:00:03.150000Z"},
	}, {
		name: "a gated attempt whose lock was acquired after its claim",
		mutate: func(t *testing.T, h *history) {
			h.event(t, "lock:a", "w1", "acquired").At = ms(700) // claimed at 600
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:1 by w1 with fence 20", "not acquired at the claim but at 2026-03-01T12:00:00.700000Z"},
	}, {
		name: "a gated attempt that outlived its lock",
		mutate: func(t *testing.T, h *history) {
			e := h.event(t, "lock:a", "w1", "released")
			e.At, e.ExpiresAt = ms(1100), ms(1100) // task 1 was done at 1200
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:1 by w1 with fence 20", "outlived its lock"},
	}, {
		name: "a gated attempt whose lock lapsed before its own lease",
		mutate: func(t *testing.T, h *history) {
			h.task(t, 2).Attempts[0].ExpiresAt = ms(2350) // the lock's lapsed at 2300
			h.task(t, 2).Attempts[0].EndedAt = ms(2400)
		},
		want:   []string{checker.RuleLockHeld},
		detail: []string{"task:2 by w2 with fence 30", "outlived its lock"},
	}, {
		name: "a gated attempt's fence also given to another resource",
		mutate: func(t *testing.T, h *history) {
			z := h.acquire("res:z", "z", 20, 5000, 1000) // w1's, on lock:a
			z.release(5100)
		},
		want: []string{checker.RuleFenceReused},
	}, {
		name: "a gated attempt's fence shared with an acquisition of another lock",
		mutate: func(t *testing.T, h *history) {
			h.task(t, 3).Lock = "lock:a" // its fences are lock:b's
		},
		want: []string{checker.RuleFenceReused, checker.RuleLockHeld},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, opts := gated()
			tc.mutate(t, h)
			rep := checker.Verify(h.History(), opts)
			if got := rules(rep); !slices.Equal(got, tc.want) {
				t.Fatalf("rules = %v, want %v; violations: %v", got, tc.want, rep.Violations)
			}
			if len(tc.detail) == 0 {
				return
			}
			i := slices.IndexFunc(rep.Violations, func(v checker.Violation) bool { return v.Rule == checker.RuleLockHeld })
			for _, want := range tc.detail {
				if d := rep.Violations[i].Detail; !strings.Contains(d, want) {
					t.Errorf("detail %q does not say %q", d, want)
				}
			}
		})
	}
}
