package checker_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/reaper"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ms is the time n milliseconds into a hand-made history.
func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// history builds a hand-made history; events get ids in the order added.
type history struct {
	events []lease.Event
	tasks  []checker.Task
	readAt int
}

func (h *history) add(kind, resource, holder string, fence int64, at, expires int) {
	h.events = append(h.events, lease.Event{
		ID: int64(len(h.events) + 1), At: ms(at), Resource: resource, Holder: holder,
		Fence: fence, Kind: kind, ExpiresAt: ms(expires),
	})
}

// holding is one lease in a hand-made history.
type holding struct {
	h        *history
	resource string
	holder   string
	fence    int64
	expires  int
}

func (h *history) acquire(resource, holder string, fence int64, at, ttl int) *holding {
	h.add("acquired", resource, holder, fence, at, at+ttl)
	return &holding{h: h, resource: resource, holder: holder, fence: fence, expires: at + ttl}
}

func (l *holding) renew(at, ttl int) {
	l.expires = at + ttl
	l.h.add("renewed", l.resource, l.holder, l.fence, at, l.expires)
}

func (l *holding) release(at int) {
	l.h.add("released", l.resource, l.holder, l.fence, at, at)
}

func (l *holding) expire(at int) {
	l.h.add("expired", l.resource, l.holder, l.fence, at, l.expires)
}

// event returns the event of the kind that holder's lease on resource
// recorded last.
func (h *history) event(t *testing.T, resource, holder, kind string) *lease.Event {
	t.Helper()
	for i := len(h.events) - 1; i >= 0; i-- {
		if e := &h.events[i]; e.Resource == resource && e.Holder == holder && e.Kind == kind {
			return e
		}
	}
	t.Fatalf("no %s event of %s by %s", kind, resource, holder)
	return nil
}

func (h *history) task(t *testing.T, id int64) *checker.Task {
	t.Helper()
	i := slices.IndexFunc(h.tasks, func(t checker.Task) bool { return t.ID == id })
	if i < 0 {
		t.Fatalf("no task %d", id)
	}
	return &h.tasks[i]
}

func (h *history) History() checker.History {
	return checker.History{Events: h.events, Tasks: h.tasks, ReadAt: ms(h.readAt)}
}

// attempt is an entry of a hand-made task's earlier_attempts.
func attempt(processor string, fence int64, started, expires, ended int, outcome string) task.Attempt {
	return task.Attempt{Processor: processor, Fence: fence, StartedAt: ms(started), ExpiresAt: ms(expires),
		EndedAt: ms(ended), Outcome: outcome}
}

// clean is a history that keeps every guarantee, read at 20 s: a reaper
// from 0 to 10 s, two resources' worth of acquisitions, renewals, releases
// and expiries (one announced, one taken over before it was due), a
// generator, and three tasks: done after a hand-back, done after a lapsed
// lease that a claim took, and dead.
func clean() (*history, checker.Options) {
	h := &history{readAt: 20000}
	r := h.acquire(reaper.Resource, "r1", 10, 0, 5000)
	r.renew(3000, 5000)
	r.renew(6000, 5000)
	r.renew(9000, 5000)
	r.release(10000)

	a := h.acquire("res:a", "a", 20, 100, 1000)
	a.renew(500, 1000)
	a.release(600)
	b := h.acquire("res:a", "b", 30, 700, 1000)
	b.expire(1900)                               // 200 ms after its expiry
	h.acquire("res:a", "c", 40, 2500, 1000)      // expires at 3500, unannounced:
	d := h.acquire("res:a", "d", 50, 3600, 1000) // taken over 100 ms later
	d.release(4000)

	g := h.acquire(demo.Resource, "g1", 60, 200, 5000)
	g.release(5000)

	// Task 1: handed back by w0 (shutting down), claimed by w1, completed.
	h.tasks = append(h.tasks, checker.Task{ID: 1, State: task.StateDone,
		Processor: "w1", Fence: 70, StartedAt: ms(1000), ExpiresAt: ms(31000),
		CreatedAt: ms(50), ProcessedAt: ms(2000),
		Attempts: []task.Attempt{attempt("w0", 65, 900, 30900, 950, task.OutcomeRequeued)}})
	// Task 2: generated; w1's lease lapsed at 1400, w2 took it over (which
	// announced the lapse) and completed it.
	h.tasks = append(h.tasks, checker.Task{ID: 2, State: task.StateDone,
		Processor: "w2", Fence: 90, StartedAt: ms(1450), ExpiresAt: ms(31450),
		CreatedAt: ms(300), ProcessedAt: ms(1600), GeneratorFence: 60,
		Attempts: []task.Attempt{attempt("w1", 80, 400, 1400, 1450, task.OutcomeExpired)}})
	// Task 3: failed on its only attempt, which its columns still show.
	h.tasks = append(h.tasks, checker.Task{ID: 3, State: task.StateDead,
		Processor: "w2", Fence: 100, StartedAt: ms(2100),
		CreatedAt: ms(2000), ProcessedAt: ms(2200),
		Attempts: []task.Attempt{attempt("w2", 100, 2100, 32100, 2200, task.OutcomeFailed)}})

	// Task 6: snoozed by its handler, then run again and completed.
	h.tasks = append(h.tasks, checker.Task{ID: 6, State: task.StateDone,
		Processor: "w1", Fence: 140, StartedAt: ms(3300), ExpiresAt: ms(33300),
		CreatedAt: ms(2900), ProcessedAt: ms(3400),
		Attempts: []task.Attempt{attempt("w1", 130, 3000, 33000, 3100, task.OutcomeSnoozed)}})
	// Task 7: cancelled while w2 ran it, which revoked its lease.
	h.tasks = append(h.tasks, checker.Task{ID: 7, State: task.StateCancelled,
		Processor: "w2", Fence: 150, StartedAt: ms(3500),
		CreatedAt: ms(3450), ProcessedAt: ms(3600),
		Attempts: []task.Attempt{attempt("w2", 150, 3500, 33500, 3600, task.OutcomeCancelled)}})

	return h, checker.Options{ExpectedTasks: []int64{1, 2, 3, 6, 7}}
}

// running is a hand-made task running under w3's lease [started, expires).
func running(id int64, started, expires int) checker.Task {
	return checker.Task{ID: id, State: task.StateRunning, Processor: "w3", Fence: 200 + id,
		StartedAt: ms(started), ExpiresAt: ms(expires), CreatedAt: ms(started - 10)}
}

// pending is a hand-made task back to pending after attempts, whose
// columns repeat its last attempt, as the database leaves them.
func pending(id int64, attempts ...task.Attempt) checker.Task {
	last := attempts[len(attempts)-1]
	return checker.Task{ID: id, State: task.StatePending, Processor: last.Processor, Fence: last.Fence,
		StartedAt: last.StartedAt, CreatedAt: attempts[0].StartedAt.Add(-time.Millisecond), Attempts: attempts}
}

func TestVerifyClean(t *testing.T) {
	t.Parallel()
	h, opts := clean()
	rep := checker.Verify(h.History(), opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	want := checker.Report{
		ReadAt: ms(20000), Events: len(h.events), Resources: 8, Acquisitions: 14, TaskAttempts: 8,
		Expiries: 3, ExpiriesJudged: 3, TasksDone: 3, TasksDead: 1, TasksCancelled: 1, Generated: 1,
	}
	if !reflect.DeepEqual(*rep, want) {
		t.Errorf("report = %+v, want %+v", *rep, want)
	}
}

// TestVerifyViolations breaks the clean history one way at a time and
// checks that exactly the rules that should fire do.
func TestVerifyViolations(t *testing.T) {
	t.Parallel()
	late := func(t *testing.T, h *history) { h.event(t, "res:a", "b", "expired").At = ms(2800) } // 1.1 s after 1700
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, h *history, opts *checker.Options)
		want   []string
		check  func(t *testing.T, rep *checker.Report)
	}{{
		name: "an overlap",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			x := h.acquire("res:a", "x", 110, 800, 1000) // inside b's [700, 1700)
			x.release(900)
		},
		want: []string{checker.RuleOverlap},
		check: func(t *testing.T, rep *checker.Report) {
			if d := rep.Violations[0].Detail; !strings.Contains(d, "res:a by x with fence 110") || !strings.Contains(d, "by b with fence 30") {
				t.Errorf("detail %q does not name both intervals", d)
			}
		},
	}, {
		name: "a fence going backwards",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			e := h.acquire("res:a", "e", 45, 5000, 1000) // after d's 50
			e.release(5500)
		},
		want: []string{checker.RuleFenceOrder},
	}, {
		name: "a fence given twice",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			z := h.acquire("res:b", "z", 30, 0, 1000) // b's fence on res:a
			z.release(100)
		},
		want: []string{checker.RuleFenceReused},
	}, {
		name: "a renewal after the release",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			(&holding{h: h, resource: "res:a", holder: "d", fence: 50}).renew(4100, 1000)
		},
		want: []string{checker.RuleOrphanEvent},
	}, {
		name: "task attempts that overlap",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).Attempts[0].EndedAt = ms(1500) // handed back after w1's claim at 1000
		},
		want: []string{checker.RuleOverlap},
		check: func(t *testing.T, rep *checker.Report) {
			d := rep.Violations[0].Detail
			for _, want := range []string{"task:1 by w1 with fence 70", "(attempt 2)", "task:1 by w0 with fence 65", "(attempt 1)"} {
				if !strings.Contains(d, want) {
					t.Errorf("detail %q does not name %q", d, want)
				}
			}
		},
	}, {
		name: "task attempts whose fences go backwards",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			h.tasks = append(h.tasks, pending(5, attempt("w1", 120, 3000, 33000, 3100, task.OutcomeRequeued),
				attempt("w2", 115, 3200, 33200, 3300, task.OutcomeRequeued)))
			opts.AllowUnfinished = true
		},
		want: []string{checker.RuleFenceOrder},
	}, {
		name: "a task attempt with a lease's fence",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).Attempts[0].Fence = 30 // b's on res:a
		},
		want: []string{checker.RuleFenceReused},
		check: func(t *testing.T, rep *checker.Report) {
			if d := rep.Violations[0].Detail; !strings.Contains(d, "res:a (event ") || !strings.Contains(d, "task:1 (attempt 1)") {
				t.Errorf("detail %q does not name both acquisitions", d)
			}
		},
	}, {
		name: "a task attempt of no known outcome",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).Attempts[0].Outcome = "vanished"
		},
		want: []string{checker.RuleOrphanEvent},
	}, {
		name: "a completion without a lease",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := h.task(t, 1)
			tk.Fence, tk.StartedAt = 0, time.Time{}
		},
		want: []string{checker.RuleTaskCompletion},
	}, {
		// The row of a stale completion: the columns show w1's attempt,
		// which had lapsed; it is not counted as a second interval.
		name: "a completion of an attempt that had ended",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := h.task(t, 2)
			tk.Processor, tk.Fence, tk.StartedAt, tk.ExpiresAt = "w1", 80, ms(400), ms(1400)
		},
		want: []string{checker.RuleTaskCompletion},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.TaskAttempts != 7 {
				t.Errorf("TaskAttempts = %d, want 7", rep.TaskAttempts)
			}
		},
	}, {
		name: "a completion before its lease was acquired",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).StartedAt = ms(2500) // completed at 2000
		},
		want: []string{checker.RuleTaskCompletion},
	}, {
		name: "a completion at the instant the lease expired",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).ExpiresAt = ms(2000)
		},
		want: []string{checker.RuleTaskCompletion},
	}, {
		name: "a completion after the lease expired",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).ExpiresAt = ms(1900)
		},
		want: []string{checker.RuleTaskCompletion},
	}, {
		name: "a task completed, then leased again",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := h.task(t, 1) // completed at 2000
			tk.Attempts = append(tk.Attempts, attempt("w3", 66, 2500, 32500, 2600, task.OutcomeRequeued))
		},
		want: []string{checker.RuleTaskReclaimed},
	}, {
		name: "a dead task leased again",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := h.task(t, 3) // dead at 2200 with fence 100
			tk.Attempts = append(tk.Attempts, attempt("w3", 110, 3000, 4000, 4100, task.OutcomeExpired))
		},
		want: []string{checker.RuleTaskReclaimed},
	}, {
		name: "a cancelled task leased again",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := h.task(t, 7) // cancelled at 3600 with fence 150
			tk.Attempts = append(tk.Attempts, attempt("w3", 160, 3700, 33700, 3800, task.OutcomeFailed))
		},
		want: []string{checker.RuleTaskReclaimed},
	}, {
		name: "a lost expected task",
		mutate: func(t *testing.T, _ *history, opts *checker.Options) {
			opts.ExpectedTasks = append(opts.ExpectedTasks, 4)
		},
		want: []string{checker.RuleTaskLost},
	}, {
		name: "an unfinished task",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.tasks = append(h.tasks, running(4, 19000, 49000))
		},
		want: []string{checker.RuleTaskUnfinished},
	}, {
		// The pending task's columns repeat its last attempt: counted twice,
		// its fence would be given twice.
		name: "unfinished tasks, allowed",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			h.tasks = append(h.tasks, running(4, 19000, 49000),
				pending(5, attempt("w3", 120, 5000, 35000, 5100, task.OutcomeRequeued)))
			opts.AllowUnfinished = true
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.TasksOther != 2 || rep.TaskAttempts != 10 {
				t.Errorf("TasksOther = %d, TaskAttempts = %d; want 2 and 10", rep.TasksOther, rep.TaskAttempts)
			}
		},
	}, {
		name: "a task lease's lapse announced late while a reaper ran",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			// w1's lease lapsed at 1400; w2's claim took it 1.1 s later.
			tk := h.task(t, 2)
			tk.Attempts[0].EndedAt = ms(2500)
			tk.StartedAt, tk.ExpiresAt, tk.ProcessedAt = ms(2500), ms(32500), ms(2600)
		},
		want: []string{checker.RuleExpiryLate},
		check: func(t *testing.T, rep *checker.Report) {
			if d := rep.Violations[0].Detail; !strings.Contains(d, "task:2 by w1 with fence 80") {
				t.Errorf("detail %q does not name w1's attempt", d)
			}
		},
	}, {
		name: "a task lease's lapse never announced while a reaper ran",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			h.tasks = append(h.tasks, running(4, 3000, 4000))
			opts.AllowUnfinished = true
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		name: "a task lease's lapse never announced, after the reaper stopped",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			h.tasks = append(h.tasks, running(4, 11000, 12000)) // the reaper released at 10000
			opts.AllowUnfinished = true
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.Expiries != 4 || rep.ExpiriesNotJudged != 1 {
				t.Errorf("expiries %d, not judged %d; want 4 and 1", rep.Expiries, rep.ExpiriesNotJudged)
			}
		},
	}, {
		name: "a task lease's lapse announced before it was due",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 2).Attempts[0].EndedAt = ms(1300) // it lapses at 1400
		},
		want: []string{checker.RuleExpiryEarly},
	}, {
		name: "a generated task inserted after its generator lease ended",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 2).CreatedAt = ms(5000) // released at 5000: [200, 5000) excludes it
		},
		want: []string{checker.RuleGeneratorFence},
	}, {
		name: "a generated task with a fence the generator never had",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.task(t, 1).GeneratorFence = 70 // task 1's own lease
		},
		want: []string{checker.RuleGeneratorFence},
	}, {
		name:   "a late expiry while a reaper ran",
		mutate: func(t *testing.T, h *history, _ *checker.Options) { late(t, h) },
		want:   []string{checker.RuleExpiryLate},
	}, {
		name: "the same late expiry inside an outage",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			late(t, h)
			opts.Outages = []checker.Window{{From: ms(2500), To: ms(2600)}}
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.ExpiriesJudged != 2 || rep.ExpiriesNotJudged != 1 {
				t.Errorf("judged %d, not judged %d; want 2 and 1", rep.ExpiriesJudged, rep.ExpiriesNotJudged)
			}
		},
	}, {
		name: "the same late expiry with a bound it keeps",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			late(t, h)
			opts.ExpiryBound = 1100 * time.Millisecond
		},
	}, {
		// The reaper renewed last at 0: it may have been killed then, so
		// nothing after its last sign of life is judged.
		name: "the same late expiry after the reaper stopped renewing",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			late(t, h)
			h.events = slices.DeleteFunc(h.events, func(e lease.Event) bool {
				return e.Resource == reaper.Resource && e.Kind != "acquired"
			})
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.ExpiriesJudged != 0 {
				t.Errorf("judged %d expiries, want 0", rep.ExpiriesJudged)
			}
		},
	}, {
		// The reaper's renewals failed from 0 on (a failover, say) and it
		// gave the lease up at its deadline, releasing it: the release shows
		// the process alive at 4600, not that it reaped since 0.
		name: "the same late expiry while the reaper's renewals failed until it gave up",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			late(t, h)
			h.events = slices.DeleteFunc(h.events, func(e lease.Event) bool {
				return e.Resource == reaper.Resource && e.Kind == "renewed"
			})
			h.event(t, reaper.Resource, "r1", "released").At = ms(4600)
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.ExpiriesJudged != 0 {
				t.Errorf("judged %d expiries, want 0", rep.ExpiriesJudged)
			}
		},
	}, {
		// Released a second after its last renewal, on schedule: it ran
		// until then.
		name: "the same late expiry before the reaper released on schedule",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			late(t, h)
			h.events = slices.DeleteFunc(h.events, func(e lease.Event) bool {
				return e.Resource == reaper.Resource && e.Kind == "renewed" && e.At.After(ms(3000))
			})
			h.event(t, reaper.Resource, "r1", "released").At = ms(4000)
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		// The reaper's process was killed at 1000 and restarted under the
		// same name, which renewed the lease under the same fence at 3000:
		// no reaper ran from 0 to 3000.
		name: "the same late expiry while the reaper's process was restarting",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			late(t, h)
			opts.Exits = []checker.Exit{{Holder: "r1", At: ms(1000)}}
		},
		check: func(t *testing.T, rep *checker.Report) {
			// Not judged: b's expiry at 1700 and task 2's lapse at 1400;
			// judged: c's at 3500, in the new process's run.
			if rep.ExpiriesJudged != 1 || rep.ExpiriesNotJudged != 2 {
				t.Errorf("judged %d, not judged %d; want 1 and 2", rep.ExpiriesJudged, rep.ExpiriesNotJudged)
			}
		},
	}, {
		// Another process exited: the reaper's ran on.
		name: "the same late expiry when another holder's process exited",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			late(t, h)
			opts.Exits = []checker.Exit{{Holder: "r2", At: ms(1000)}}
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		// The reaper's process exited after the expiry was due: it ran
		// through the expiry's span.
		name: "the same late expiry when the reaper's process exited later",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			late(t, h)
			opts.Exits = []checker.Exit{{Holder: "r1", At: ms(4000)}}
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		name: "an expiry never announced, taken over late",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			// c expires at 3500; d takes over at 4600.
			acq, rel := h.event(t, "res:a", "d", "acquired"), h.event(t, "res:a", "d", "released")
			acq.At, acq.ExpiresAt = ms(4600), ms(5600)
			rel.At, rel.ExpiresAt = ms(4700), ms(4700)
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		name: "an expiry never announced by the time the history was read",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.acquire("res:c", "q", 110, 3000, 1000)
		},
		want: []string{checker.RuleExpiryLate},
	}, {
		name: "an unannounced expiry not yet due when the history was read",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.acquire("res:c", "q", 110, 3000, 1000) // expires at 4000, due by 5000
			h.readAt = 4500
		},
		check: func(t *testing.T, rep *checker.Report) {
			if rep.Expiries != 4 || rep.ExpiriesNotJudged != 1 {
				t.Errorf("expiries %d, not judged %d; want 4 and 1", rep.Expiries, rep.ExpiriesNotJudged)
			}
		},
	}, {
		name: "an expiry announced before it was due",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.event(t, "res:a", "b", "expired").At = ms(1600) // expires at 1700
		},
		want: []string{checker.RuleExpiryEarly},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, opts := clean()
			tc.mutate(t, h, &opts)
			rep := checker.Verify(h.History(), opts)
			if got := rules(rep); !slices.Equal(got, tc.want) {
				t.Fatalf("rules = %v, want %v; violations: %v", got, tc.want, rep.Violations)
			}
			if tc.check != nil {
				tc.check(t, rep)
			}
		})
	}
}

// rules returns the distinct rules rep's violations broke, sorted.
func rules(rep *checker.Report) []string {
	var rs []string
	for _, v := range rep.Violations {
		rs = append(rs, v.Rule)
	}
	slices.Sort(rs)
	return slices.Compact(rs)
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	h, opts := clean()
	var b strings.Builder
	if err := checker.Verify(h.History(), opts).WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"acquisitions 14 (task attempts 8)", "expiries 3: judged 3, not judged 0", "done 3, dead 1, cancelled 1", "no violations"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("clean report lacks %q:\n%s", want, b.String())
		}
	}

	h, opts = clean()
	for id := int64(100); id < 100+checker.MaxPerRule+5; id++ {
		opts.ExpectedTasks = append(opts.ExpectedTasks, id)
	}
	x := h.acquire("res:a", "x", 110, 800, 1000)
	x.release(900)
	b.Reset()
	if err := checker.Verify(h.History(), opts).WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	overlap, lost := strings.Index(out, "\noverlap (1)\n"), strings.Index(out, "\ntask-lost (25)\n")
	if overlap < 0 || lost < overlap {
		t.Errorf("want the overlap, then the lost tasks:\n%s", out)
	}
	if !strings.Contains(out, "task 119 was inserted") || strings.Contains(out, "task 120 was inserted") {
		t.Errorf("want the first %d lost tasks listed, no more:\n%s", checker.MaxPerRule, out)
	}
	if !strings.Contains(out, "… and 5 more") {
		t.Errorf("want the rest counted:\n%s", out)
	}
}
