package leasehold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// Middleware is what a program wraps around a client's inserts and around
// the attempts of its workers: tracing (package leaseholdotel, a module of
// its own), metrics, logs, a tenant's context. Config.Middleware lists
// them, the first outermost. Either field may be nil.
type Middleware struct {
	// Insert is called around every insert of the client (Insert,
	// InsertTx, InsertMany, InsertManyTx, InsertManyFast and
	// InsertManyFastTx), with the tasks about to be
	// inserted, after they were checked: it may add to their Metadata, and
	// must call next, with the context to insert with, for them to be
	// inserted; what it returns is the insert's error (one that returns
	// nil without calling next fails the insert, as nothing was inserted).
	Insert func(ctx context.Context, tasks []*InsertingTask, next func(context.Context) error) error
	// Work is called around every attempt that a worker of the client
	// runs, with the claimed task (its Metadata as the insert left it): it
	// must call next, with the context for the worker, for the worker to
	// run, and returns what becomes of the attempt: next's error, or its
	// own.
	Work func(ctx context.Context, t *task.Task, next func(context.Context) error) error
}

// InsertingTask is one task of an insert, as Middleware.Insert sees it.
type InsertingTask struct {
	Kind  string
	Queue string
	Args  TaskArgs
	// Metadata travels with the task (task.Task.Metadata): add to it.
	Metadata map[string]string
}

// inserting runs the client's Insert middleware around insert, which
// inserts nts; the middleware's additions to the metadata go into nts.
func (c *Client) inserting(ctx context.Context, params []InsertParams, nts []taskstore.NewTask, insert func(context.Context) error) error {
	if len(c.insertMW) == 0 {
		return insert(ctx)
	}
	tasks := make([]*InsertingTask, len(nts))
	for i := range nts {
		q := nts[i].Queue
		if q == "" {
			q = task.DefaultQueue
		}
		tasks[i] = &InsertingTask{Kind: nts[i].Kind, Queue: q, Args: params[i].Args, Metadata: maps.Clone(nts[i].Metadata)}
		if tasks[i].Metadata == nil {
			tasks[i].Metadata = map[string]string{}
		}
	}
	inserted := false
	next := func(ctx context.Context) error {
		inserted = true
		for i, t := range tasks {
			if err := task.CheckMetadata(t.Metadata); err != nil {
				return fmt.Errorf("%w: the metadata a middleware gave task %d of the insert: %w", ErrInvalidArgument, i, err)
			}
			if len(t.Metadata) > 0 {
				nts[i].Metadata = t.Metadata
			}
		}
		return insert(ctx)
	}
	for i := len(c.insertMW) - 1; i >= 0; i-- {
		mw, inner := c.insertMW[i], next
		next = func(ctx context.Context) error { return mw(ctx, tasks, inner) }
	}
	if err := next(ctx); err != nil {
		return err
	}
	if !inserted {
		return errors.New("an insert middleware returned without calling next: nothing was inserted")
	}
	return nil
}

// working runs the client's Work middleware around one attempt.
func (c *Client) working(ctx context.Context, t task.Task, run func(context.Context, task.Task) (json.RawMessage, error)) (json.RawMessage, error) {
	if len(c.workMW) == 0 {
		return run(ctx, t) // t stays on the stack: most clients have no middleware
	}
	return c.workingThrough(ctx, t, run)
}

// workingThrough is working with middleware, which gets the task's address.
func (c *Client) workingThrough(ctx context.Context, t task.Task, run func(context.Context, task.Task) (json.RawMessage, error)) (json.RawMessage, error) {
	var out json.RawMessage
	next := func(ctx context.Context) error {
		var err error
		out, err = run(ctx, t)
		return err
	}
	for i := len(c.workMW) - 1; i >= 0; i-- {
		mw, inner := c.workMW[i], next
		next = func(ctx context.Context) error { return mw(ctx, &t, inner) }
	}
	err := next(ctx)
	if err != nil {
		return nil, err
	}
	return out, nil
}
