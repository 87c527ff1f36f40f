package checker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/lease"
)

// Read reads the history of pool's database whole, as Check reads it (one
// read-only REPEATABLE READ transaction), for the rules that judge several
// histories at once (VerifyFences).
func Read(ctx context.Context, pool *pgxpool.Pool) (History, error) {
	var h History
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&h.ReadAt); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		if err := streamEvents(ctx, tx, func(es []lease.Event) { h.Events = append(h.Events, es...) }); err != nil {
			return fmt.Errorf("read lease_events: %w", err)
		}
		if err := streamTasks(ctx, tx, func(t Task) { h.Tasks = append(h.Tasks, t) }); err != nil {
			return fmt.Errorf("read tasks: %w", err)
		}
		var err error
		if h.Limits, err = readLimits(ctx, tx); err != nil {
			return fmt.Errorf("read lease_limits: %w", err)
		}
		if h.Rates, err = readRates(ctx, tx); err != nil {
			return fmt.Errorf("read the rates of lease_limits: %w", err)
		}
		return nil
	})
	if err != nil {
		return History{}, fmt.Errorf("checker: read the history: %w", err)
	}
	return h, nil
}

// VerifyFences judges RuleFenceReused over the union of several histories
// of one leasehold database read from different servers: after a failover
// that lost transactions, the old primary's (all it committed, its lost
// commits included: see localpg's ReopenOld) and the new primary's. Each
// server's sequences (of fences, of event and task ids) may have handed out
// the same numbers again after they diverged, so an acquisition is known by
// more than its number: a lease's acquired event by resource, holder, fence
// and time, a task attempt by the task's id and creation, its processor,
// fence and start. One seen in several histories (made before they
// diverged) counts once. Any fence two acquisitions share is a violation,
// unless they are a gated task's attempt and its lock's acquisition (its
// slot's, for a key of k slots), which share one fence by design. The
// report counts the distinct acquisitions (Acquisitions, TaskAttempts) and
// carries the latest ReadAt.
func VerifyFences(hs ...History) *Report {
	var limits []map[string]int
	for _, h := range hs {
		limits = append(limits, h.Limits)
	}
	v := newVerifier(Options{}, time.Time{}, nil, mergeLimits(limits...), nil)
	seen := map[string]bool{}
	use := func(key string, u fenceUse) {
		if seen[key] {
			return
		}
		seen[key] = true
		v.rep.Acquisitions++
		if u.attempt > 0 {
			v.rep.TaskAttempts++
		}
		v.fences = append(v.fences, u)
	}
	for _, h := range hs {
		if h.ReadAt.After(v.rep.ReadAt) {
			v.rep.ReadAt = h.ReadAt
		}
		v.rep.Events += len(h.Events)
		for _, e := range h.Events {
			if e.Kind == kindAcquired {
				use(fmt.Sprintf("lease\x00%s\x00%s\x00%d\x00%s", e.Resource, e.Holder, e.Fence, ts(e.At)),
					fenceUse{fence: e.Fence, id: e.ID, resource: e.Resource})
			}
		}
		for _, t := range h.Tasks {
			task := fmt.Sprintf("task\x00%d\x00%s", t.ID, ts(t.CreatedAt))
			for i, a := range t.Attempts {
				use(fmt.Sprintf("%s\x00%s\x00%d\x00%s", task, a.Processor, a.Fence, ts(a.StartedAt)),
					fenceUse{fence: a.Fence, id: t.ID, attempt: i + 1, lock: t.Lock})
			}
			if hasCurrent(t) {
				use(fmt.Sprintf("%s\x00%s\x00%d\x00%s", task, t.Processor, t.Fence, ts(t.StartedAt)),
					fenceUse{fence: t.Fence, id: t.ID, attempt: len(t.Attempts) + 1, lock: t.Lock})
			}
		}
	}
	v.checkFencesUnique()
	return v.rep
}
