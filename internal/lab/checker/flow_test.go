package checker_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// rated is a history of the key api, of a rate of 3 starts a second, read
// at 20 s, without a reaper: six tasks on it, each attempt 50 ms long in a
// slot of its own, starting at
//
//	0, 100 (failed), 200, 1000 (task 2 again), 1100, 1200, 2300
//
// so that every four starts in a row span at least a second: [200, 1200)
// holds three, the fourth, 1200, starting exactly a period after 200.
// Moving it to 1199 breaks the rate once.
func rated() (*history, checker.Options) {
	h := &history{readAt: 20000}
	fence := int64(10)
	gated := func(at int, processor string) (task.Attempt, int64) {
		fence++
		s := h.acquire(fmt.Sprintf("api#%d", fence), processor, fence, at, 1000)
		s.release(at + 50)
		return attempt(processor, fence, at, at+1000, at+50, task.OutcomeFailed), fence
	}
	done := func(id int64, at int, earlier ...task.Attempt) {
		a, f := gated(at, fmt.Sprintf("w%d", id))
		h.tasks = append(h.tasks, checker.Task{ID: id, State: task.StateDone, Queue: "default", Lock: "api", Attempts: earlier,
			Processor: a.Processor, Fence: f, StartedAt: a.StartedAt, ExpiresAt: a.ExpiresAt, ProcessedAt: a.EndedAt, CreatedAt: ms(0)})
	}
	done(1, 0)
	first, _ := gated(100, "w2")
	done(3, 200)
	done(2, 1000, first)
	done(4, 1100)
	done(5, 1200)
	done(6, 2300)
	return h, checker.Options{ExpectedTasks: []int64{1, 2, 3, 4, 5, 6}}
}

func ratedHistory(h *history) checker.History {
	hist := h.History()
	hist.Limits = map[string]int{"api": 1000}
	hist.Rates = map[string]checker.Rate{"api": {Starts: 3, Period: time.Second}}
	return hist
}

func TestVerifyRate(t *testing.T) {
	t.Parallel()
	h, opts := rated()
	rep := checker.Verify(ratedHistory(h), opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	want := []checker.RateKey{{Key: "api", Rate: checker.Rate{Starts: 3, Period: time.Second}, Tasks: 6, Starts: 7,
		MostInWindow: 3, BusiestAt: ms(0)}}
	if !slices.Equal(rep.RateKeys, want) {
		t.Errorf("rate keys = %+v, want %+v", rep.RateKeys, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if w := "rate of api (3 start(s) per 1s): 7 start(s) of 6 task(s), at most 3 in a window of 1s"; !strings.Contains(b.String(), w) {
		t.Errorf("report lacks %q:\n%s", w, b.String())
	}

	// A start a microsecond early: [200, 1200) holds four.
	early := h.task(t, 5)
	early.StartedAt = early.StartedAt.Add(-time.Microsecond)
	for i := range h.events {
		if e := &h.events[i]; e.Fence == early.Fence && e.Kind == "acquired" {
			e.At = early.StartedAt
		}
	}
	rep = checker.Verify(ratedHistory(h), opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleRateLimit}) || len(rep.Violations) != 1 {
		t.Fatalf("violations = %v, want one %q", rep.Violations, checker.RuleRateLimit)
	}
	for _, w := range []string{"api, a key of 3 start(s) per 1s: 4 starts in [2026-03-01T12:00:00.200000Z, 2026-03-01T12:00:01.200000Z)",
		"task:3 attempt 1 by w3 at 2026-03-01T12:00:00.200000Z", "task:2 attempt 2 by w2", "task:4 attempt 1",
		"task:5 attempt 1 by w5 at 2026-03-01T12:00:01.199999Z"} {
		if d := rep.Violations[0].Detail; !strings.Contains(d, w) {
			t.Errorf("detail %q does not say %q", d, w)
		}
	}
	if got := rep.RateKeys[0].MostInWindow; got != 4 {
		t.Errorf("most in a window = %d, want 4", got)
	}

	// The caller's rate wins over lease_limits': by 4 a second, the same
	// history is clean.
	opts.Rates = map[string]checker.Rate{"api": {Starts: 4, Period: time.Second}}
	if rep = checker.Verify(ratedHistory(h), opts); !rep.OK() {
		t.Errorf("violations by a rate of 4 a second: %v", rep.Violations)
	}
	// An earlier attempt counts: by 2 a second, the failed start at 100
	// makes [0, 1000) hold three.
	h, opts = rated()
	opts.Rates = map[string]checker.Rate{"api": {Starts: 2, Period: time.Second}}
	rep = checker.Verify(ratedHistory(h), opts)
	if len(rep.Violations) == 0 || !strings.Contains(rep.Violations[0].Detail,
		"3 starts in [2026-03-01T12:00:00.000000Z, 2026-03-01T12:00:01.000000Z): task:1 attempt 1 by w1 at 2026-03-01T12:00:00.000000Z; task:2 attempt 1 by w2 at 2026-03-01T12:00:00.100000Z; task:3") {
		t.Errorf("violations by a rate of 2 a second: %v; want the first to name [0, 1000) and its three starts", rep.Violations)
	}
}

// paused is a history of the queue q, paused at 1000 (binding every claim
// from 1010) until 2000, and at 3000 until 3500 (never seen binding), read
// at 20 s: tasks of q start at 500, 1000 and 1005 (claims under way at the
// first pause's commit), 2000 (as it ended) and 3100 (in the pause not
// judged); a task of another queue starts at 1500. The one that starts at
// 2000 was created at 1500.
func paused() (*history, checker.Options) {
	h := &history{readAt: 20000}
	for i, at := range []int{500, 1000, 1005, 2000, 3100, 1500} {
		id := int64(i + 1)
		queue := "q"
		if at == 1500 {
			queue = "other"
		}
		h.tasks = append(h.tasks, checker.Task{ID: id, State: task.StateDone, Queue: queue, Processor: "w", Fence: 10 + id,
			StartedAt: ms(at), ExpiresAt: ms(at + 1000), ProcessedAt: ms(at + 50), CreatedAt: ms(0)})
	}
	h.tasks[3].CreatedAt = ms(1500) // held back by the first pause
	return h, checker.Options{ExpectedTasks: []int64{1, 2, 3, 4, 5, 6}, Pauses: []checker.Pause{
		{Queue: "q", At: ms(3000), Until: ms(3500)},
		{Queue: "q", At: ms(1000), From: ms(1010), Until: ms(2000)},
	}}
}

func TestVerifyQueuePaused(t *testing.T) {
	t.Parallel()
	h, opts := paused()
	rep := checker.Verify(h.History(), opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	want := []checker.PausedQueue{{Queue: "q", Pauses: 2, Judged: 1, Paused: 990 * time.Millisecond,
		Tasks: 5, Starts: 5, HeldBack: 1, InFlight: 2, NotJudged: 1, Outside: 2}}
	if !slices.Equal(rep.PausedQueues, want) {
		t.Errorf("paused queues = %+v, want %+v", rep.PausedQueues, want)
	}

	// Starts at the instant the pause bound every claim, and just before
	// its end, and one of another queue within it.
	tk := h.task(t, 1)
	tk.StartedAt, tk.ExpiresAt, tk.ProcessedAt = ms(1010), ms(2010), ms(1060)
	h.task(t, 4).StartedAt = ms(2000).Add(-time.Microsecond)
	rep = checker.Verify(h.History(), opts)
	if got := rules(rep); !slices.Equal(got, []string{checker.RuleQueuePaused}) || len(rep.Violations) != 2 {
		t.Fatalf("violations = %v, want two %q", rep.Violations, checker.RuleQueuePaused)
	}
	for i, w := range []string{
		"task:1 attempt 1 by w at 2026-03-01T12:00:01.010000Z started in the paused queue q, 0s after the pause bound every claim: " +
			"the pause of q at 2026-03-01T12:00:01.000000Z, binding every claim from 2026-03-01T12:00:01.010000Z, until 2026-03-01T12:00:02.000000Z",
		"task:4 attempt 1 by w at 2026-03-01T12:00:01.999999Z started in the paused queue q, 989.999ms after",
	} {
		if d := rep.Violations[i].Detail; d != w && !strings.HasPrefix(d, w) {
			t.Errorf("detail %q does not begin %q", d, w)
		}
	}

	// An earlier attempt counts, and a pause not ended runs to ReadAt.
	h, opts = paused()
	tk = h.task(t, 5)
	tk.Attempts = []task.Attempt{attempt("w", 1, 4000, 5000, 4050, task.OutcomeFailed)}
	tk.Fence, tk.StartedAt, tk.ExpiresAt, tk.ProcessedAt = 20, ms(5000), ms(6000), ms(5050)
	opts.Pauses = append(opts.Pauses, checker.Pause{Queue: "q", At: ms(3900), From: ms(3950)})
	rep = checker.Verify(h.History(), opts)
	if len(rep.Violations) != 2 || !strings.Contains(rep.Violations[0].Detail, "task:5 attempt 1 by w at 2026-03-01T12:00:04.000000Z") ||
		!strings.Contains(rep.Violations[1].Detail, "task:5 attempt 2 by w at 2026-03-01T12:00:05.000000Z") {
		t.Errorf("violations = %v, want both attempts of task 5 within the pause not ended", rep.Violations)
	}
}
