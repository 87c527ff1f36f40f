package leasehold

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// EventKind is what became of a task attempt that this client's workers ran.
type EventKind string

// The kinds of Event.
const (
	// EventCompleted: the task is done.
	EventCompleted EventKind = "completed"
	// EventFailed: the attempt failed and the task will be tried again
	// after its backoff.
	EventFailed EventKind = "failed"
	// EventDead: the attempt failed and it was the task's last: it is dead.
	EventDead EventKind = "dead"
	// EventCancelled: the handler cancelled its task (Cancel), or the task
	// was cancelled while it ran (Err wraps task.ErrCancelled).
	EventCancelled EventKind = "cancelled"
	// EventSnoozed: the handler asked to run the task again later (Snooze).
	EventSnoozed EventKind = "snoozed"
	// EventRequeued: the task was handed back, its attempt not counted (the
	// client stopped while it ran, or its lease was given up at its
	// deadline).
	EventRequeued EventKind = "requeued"
	// EventLeaseLost: the task's lease was lost while it ran (Err says why):
	// nothing the worker reported was recorded, and another worker may run
	// the task again.
	EventLeaseLost EventKind = "lease_lost"
)

// Event is what became of one attempt of a task run by this client's
// workers.
type Event struct {
	Kind     EventKind
	TaskID   int64
	TaskKind string
	// Attempt is the attempt's number, 1 for the first.
	Attempt int
	// Fence is the attempt's lease's fence; Processor the worker that ran it.
	Fence     int64
	Processor string
	// Err is the attempt's error (EventFailed, EventDead, EventCancelled)
	// or why its lease counts as lost (EventLeaseLost); nil otherwise.
	Err error
}

// eventBuffer is how many events a subscriber may fall behind by; past it,
// the newest events are dropped for it (see Subscribe).
const eventBuffer = 1024

// events fans a client's worker events out to its subscribers.
type events struct {
	mu      sync.Mutex
	subs    []*subscriber
	n       atomic.Int32 // len(subs): a client nobody subscribes to publishes nothing
	dropped atomic.Int64
}

type subscriber struct {
	kinds []EventKind // empty: all
	c     chan *Event
}

// Subscribe returns a channel of what becomes of the attempts of this
// client's workers (of the kinds given; none: every kind), for the program's
// own metrics and tests, and a function that ends the subscription and
// closes the channel. Events are sent as the attempts end, without waiting
// for the reader: a subscriber that falls more than 1024 events behind
// misses the newest (DroppedEvents counts them). It works the same on an
// embedded and a remote client.
func (c *Client) Subscribe(kinds ...EventKind) (<-chan *Event, func()) {
	s := &subscriber{kinds: slices.Clone(kinds), c: make(chan *Event, eventBuffer)}
	c.events.mu.Lock()
	c.events.subs = append(c.events.subs, s)
	c.events.n.Store(int32(len(c.events.subs)))
	c.events.mu.Unlock()
	var once sync.Once
	return s.c, func() {
		once.Do(func() {
			c.events.mu.Lock()
			defer c.events.mu.Unlock()
			c.events.subs = slices.DeleteFunc(c.events.subs, func(o *subscriber) bool { return o == s })
			c.events.n.Store(int32(len(c.events.subs)))
			close(s.c)
		})
	}
}

// DroppedEvents is how many events subscribers missed because they fell
// behind.
func (c *Client) DroppedEvents() int64 { return c.events.dropped.Load() }

// publish is the workers' OnEvent: the attempt's end, to every subscriber
// of its kind.
func (e *events) publish(ev worker.Event) {
	if e.n.Load() == 0 {
		return
	}
	out := publicEvent(ev)
	if out == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		if len(s.kinds) > 0 && !slices.Contains(s.kinds, out.Kind) {
			continue
		}
		select {
		case s.c <- out:
		default:
			e.dropped.Add(1)
		}
	}
}

// publicEvent is a worker's event as Subscribe shows it; nil for those it
// does not (claims, heartbeats, the dispatcher's rounds).
func publicEvent(ev worker.Event) *Event {
	out := &Event{TaskID: ev.TaskID, TaskKind: ev.TaskKind, Attempt: int(ev.Attempts), Fence: ev.Fence, Processor: ev.Processor, Err: ev.Err}
	switch ev.Kind {
	case worker.EventCompleted:
		out.Kind, out.Err = EventCompleted, nil
	case worker.EventFailed:
		out.Kind = EventFailed
		if ev.State == task.StateDead {
			out.Kind = EventDead
		}
	case worker.EventCancelled:
		out.Kind = EventCancelled
	case worker.EventSnoozed:
		out.Kind, out.Err = EventSnoozed, nil
	case worker.EventRequeued:
		out.Kind, out.Err = EventRequeued, nil
	case worker.EventLeaseLost:
		out.Kind = EventLeaseLost
		if errors.Is(ev.Err, task.ErrCancelled) {
			out.Kind = EventCancelled
		}
	default:
		return nil
	}
	return out
}
