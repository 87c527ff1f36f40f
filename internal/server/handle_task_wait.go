package server

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// claimWaiters is the replica's dispatcher of the claims that wait
// (POST /api/tasks/next with wait_seconds). A waiting request joins a group,
// one per (kinds, queues) asked for, and one goroutine claims for all the
// waiters of a group at once: one statement for every waiter, whatever
// their number, each task handed to the waiter it was claimed for. It runs
// while claims wait (and a moment after the last), woken by a new waiter,
// by the NOTIFY of an insert or of a task put back, by a reconnect of the
// listener, and when a task scheduled for later falls due; so hundreds of
// idle waiters cost no statement, and an insert costs one claim per group,
// not one per waiter. Its registration as a waiter for inserted tasks
// (schema/0008) is what makes inserts notify while claims wait.
type claimWaiters struct {
	waiter *notify.Waiter // nil without a listener

	mu      sync.Mutex
	groups  map[string]*waitGroup
	n       int           // requests waiting
	running bool          // the dispatcher runs
	wake    chan struct{} // capacity 1: something changed
}

// waitGroup are the waiting claims of one (kinds, queues), in arrival order.
type waitGroup struct {
	kinds, queues []string
	waiting       []*waitingClaim
}

// waitingClaim is one waiting request. reply gets its answer once, under
// claimWaiters.mu, which also guards answered.
type waitingClaim struct {
	processor string
	group     *waitGroup
	reply     chan waitReply // capacity 1
	answered  bool           // a reply was sent, or the request left
}

type waitReply struct {
	task task.Task
	err  error
}

// Tunables of the dispatcher.
const (
	// waitLinger is how long the dispatcher stays (registered, listening)
	// after the last waiter left: a client that asks again at once, as
	// workers do, costs no new registration.
	waitLinger = 2 * time.Second
	// waitStatement bounds each statement of the dispatcher.
	waitStatement = 5 * time.Second
	// lapsedEvery is how often, at most, the dispatcher's claims also take
	// running tasks whose lease lapsed (ClaimParams.WithLapsed).
	lapsedEvery = time.Second
)

func newClaimWaiters(l *notify.Listener, instance string) *claimWaiters {
	c := &claimWaiters{groups: map[string]*waitGroup{}, wake: make(chan struct{}, 1)}
	if l != nil {
		c.waiter = l.Waiter(instance + "/api-claims")
	}
	return c
}

// groupKey names the group of a claim: its kinds and queues, as sets.
func groupKey(kinds, queues []string) string {
	k, q := slices.Clone(kinds), slices.Clone(queues)
	slices.Sort(k)
	slices.Sort(q)
	return strings.Join(slices.Compact(k), "\x00") + "\x01" + strings.Join(slices.Compact(q), "\x00")
}

// claimWaiting claims p (one processor) for a request with wait_seconds:
// it joins the dispatcher's group of its kinds and queues and waits, up to
// wait, for the task claimed for it. When the wait runs out it answers
// nothing (204). The wait ends early, with nothing claimed, when the client
// goes away (a task claimed for it just then is handed back) or the replica
// shuts down (errStopping: 503, for the client to ask another replica; the
// front door or a Service sends it to one). Tasks scheduled for later are
// waited for until they fall due, by the database clock.
func claimWaiting(w http.ResponseWriter, r *http.Request, d Deps, p taskstore.ClaimParams, wait time.Duration) ([]task.Task, error) {
	ctx, _, stop := unbounded(r)
	defer stop()
	holdOpen(w, time.Now().Add(wait))
	select {
	case <-d.Stopping:
		return nil, errStopping
	default:
	}

	c := d.claimWaiters
	wc := c.join(d, p)
	d.Log.Debug().Str("processor", p.Processors[0]).Strs("kinds", p.Kinds).Strs("queues", p.Queues).Stringer("wait", wait).
		Msg("claim waits for a task")
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case rep := <-wc.reply:
		return answer(rep)
	case <-timer.C:
		if c.leave(wc) {
			return nil, nil
		}
		return answer(<-wc.reply) // claimed for it as the wait ran out: take it
	case <-ctx.Done():
		if !c.leave(wc) {
			if rep := <-wc.reply; rep.err == nil {
				handBackAbandoned(d, []task.Task{rep.task}) // claimed as the client went away
			}
		}
		d.Log.Debug().Str("processor", wc.processor).Msg("claim stopped waiting: the client went away")
		return nil, ctx.Err()
	}
}

func answer(rep waitReply) ([]task.Task, error) {
	if rep.err != nil {
		return nil, rep.err
	}
	return []task.Task{rep.task}, nil
}

// join adds a waiting claim for p's processor, starting the dispatcher when
// it is not running, and wakes it to claim for the newcomer.
func (c *claimWaiters) join(d Deps, p taskstore.ClaimParams) *waitingClaim {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := groupKey(p.Kinds, p.Queues)
	g := c.groups[key]
	if g == nil {
		g = &waitGroup{kinds: p.Kinds, queues: p.Queues}
		c.groups[key] = g
	}
	wc := &waitingClaim{processor: p.Processors[0], group: g, reply: make(chan waitReply, 1)}
	g.waiting = append(g.waiting, wc)
	c.n++
	if !c.running {
		c.running = true
		go c.run(d, p.TTL)
	}
	c.poke()
	return wc
}

// leave takes a waiting claim out; false when it was answered already (its
// reply is, or is about to be, in its channel).
func (c *claimWaiters) leave(wc *waitingClaim) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if wc.answered {
		return false
	}
	c.remove(wc)
	if c.n == 0 {
		c.poke() // the dispatcher may linger, then stop
	}
	return true
}

// remove takes wc out of its group; the caller holds mu.
func (c *claimWaiters) remove(wc *waitingClaim) {
	wc.answered = true
	g := wc.group
	g.waiting = slices.DeleteFunc(g.waiting, func(x *waitingClaim) bool { return x == wc })
	c.n--
}

// poke wakes the dispatcher; the caller holds mu.
func (c *claimWaiters) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// claimRound is what the dispatcher claims for one group in a round.
type claimRound struct {
	group      *waitGroup
	processors []string
}

// run is the dispatcher: it claims for every group with waiters whenever
// something may have made a task claimable, until no claim has waited for
// waitLinger or the replica shuts down.
func (c *claimWaiters) run(d Deps, ttl time.Duration) {
	var sub *notify.Subscription
	if d.Listener != nil {
		// Subscribed before the registration and the first claim, so that
		// nothing inserted after that claim goes unnoticed.
		sub = d.Listener.Subscribe(notify.ChannelTask, 16)
		defer sub.Close()
	}
	var changes <-chan notify.Notification
	var resync <-chan struct{}
	if sub != nil {
		changes, resync = sub.C(), sub.Resync()
	}
	// proven: registered, and every insert that may have missed the
	// registration has committed, so a claim from now on misses nothing that
	// does not notify. Until then the dispatcher looks again soon.
	proven := false
	registered := false
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var idleSince time.Time
	// lastLapsed is when a round last also took running tasks whose lease
	// lapsed before a reaper put them back: at most once a second, for a
	// cluster whose reaper is late or not running (that look reads the
	// index of running tasks; with a reaper, its requeue's NOTIFY wakes the
	// waiters anyway).
	var lastLapsed time.Time
	for {
		c.mu.Lock()
		if c.n == 0 {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if time.Since(idleSince) >= c.linger() {
				// Unregistered before the dispatcher counts as stopped, so
				// that a successor's registration is never undone by it.
				c.mu.Unlock()
				if registered {
					c.waiter.UnregisterWithin(context.Background(), time.Second)
					registered, proven = false, false
				}
				c.mu.Lock()
				if c.n == 0 {
					c.running = false
					c.mu.Unlock()
					return
				}
				idleSince = time.Time{} // a claim came meanwhile: on, registering again
			}
		} else {
			idleSince = time.Time{}
		}
		if c.n > 0 && c.waiter != nil && !proven {
			// Registered before the rounds are made, so that they name the
			// waiters that wait once the registration holds: a registration
			// can take a while (BarrierWait), and one who left meanwhile must
			// not be claimed for.
			c.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), waitStatement)
			err := c.waiter.Register(ctx)
			cancel()
			registered = true
			proven = err == nil
			c.mu.Lock()
		}
		var rounds []claimRound
		for key, g := range c.groups {
			if len(g.waiting) == 0 {
				delete(c.groups, key)
				continue
			}
			r := claimRound{group: g}
			for _, wc := range g.waiting {
				r.processors = append(r.processors, wc.processor)
			}
			rounds = append(rounds, r)
		}
		c.mu.Unlock()

		next := time.Hour
		if len(rounds) > 0 {
			withLapsed := time.Since(lastLapsed) >= lapsedEvery
			if withLapsed {
				lastLapsed = time.Now()
			}
			for _, r := range rounds {
				next = min(next, c.claimFor(d, ttl, r, withLapsed))
			}
			if c.waiter != nil && !proven {
				next = min(next, notify.BarrierWait)
			}
		} else if !idleSince.IsZero() {
			next = c.linger() - time.Since(idleSince)
		}
		timer.Reset(max(next, time.Millisecond))
		for woken := false; !woken; {
			select {
			case <-d.Stopping:
				c.stop()
				if registered {
					c.waiter.UnregisterWithin(context.Background(), time.Second)
				}
				return
			case <-c.wake:
				woken = true
			case <-timer.C:
				woken = true
			case <-resync:
				proven, woken = false, true
			case n := <-changes:
				woken = n.Payload == notify.TasksInserted || n.Payload == notify.TasksRequeued
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// claimFor claims for the waiters of one round, answers those it claimed a
// task for, and returns how soon the group's next task falls due (an hour
// when none is pending, or when all were served).
func (c *claimWaiters) claimFor(d Deps, ttl time.Duration, r claimRound, withLapsed bool) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), waitStatement)
	defer cancel()
	tasks, err := d.Tasks.Claim(ctx, taskstore.ClaimParams{
		Processors: r.processors, TTL: ttl, Kinds: r.group.kinds, Queues: r.group.queues, WithLapsed: withLapsed,
	})
	c.mu.Lock()
	var orphans []task.Task
	if err != nil {
		// The database is unavailable: every waiter of the group hears so
		// (503), rather than wait for nothing.
		for _, wc := range slices.Clone(r.group.waiting) {
			c.remove(wc)
			wc.reply <- waitReply{err: err}
		}
	}
	for _, t := range tasks {
		i := slices.IndexFunc(r.group.waiting, func(wc *waitingClaim) bool { return wc.processor == t.Processor })
		if i < 0 {
			orphans = append(orphans, t) // its requester left while the claim ran
			continue
		}
		wc := r.group.waiting[i]
		c.remove(wc)
		wc.reply <- waitReply{task: t}
	}
	left := len(r.group.waiting)
	c.mu.Unlock()
	if len(orphans) > 0 {
		handBackAbandoned(d, orphans)
	}
	if err != nil || left == 0 {
		return time.Hour
	}
	asked := time.Now()
	due, dbNow, err := d.Tasks.NextDue(ctx, r.group.queues, r.group.kinds)
	if err != nil {
		return time.Second // a look again soon
	}
	// By the database clock, and a little after, so that it is due.
	return time.Until(due.Add(-dbNow.Sub(asked))) + 5*time.Millisecond
}

// linger is how long the dispatcher stays after the last waiter left: with
// no registration to keep (no listener), not at all.
func (c *claimWaiters) linger() time.Duration {
	if c.waiter == nil {
		return 0
	}
	return waitLinger
}

// stop answers every waiting claim errStopping: the replica shuts down.
func (c *claimWaiters) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, g := range c.groups {
		for _, wc := range slices.Clone(g.waiting) {
			c.remove(wc)
			wc.reply <- waitReply{err: errStopping}
		}
		delete(c.groups, key)
	}
	c.running = false
}

// handBackAbandoned requeues tasks claimed for a client that went away
// before it could hear so, rather than leave them held for a whole TTL.
func handBackAbandoned(d Deps, tasks []task.Task) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range tasks {
		if _, err := d.Tasks.Requeue(ctx, t.ID, t.Processor, t.Fence, "the client that claimed it went away"); err != nil &&
			!errors.Is(err, task.ErrLeaseLost) {
			d.Log.Warn().Err(err).Int64("task", t.ID).Msg("could not hand back a task claimed for a client that went away; it will be claimed again when its lease lapses")
		}
	}
}
