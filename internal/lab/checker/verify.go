package checker

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/reaper"
)

// The rules, as Violation.Rule names them. Times are compared exactly, to
// the microsecond PostgreSQL stores.
const (
	// RuleOverlap: two holding intervals of one resource overlap. An
	// interval is half-open, [start, end), end = min(its release, its last
	// expires_at). A lease's interval starts at its acquired event's at; its
	// release is its released event's at and its last expires_at that of its
	// latest acquired or renewed event (a released event's own expires_at is
	// the release time). A task attempt's interval starts at its started_at;
	// its last expires_at is its expires_at (must_heartbeat_before for the
	// attempt in the task's columns); a failed or requeued attempt is
	// released at its ended_at, the completed one at the task's
	// processed_at, an expired one not at all. Sorted by start, an interval
	// overlaps when its start < the latest end before it. One that starts
	// exactly at the previous end does not: a takeover stamps its start
	// after finding expires_at <= now(), which may be the same microsecond.
	RuleOverlap = "overlap"
	// RuleFenceOrder: an acquisition's fence is <= the fence of the
	// resource's previous acquisition: in event id order for a lease (a
	// resource's acquisitions are serialised by its row lock, so the ids
	// record their order), and for a task in the order of earlier_attempts,
	// then the attempt in its columns (each attempt is appended by the
	// statement that ended it, under the task's row lock).
	RuleFenceOrder = "fence-order"
	// RuleFenceReused: two acquisitions, of any resources, leases and task
	// attempts alike, carry the same fence, which one sequence hands out.
	RuleFenceReused = "fence-reused"
	// RuleOrphanEvent: a renewed, released or expired event whose holder or
	// fence is not that of the resource's latest acquisition, or that comes
	// after that interval's release (or, for a renewal or a second expired
	// event, after its expiry was announced); or an entry of a task's
	// earlier_attempts with no known outcome. Such a record is not applied
	// to any interval (the attempt's fence still counts for RuleFenceReused).
	RuleOrphanEvent = "orphan-event"
	// RuleTaskUnfinished: a task is neither done, dead nor cancelled, and
	// Options.AllowUnfinished is false.
	RuleTaskUnfinished = "task-unfinished"
	// RuleTaskLost: an id of Options.ExpectedTasks has no task.
	RuleTaskLost = "task-lost"
	// RuleTaskCompletion: a done task's completion (processor, fence,
	// processed_at) is not the end of a live lease of the task. The
	// completion ends the attempt in the task's columns in the statement
	// that checks must_heartbeat_before > now() and stamps processed_at with
	// that now(), keeping must_heartbeat_before. So the exact test is: the
	// columns hold a lease (processor, fence, started_at,
	// must_heartbeat_before), no attempt of earlier_attempts has its fence
	// (that attempt had ended, and the completion is not counted as a second
	// interval), started_at <= processed_at, and processed_at <
	// must_heartbeat_before: the completion is the instant the interval
	// ends, which [start, end) itself excludes.
	RuleTaskCompletion = "task-completion"
	// RuleTaskReclaimed: a done or dead task was leased again after it
	// finished: an attempt with a fence greater than the task's final one
	// (the fence in its columns: the completed attempt's, or for a dead
	// task that of the attempt that ended it, the last of earlier_attempts),
	// or, other than the final one, starting at or after processed_at.
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
	// release whose last expires_at E <= ReadAt. A lease's is announced by
	// its expired event; a task attempt's by the statement that ended it (a
	// reaper putting the task back, or a claim taking it), at its ended_at.
	// It is judged only when one reaper interval ran through all of [E,
	// E+bound] and no outage window meets that span; a reaper runs from its
	// acquisition to its last sign of life, its latest acquired, renewed or
	// released event, since a holder that stopped renewing may have been
	// killed; a release counts as a sign of life only when it came within
	// half a TTL of the sign before it (a later one is a holder giving up
	// at its deadline after its renewals failed), and not across an exit of
	// its holder's process (Options.Exits): a process restarted under the
	// same name may renew the lease under the same fence. Judged, it is late
	// when it was announced after E+bound, or it
	// was not announced and the resource was acquired again after E+bound,
	// or neither happened and ReadAt > E+bound. Acquired again by E+bound
	// and not announced is fine: the lease was no longer expired when the
	// announcement fell due. Not announced, not acquired again and ReadAt
	// <= E+bound: not judged yet.
	RuleExpiryLate = "expiry-late"
	// RuleExpiryEarly: an expiry was announced before the interval's last
	// expires_at: a live lease was announced expired. Judged whether or not
	// a reaper ran.
	RuleExpiryEarly = "expiry-early"
	// RuleLockHeld: an attempt of a lease-gated task (one with a lock) was
	// not inside a holding of its lock's lease. The claim acquires the
	// lock's lease in the statement that takes the task, for the task's
	// processor; the attempt takes the lock's fence, acquisition time and
	// expiry as its fence, started_at and must_heartbeat_before; a
	// heartbeat renews the lock to the task's new expiry, and the end of
	// the attempt releases it, at that statement's clock_timestamp(), at
	// or after the attempt's end. So, for the attempt (processor p, fence
	// f, started_at s, end e as RuleOverlap has it), the lock's history
	// must hold an acquisition with fence f, by p, whose interval [ls, le)
	// has ls = s (acquired at the claim) and e <= le; and no other holding
	// of the lock, a lease's or another gated task's, may meet [s, e): each
	// that does is a violation too. Holdings of one lock are also judged
	// against each other by RuleOverlap, as any lease's; a gated attempt
	// and its lock's acquisition share a fence, which RuleFenceReused does
	// not count twice.
	//
	// A task whose lock is a key of k slots (see RuleSlotLimit) holds one
	// of the key's slots instead: its claim acquires a free slot KEY#n,
	// whose lease the attempt follows as above. So the acquisition with
	// fence f is sought among the key's slots (and the key's own lease,
	// for an attempt made before the key had a limit), and the holdings
	// that may not meet [s, e) are the other holdings of that slot: the
	// key's other slots are held beside it by design, up to its limit.
	RuleLockHeld = "lock-held"
	// RuleSlotLimit: more holders of a key of k slots at one instant than
	// k. A key with a limit (a row of lease_limits, or a key of
	// Options.Limits) is held through its slots, the leases KEY#n
	// (lease.SlotName); each holding of a slot is an interval as
	// RuleOverlap has it, [start, end) with end = min(its release or
	// expiry, its last expires_at), a task claimed into a slot being its
	// slot's holding, counted once. Every slot KEY#n counts, whatever n.
	// k is the key's highest limit: the larger of Options.Limits[key] and
	// its lease_limits row when the history was read (the larger of its
	// slots and its span: a lowered limit keeps its old span while
	// holders above it may be live). Sorted by start, at each start t the
	// holdings live at t (start <= t < end) must be at most k; each start
	// at which they are more is a violation, naming them all. A caller
	// that lowered a key's limit names the highest it set in
	// Options.Limits, since lease_limits forgets it once those holders
	// are gone.
	RuleSlotLimit = "slot-limit"
	// RuleRateLimit: more starts of a key's tasks in a window of its
	// period than its rate allows. A key's rate is at most N of its tasks
	// (those whose lock is the key) starting in any period P:
	// Options.Rates[key], else its rate in lease_limits when the history
	// was read (right when the rate never changed). Each attempt of such a
	// task is a start, at its started_at: every entry of earlier_attempts,
	// whatever its outcome, and the attempt in the task's columns. A claim
	// starts one of the key's tasks only when the N-th latest start the
	// key's row records lies at least P before the clock it reads, and the
	// start it records (the task's started_at) is that clock or later. So,
	// sorted, the starts keep s[i+N] - s[i] >= P for every i: no half-open
	// window [t, t+P) holds more than N. Each i with s[i+N] - s[i] < P is a
	// violation, naming the window [s[i], s[i]+P) and every start in it,
	// unless that window holds no start after those of the window
	// reported before it.
	RuleRateLimit = "rate-limit"
	// RuleQueuePaused: an attempt of a task of a paused queue started
	// while the pause bound every claim. A pause (Options.Pauses, as the
	// one who made it recorded it: the queue_pauses row keeps a queue's
	// latest pause only) runs from At, its paused_at (the pausing
	// statement's now(), before its commit), to Until, its until (the end
	// it was given, or the resume's now()). A claim counts a queue paused
	// when its snapshot shows the pause and its own now() is before
	// until, and stamps the tasks it starts with its now() or a later
	// clock. So a claim whose transaction began at or after Until, the
	// only kind that may start the queue's tasks once the pause is seen,
	// starts them at or after Until. At the other end the snapshot
	// decides: a claim whose snapshot was taken before the pause committed
	// does not see it, and may start the queue's tasks after At, even
	// after the commit, until its statement ends. From is when none of
	// those was left (see PauseMade): a few milliseconds after the commit,
	// the time to see it. A start s with From <= s < Until is a
	// violation; one in [At, From) came from a claim under way at the
	// pause's commit (or just after it, before it was seen), and is
	// counted (PausedQueue.InFlight), not judged. A pause whose From is
	// zero, or not before its Until, judges nothing; a zero Until is a
	// pause not ended when the history was read.
	RuleQueuePaused = "queue-paused"
	// RuleScheduleDuplicate: two tasks of one schedule (tasks.schedule)
	// carry the same schedule_tick.
	RuleScheduleDuplicate = "schedule-duplicate"
	// RuleScheduleTick: a task of a schedule of Options.Schedules has a
	// tick that is not one of the schedule's: the ticks are its First,
	// then each the cron's next after the one before (a tick made for a
	// run of missed ones is the latest of them, still one of these). Or
	// its tick is at or after the schedule's Next (which had not been made
	// yet), or the task was created before its tick fell due (the
	// scheduler enqueues a tick once the database clock has passed it).
	RuleScheduleTick = "schedule-tick"
	// RuleScheduleCount: a schedule's tasks, missed and skipped ticks do
	// not add up to its ticks before its Next: each tick the scheduler
	// moved past was made exactly one task, or was counted missed (it fell
	// due while no scheduler ran, and a later one was made for it) or
	// skipped (a unique schedule's previous task was still pending or
	// running).
	RuleScheduleCount = "schedule-count"
	// RuleScheduleBehind: more than one of a schedule's ticks due by its
	// End (those at or before End) is at or after its Next: the scheduler
	// had neither made nor counted them when the schedule stopped. The
	// last tick due may have been in flight then.
	RuleScheduleBehind = "schedule-behind"
)

// ruleOrder is the order in which a report lists the rules.
var ruleOrder = []string{
	RuleOverlap, RuleFenceOrder, RuleFenceReused, RuleOrphanEvent,
	RuleTaskLost, RuleTaskUnfinished, RuleTaskCompletion, RuleTaskReclaimed,
	RuleGeneratorFence, RuleExpiryLate, RuleExpiryEarly, RuleLockHeld, RuleSlotLimit, RuleRateLimit, RuleQueuePaused,
	RuleScheduleDuplicate, RuleScheduleTick, RuleScheduleCount, RuleScheduleBehind,
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
	// Events are the lease history (lease_events), in any order: every
	// lease but the tasks', which the tasks carry.
	Events []lease.Event
	// Tasks are the rows of the tasks table, with their leases, in any
	// order.
	Tasks []Task
	// ReadAt is the database clock when the history was read: a lease whose
	// expires_at is later had not expired then.
	ReadAt time.Time
	// Limits are the keys of k slots, each with its limit as lease_limits
	// held it at ReadAt (the larger of its slots and its span): see
	// RuleSlotLimit.
	Limits map[string]int
	// Rates are the keys with a rate, as lease_limits held them at
	// ReadAt: see RuleRateLimit.
	Rates map[string]Rate
}

// Task is what the checker needs of a row of tasks: its state, its lease
// columns and its earlier attempts. A zero field stands for NULL: fences
// start at 1.
type Task struct {
	ID    int64
	State string
	Queue string
	// Processor, Fence, StartedAt and ExpiresAt (must_heartbeat_before) are
	// the lease of the task's latest attempt. For a running task it is the
	// current attempt, for a done one the completed attempt (ExpiresAt is
	// the expiry it had at the completion). For a pending or dead task that
	// attempt has ended and is the last of Attempts: these fields are not
	// read as an attempt of their own.
	Processor   string
	Fence       int64
	StartedAt   time.Time
	ExpiresAt   time.Time
	ProcessedAt time.Time // done or dead: when it finished
	CreatedAt   time.Time
	// GeneratorFence is the fence of the generator lease it was inserted
	// under; 0 when it was not generated.
	GeneratorFence int64
	// Attempts are the entries of earlier_attempts, in their order: every
	// attempt that ended otherwise than by the completion.
	Attempts []task.Attempt
	// Lock is the resource whose lease gates the task (lock_resource); ""
	// for an ungated task.
	Lock string
	// Schedule is the schedule that made the task and ScheduleTick the
	// tick it was made for; "" and the zero time for a task no schedule
	// made.
	Schedule     string
	ScheduleTick time.Time
}

// Verify judges h against every rule.
func Verify(h History, opts Options) *Report {
	var locks []string
	for _, t := range h.Tasks {
		if t.Lock != "" {
			locks = append(locks, t.Lock)
		}
	}
	v := newVerifier(opts, h.ReadAt, locks, h.Limits, h.Rates)
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
// (resource), then one task at a time (task): a task's rules need the
// generator's and the reaper's intervals, which the resources give. finish
// judges what needs the whole history. It keeps only what the later steps
// need.
type verifier struct {
	opts   Options
	bound  time.Duration
	readAt time.Time
	rep    *Report

	expected  map[int64]bool     // the expected tasks not seen yet
	fences    []fenceUse         // every acquisition's fence
	reaper    []interval         // the reaper's intervals, by start
	generator map[int64]interval // the generator's intervals by fence
	expiries  []interval         // leases that ran out, judged once the reaper's intervals are known
	attempts  []interval         // the intervals of the task at hand, reused from task to task
	// locks are the holdings of each resource that gates a task, by
	// resource: nil until the resource's events are read. The slots of
	// the keys of slotKeys are kept here too, once read.
	locks map[string]*lockHoldings
	// slotKeys are the keys of k slots and their slots.
	slotKeys *slotKeys
	// ticks are the ticks of each schedule's tasks, by schedule, with the
	// task that has each.
	ticks map[string][]madeTick
	// flow are the keys with a rate and the paused queues, with what
	// their rules need of the tasks.
	flow *flow
}

// fenceUse is one acquisition's fence: a lease's acquired event, or a task
// attempt.
type fenceUse struct {
	fence    int64
	id       int64  // the acquired event's id, or the task's
	attempt  int    // the task attempt's number; 0 for a lease's acquisition
	resource string // the lease's resource; "" for a task attempt
	lock     string // the task attempt's lock, when it is gated; ""
}

func (u fenceUse) String() string {
	if u.attempt > 0 {
		return fmt.Sprintf("%s (attempt %d)", taskstore.LeaseResource(u.id), u.attempt)
	}
	return fmt.Sprintf("%s (event %d)", u.resource, u.id)
}

// interval is one holding of a resource, from its acquisition to its
// release or expiry: a lease's, from its events, or a task attempt's, from
// the task's row.
type interval struct {
	resource   string
	holder     string
	fence      int64
	acquiredID int64       // the acquired event; 0 for a task attempt
	attempt    int         // the task attempt's number, from 1; 0 for a lease
	start      time.Time   // the acquired event's at, or the attempt's started_at
	expires    time.Time   // expires_at of the latest acquired or renewed event, or the attempt's
	lastSign   time.Time   // at of the latest acquired, renewed or released event; zero for a task attempt
	signs      []time.Time // every sign of life, in order: the acquisition, then each renewal (and release) lastSign took
	releasedID int64       // the released event; 0 when none, or for a task attempt
	released   time.Time   // zero when not released
	expiredID  int64       // the expired event; 0 when none, or for a task attempt
	announced  time.Time   // when the expiry was announced; zero when it was not
	next       time.Time   // start of the resource's next acquisition; zero when none
}

// end is where the interval stops holding: min(released, expires).
func (iv *interval) end() time.Time {
	if !iv.released.IsZero() && iv.released.Before(iv.expires) {
		return iv.released
	}
	return iv.expires
}

func (iv *interval) String() string {
	from := fmt.Sprintf("acquired: event %d", iv.acquiredID)
	if iv.attempt > 0 {
		from = fmt.Sprintf("attempt %d", iv.attempt)
	}
	return fmt.Sprintf("%s by %s with fence %d [%s, %s) (%s)",
		iv.resource, iv.holder, iv.fence, ts(iv.start), ts(iv.end()), from)
}

// record names the lease event eventID that changed the interval, for a
// detail; "" for a task attempt, whose String names it.
func (iv *interval) record(eventID int64) string {
	if iv.attempt > 0 {
		return ""
	}
	return fmt.Sprintf(" (event %d)", eventID)
}

// ts formats a database time to the microsecond, in UTC.
func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// newVerifier returns a verifier for a history read at readAt, in which
// locks are the resources that gate tasks (repeats allowed): their
// holdings are kept for RuleLockHeld. limits are the keys of k slots as
// the database held them (History.Limits); with Options.Limits they say
// which keys' slots are kept for RuleSlotLimit, and with what k; rates
// (History.Rates), with Options.Rates, which keys' starts are judged by
// RuleRateLimit.
func newVerifier(opts Options, readAt time.Time, locks []string, limits map[string]int, rates map[string]Rate) *verifier {
	v := &verifier{
		opts:      opts,
		bound:     opts.expiryBound(),
		readAt:    readAt,
		rep:       &Report{ReadAt: readAt},
		expected:  make(map[int64]bool, len(opts.ExpectedTasks)),
		generator: make(map[int64]interval),
		locks:     make(map[string]*lockHoldings),
		ticks:     make(map[string][]madeTick),
		slotKeys:  newSlotKeys(mergeLimits(limits, opts.Limits)),
		flow:      newFlow(opts, rates),
	}
	for _, id := range opts.ExpectedTasks {
		v.expected[id] = true
	}
	for _, l := range locks {
		v.locks[l] = nil
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
		if v.ranOut(&ivs[i]) {
			v.expiries = append(v.expiries, ivs[i])
		}
	}

	switch events[0].Resource {
	case reaper.Resource:
		v.reaper = v.runs(ivs)
	case demo.Resource:
		for _, iv := range ivs {
			v.generator[iv.fence] = iv
		}
	}
	resource := events[0].Resource
	if key, ok := v.slotKeys.keyOf(resource); ok {
		h := newLockHoldings(ivs)
		v.locks[resource] = h
		v.slotKeys.add(key, resource, h)
	} else if _, ok := v.locks[resource]; ok {
		v.locks[resource] = newLockHoldings(ivs)
	}
}

// ranOut checks RuleExpiryEarly on iv and reports whether it ran out, not
// released, by ReadAt: an expiry for RuleExpiryLate to judge.
func (v *verifier) ranOut(iv *interval) bool {
	if !iv.announced.IsZero() && iv.announced.Before(iv.expires) {
		v.violate(RuleExpiryEarly, "%s: announced expired at %s%s, before its expires_at %s",
			iv, ts(iv.announced), iv.record(iv.expiredID), ts(iv.expires))
	}
	return iv.released.IsZero() && !iv.expires.After(v.readAt)
}

// intervals turns one resource's events, in id order, into its holding
// intervals, sorted by start; it checks the fence order and the events that
// fit no interval on the way.
func (v *verifier) intervals(events []lease.Event) []interval {
	var ivs []interval
	for _, e := range events {
		if e.Kind == kindAcquired {
			v.rep.Acquisitions++
			v.fences = append(v.fences, fenceUse{fence: e.Fence, id: e.ID, resource: e.Resource})
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
				start: e.At, expires: e.ExpiresAt, lastSign: e.At, signs: []time.Time{e.At},
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
			cur.signs = append(cur.signs, e.At)
		case kindReleased:
			cur.releasedID, cur.released = e.ID, e.At
			// A holder renews every third of its TTL. One that let half its
			// TTL pass without a renewal was not reaching the database: its
			// release is the holder giving the lease up at its deadline
			// (the last renewal may have landed unanswered), which shows
			// the process alive then, not that it worked in between.
			if ttl := cur.expires.Sub(cur.lastSign); e.At.Sub(cur.lastSign) < ttl/2 {
				cur.lastSign = e.At
				cur.signs = append(cur.signs, e.At)
			}
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
	case !cur.released.IsZero():
		return fmt.Sprintf("comes after the release of %s (event %d)", cur, cur.releasedID)
	case !cur.announced.IsZero() && e.Kind != kindReleased:
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

// task checks one task: its lease's intervals, as resource does a lease's,
// and the task rules. Every resource must have been fed before: the
// task's expiries are judged at once, against the reaper's intervals.
func (v *verifier) task(t Task) {
	delete(v.expected, t.ID)
	ivs := v.taskIntervals(t)
	v.checkOverlap(ivs)
	for i := range ivs {
		if v.ranOut(&ivs[i]) {
			v.judgeExpiry(&ivs[i])
		}
	}

	switch t.State {
	case task.StateDone:
		v.rep.TasksDone++
		v.checkCompletion(t)
		v.checkReclaimed(t, ivs)
	case task.StateDead:
		v.rep.TasksDead++
		v.checkReclaimed(t, ivs)
	case task.StateCancelled:
		v.rep.TasksCancelled++
		v.checkReclaimed(t, ivs)
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
	if t.Lock != "" {
		v.rep.GatedTasks++
		for i := range ivs {
			v.checkLockHeld(t, &ivs[i])
		}
	}
	if t.Schedule != "" {
		v.addTick(t)
	}
	v.flowTask(t)
}

// taskIntervals turns t's attempts into the intervals of its lease, sorted
// by start, in a slice reused from task to task: each entry of
// earlier_attempts, then, for a running or done task, the attempt in its
// columns (unless a done task's fence is that of an earlier attempt, which
// checkCompletion reports). It checks the fence order and the entries of
// no known outcome on the way.
func (v *verifier) taskIntervals(t Task) []interval {
	ivs := v.attempts[:0]
	defer func() { v.attempts = ivs[:0] }()
	current := hasCurrent(t)
	if len(t.Attempts) == 0 && !current {
		return ivs
	}
	v.rep.Resources++
	resource := taskstore.LeaseResource(t.ID)
	n := len(t.Attempts)
	for i := range n + 1 {
		var iv interval
		switch {
		case i < n:
			a := t.Attempts[i]
			iv = interval{resource: resource, holder: a.Processor, fence: a.Fence, attempt: i + 1, start: a.StartedAt, expires: a.ExpiresAt}
			switch a.Outcome {
			case task.OutcomeFailed, task.OutcomeRequeued, task.OutcomeSnoozed, task.OutcomeCancelled:
				// Ended by its holder (failed, handed back, snoozed) or revoked
				// by a cancellation: released then.
				iv.released = a.EndedAt
			case task.OutcomeExpired:
				iv.announced = a.EndedAt
			default:
				v.violate(RuleOrphanEvent, "%s: attempt %d (by %s with fence %d, started at %s, ended at %s) has no known outcome: %q",
					resource, iv.attempt, a.Processor, a.Fence, ts(a.StartedAt), ts(a.EndedAt), a.Outcome)
			}
		case current:
			iv = interval{resource: resource, holder: t.Processor, fence: t.Fence, attempt: i + 1, start: t.StartedAt, expires: t.ExpiresAt}
			if t.State == task.StateDone {
				iv.released = t.ProcessedAt
			}
		default:
			continue
		}
		v.rep.Acquisitions++
		v.rep.TaskAttempts++
		v.fences = append(v.fences, fenceUse{fence: iv.fence, id: t.ID, attempt: iv.attempt, lock: t.Lock})
		if len(ivs) > 0 {
			prev := &ivs[len(ivs)-1]
			prev.next = iv.start
			if iv.fence <= prev.fence {
				v.violate(RuleFenceOrder, "%s: attempt %d by %s has fence %d after attempt %d by %s with fence %d",
					resource, iv.attempt, iv.holder, iv.fence, prev.attempt, prev.holder, prev.fence)
			}
		}
		ivs = append(ivs, iv)
	}
	// An earlier attempt of no known outcome is applied to no interval.
	ivs = slices.DeleteFunc(ivs, func(iv interval) bool {
		return iv.attempt <= len(t.Attempts) && !knownOutcome(t.Attempts[iv.attempt-1].Outcome)
	})
	slices.SortStableFunc(ivs, func(a, b interval) int { return a.start.Compare(b.start) })
	return ivs
}

// knownOutcome reports whether outcome is one an attempt may end with.
func knownOutcome(outcome string) bool {
	switch outcome {
	case task.OutcomeFailed, task.OutcomeRequeued, task.OutcomeExpired, task.OutcomeSnoozed, task.OutcomeCancelled:
		return true
	}
	return false
}

// hasCurrent reports whether t's columns hold an attempt of their own: t
// is running or done under a lease, and no earlier attempt has its fence.
func hasCurrent(t Task) bool {
	return (t.State == task.StateRunning || t.State == task.StateDone) &&
		t.Fence != 0 && !t.StartedAt.IsZero() && attemptWithFence(t, t.Fence) < 0
}

// attemptWithFence returns the index in t.Attempts of the attempt with
// fence; -1 when there is none.
func attemptWithFence(t Task, fence int64) int {
	return slices.IndexFunc(t.Attempts, func(a task.Attempt) bool { return a.Fence == fence })
}

// checkCompletion checks that done task t was completed by the holder of
// its live lease: see RuleTaskCompletion.
func (v *verifier) checkCompletion(t Task) {
	done := fmt.Sprintf("task %d done by %q with fence %d at %s", t.ID, t.Processor, t.Fence, ts(t.ProcessedAt))
	if t.Processor == "" || t.ProcessedAt.IsZero() || t.Fence == 0 || t.StartedAt.IsZero() || t.ExpiresAt.IsZero() {
		v.violate(RuleTaskCompletion, "%s: a done task needs a processor, processed_at and a lease (fence, started_at, must_heartbeat_before)", done)
		return
	}
	if i := attemptWithFence(t, t.Fence); i >= 0 {
		a := t.Attempts[i]
		v.violate(RuleTaskCompletion, "%s: the attempt with that fence had ended before, %s at %s (attempt %d by %s)",
			done, a.Outcome, ts(a.EndedAt), i+1, a.Processor)
		return
	}
	switch {
	case t.ProcessedAt.Before(t.StartedAt):
		v.violate(RuleTaskCompletion, "%s: before its lease was acquired at %s", done, ts(t.StartedAt))
	case !t.ProcessedAt.Before(t.ExpiresAt):
		v.violate(RuleTaskCompletion, "%s: its lease had expired at %s", done, ts(t.ExpiresAt))
	}
}

// checkReclaimed checks that finished task t, with the intervals ivs of
// its lease, was not leased again: see RuleTaskReclaimed.
func (v *verifier) checkReclaimed(t Task, ivs []interval) {
	if t.Fence == 0 || t.ProcessedAt.IsZero() {
		return
	}
	for i := range ivs {
		iv := &ivs[i]
		if iv.fence > t.Fence || (iv.fence != t.Fence && !iv.start.Before(t.ProcessedAt)) {
			v.violate(RuleTaskReclaimed, "task %d %s at %s with fence %d, yet leased again: %s",
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
			t.ID, ts(t.CreatedAt), t.GeneratorFence, demo.Resource)
	case t.CreatedAt.Before(iv.start) || !t.CreatedAt.Before(iv.end()):
		v.violate(RuleGeneratorFence, "task %d created at %s with generator fence %d, outside %s",
			t.ID, ts(t.CreatedAt), t.GeneratorFence, &iv)
	}
}

// finish judges what needed the whole history and returns the report.
func (v *verifier) finish() *Report {
	v.checkFencesUnique()
	v.judgeSchedules()
	v.checkSlotLimits()
	v.checkRates()
	v.finishPauses()
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
	return v.rep
}

// checkFencesUnique reports every fence two acquisitions share.
func (v *verifier) checkFencesUnique() {
	slices.SortFunc(v.fences, func(a, b fenceUse) int {
		return cmp.Or(cmp.Compare(a.fence, b.fence), cmp.Compare(a.attempt, b.attempt), cmp.Compare(a.id, b.id))
	})
	for lo := 0; lo < len(v.fences); {
		hi := lo + 1
		for hi < len(v.fences) && v.fences[hi].fence == v.fences[lo].fence {
			hi++
		}
		// A gated task's attempt takes the fence of its lock's
		// acquisition (of a slot of its lock, for a key of k slots), made
		// by the same claim: one fence given once, seen from both
		// resources (RuleLockHeld checks that they match).
		if same := v.fences[lo:hi]; len(same) != 2 || !v.lockPair(same[0], same[1]) {
			for i := lo + 1; i < hi; i++ {
				v.violate(RuleFenceReused, "fence %d given twice: %s and %s", v.fences[i].fence, v.fences[i-1], v.fences[i])
			}
		}
		lo = hi
	}
}

// lockPair reports whether a and b are a lease's acquisition and the
// attempt of a task gated by that lease's resource, or by the key of k
// slots whose slot that resource is.
func (v *verifier) lockPair(a, b fenceUse) bool {
	if a.attempt > 0 {
		a, b = b, a
	}
	if a.attempt != 0 || b.attempt == 0 || b.lock == "" {
		return false
	}
	key, slot := v.slotKeys.keyOf(a.resource)
	return b.lock == a.resource || (slot && b.lock == key)
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
	case !x.announced.IsZero():
		if x.announced.After(deadline) {
			late = fmt.Sprintf("announced at %s%s, %s after its expires_at", ts(x.announced), x.record(x.expiredID), x.announced.Sub(x.expires))
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

// runs splits the reaper's intervals, sorted by start, at the exits of
// their holders' processes (Options.Exits): a supervisor that restarts a
// process under the same name lets the new one renew its predecessor's
// lease under the same fence, and the reaper did not run between the old
// process's last sign of life and the new one's first. Each run is a copy
// of its interval whose start and lastSign are the run's first and last
// signs of life.
func (v *verifier) runs(ivs []interval) []interval {
	if len(v.opts.Exits) == 0 {
		return ivs
	}
	var out []interval
	for _, iv := range ivs {
		var exits []time.Time
		for _, x := range v.opts.Exits {
			if x.Holder == iv.holder && x.At.After(iv.start) && x.At.Before(iv.lastSign) {
				exits = append(exits, x.At)
			}
		}
		if len(exits) == 0 {
			out = append(out, iv)
			continue
		}
		slices.SortFunc(exits, time.Time.Compare)
		run := iv
		run.lastSign = time.Time{}
		for _, sign := range iv.signs {
			if len(exits) > 0 && sign.After(exits[0]) {
				// The process that gave the run's signs exited before this
				// one: the run ends at its last sign, the next begins here.
				if !run.lastSign.IsZero() {
					out = append(out, run)
				}
				for len(exits) > 0 && sign.After(exits[0]) {
					exits = exits[1:]
				}
				run.start = sign
			}
			run.lastSign = sign
		}
		out = append(out, run)
	}
	return out
}

// inOutage reports whether [from, to] meets an outage window.
func (v *verifier) inOutage(from, to time.Time) bool {
	return slices.ContainsFunc(v.opts.Outages, func(w Window) bool {
		return !w.From.After(to) && !w.To.Before(from)
	})
}
