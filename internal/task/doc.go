// Package task is leasehold's task queue on PostgreSQL.
//
// A task moves through these states:
//
//	          Claim: a new lease in the task's row
//	          and fence, attempts + 1
//	pending ───────────────────────────────▶ running ──┐
//	  ▲  ▲                                   │  │  ▲ ◀──┘ Heartbeat: the lease renewed
//	  │  │ Fail (attempts left):             │  │  │
//	  │  └─ backoff with jitter ─────────────┘  │  │ the lease lapsed (worker crashed
//	  │                                         │  │ or stalled): the reaper's
//	  │  Requeue (shutdown: no attempt counted) │  │ RequeueLapsed puts it back,
//	  │  RequeueLapsed (the lease lapsed)       │  │ or Claim takes it again
//	  └─────────────────────────────────────────┤  └───────────────────────────────
//	                                            ├── Complete ──▶ done
//	                                            └── Fail, no attempts left,
//	                                                or lapsed on the last one ──▶ dead
//
// A task's lease lives in its own row (schema/0009): processor is the
// holder, fence the fencing token (drawn from the sequence every lease
// draws from, under the row lock), must_heartbeat_before the expiry, and
// ttl_seconds what a heartbeat renews it by. So a claim and a completion are
// one row write each. Every change of a running task is a compare-and-set
// on (processor, fence, lease live), so a worker that lost its lease (it
// stalled past the TTL, the task was claimed again) is refused with
// ErrLeaseLost and can never complete the task: each task is done at most
// once, and one that is never completed is claimed again until it is done
// or dead. Each attempt that ends otherwise than by the completion (lapsed,
// failed, handed back) is appended to the row's earlier_attempts (Attempt):
// the task's lease history.
//
// The reaper announces a lapsed task lease by putting the task back to
// pending (RequeueLapsed): the statement trigger NOTIFYs "requeued", which
// wakes the workers.
package task
