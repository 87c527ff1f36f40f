package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// maxCompleteBatch bounds the completions one statement records.
const maxCompleteBatch = 500

// completer records the completions of a pool's workers in batches: one
// statement, and one commit, for all the completions that arrived while
// the previous statement ran. When completions are few a batch is one
// completion and nothing waits; under load one commit carries many, which
// is what lets a replica complete more tasks a second than it can commit
// transactions.
//
// While the pool is fed (its dispatcher's last claim got a task for every
// idle worker: more are likely waiting), the same statement also claims
// the next task of each worker whose completion it records
// (taskstore.Store.CompleteAndClaim): a busy replica then runs one statement
// and one commit per round of tasks, not a claim and a completion. A
// claim that comes back short stops the feeding; the workers left without
// a task go idle, and the dispatcher takes over, registering as a waiter
// for inserted tasks as it does.
//
// A batch is sent at once when no statement of the completer's is in
// flight. While one is, a second is sent only once its batch holds half
// the pool's workers, and at least minSecondBatch (secondBatch): a drain
// of a large pool then keeps two statements of half the workers each in
// flight, and the database's cores busy, where one statement at a time
// would leave half the workers waiting for it. Completions that trickle
// in wait for the statement in flight, as they would with one statement
// at a time, rather than split the rounds of a busy pool into ever
// smaller batches. A small pool never sends a second: its completions
// all gather while one statement runs, and a statement costs the server
// about as much as a few dozen of the tasks it carries, so halving its
// batches would cost more than the second core gives.
type completer struct {
	p    *Pool
	reqs chan completeReq
	// secondBatch is the smallest batch sent while another is in flight.
	secondBatch int
	// send records a batch and answers its requests: record, but for
	// tests of the batching.
	send func([]completeReq)
}

// maxInFlight bounds the completer's statements in flight at once.
const maxInFlight = 2

// minSecondBatch is the smallest batch sent beside a statement in flight.
const minSecondBatch = 25

type completeReq struct {
	c        taskstore.Completion
	deadline time.Time // the requester waits until then
	reply    chan completeReply
}

// completeReply is what became of a completion, and the worker's next task
// when the statement claimed one for it.
type completeReply struct {
	err  error
	next *claim
}

func newCompleter(p *Pool) *completer {
	c := &completer{p: p, reqs: make(chan completeReq), secondBatch: max(p.Workers/maxInFlight, minSecondBatch)}
	c.send = c.record
	return c
}

// complete completes one task as part of the next batch, and returns the
// worker's next task when the batch claimed one for it (whatever became
// of the completion). Its errors are Store.Complete's: task.ErrLeaseLost
// when the compare-and-set refused it.
func (c *completer) complete(ctx context.Context, comp taskstore.Completion) (*claim, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	reply := replies.Get().(chan completeReply)
	req := completeReq{c: comp, deadline: deadline, reply: reply}
	select {
	case c.reqs <- req:
	case <-ctx.Done():
		replies.Put(reply)
		return nil, context.Cause(ctx)
	}
	select {
	case r := <-req.reply:
		replies.Put(reply) // empty again
		return r.next, r.err
	case <-ctx.Done():
		// The batch may still commit; the caller's retry finds out. A task
		// it claimed for this worker is left to lapse, and be requeued.
		return nil, context.Cause(ctx)
	}
}

// replies are the requests' reply channels (capacity 1), reused once
// answered and read: a completion costs no channel of its own.
var replies = sync.Pool{New: func() any { return make(chan completeReply, 1) }}

// run records batches until ctx ends, then waits for its statements in
// flight; the pool ends it after its workers.
func (c *completer) run(ctx context.Context) {
	var (
		batch    []completeReq
		inFlight int
		finished = make(chan struct{}, maxInFlight)
		sending  sync.WaitGroup
	)
	defer sending.Wait()
	for {
		if len(batch) > 0 && (inFlight == 0 || inFlight < maxInFlight && len(batch) >= c.secondBatch) {
			b := batch
			// The next batch is likely this one's size: room for it at
			// once, not regrown from nothing by append.
			batch = make([]completeReq, 0, len(b))
			if inFlight > 0 {
				c.p.counters.overlapped.Add(1)
			}
			inFlight++
			sending.Go(func() {
				c.send(b)
				finished <- struct{}{}
			})
			continue
		}
		reqs := c.reqs
		if len(batch) >= maxCompleteBatch {
			reqs = nil // full: wait for a statement to finish
		}
		select {
		case <-ctx.Done():
			return
		case <-finished:
			inFlight--
		case r := <-reqs:
			batch = append(batch, r)
		gather:
			for len(batch) < maxCompleteBatch {
				select {
				case r := <-c.reqs:
					batch = append(batch, r)
				default:
					break gather
				}
			}
		}
	}
}

// record completes one batch, claiming the workers' next tasks while the
// pool is fed, and answers every request in it.
func (c *completer) record(batch []completeReq) {
	p := c.p
	cs := make([]taskstore.Completion, len(batch))
	latest := batch[0].deadline
	for i, r := range batch {
		cs[i] = r.c
		if r.deadline.After(latest) {
			latest = r.deadline
		}
	}
	var claimFor []string
	if p.fed.Load() {
		claimFor = make([]string, len(batch))
		for i, r := range batch {
			claimFor[i] = r.c.Processor
		}
	}
	hints, hinted := p.hints.forClaim()
	// No requester waits past its own deadline; the statement may run until
	// the last of them stops waiting.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	sent := time.Now()
	var (
		done    map[int64]bool
		claimed []task.Task
		err     error
	)
	if claimFor == nil {
		done, err = p.Tasks.CompleteMany(ctx, cs)
	} else {
		done, claimed, err = p.Tasks.CompleteAndClaim(ctx, cs, p.claimParams(claimFor, hints, false))
	}
	cancel()
	next := make(map[string]*claim, len(claimed))
	if claimFor != nil && err == nil {
		p.counters.claims.Add(1)
		p.counters.claimed.Add(int64(len(claimed)))
		p.hints.claimed(sent, !hinted, claimed)
		if len(claimed) < len(claimFor) {
			// The queue ran short (or a task sits before a hint): the
			// dispatcher takes over, and looks at everything.
			p.fed.Store(false)
		}
		claims := make([]claim, len(claimed)) // one allocation for the batch
		for i, t := range claimed {
			claims[i] = claim{task: t, sent: sent, wake: WakeChained}
			next[t.Processor] = &claims[i]
		}
	}
	for _, r := range batch {
		switch {
		case err != nil:
			r.reply <- completeReply{err: err}
		case done[r.c.ID]:
			r.reply <- completeReply{next: next[r.c.Processor]}
		default:
			r.reply <- completeReply{err: fmt.Errorf("complete task %d: %w", r.c.ID, task.ErrLeaseLost), next: next[r.c.Processor]}
		}
	}
}
