// Package taskstore is leasehold's task queue on PostgreSQL: the statements
// that insert, claim, heartbeat, complete, fail, put back, cancel and retry
// tasks, each a compare-and-set on the task's row where a lease guards it.
// Package task holds the types, and draws the states.
//
// A task's lease lives in its own row (schema/0009): processor is the
// holder, fence the fencing token (drawn from the sequence every lease
// draws from, under the row lock), must_heartbeat_before the expiry, and
// ttl_seconds what a heartbeat renews it by. So a claim and a completion are
// one row write each. Every change of a running task is a compare-and-set
// on (processor, fence, lease live), so a worker that lost its lease (it
// stalled past the TTL, the task was claimed again, it was cancelled) is
// refused with task.ErrLeaseLost and can never complete the task: each task
// is done at most once, and one that is never completed is claimed again
// until it is done or dead. Each attempt that ends otherwise than by the
// completion (lapsed, failed, handed back, snoozed, cancelled) is appended
// to the row's earlier_attempts (task.Attempt): the task's lease history.
//
// A claim names the queues and kinds it can take (schema/0011): it reads
// only their branches (queue, kind, priority) of the pending index, lowest
// (priority, scheduled_at, id) first, and may carry hints that skip the
// entries its claimer's earlier claims left behind (Hint).
//
// The reaper announces a lapsed task lease by putting the task back to
// pending (RequeueLapsed): the statement trigger NOTIFYs "requeued", which
// wakes the workers. A cancellation of a running task NOTIFYs
// "cancelled:<id>", which stops its worker.
package taskstore
