package worker

import (
	"strings"
	"sync/atomic"
	"time"
)

// Wake says why the dispatcher ran a round of claims: a set of reasons,
// since wake-ups that arrive while it is busy are coalesced into one.
type Wake uint32

// The reasons the dispatcher claims.
const (
	WakeStart      Wake = 1 << iota // Run started: catch up with what is already waiting
	WakeInsert                      // a leasehold_task notification: tasks were inserted
	WakeResync                      // the listener (re)connected or dropped notifications: catch up
	WakeDue                         // the next pending task's scheduled_at came (a retry's backoff)
	WakeSafetyPoll                  // nothing else woke the dispatcher for SafetyPoll
	WakeWorkerIdle                  // a worker finished while more work may be waiting
	WakeBacklog                     // the last claim got all it asked for: more may be waiting
	WakeRetry                       // a claim failed: trying again
	WakeRequeued                    // a leasehold_task notification: tasks went back to pending (failed, handed back, or their lease lapsed)
	// WakeRegistered: the pool has just registered as a waiter for
	// inserted tasks; the claim catches up with the inserts that did not
	// notify because nobody was registered.
	WakeRegistered
	// WakeChained: no dispatcher round; the statement that recorded the
	// worker's completion claimed its next task (while the pool is fed).
	WakeChained
	// WakeShort: a claim that skipped what earlier claims took (hints) came
	// back short; the next looks at everything.
	WakeShort
)

var wakeNames = []string{"start", "insert", "resync", "due", "safety-poll", "worker-idle", "backlog", "retry", "requeued", "registered", "chained", "short"}

// String lists the reasons, e.g. "insert|requeued".
func (w Wake) String() string {
	var names []string
	for i, name := range wakeNames {
		if w&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// EventKind is what happened in an Event.
type EventKind string

// The kinds of Event.
const (
	EventClaimed   EventKind = "claimed"    // the dispatcher claimed a task for a worker
	EventCompleted EventKind = "completed"  // a worker completed its task
	EventFailed    EventKind = "failed"     // a worker recorded a failed attempt (retry or dead)
	EventRequeued  EventKind = "requeued"   // a task was handed back at shutdown
	EventSnoozed   EventKind = "snoozed"    // a handler asked to run its task again later
	EventCancelled EventKind = "cancelled"  // a handler cancelled its task
	EventLeaseLost EventKind = "lease-lost" // a worker lost its task's lease (or the task was cancelled) and abandoned the task
	EventCrashed   EventKind = "crashed"    // the handler abandoned its task (ErrAbandon: a simulated crash)
	EventAsleep    EventKind = "asleep"     // the dispatcher finished a round of claims and waits to be woken
	// EventHeartbeatFailed: a heartbeat was refused (EventLeaseLost follows)
	// or failed (retried until the lease's local deadline).
	EventHeartbeatFailed EventKind = "heartbeat-failed"
)

// Event is something a Pool did, reported to OnEvent (tests, metrics).
type Event struct {
	Kind      EventKind
	TaskKind  string // the task's kind; empty for EventAsleep
	Processor string // the worker, "<Instance>/w<N>"; empty for EventAsleep
	TaskID    int64
	Fence     int64
	Attempts  int32 // the task's attempts, this one included
	// Wake is why the dispatcher claimed (EventClaimed) or what the round
	// that just ended answered (EventAsleep).
	Wake Wake
	// Err is the run's error (EventFailed) or why the lease counts as lost
	// (EventLeaseLost: task.ErrLeaseLost, lease.ErrDeadline or
	// task.ErrCancelled, wrapped).
	Err error
	// Interrupted is set on EventLeaseLost when the task's context was
	// cancelled before the task ran to its end.
	Interrupted bool
	// State is the task's state after the worker's write: done
	// (EventCompleted), pending (EventRequeued, or EventFailed with a retry
	// due after a backoff) or dead (EventFailed with no attempt left).
	State string
	// Waited is, on EventClaimed, how long the task waited to be claimed:
	// from the later of its insert and its scheduled_at to the claim, all by
	// the database clock. For a task claimed again after its lease lapsed
	// (Attempts > 1) it includes the attempts before.
	Waited time.Duration
}

// Counters are a Pool's running totals, for metrics.
type Counters struct {
	Claims    int64 // claim statements sent
	Empty     int64 // claim statements that found nothing: wake-ups that were futile
	Claimed   int64 // tasks claimed
	Completed int64
	Failed    int64
	Requeued  int64
	Snoozed   int64
	Cancelled int64 // by their handlers
	LeaseLost int64
	Crashed   int64
	// Registered counts the dispatcher's registrations as a waiter for
	// inserted tasks: each time it went idle after its workers were all
	// busy (or at start).
	Registered int64
	// Overlapped counts the completion statements sent while another was
	// in flight: a large pool's drain keeps two.
	Overlapped int64
}

type counters struct {
	claims, empty, claimed, completed, failed, requeued, snoozed, cancelled, leaseLost, crashed, registered, overlapped atomic.Int64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Claims: c.claims.Load(), Empty: c.empty.Load(), Claimed: c.claimed.Load(),
		Completed: c.completed.Load(), Failed: c.failed.Load(), Requeued: c.requeued.Load(),
		Snoozed: c.snoozed.Load(), Cancelled: c.cancelled.Load(),
		LeaseLost: c.leaseLost.Load(), Crashed: c.crashed.Load(), Registered: c.registered.Load(),
		Overlapped: c.overlapped.Load(),
	}
}
