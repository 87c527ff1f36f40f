package server

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// claimWaiters is the replica's one registration as a waiter for inserted
// tasks (schema/0008) on behalf of the claims that wait (wait_seconds):
// inserts notify only while someone waits, so the first waiting claim
// registers it and the last one to stop waiting unregisters it.
type claimWaiters struct {
	waiter *notify.Waiter
	mu     sync.Mutex // held across Register and Unregister: one owner at a time
	n      int        // claims waiting
}

func newClaimWaiters(l *notify.Listener, instance string) *claimWaiters {
	if l == nil {
		return nil
	}
	return &claimWaiters{waiter: l.Waiter(instance + "/api-claims")}
}

// join counts one more waiting claim and makes sure the registration holds
// for the LISTEN session that is up: once it returns nil, a claim sees
// every task whose insert did not notify.
func (c *claimWaiters) join(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.waiter.Register(ctx)
}

// registered re-registers after the listener reconnected (Register returns
// at once while the registration holds).
func (c *claimWaiters) registered(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiter.Register(ctx)
}

// leave counts one waiting claim less, unregistering after the last.
func (c *claimWaiters) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n--
	if c.n == 0 {
		c.waiter.UnregisterWithin(context.Background(), time.Second)
	}
}

// claimWaiting claims p for a request with wait_seconds: while nothing it
// may take is due it waits, up to wait, woken by the NOTIFY of an insert or
// of a task put back (and by a reconnect of the listener, after which it
// registers again and looks), and claims again. Many waiting claims on
// many replicas each get a different task (SKIP LOCKED); those that get
// none wait on. The wait ends early, with nothing claimed, when the client
// goes away (and a task claimed just then is handed back) or the replica
// shuts down (503: another replica will answer).
//
// Scheduled tasks (a retry's backoff, scheduled_at in the future) are
// waited for until they fall due, by the database clock.
func claimWaiting(w http.ResponseWriter, r *http.Request, d Deps, p taskstore.ClaimParams, wait time.Duration) ([]task.Task, error) {
	ctx, budget, stop := unbounded(r)
	defer stop()
	deadline := time.Now().Add(wait)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(deadline.Add(answerMargin))
	_ = rc.SetWriteDeadline(deadline.Add(answerMargin))

	bounded := func() (context.Context, context.CancelFunc) {
		if budget > 0 {
			return context.WithTimeout(ctx, budget)
		}
		return ctx, func() {}
	}
	// Subscribed before the registration and the first claim, so that
	// nothing inserted after that claim goes unnoticed.
	var sub *notify.Subscription
	// proven: the registration holds and every insert that may have missed
	// it has committed, so a claim from now on misses nothing that does not
	// notify. Until then the waits are short, and registering is tried again.
	proven := false
	if d.Listener != nil {
		sub = d.Listener.Subscribe(notify.ChannelTask, 16)
		defer sub.Close()
		rctx, cancel := bounded()
		err := d.claimWaiters.join(rctx)
		cancel()
		defer d.claimWaiters.leave()
		if err != nil && !errors.Is(err, notify.ErrNotListening) && !errors.Is(err, notify.ErrInsertsInFlight) {
			return nil, err
		}
		proven = err == nil
	}
	for {
		if sub != nil && !proven {
			rctx, cancel := bounded()
			proven = d.claimWaiters.registered(rctx) == nil
			cancel()
		}
		cctx, cancel := bounded()
		tasks, err := d.Tasks.Claim(cctx, p)
		cancel()
		if err != nil {
			return nil, err
		}
		if len(tasks) > 0 {
			if ctx.Err() != nil {
				handBackAbandoned(d, tasks) // claimed as the client went away
				return nil, ctx.Err()
			}
			return tasks, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		// A task scheduled for later falls due by the database clock.
		nctx, cancel := bounded()
		asked := time.Now()
		due, dbNow, err := d.Tasks.NextDue(nctx, p.Queues, p.Kinds)
		cancel()
		if err != nil {
			return nil, err
		}
		untilDue := time.Until(due.Add(-dbNow.Sub(asked))) + 5*time.Millisecond
		wait := min(left, max(untilDue, 10*time.Millisecond))
		if !proven {
			wait = min(wait, notify.BarrierWait)
		}
		resynced, err := waitForTasks(ctx, d, sub, wait)
		if err != nil {
			return nil, err
		}
		if resynced {
			proven = false // registered again before the next claim
		}
	}
}

// waitForTasks waits up to d for a sign that a task may be claimable: an
// insert or a task put back notified, or a resync of the listener (resynced:
// the registration must be renewed). It returns ctx's error when ctx ends
// first, errStopping when the replica shuts down first.
func waitForTasks(ctx context.Context, d Deps, sub *notify.Subscription, wait time.Duration) (resynced bool, err error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var changes <-chan notify.Notification
	var resync <-chan struct{}
	if sub != nil {
		changes, resync = sub.C(), sub.Resync()
	}
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-d.Stopping:
			return false, errStopping
		case <-timer.C:
			return false, nil
		case <-resync:
			return true, nil
		case n := <-changes:
			if n.Payload == notify.TasksInserted || n.Payload == notify.TasksRequeued {
				return false, nil
			}
		}
	}
}

// handBackAbandoned requeues tasks claimed for a client that went away
// before it could hear so, rather than leave them held for a whole TTL.
func handBackAbandoned(d Deps, tasks []task.Task) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range tasks {
		if _, err := d.Tasks.Requeue(ctx, t.ID, t.Processor, t.Fence, "the client that claimed it went away"); err != nil {
			d.Log.Warn().Err(err).Int64("task", t.ID).Msg("could not hand back a task claimed for a client that went away; it will be claimed again when its lease lapses")
		}
	}
}
