package checker

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/schedule"
)

// Schedule is a schedule whose ticks the checker judges, as its caller
// knew it: its definition, its first tick, and its state when it stopped
// ticking (when it was removed; a schedule still in the database ticks on,
// and its counters with it).
type Schedule struct {
	Name string
	// Cron and Zone are its cron expression and zone, as the API gave them.
	Cron, Zone string
	// First is its first tick: its next_tick when it was created.
	First time.Time
	// Next, Missed and Skipped are its next_tick, missed_ticks and
	// skipped_ticks when it stopped ticking.
	Next            time.Time
	Missed, Skipped int64
	// End is when it stopped ticking, as the caller saw it: a time by
	// which the scheduler had made every tick due, but perhaps the last,
	// e.g. when the request that removed it was sent. Zero: ReadAt.
	End time.Time
}

// ScheduleTicks are one schedule's ticks, as the report shows them.
type ScheduleTicks struct {
	Name, Cron string
	// Expected are the cron's ticks from the schedule's first through its
	// End.
	Expected int
	// Made are the tasks the schedule made (one per tick, unless
	// RuleScheduleDuplicate says otherwise); Missed and Skipped, its
	// counters.
	Made            int
	Missed, Skipped int64
	// Behind are the ticks due by End that the scheduler had not reached
	// when the schedule stopped (at most one, in flight); Ahead, those
	// after End it had (one that fell due while the schedule was being
	// removed). Expected - Behind + Ahead = Made + Missed + Skipped.
	Behind, Ahead int
}

// madeTick is a task's tick.
type madeTick struct {
	tick time.Time
	task int64
}

// addTick records the tick of t, a task a schedule made, and checks that
// t was not made before its tick fell due.
func (v *verifier) addTick(t Task) {
	v.ticks[t.Schedule] = append(v.ticks[t.Schedule], madeTick{tick: t.ScheduleTick, task: t.ID})
	if t.CreatedAt.Before(t.ScheduleTick) {
		v.violate(RuleScheduleTick, "schedule %s: task %d was created at %s, before its tick %s",
			t.Schedule, t.ID, ts(t.CreatedAt), ts(t.ScheduleTick))
	}
}

// judgeSchedules checks the ticks of every schedule's tasks: distinct for
// every schedule, and, for those of Options.Schedules, on the schedule's
// ticks and adding up (RuleScheduleTick, RuleScheduleCount,
// RuleScheduleBehind).
func (v *verifier) judgeSchedules() {
	for _, name := range sortedKeys(v.ticks) {
		ticks := v.ticks[name]
		slices.SortFunc(ticks, func(a, b madeTick) int { return cmp.Or(a.tick.Compare(b.tick), cmp.Compare(a.task, b.task)) })
		for i := 1; i < len(ticks); i++ {
			if ticks[i].tick.Equal(ticks[i-1].tick) {
				v.violate(RuleScheduleDuplicate, "schedule %s: tasks %d and %d were both made for the tick %s",
					name, ticks[i-1].task, ticks[i].task, ts(ticks[i].tick))
			}
		}
	}
	for _, s := range v.opts.Schedules {
		v.judgeSchedule(s, v.ticks[s.Name])
	}
}

// judgeSchedule judges s, whose tasks have ticks (sorted), and adds its
// figures to the report.
func (v *verifier) judgeSchedule(s Schedule, ticks []madeTick) {
	name := fmt.Sprintf("schedule %s (%s)", s.Name, s.Cron)
	spec, err := schedule.Parse(s.Cron, s.Zone)
	if err != nil {
		v.violate(RuleScheduleTick, "%s: its cron cannot be read in zone %q: %v", name, s.Zone, err)
		return
	}
	end := s.End
	if end.IsZero() {
		end = v.readAt
	}
	st := ScheduleTicks{Name: s.Name, Cron: s.Cron, Made: len(ticks), Missed: s.Missed, Skipped: s.Skipped}
	limit := latest(s.Next, end)
	if len(ticks) > 0 {
		limit = latest(limit, ticks[len(ticks)-1].tick)
	}
	// The schedule's ticks in order, beside its tasks' ticks in order.
	i, passed := 0, 0
	for g := s.First; !g.IsZero() && !g.After(limit); g = spec.Next(g) {
		for ; i < len(ticks) && ticks[i].tick.Before(g); i++ {
			v.offGrid(name, s, ticks[i])
		}
		for ; i < len(ticks) && ticks[i].tick.Equal(g); i++ {
			if !g.Before(s.Next) {
				v.violate(RuleScheduleTick, "%s: task %d was made for the tick %s, at or after the next tick %s, not made yet",
					name, ticks[i].task, ts(g), ts(s.Next))
			}
		}
		due, reached := !g.After(end), g.Before(s.Next)
		switch {
		case due && reached:
			st.Expected++
			passed++
		case due:
			st.Expected++
			st.Behind++
		case reached:
			st.Ahead++
			passed++
		}
	}
	for ; i < len(ticks); i++ {
		v.offGrid(name, s, ticks[i])
	}
	v.rep.Schedules = append(v.rep.Schedules, st)
	if got := int64(st.Made) + s.Missed + s.Skipped; got != int64(passed) {
		v.violate(RuleScheduleCount, "%s: %d task(s) made, %d tick(s) missed and %d skipped, for the %d tick(s) from its first, %s, to its next, %s",
			name, st.Made, s.Missed, s.Skipped, passed, ts(s.First), ts(s.Next))
	}
	if st.Behind > 1 {
		v.violate(RuleScheduleBehind, "%s: %d tick(s) due by %s, from %s on, were neither made nor counted when it stopped",
			name, st.Behind, ts(end), ts(s.Next))
	}
}

// offGrid reports a task whose tick is not one of s's.
func (v *verifier) offGrid(name string, s Schedule, t madeTick) {
	v.violate(RuleScheduleTick, "%s: task %d was made for %s, which is not one of its ticks (the first %s, then the cron's)",
		name, t.task, ts(t.tick), ts(s.First))
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
