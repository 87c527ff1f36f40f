package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/lab/checker"
)

// Fault is one fault injected.
type Fault struct {
	At     time.Time // when it was injected
	Kind   Kind
	Victim string // the replica; "primary <node>" for a failover; empty for a restart of PostgreSQL
	PID    int    // the victim's process
	Detail string // what was done and what was seen of its effect
}

// Latency is the longest of a kind of wait the soak measured.
type Latency struct {
	Max     time.Duration
	Of      string // which wait it was
	Samples int    // how many were measured
}

func (l *Latency) add(d time.Duration, of string) {
	if l.Samples == 0 || d > l.Max {
		l.Max, l.Of = d, of
	}
	l.Samples++
}

func (l Latency) String() string {
	if l.Samples == 0 {
		return "not measured"
	}
	return fmt.Sprintf("%v (%s; longest of %d)", round(l.Max), l.Of, l.Samples)
}

// Report is what a soak did and found.
type Report struct {
	Seed          uint64
	Replicas      int
	LeaseTTL      time.Duration
	FaultInterval time.Duration
	Standby       string        // Options.Standby: "" for a single cluster
	Started       time.Time     // when the load and the faults began
	Elapsed       time.Duration // how long they lasted
	Interrupted   bool          // the soak was stopped before its end: no drain

	Faults []Fault
	// Outages are the windows in which no expiry could be announced, given to the
	// checker: the restarts of PostgreSQL, and the pauses of the replica that was the
	// reaper.
	Outages []checker.Window
	// DBDown is how long PostgreSQL was down in all, over DBRestarts restarts, or how long
	// there was no primary (from a death to the first lease granted after it) over
	// Failovers failovers, Rewound of which rebuilt the old primary by pg_rewind (the others
	// by pg_basebackup).
	DBDown     time.Duration
	DBRestarts int
	Failovers  int
	Rewound    int

	TasksCreated    int // by the soak over the API, answered 201
	TasksGenerated  int // by the generator
	TasksDone       int
	TasksDead       int
	TasksCancelled  int  // by the soak's operator (controlTasks)
	TasksUnfinished int  // still pending or running at the end
	Drained         bool // every task finished before the replicas were stopped
	LeaseGrants     int  // acquisitions (201) by the soak's lease clients, the slot clients' included

	// Apps is what became of the tasks of the applications on the library.
	Apps AppStats
	// Schedules are the soak's schedules, in the order created; their ticks are in
	// Check.Schedules, by name.
	Schedules []ScheduleRun
	// Gated is what became of the lease-gated tasks.
	Gated GatedStats
	// Slots are what became of the soak's use of each key of k slots, in the order of
	// slotKeys.
	Slots []SlotStats
	// Rate is what became of the soak's key with a rate; PausedQueue, of its queue
	// paused and resumed.
	Rate        RateStats
	PausedQueue PauseStats

	// Reclaim is the longest wait from a kill -9 to a task the victim was running being
	// claimed again; Release, from a SIGTERM to the last of the victim's leases being free.
	Reclaim, Release Latency
	// FailoverGrant is the longest wait from a primary's death to the first lease granted
	// after it.
	FailoverGrant Latency
	// ReaperBack is the longest wait from the database's return (the end of a restart,
	// the first lease granted after a failover) to the reaper's first lease event on it:
	// the outages given to the checker last until then.
	ReaperBack Latency

	// Check is the checker's report; nil when it failed to run.
	Check *checker.Report
	// Violations are broken guarantees the soak saw itself, besides the checker's: the
	// lease clients' view of mutual exclusion, and leases left held by a clean shutdown.
	Violations []checker.Violation
	// Problems are failures of the soak that are not broken guarantees: a queue that did
	// not drain, a killed replica's task never claimed again, the checker failing.
	Problems []string
}

// GatedStats count the lease-gated tasks.
type GatedStats struct {
	Created int // by the soak over the API, answered 201, on the gateLocks
	// Tasks are all of them (the gated schedules' and those on the keys of k slots
	// included), Done those done, Scheduled those the gated schedules made.
	Tasks, Done, Scheduled int
	// ScheduleTasks are the tasks every schedule made, gated or not.
	ScheduleTasks int
}

// AllViolations returns the checker's violations and the soak's own.
func (r *Report) AllViolations() []checker.Violation {
	var all []checker.Violation
	if r.Check != nil {
		all = append(all, r.Check.Violations...)
	}
	return append(all, r.Violations...)
}

// OK reports whether the soak ran to its end, found every guarantee kept and had no problem.
func (r *Report) OK() bool {
	return !r.Interrupted && r.Check != nil && len(r.AllViolations()) == 0 && len(r.Problems) == 0
}

// FaultCounts returns how many faults of each kind were injected.
func (r *Report) FaultCounts() map[Kind]int {
	counts := map[Kind]int{}
	for _, f := range r.Faults {
		counts[f.Kind]++
	}
	return counts
}

func (r *Report) verdict() string {
	switch {
	case r.OK():
		return "PASS"
	case r.Interrupted:
		return "FAIL (interrupted)"
	default:
		return "FAIL"
	}
}

// summary is the report's table of figures, as label/value rows.
func (r *Report) summary() [][2]string {
	counts := r.FaultCounts()
	var kinds []string
	listed := AllKinds
	if r.Standby != "" {
		listed = StandbyKinds
	}
	for _, k := range listed {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, counts[k]))
	}
	acquisitions := "n/a"
	if r.Check != nil {
		acquisitions = fmt.Sprint(r.Check.Acquisitions)
	}
	drained := "yes"
	if !r.Drained {
		drained = fmt.Sprintf("no (%d task(s) left pending or running)", r.TasksUnfinished)
	}
	rows := [][2]string{
		{"result", r.verdict()},
		{"started", r.Started.UTC().Format(time.RFC3339)},
		{"duration", fmt.Sprintf("%v of load and faults", r.Elapsed.Round(time.Second))},
		{"replicas", fmt.Sprintf("%d (lease TTL %v, %d workers each)", r.Replicas, r.LeaseTTL, workers)},
		{"seed", fmt.Sprint(r.Seed)},
		{"faults", fmt.Sprintf("%d: %s (one every %v on average)", len(r.Faults), strings.Join(kinds, ", "), r.FaultInterval)},
	}
	if r.Standby == "" {
		rows = append(rows, [2]string{"PostgreSQL down", fmt.Sprintf("%v in %d restart(s)", round(r.DBDown), r.DBRestarts)})
	} else {
		rows = append(rows,
			[2]string{"PostgreSQL", "a primary and a synchronous streaming standby, on one multi-host URL (target_session_attrs=read-write)"},
			[2]string{"failovers", fmt.Sprintf("%d (primary stopped hard, standby promoted, old primary rebuilt as the standby: "+
				"%d by pg_rewind, %d by pg_basebackup); no primary for %v in all", r.Failovers, r.Rewound, r.Failovers-r.Rewound, round(r.DBDown))},
			[2]string{"longest primary death → first lease", r.FailoverGrant.String()})
	}
	if r.ReaperBack.Samples > 0 {
		rows = append(rows, [2]string{"longest database back → reaper back (the outages end then)", r.ReaperBack.String()})
	}
	rows = append(rows, [][2]string{
		{"tasks done", fmt.Sprint(r.TasksDone)},
		{"tasks dead", fmt.Sprint(r.TasksDead)},
		{"tasks cancelled (by the soak's operator)", fmt.Sprint(r.TasksCancelled)},
		{"applications on the library", fmt.Sprintf("%s (embedded on a pool) and %s (remote, over REST), %d workers each",
			AppEmbedded, AppRemote, appWorkers)},
		{"leasehold work processes", fmt.Sprintf("%s and %s (over REST), %d slots each, running a shell script (task lease TTL %v)", WorkA, WorkB, workSlots, shellTTL)},
		{"their tasks done", fmt.Sprintf("%s %d, %s %d, %s %d; by %s %d, by %s %d, by %s %d, by %s %d; %d after a snooze, %d after a failed attempt",
			KindDigest, r.Apps.Done[KindDigest], KindFlaky, r.Apps.Done[KindFlaky], KindShell, r.Apps.Done[KindShell],
			AppEmbedded, r.Apps.DoneBy[AppEmbedded], AppRemote, r.Apps.DoneBy[AppRemote],
			WorkA, r.Apps.DoneBy[WorkA], WorkB, r.Apps.DoneBy[WorkB], r.Apps.Snoozed, r.Apps.Failed)},
		{"their tasks cancelled / retried / dead", fmt.Sprintf("%d / %d / %d", r.Apps.Cancelled, r.Apps.Retried, r.Apps.Dead)},
		{"orders inserted with their task in one transaction", fmt.Sprint(r.Apps.Orders)},
		{"tasks generated", fmt.Sprint(r.TasksGenerated)},
		{"tasks created over the API (201)", fmt.Sprint(r.TasksCreated)},
		{"queue drained", drained},
		{"leases acquired by the soak's clients", fmt.Sprint(r.LeaseGrants)},
		{"lease-gated tasks", r.gatedRow()},
	}...)
	rows = append(rows, r.slotRows()...)
	rows = append(rows, r.flowRows()...)
	rows = append(rows, [][2]string{
		{"lease acquisitions in the history", acquisitions},
		{"violations", fmt.Sprint(len(r.AllViolations()))},
		{"longest kill -9 → its task claimed again", r.Reclaim.String()},
		{"longest SIGTERM → its leases free", r.Release.String()},
	}...)
	// After the leases, before the violations.
	at := slices.IndexFunc(rows, func(row [2]string) bool { return row[0] == "violations" })
	return slices.Insert(rows, at, r.scheduleRows()...)
}

// gatedRow is the report's figure of the lease-gated tasks.
func (r *Report) gatedRow() string {
	attempts := "n/a"
	if r.Check != nil {
		attempts = fmt.Sprint(r.Check.GatedAttempts)
	}
	return fmt.Sprintf("%d created over the API (201) on %s (the first two the lease clients' too), %d made by the gated schedules; "+
		"%d in all, %d done (with the keys of k slots'); %s attempts, each inside a holding of its lock (or of its slot)", r.Gated.Created, strings.Join(gateLocks, ", "),
		r.Gated.Scheduled, r.Gated.Tasks, r.Gated.Done, attempts)
}

// slotRows are the report's figures of the keys of k slots: one row each, with its
// slots' holdings as the checker counted them.
func (r *Report) slotRows() [][2]string {
	var rows [][2]string
	for _, st := range r.Slots {
		holdings := "not counted"
		if r.Check != nil {
			if i := slices.IndexFunc(r.Check.SlotKeys, func(k checker.SlotKey) bool { return k.Key == st.Key }); i >= 0 {
				k := r.Check.SlotKeys[i]
				holdings = fmt.Sprintf("%d slot holding(s) in the history (of %d slot(s)), at most %d at once; %d task attempt(s), each inside its slot's holding",
					k.Holdings, k.Slots, k.MostAtOnce, k.Attempts)
			}
		}
		rows = append(rows, [2]string{fmt.Sprintf("key %s of %d slot(s)", st.Key, st.Limit),
			fmt.Sprintf("%d task(s) created over the API (201), %d in all, %d done; %d slot(s) granted to the slot clients; %s",
				st.Created, st.Tasks, st.Done, st.Grants, holdings)})
	}
	return rows
}

// flowRows are the report's figures of the key with a rate and of the paused queue, with
// their starts as the checker counted them.
func (r *Report) flowRows() [][2]string {
	rate, paused := "not counted", "not counted"
	if r.Check != nil {
		if i := slices.IndexFunc(r.Check.RateKeys, func(k checker.RateKey) bool { return k.Key == r.Rate.Key }); i >= 0 {
			k := r.Check.RateKeys[i]
			rate = fmt.Sprintf("%d start(s) in the history (every attempt), at most %d in a window of %v", k.Starts, k.MostInWindow, k.Rate.Period)
		}
		if i := slices.IndexFunc(r.Check.PausedQueues, func(q checker.PausedQueue) bool { return q.Queue == r.PausedQueue.Queue }); i >= 0 {
			q := r.Check.PausedQueues[i]
			paused = fmt.Sprintf("%d pause(s) judged, binding every claim for %v in all; %d start(s): %d outside every pause, "+
				"%d by claims under way at a pause's commit, %d within pauses not judged; %d task(s) created during a pause first started after it",
				q.Judged, round(q.Paused), q.Starts, q.Outside, q.InFlight, q.NotJudged, q.HeldBack)
		}
	}
	p := r.PausedQueue
	return [][2]string{
		{fmt.Sprintf("key %s, %v", r.Rate.Key, r.Rate.Rate), fmt.Sprintf("%d task(s) created over the API (201) in bursts above the rate, %d in all, %d done; %s",
			r.Rate.Created, r.Rate.Tasks, r.Rate.Done, rate)},
		{"queue " + p.Queue, fmt.Sprintf("%d pause(s) over the API (%d ended by their until, the others resumed), %v in all; "+
			"%d task(s) created over the API (201), %d in all, %d done; %s", p.Pauses, p.Timed, round(p.Paused), p.Created, p.Tasks, p.Done, paused)},
	}
}

// scheduleRows are the report's figures of the schedules: one row each, with its ticks
// as the checker counted them.
func (r *Report) scheduleRows() [][2]string {
	var rows [][2]string
	for _, s := range r.Schedules {
		what := s.Cron
		if s.Zone != "" && s.Zone != "UTC" {
			what += " in " + s.Zone
		}
		what += ", kind " + s.Kind
		if s.Lock != "" {
			what += ", lock " + s.Lock
		}
		if s.Unique {
			what += ", unique"
		}
		ticks := "not counted"
		if r.Check != nil {
			if i := slices.IndexFunc(r.Check.Schedules, func(t checker.ScheduleTicks) bool { return t.Name == s.Name }); i >= 0 {
				t := r.Check.Schedules[i]
				ticks = fmt.Sprintf("%d / %d / %d / %d%s", t.Expected, t.Made, t.Missed, t.Skipped, t.InFlight())
			}
		}
		rows = append(rows, [2]string{"schedule " + s.Name + ": ticks expected / made / missed / skipped",
			fmt.Sprintf("%s (%s)", ticks, what)})
	}
	return rows
}

// WriteText writes the report for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString("chaos soak report\n")
	for _, row := range r.summary() {
		fmt.Fprintf(&b, "  %-40s %s\n", row[0]+":", row[1])
	}
	for _, v := range r.AllViolations() {
		fmt.Fprintf(&b, "VIOLATION %s: %s\n", v.Rule, v.Detail)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "PROBLEM %s\n", p)
	}
	if r.Check != nil {
		b.WriteString("checker:\n")
		if err := r.Check.WriteText(&indent{w: &b}); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteMarkdown writes the report as a markdown document, the fault log included.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Chaos soak: %s\n\n", r.verdict())
	b.WriteString("| | |\n|---|---|\n")
	for _, row := range r.summary() {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], mdCell(row[1]))
	}
	b.WriteString("\n## Violations\n\n")
	if vs := r.AllViolations(); len(vs) == 0 {
		b.WriteString("None.\n")
	} else {
		for _, v := range vs {
			fmt.Fprintf(&b, "- **%s**: %s\n", v.Rule, v.Detail)
		}
	}
	if len(r.Problems) > 0 {
		b.WriteString("\n## Problems\n\n")
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	if r.Check != nil {
		b.WriteString("\n## Checker\n\n```\n")
		if err := r.Check.WriteText(&b); err != nil {
			return err
		}
		b.WriteString("```\n")
	}
	b.WriteString("\n## Faults\n\n| time (UTC) | fault | victim | what happened |\n|---|---|---|---|\n")
	for _, f := range r.Faults {
		victim := f.Victim
		if victim == "" {
			victim = "PostgreSQL"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", clock(f.At), f.Kind, victim, mdCell(f.Detail))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mdCell escapes what would break a markdown table cell.
func mdCell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// indent writes every line indented by four spaces.
type indent struct {
	w   io.Writer
	mid bool // within a line
}

func (i *indent) Write(p []byte) (int, error) {
	var b strings.Builder
	for _, c := range string(p) {
		if !i.mid {
			b.WriteString("    ")
		}
		b.WriteRune(c)
		i.mid = c != '\n'
	}
	if _, err := io.WriteString(i.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}
