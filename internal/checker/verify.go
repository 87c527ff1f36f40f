package checker

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/generator"
	"github.com/leasehold/leasehold/internal/lease"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/task"
)

// The rules, as Violation.Rule names them. Times are compared exactly, to
// the microsecond PostgreSQL stores.
const (
	// RuleOverlap: two holding intervals of one resource overlap. An
	// interval is half-open, [start, end): start is its acquired event's at,
	// end = min(its released event's at, its last expires_at), the last
	// expires_at being that of its latest acquired or renewed event (a
	// released event's own expires_at is the release time). Sorted by start,
	// an interval overlaps when its start < the latest end before it. One
	// that starts exactly at the previous end does not: a takeover stamps
	// clock_timestamp() after finding expires_at <= now(), which may be the
	// same microsecond.
	RuleOverlap = "overlap"
	// RuleFenceOrder: an acquisition's fence is <= the fence of the
	// resource's previous acquisition, in event id order (a resource's
	// acquisitions are serialised by its row lock, so the ids record their
	// order).
	RuleFenceOrder = "fence-order"
	// RuleFenceReused: two acquisitions, of any resources, carry the same
	// fence, which one sequence hands out.
	RuleFenceReused = "fence-reused"
	// RuleOrphanEvent: a renewed, released or expired event whose holder or
	// fence is not that of the resource's latest acquisition, or that comes
	// after that interval's release (or, for a renewal or a second expired
	// event, after its expiry was announced). Such an event is not applied
	// to any interval.
	RuleOrphanEvent = "orphan-event"
	// RuleTaskUnfinished: a task is neither done nor dead, and
	// Options.AllowUnfinished is false.
	RuleTaskUnfinished = "task-unfinished"
	// RuleTaskLost: an id of Options.ExpectedTasks has no task, or a lease
	// task:<id> was taken for a task that does not exist.
	RuleTaskLost = "task-lost"
	// RuleTaskCompletion: a done task's completion (processor, fence,
	// processed_at) is not the end of the lease task:<id> acquired by that
	// processor with that fence. The completion releases the lease in the
	// same statement, stamping processed_at, released_at and expires_at with
	// one now(), after checking expires_at > now(). So the exact test is
	// start <= processed_at, the interval's released event at ==
	// processed_at, and processed_at < its last expires_at: the completion
	// is the instant the interval ends, which [start, end) itself excludes.
	RuleTaskCompletion = "task-completion"
	// RuleTaskReclaimed: a done or dead task's lease was acquired again
	// after it finished: an acquisition of task:<id> with a fence greater
	// than the task's final one, or, other than the final one, starting at
	// or after processed_at.
	RuleTaskReclaimed = "task-reclaimed"
	// RuleGeneratorFence: a task carrying generator_fence f was not inserted
	// inside the interval of the generator lease acquired with fence f:
	// start <= created_at < end. created_at is the insert's now(); the
	// insert checks expires_at > now() and holds the lease row FOR SHARE
	// until it commits, so a release (which locks the row) or a takeover
	// ends the interval after it.
	RuleGeneratorFence = "generator-fence"
	// RuleExpiryLate: an expiry was announced more than the bound after its
	// expires_at while a reaper ran. An expiry is an interval with no
	// released event whose last expires_at E <= ReadAt. It is judged only
	// when one reaper interval ran through all of [E, E+bound] and no
	// outage window meets that span; a reaper runs from its acquisition to
	// its last sign of life, its latest acquired, renewed or released
	// event, since a holder that stopped renewing may have been killed.
	// Judged, it is late when its expired event's at > E+bound, or it has
	// no expired event and the resource was acquired again after E+bound,
	// or neither happened and ReadAt > E+bound. Acquired again by E+bound
	// and not announced is fine: the lease was no longer expired when the
	// announcement fell due. Not announced, not acquired again and ReadAt
	// <= E+bound: not judged yet.
	RuleExpiryLate = "expiry-late"
	// RuleExpiryEarly: an expired event's at is before the interval's last
	// expires_at: a live lease was announced expired. Judged whether or not
	// a reaper ran.
	RuleExpiryEarly = "expiry-early"
)

// ruleOrder is the order in which a report lists the rules.
var ruleOrder = []string{
	RuleOverlap, RuleFenceOrder, RuleFenceReused, RuleOrphanEvent,
	RuleTaskLost, RuleTaskUnfinished, RuleTaskCompletion, RuleTaskReclaimed,
	RuleGeneratorFence, RuleExpiryLate, RuleExpiryEarly,
}

// The kinds of lease events.
const (
	kindAcquired = "acquired"
	kindRenewed  = "renewed"
	kindReleased = "released"
	kindExpired  = "expired"
)

// History is what the database recorded, as Verify judges it.
type History struct {
	// Events are the lease history (lease_events), in any order.
	Events []lease.Event
	// Tasks are the rows of the tasks table, in any order.
	Tasks []Task
	// ReadAt is the database clock when the history was read: a lease whose
	// expires_at is later had not expired then.
	ReadAt time.Time
}

// Task is what the checker needs of a row of tasks. A zero field stands for
// NULL: fences start at 1.
type Task struct {
	ID             int64
	State          string
	Processor      string
	Fence          int64
	ProcessedAt    time.Time
	CreatedAt      time.Time
	GeneratorFence int64
}

// Verify judges h against every rule.
func Verify(h History, opts Options) *Report {
	v := newVerifier(opts, h.ReadAt)
	events := slices.Clone(h.Events)
	slices.SortFunc(events, func(a, b lease.Event) int {
		return cmp.Or(strings.Compare(a.Resource, b.Resource), cmp.Compare(a.ID, b.ID))
	})
	for len(events) > 0 {
		n := 1
		for n < len(events) && events[n].Resource == events[0].Resource {
			n++
		}
		v.resource(events[:n])
		events = events[n:]
	}
	for _, t := range h.Tasks {
		v.task(t)
	}
	return v.finish()
}

// verifier applies the rules to a history fed to it one resource at a time
// (resource), then one task at a time (task); finish judges what needs the
// whole history. It keeps only what the later steps need.
type verifier struct {
	opts   Options
	bound  time.Duration
	readAt time.Time
	rep    *Report

	expected   map[int64]bool       // the expected tasks not seen yet
	fences     []fenceUse           // every acquisition's fence
	reaper     []interval           // the reaper's intervals, by start
	generator  map[int64]interval   // the generator's intervals by fence
	taskLeases map[int64][]interval // the intervals of task:<id>, until task <id> is seen
	expiries   []interval           // intervals that ran out, judged once the reaper's are known
}

// fenceUse is one acquisition's fence.
type fenceUse struct {
	fence    int64
	eventID  int64
	resource string
}

// interval is one holding of a resource, from its acquired event to its
// release or expiry.
type interval struct {
	resource   string
	holder     string
	fence      int64
	acquiredID int64     // the acquired event
	start      time.Time // the acquired event's at
	expires    time.Time // expires_at of the latest acquired or renewed event
	lastSign   time.Time // at of the latest acquired, renewed or released event
	releasedID int64     // the released event; 0 when none
	released   time.Time
	expiredID  int64 // the expired event; 0 when the expiry was not announced
	announced  time.Time
	next       time.Time // start of the resource's next acquisition; zero when none
}

// end is where the interval stops holding: min(released, expires).
func (iv *interval) end() time.Time {
	if iv.releasedID != 0 && iv.released.Before(iv.expires) {
		return iv.released
	}
	return iv.expires
}

func (iv *interval) String() string {
	return fmt.Sprintf("%s by %s with fence %d [%s, %s) (acquired: event %d)",
		iv.resource, iv.holder, iv.fence, ts(iv.start), ts(iv.end()), iv.acquiredID)
}

// ts formats a database time to the microsecond, in UTC.
func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

func newVerifier(opts Options, readAt time.Time) *verifier {
	v := &verifier{
		opts:       opts,
		bound:      opts.expiryBound(),
		readAt:     readAt,
		rep:        &Report{ReadAt: readAt},
		expected:   make(map[int64]bool, len(opts.ExpectedTasks)),
		generator:  make(map[int64]interval),
		taskLeases: make(map[int64][]interval),
	}
	for _, id := range opts.ExpectedTasks {
		v.expected[id] = true
	}
	return v
}

func (v *verifier) violate(rule, format string, args ...any) {
	v.rep.Violations = append(v.rep.Violations, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...)})
}

// resource takes every event of one resource, in id order: it checks the
// rules of that resource alone and keeps what the other rules need.
func (v *verifier) resource(events []lease.Event) {
	v.rep.Resources++
	v.rep.Events += len(events)
	ivs := v.intervals(events)
	v.checkOverlap(ivs)
	for i := range ivs {
		iv := &ivs[i]
		if iv.expiredID != 0 && iv.announced.Before(iv.expires) {
			v.violate(RuleExpiryEarly, "%s: announced expired at %s (event %d), before its expires_at %s",
				iv, ts(iv.announced), iv.expiredID, ts(iv.expires))
		}
		if iv.releasedID == 0 && !iv.expires.After(v.readAt) {
			v.expiries = append(v.expiries, *iv)
		}
	}

	name := events[0].Resource
	switch name {
	case reaper.Resource:
		v.reaper = ivs
	case generator.Resource:
		for _, iv := range ivs {
			v.generator[iv.fence] = iv
		}
	default:
		if id, ok := taskID(name); ok {
			v.taskLeases[id] = ivs
		}
	}
}

// taskID returns the id of the task whose lease is resource.
func taskID(resource string) (int64, bool) {
	s, ok := strings.CutPrefix(resource, "task:")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || task.LeaseResource(id) != resource {
		return 0, false
	}
	return id, true
}

// intervals turns one resource's events, in id order, into its holding
// intervals, sorted by start; it checks the fence order and the events that
// fit no interval on the way.
func (v *verifier) intervals(events []lease.Event) []interval {
	var ivs []interval
	for _, e := range events {
		if e.Kind == kindAcquired {
			v.rep.Acquisitions++
			v.fences = append(v.fences, fenceUse{fence: e.Fence, eventID: e.ID, resource: e.Resource})
			if n := len(ivs); n > 0 {
				prev := &ivs[n-1]
				prev.next = e.At
				if e.Fence <= prev.fence {
					v.violate(RuleFenceOrder, "%s: event %d gave %s fence %d after event %d gave %s fence %d",
						e.Resource, e.ID, e.Holder, e.Fence, prev.acquiredID, prev.holder, prev.fence)
				}
			}
			ivs = append(ivs, interval{
				resource: e.Resource, holder: e.Holder, fence: e.Fence, acquiredID: e.ID,
				start: e.At, expires: e.ExpiresAt, lastSign: e.At,
			})
			continue
		}
		var cur *interval
		if n := len(ivs); n > 0 {
			cur = &ivs[n-1]
		}
		if why := misfit(cur, e); why != "" {
			v.violate(RuleOrphanEvent, "%s: event %d (%s by %s with fence %d at %s) %s",
				e.Resource, e.ID, e.Kind, e.Holder, e.Fence, ts(e.At), why)
			continue
		}
		switch e.Kind {
		case kindRenewed:
			cur.expires, cur.lastSign = e.ExpiresAt, e.At
		case kindReleased:
			cur.releasedID, cur.released, cur.lastSign = e.ID, e.At, e.At
		case kindExpired:
			cur.expiredID, cur.announced = e.ID, e.At
		}
	}
	slices.SortStableFunc(ivs, func(a, b interval) int { return a.start.Compare(b.start) })
	return ivs
}

// misfit says why a renewed, released or expired event e does not belong
// to cur, the resource's latest interval (nil when there is none); "" when
// it does.
func misfit(cur *interval, e lease.Event) string {
	switch {
	case e.Kind != kindRenewed && e.Kind != kindReleased && e.Kind != kindExpired:
		return "is of no known kind"
	case cur == nil:
		return "comes before any acquisition"
	case cur.holder != e.Holder || cur.fence != e.Fence:
		return fmt.Sprintf("does not match the latest acquisition, %s", cur)
	case cur.releasedID != 0:
		return fmt.Sprintf("comes after the release of %s (event %d)", cur, cur.releasedID)
	case cur.expiredID != 0 && e.Kind != kindReleased:
		// A release may follow the expired event: one that began before the
		// expiry and waited for the reaper's row lock.
		return fmt.Sprintf("comes after the expiry of %s was announced (event %d)", cur, cur.expiredID)
	}
	return ""
}

// checkOverlap reports each interval, of ivs sorted by start, that starts
// before the latest end of those before it.
func (v *verifier) checkOverlap(ivs []interval) {
	var last *interval // the interval with the latest end so far
	for i := range ivs {
		iv := &ivs[i]
		if last != nil && iv.start.Before(last.end()) {
			v.violate(RuleOverlap, "%s overlaps %s", iv, last)
		}
		if last == nil || iv.end().After(last.end()) {
			last = iv
		}
	}
}

// task checks one task against the task leases and the generator's.
func (v *verifier) task(t Task) {
	delete(v.expected, t.ID)
	leases := v.taskLeases[t.ID]
	delete(v.taskLeases, t.ID)

	switch t.State {
	case task.StateDone:
		v.rep.TasksDone++
		v.checkCompletion(t, leases)
		v.checkReclaimed(t, leases)
	case task.StateDead:
		v.rep.TasksDead++
		v.checkReclaimed(t, leases)
	default:
		v.rep.TasksOther++
		if !v.opts.AllowUnfinished {
			v.violate(RuleTaskUnfinished, "task %d is %s (processor %q, fence %d)", t.ID, t.State, t.Processor, t.Fence)
		}
	}
	if t.GeneratorFence != 0 {
		v.rep.Generated++
		v.checkGenerated(t)
	}
}

// checkCompletion checks that done task t was completed by the holder of
// its live lease: see RuleTaskCompletion.
func (v *verifier) checkCompletion(t Task, leases []interval) {
	done := fmt.Sprintf("task %d done by %q with fence %d at %s", t.ID, t.Processor, t.Fence, ts(t.ProcessedAt))
	if t.Processor == "" || t.Fence == 0 || t.ProcessedAt.IsZero() {
		v.violate(RuleTaskCompletion, "%s: a done task needs a processor, a fence and processed_at", done)
		return
	}
	i := slices.IndexFunc(leases, func(iv interval) bool { return iv.fence == t.Fence })
	if i < 0 {
		v.violate(RuleTaskCompletion, "%s: %s was never acquired with that fence", done, task.LeaseResource(t.ID))
		return
	}
	iv := &leases[i]
	switch {
	case iv.holder != t.Processor:
		v.violate(RuleTaskCompletion, "%s: the lease with that fence is %s", done, iv)
	case t.ProcessedAt.Before(iv.start):
		v.violate(RuleTaskCompletion, "%s: before its lease was acquired, %s", done, iv)
	case iv.releasedID == 0:
		v.violate(RuleTaskCompletion, "%s: the completion did not release its lease, %s", done, iv)
	case !iv.released.Equal(t.ProcessedAt):
		v.violate(RuleTaskCompletion, "%s: its lease was released at %s (event %d), not by the completion: %s",
			done, ts(iv.released), iv.releasedID, iv)
	case !t.ProcessedAt.Before(iv.expires):
		v.violate(RuleTaskCompletion, "%s: its lease had expired at %s: %s", done, ts(iv.expires), iv)
	}
}

// checkReclaimed checks that finished task t was not leased again: see
// RuleTaskReclaimed.
func (v *verifier) checkReclaimed(t Task, leases []interval) {
	if t.Fence == 0 || t.ProcessedAt.IsZero() {
		return
	}
	for i := range leases {
		iv := &leases[i]
		if iv.fence > t.Fence || (iv.fence != t.Fence && !iv.start.Before(t.ProcessedAt)) {
			v.violate(RuleTaskReclaimed, "task %d %s at %s with fence %d, yet acquired again: %s",
				t.ID, t.State, ts(t.ProcessedAt), t.Fence, iv)
		}
	}
}

// checkGenerated checks that generated task t was inserted inside the
// generator interval of its fence: see RuleGeneratorFence.
func (v *verifier) checkGenerated(t Task) {
	iv, ok := v.generator[t.GeneratorFence]
	switch {
	case !ok:
		v.violate(RuleGeneratorFence, "task %d created at %s with generator fence %d: %s was never acquired with that fence",
			t.ID, ts(t.CreatedAt), t.GeneratorFence, generator.Resource)
	case t.CreatedAt.Before(iv.start) || !t.CreatedAt.Before(iv.end()):
		v.violate(RuleGeneratorFence, "task %d created at %s with generator fence %d, outside %s",
			t.ID, ts(t.CreatedAt), t.GeneratorFence, &iv)
	}
}

// finish judges what needed the whole history and returns the report.
func (v *verifier) finish() *Report {
	v.checkFencesUnique()
	for i := range v.expiries {
		v.judgeExpiry(&v.expiries[i])
	}
	lost := make([]int64, 0, len(v.expected))
	for id := range v.expected {
		lost = append(lost, id)
	}
	slices.Sort(lost)
	for _, id := range lost {
		v.violate(RuleTaskLost, "task %d was inserted but is not in the tasks table", id)
	}
	orphans := make([]int64, 0, len(v.taskLeases))
	for id := range v.taskLeases {
		orphans = append(orphans, id)
	}
	slices.Sort(orphans)
	for _, id := range orphans {
		v.violate(RuleTaskLost, "task %d is not in the tasks table, yet its lease was taken: %s", id, &v.taskLeases[id][0])
	}
	return v.rep
}

// checkFencesUnique reports every fence two acquisitions share.
func (v *verifier) checkFencesUnique() {
	slices.SortFunc(v.fences, func(a, b fenceUse) int {
		return cmp.Or(cmp.Compare(a.fence, b.fence), cmp.Compare(a.eventID, b.eventID))
	})
	for i := 1; i < len(v.fences); i++ {
		if a, b := v.fences[i-1], v.fences[i]; a.fence == b.fence {
			v.violate(RuleFenceReused, "fence %d given twice: %s (event %d) and %s (event %d)",
				a.fence, a.resource, a.eventID, b.resource, b.eventID)
		}
	}
}

// judgeExpiry judges one interval that ran out: see RuleExpiryLate.
func (v *verifier) judgeExpiry(x *interval) {
	v.rep.Expiries++
	deadline := x.expires.Add(v.bound)
	reaper := v.reaperThrough(x.expires, deadline)
	if reaper == nil || v.inOutage(x.expires, deadline) {
		v.rep.ExpiriesNotJudged++
		return
	}
	late := ""
	switch {
	case x.expiredID != 0:
		if x.announced.After(deadline) {
			late = fmt.Sprintf("announced at %s (event %d), %s after its expires_at", ts(x.announced), x.expiredID, x.announced.Sub(x.expires))
		}
	case !x.next.IsZero():
		if x.next.After(deadline) {
			late = fmt.Sprintf("never announced; acquired again at %s, %s after its expires_at", ts(x.next), x.next.Sub(x.expires))
		}
	case v.readAt.After(deadline):
		late = fmt.Sprintf("never announced by %s, when the history was read", ts(v.readAt))
	default:
		v.rep.ExpiriesNotJudged++
		return
	}
	v.rep.ExpiriesJudged++
	if late != "" {
		v.violate(RuleExpiryLate, "%s: %s, while the reaper ran: %s (alive at %s)", x, late, reaper, ts(reaper.lastSign))
	}
}

// reaperThrough returns the reaper interval that ran through all of
// [from, to], nil when none did: one that began by from and whose last sign
// of life is at or after to (a sign of life is never after the interval's
// end). The reaper's intervals do not overlap (RuleOverlap reports it when
// they do), so only the latest one to begin by from can.
func (v *verifier) reaperThrough(from, to time.Time) *interval {
	i, _ := slices.BinarySearchFunc(v.reaper, from, func(iv interval, t time.Time) int {
		if iv.start.After(t) {
			return 1
		}
		return -1
	})
	if i == 0 || v.reaper[i-1].lastSign.Before(to) {
		return nil
	}
	return &v.reaper[i-1]
}

// inOutage reports whether [from, to] meets an outage window.
func (v *verifier) inOutage(from, to time.Time) bool {
	return slices.ContainsFunc(v.opts.Outages, func(w Window) bool {
		return !w.From.After(to) && !w.To.Before(from)
	})
}
