package checker

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Violation is one broken guarantee.
type Violation struct {
	Rule   string // one of the Rule constants, e.g. RuleOverlap
	Detail string // what was seen, with ids, holders, fences and times
}

// Report is what Check found.
type Report struct {
	// ReadAt is the database clock when the history was read.
	ReadAt time.Time
	// Events are the lease events read.
	Events int
	// Resources are the resources with a holding interval: those with at
	// least one lease event, and the tasks with at least one attempt.
	Resources int
	// Acquisitions are the holding intervals: the acquired events and the
	// task attempts.
	Acquisitions int
	// TaskAttempts are the acquisitions read from the task rows: the
	// entries of earlier_attempts, and the attempts of running and done
	// tasks.
	TaskAttempts int
	// Expiries are the intervals that ran out, not released, by ReadAt;
	// ExpiriesJudged of them were judged by RuleExpiryLate, and
	// ExpiriesNotJudged were not (no reaper ran through their span, it
	// met an outage, or their deadline had not passed by ReadAt).
	Expiries          int
	ExpiriesJudged    int
	ExpiriesNotJudged int
	// TasksDone, TasksDead, TasksCancelled and TasksOther count the tasks
	// by state.
	TasksDone      int
	TasksDead      int
	TasksCancelled int
	TasksOther     int
	// Generated are the tasks inserted by the generator.
	Generated int
	// GatedTasks are the tasks gated by a lock; GatedAttempts, their
	// attempts, each judged by RuleLockHeld.
	GatedTasks    int
	GatedAttempts int
	// SlotKeys are the keys of k slots, by key, with their slots'
	// holdings as RuleSlotLimit counted them; nil when there is none.
	SlotKeys []SlotKey
	// RateKeys are the keys with a rate, by key, with their tasks' starts
	// as RuleRateLimit counted them; PausedQueues, the queues of
	// Options.Pauses, by queue, with their tasks' starts as
	// RuleQueuePaused counted them.
	RateKeys     []RateKey
	PausedQueues []PausedQueue
	// Schedules are the ticks of each schedule of Options.Schedules, in
	// their order.
	Schedules  []ScheduleTicks
	Violations []Violation
}

// InFlight says, for a report, which ticks at the schedule's end were in
// flight: "" when none was.
func (s ScheduleTicks) InFlight() string {
	var parts []string
	if s.Behind > 0 {
		parts = append(parts, fmt.Sprintf("%d due at its end not made yet", s.Behind))
	}
	if s.Ahead > 0 {
		parts = append(parts, fmt.Sprintf("%d made after its end", s.Ahead))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// OK reports whether no guarantee was broken.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// MaxPerRule is how many violations of one rule WriteText lists.
const MaxPerRule = 20

// WriteText writes the report for humans: the counts, then the violations
// grouped by rule, at most MaxPerRule of each.
func (r *Report) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "history read at %s\n", ts(r.ReadAt))
	fmt.Fprintf(bw, "lease events %d, resources %d, acquisitions %d (task attempts %d)\n",
		r.Events, r.Resources, r.Acquisitions, r.TaskAttempts)
	fmt.Fprintf(bw, "expiries %d: judged %d, not judged %d\n", r.Expiries, r.ExpiriesJudged, r.ExpiriesNotJudged)
	fmt.Fprintf(bw, "tasks: done %d, dead %d, cancelled %d, other %d; generated %d\n",
		r.TasksDone, r.TasksDead, r.TasksCancelled, r.TasksOther, r.Generated)
	fmt.Fprintf(bw, "gated tasks %d, their attempts %d (each inside a holding of its lock)\n", r.GatedTasks, r.GatedAttempts)
	for _, k := range r.SlotKeys {
		fmt.Fprintln(bw, k.line())
	}
	for _, k := range r.RateKeys {
		fmt.Fprintln(bw, k.line())
	}
	for _, q := range r.PausedQueues {
		fmt.Fprintln(bw, q.line())
	}
	for _, s := range r.Schedules {
		fmt.Fprintf(bw, "schedule %s (%s): ticks expected %d, made %d, missed %d, skipped %d%s\n",
			s.Name, s.Cron, s.Expected, s.Made, s.Missed, s.Skipped, s.InFlight())
	}
	if r.OK() {
		fmt.Fprintln(bw, "no violations")
		return bw.Flush()
	}
	fmt.Fprintf(bw, "violations: %d\n", len(r.Violations))

	byRule := make(map[string][]Violation)
	for _, v := range r.Violations {
		byRule[v.Rule] = append(byRule[v.Rule], v)
	}
	rules := make([]string, 0, len(byRule))
	for rule := range byRule {
		rules = append(rules, rule)
	}
	// The known rules in their order, then any other by name.
	slices.SortFunc(rules, func(a, b string) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b))
	})
	for _, rule := range rules {
		vs := byRule[rule]
		fmt.Fprintf(bw, "\n%s (%d)\n", rule, len(vs))
		for _, v := range vs[:min(len(vs), MaxPerRule)] {
			fmt.Fprintf(bw, "  %s\n", v.Detail)
		}
		if len(vs) > MaxPerRule {
			fmt.Fprintf(bw, "  … and %d more\n", len(vs)-MaxPerRule)
		}
	}
	return bw.Flush()
}

// rank is a rule's place in ruleOrder; unknown rules come last.
func rank(rule string) int {
	if i := slices.Index(ruleOrder, rule); i >= 0 {
		return i
	}
	return len(ruleOrder)
}
