package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/task"
)

// maxCompleteBatch bounds the completions one statement records.
const maxCompleteBatch = 500

// completer records the completions of a pool's workers in batches: one
// statement, and one commit, for all the completions that arrived while
// the previous statement ran. When completions are few a batch is one
// completion and nothing waits; under load one commit carries many, which
// is what lets a replica complete more tasks a second than it can commit
// transactions.
type completer struct {
	tasks *task.Store
	reqs  chan completeReq
}

type completeReq struct {
	c        task.Completion
	deadline time.Time // the requester waits until then
	reply    chan error
}

func newCompleter(tasks *task.Store) *completer {
	return &completer{tasks: tasks, reqs: make(chan completeReq)}
}

// complete completes one task as part of the next batch. Its errors are
// Store.Complete's: task.ErrLeaseLost when the compare-and-set refused it.
func (c *completer) complete(ctx context.Context, comp task.Completion) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	req := completeReq{c: comp, deadline: deadline, reply: make(chan error, 1)}
	select {
	case c.reqs <- req:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case err := <-req.reply:
		return err
	case <-ctx.Done():
		// The batch may still commit; the caller's retry finds out.
		return context.Cause(ctx)
	}
}

// run records batches until ctx ends; the pool ends it after its workers.
func (c *completer) run(ctx context.Context) {
	for {
		var batch []completeReq
		select {
		case <-ctx.Done():
			return
		case r := <-c.reqs:
			batch = append(batch, r)
		}
	gather:
		for len(batch) < maxCompleteBatch {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			default:
				break gather
			}
		}
		c.record(batch)
	}
}

// record completes one batch and answers every request in it.
func (c *completer) record(batch []completeReq) {
	cs := make([]task.Completion, len(batch))
	latest := batch[0].deadline
	for i, r := range batch {
		cs[i] = r.c
		if r.deadline.After(latest) {
			latest = r.deadline
		}
	}
	// No requester waits past its own deadline; the statement may run until
	// the last of them stops waiting.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	done, err := c.tasks.CompleteMany(ctx, cs)
	cancel()
	for _, r := range batch {
		switch {
		case err != nil:
			r.reply <- err
		case done[r.c.ID]:
			r.reply <- nil
		default:
			r.reply <- fmt.Errorf("complete task %d: %w", r.c.ID, task.ErrLeaseLost)
		}
	}
}
