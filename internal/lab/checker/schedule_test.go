package checker_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// sec is the time n seconds into a hand-made history (t0 is 12:00:00).
func sec(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }

// scheduled is a history of two schedules' tasks that keeps every
// guarantee, and the options that describe the schedules:
//
//	every-1s  @every 1s from 12:00:01; removed at 12:00:10.5 with its next
//	          tick 12:00:11: ticks 1 to 10 s made, but 4 and 5 s (missed:
//	          the task of 6 s stands for them) and 8 s (skipped)
//	minutely  "* * * * *" in Europe/Berlin from 12:01:00, removed at
//	          12:02:30 with its next tick 12:03:00: both ticks made
//
// Each task was created 5 ms after its tick and is done.
func scheduled() (*history, checker.Options) {
	h := &history{readAt: 200000}
	var id int64
	made := func(name string, tick time.Time) {
		id++
		h.tasks = append(h.tasks, checker.Task{ID: id, State: task.StateDone, Schedule: name, ScheduleTick: tick,
			Processor: "w1", Fence: 100 + id, CreatedAt: tick.Add(5 * time.Millisecond),
			StartedAt: tick.Add(10 * time.Millisecond), ExpiresAt: tick.Add(time.Hour), ProcessedAt: tick.Add(20 * time.Millisecond)})
	}
	for _, s := range []float64{1, 2, 3, 6, 7, 9, 10} {
		made("every-1s", sec(s))
	}
	made("minutely", sec(60))
	made("minutely", sec(120))
	return h, checker.Options{Schedules: []checker.Schedule{
		{Name: "every-1s", Cron: "@every 1s", Zone: "UTC", First: sec(1), Next: sec(11), Missed: 2, Skipped: 1, End: sec(10.5)},
		{Name: "minutely", Cron: "* * * * *", Zone: "Europe/Berlin", First: sec(60), Next: sec(180), End: sec(150)},
	}}
}

func TestVerifySchedulesClean(t *testing.T) {
	t.Parallel()
	h, opts := scheduled()
	rep := checker.Verify(h.History(), opts)
	if !rep.OK() {
		t.Fatalf("violations in a clean history: %v", rep.Violations)
	}
	want := []checker.ScheduleTicks{
		{Name: "every-1s", Cron: "@every 1s", Expected: 10, Made: 7, Missed: 2, Skipped: 1},
		{Name: "minutely", Cron: "* * * * *", Expected: 2, Made: 2},
	}
	if !reflect.DeepEqual(rep.Schedules, want) {
		t.Errorf("schedules = %+v, want %+v", rep.Schedules, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if line := "schedule every-1s (@every 1s): ticks expected 10, made 7, missed 2, skipped 1\n"; !strings.Contains(b.String(), line) {
		t.Errorf("report lacks %q:\n%s", line, b.String())
	}
}

// TestVerifySchedules breaks the scheduled history one way at a time and
// checks that exactly the rules that should fire do.
func TestVerifySchedules(t *testing.T) {
	t.Parallel()
	every := func(opts *checker.Options) *checker.Schedule { return &opts.Schedules[0] }
	tick := func(t *testing.T, h *history, at time.Time) *checker.Task {
		t.Helper()
		i := slices.IndexFunc(h.tasks, func(tk checker.Task) bool { return tk.Schedule == "every-1s" && tk.ScheduleTick.Equal(at) })
		if i < 0 {
			t.Fatalf("no task of every-1s for %s", at)
		}
		return &h.tasks[i]
	}
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, h *history, opts *checker.Options)
		want   []string
		ticks  *checker.ScheduleTicks // every-1s's figures, when they matter
	}{{
		name: "a tick made twice",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			dup := *tick(t, h, sec(3))
			dup.ID, dup.Fence = 50, 150
			h.tasks = append(h.tasks, dup)
		},
		want: []string{checker.RuleScheduleCount, checker.RuleScheduleDuplicate},
	}, {
		name: "a tick made twice by a schedule the caller did not name",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			for _, id := range []int64{50, 51} {
				h.tasks = append(h.tasks, checker.Task{ID: id, State: task.StateCancelled, Schedule: "other",
					ScheduleTick: sec(5), CreatedAt: sec(5), ProcessedAt: sec(6)})
			}
		},
		want: []string{checker.RuleScheduleDuplicate},
	}, {
		name: "a tick that is not one of the schedule's",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tk := tick(t, h, sec(3))
			tk.ScheduleTick = sec(3.5)
		},
		want: []string{checker.RuleScheduleTick},
	}, {
		name: "a tick before the schedule's first",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).First, every(opts).Missed = sec(2), 1 // the task of 1 s stands for none
		},
		want: []string{checker.RuleScheduleTick},
	}, {
		name: "a tick never made",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			h.tasks = slices.DeleteFunc(h.tasks, func(tk checker.Task) bool { return tk.ScheduleTick.Equal(sec(7)) })
		},
		want:  []string{checker.RuleScheduleCount},
		ticks: &checker.ScheduleTicks{Name: "every-1s", Cron: "@every 1s", Expected: 10, Made: 6, Missed: 2, Skipped: 1},
	}, {
		name: "a tick made before it fell due",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			tick(t, h, sec(9)).CreatedAt = sec(8.9)
		},
		want: []string{checker.RuleScheduleTick},
	}, {
		name: "a tick made past the schedule's next tick",
		mutate: func(t *testing.T, h *history, _ *checker.Options) {
			late := *tick(t, h, sec(10))
			late.ID, late.Fence, late.ScheduleTick, late.CreatedAt = 50, 150, sec(11), sec(11.1)
			h.tasks = append(h.tasks, late)
		},
		want: []string{checker.RuleScheduleCount, checker.RuleScheduleTick},
	}, {
		name: "ticks due by the end that the scheduler never reached",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).End = sec(13.5) // 11, 12 and 13 s due
		},
		want:  []string{checker.RuleScheduleBehind},
		ticks: &checker.ScheduleTicks{Name: "every-1s", Cron: "@every 1s", Expected: 13, Made: 7, Missed: 2, Skipped: 1, Behind: 3},
	}, {
		name: "the last tick in flight at the end",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).End = sec(11.2) // 11 s due, not made yet
		},
		ticks: &checker.ScheduleTicks{Name: "every-1s", Cron: "@every 1s", Expected: 11, Made: 7, Missed: 2, Skipped: 1, Behind: 1},
	}, {
		name: "a tick made after the end, as the schedule was removed",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).End = sec(9.5)
		},
		ticks: &checker.ScheduleTicks{Name: "every-1s", Cron: "@every 1s", Expected: 9, Made: 7, Missed: 2, Skipped: 1, Ahead: 1},
	}, {
		name: "missed ticks miscounted",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).Missed = 3
		},
		want: []string{checker.RuleScheduleCount},
	}, {
		name: "a cron the checker cannot read",
		mutate: func(t *testing.T, h *history, opts *checker.Options) {
			every(opts).Zone = "Mars/Olympus_Mons"
		},
		want: []string{checker.RuleScheduleTick},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, opts := scheduled()
			tc.mutate(t, h, &opts)
			rep := checker.Verify(h.History(), opts)
			if got := rules(rep); !slices.Equal(got, tc.want) {
				t.Fatalf("rules = %v, want %v; violations: %v", got, tc.want, rep.Violations)
			}
			if tc.ticks != nil && (len(rep.Schedules) == 0 || rep.Schedules[0] != *tc.ticks) {
				t.Errorf("schedules = %+v, want every-1s's %+v", rep.Schedules, *tc.ticks)
			}
		})
	}
}
