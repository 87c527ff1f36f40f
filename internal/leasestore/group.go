package leasestore

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/internal/db"
)

// maxGroup bounds the operations one group carries: a group is sent in one
// write, which should fit the socket's buffer.
const maxGroup = 64

// groupTimeout bounds a group whose operations have no deadline of their own.
const groupTimeout = 30 * time.Second

// committer lets concurrent lease operations share commits. Every
// transaction that NOTIFYs (each lease change does) holds PostgreSQL's
// notification lock through its commit's WAL flush, so such commits never
// share a flush: one operation per transaction caps the whole server near
// one client's commit rate. Grouped, one flush carries every operation of a
// kind that arrived while the previous group committed.
//
// Each group goes to the server as one pipelined batch per kind (acquire,
// renew, release) ending in a single Sync: one implicit transaction, which
// the server runs and commits without waiting for the client. So a replica
// paused mid-group (SIGSTOP, a GC pause) holds no row lock while it is
// paused, as an explicit BEGIN … COMMIT would. The statements are exactly
// those the operations would run alone; a group has at most one operation
// per resource (all of a transaction's statements read one now()), ordered
// by resource, so that two groups take their row locks in the same order
// and cannot deadlock.
//
// It is leader-based group commit: an operation that arrives while no group
// runs leads one at once (alone when the store is idle: no added latency);
// operations that arrive meanwhile queue, and when the group is done the
// first of them leads the next, all of them in it.
type committer struct {
	q *db.Queries

	mu      sync.Mutex
	leading bool
	queue   []*groupOp
}

type opKind int

const (
	opAcquire opKind = iota
	opRenew
	opRelease
)

// groupOp is one operation and, once done is closed, its outcome.
type groupOp struct {
	ctx      context.Context
	resource string
	kind     opKind
	acquire  db.LeaseAcquireParams
	renew    db.LeaseRenewParams
	release  db.LeaseReleaseParams

	acquired db.LeaseAcquireRow // opAcquire's row
	row      db.Lease           // opRenew's and opRelease's row
	err      error              // pgx.ErrNoRows: no row, as the statement alone would say

	done chan struct{}
	lead chan struct{}
}

func newCommitter(q *db.Queries) *committer { return &committer{q: q} }

// do runs op in the next group and returns once its outcome is known.
func (c *committer) do(ctx context.Context, op *groupOp) {
	op.ctx, op.done, op.lead = ctx, make(chan struct{}), make(chan struct{}, 1)
	c.mu.Lock()
	c.queue = append(c.queue, op)
	if c.leading {
		c.mu.Unlock()
		select {
		case <-op.done:
			return
		case <-op.lead:
		}
		c.mu.Lock()
	}
	c.leading = true
	group := c.take()
	c.mu.Unlock()

	c.run(group)

	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].lead <- struct{}{} // the next group's leader; leading stays true
	} else {
		c.leading = false
	}
	c.mu.Unlock()
}

// take removes the next group from the queue, in order: at most maxGroup
// operations and one per resource. c.mu is held; the leader's operation is
// first in the queue, so it is always in its own group.
func (c *committer) take() []*groupOp {
	var group, rest []*groupOp
	seen := make(map[string]bool, len(c.queue))
	for _, op := range c.queue {
		if len(group) < maxGroup && !seen[op.resource] {
			seen[op.resource] = true
			group = append(group, op)
		} else {
			rest = append(rest, op)
		}
	}
	c.queue = rest
	return group
}

// run sends the group, a batch per kind, and tells each operation its
// outcome.
func (c *committer) run(group []*groupOp) {
	defer func() {
		for _, op := range group {
			close(op.done)
		}
	}()
	byKind := make(map[opKind][]*groupOp, 3)
	for _, op := range group {
		if err := op.ctx.Err(); err != nil {
			op.err = context.Cause(op.ctx) // its caller gave up while it waited
			continue
		}
		byKind[op.kind] = append(byKind[op.kind], op)
	}
	for _, kind := range []opKind{opAcquire, opRenew, opRelease} {
		ops := byKind[kind]
		if len(ops) == 0 {
			continue
		}
		slices.SortFunc(ops, func(a, b *groupOp) int { return cmp.Compare(a.resource, b.resource) })
		ctx, cancel := groupContext(ops)
		err := c.send(ctx, kind, ops)
		cancel()
		switch {
		case err == nil:
		case len(ops) > 1 && oneStatementFailed(err):
			// A statement failed, so the batch's transaction was rolled back
			// and none of it happened: each on its own, so that one
			// operation's failure is not the others'.
			for _, op := range ops {
				c.alone(kind, op)
			}
		default:
			for _, op := range ops {
				if op.err == nil || errors.Is(op.err, pgx.ErrNoRows) {
					op.err = err // the outcome of the whole batch is unknown
				}
			}
		}
		if kind == opAcquire {
			c.retryRaces(ops)
		}
	}
}

// retryRaces runs again, alone, the acquisitions that found the lease
// changing between the two halves of their statement (no row: a concurrent
// insert, or an expiry).
func (c *committer) retryRaces(ops []*groupOp) {
	for _, op := range ops {
		for range 9 {
			if !errors.Is(op.err, pgx.ErrNoRows) {
				break
			}
			c.alone(opAcquire, op)
		}
	}
}

// alone runs op in a batch of its own, as it would run without groups.
func (c *committer) alone(kind opKind, op *groupOp) {
	if err := c.send(op.ctx, kind, []*groupOp{op}); err != nil {
		op.err = err
	}
}

// oneStatementFailed reports whether a batch failed on one of its
// statements (a constraint, a deadlock), which running the operations
// alone would confine to one of them; not when the server or the
// connection failed, or a statement ran out of time, which would fail
// them all again, one after another.
func oneStatementFailed(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "53", "57": // connection, resources, operator intervention (statement_timeout included)
		return false
	}
	return true
}

// send runs ops, all of kind, as one batch: one round trip, one implicit
// transaction. Each operation's own outcome lands in it (pgx.ErrNoRows
// included); the error returned is the batch's, nil when it committed.
func (c *committer) send(ctx context.Context, kind opKind, ops []*groupOp) error {
	var results interface{ Close() error }
	switch kind {
	case opAcquire:
		params := make([]db.LeaseAcquireParams, len(ops))
		for i, op := range ops {
			params[i] = op.acquire
		}
		br := c.q.LeaseAcquire(ctx, params)
		br.QueryRow(func(i int, row db.LeaseAcquireRow, err error) { ops[i].acquired, ops[i].err = row, err })
		results = br
	case opRenew:
		params := make([]db.LeaseRenewParams, len(ops))
		for i, op := range ops {
			params[i] = op.renew
		}
		br := c.q.LeaseRenew(ctx, params)
		br.QueryRow(func(i int, row db.Lease, err error) { ops[i].row, ops[i].err = row, err })
		results = br
	case opRelease:
		params := make([]db.LeaseReleaseParams, len(ops))
		for i, op := range ops {
			params[i] = op.release
		}
		br := c.q.LeaseRelease(ctx, params)
		br.QueryRow(func(i int, row db.Lease, err error) { ops[i].row, ops[i].err = row, err })
		results = br
	}
	if err := results.Close(); err != nil {
		return err
	}
	for _, op := range ops {
		if op.err != nil && !errors.Is(op.err, pgx.ErrNoRows) {
			return op.err
		}
	}
	return nil
}

// groupContext bounds a batch by the latest deadline of its operations: no
// caller waits longer, and none is cut short.
func groupContext(ops []*groupOp) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, op := range ops {
		d, ok := op.ctx.Deadline()
		if !ok {
			latest = time.Now().Add(groupTimeout)
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
