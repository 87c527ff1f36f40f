package schedule

import (
	"time"

	"github.com/robfig/cron/v3"
)

// starBit marks a cron field given as "*" (robfig/cron's SpecSchedule).
const starBit = 1 << 63

// wallClock is a schedule of cron fields read in a zone with a change of
// the clocks, ticking as cron(8) does across one: a tick whose local time
// is skipped when the clocks go forward runs at the first instant after the
// change (a daily job at 02:30 runs at 03:00 that day, not never), and one
// whose local time happens twice when they go back runs once, at the first
// (not twice). A schedule whose hour field is "*" is exempt from both: it
// runs every hour as the clock shows it.
type wallClock struct {
	spec *cron.SpecSchedule
	loc  *time.Location
}

func (w wallClock) Next(t time.Time) time.Time {
	n := w.spec.Next(t)
	if n.IsZero() || w.spec.Hour&starBit != 0 {
		return n
	}
	for range 4 { // at most a few changes of the clocks lie between two ticks that matter
		tr, before, after, ok := transition(t, n, w.loc)
		if !ok {
			return n
		}
		if after > before {
			// Forward: the local times from the change to after-before
			// later did not exist. A tick among them, on the clock that was
			// running before the change, runs at the change.
			old := *w.spec
			old.Location = time.FixedZone("", before)
			if m := old.Next(tr.Add(-time.Second)); !m.IsZero() && m.Before(tr.Add(time.Duration(after-before)*time.Second)) && tr.After(t) {
				return tr
			}
			return n
		}
		// Back: the local times of the hour (or so) after the change
		// happened before it too. A tick among them is a second one.
		if n.Before(tr.Add(time.Duration(before-after) * time.Second)) {
			t = n
			n = w.spec.Next(n)
			if n.IsZero() {
				return n
			}
			continue
		}
		return n
	}
	return n
}

// transition finds the first change of loc's UTC offset in (a, b]: the
// instant tr from which the new offset holds, and the offsets (seconds east
// of UTC) before and after it. ok is false when there is none.
func transition(a, b time.Time, loc *time.Location) (tr time.Time, before, after int, ok bool) {
	_, before = a.In(loc).Zone()
	_, end := b.In(loc).Zone()
	if before == end {
		// Two changes (there and back) between ticks over half a year apart
		// are not looked for: no schedule that ticks that rarely is helped.
		return time.Time{}, 0, 0, false
	}
	lo, hi := a, b // offset(lo) == before, offset(hi) != before
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2)
		if _, off := mid.In(loc).Zone(); off == before {
			lo = mid
		} else {
			hi = mid
		}
	}
	_, after = hi.In(loc).Zone()
	return hi.Truncate(time.Second), before, after, true
}
