// Package task is leasehold's task queue on PostgreSQL.
//
// A task moves through these states:
//
//	          Claim: a new lease task:<id> and fence,
//	          attempts + 1
//	pending ───────────────────────────────▶ running ──┐
//	  ▲  ▲                                   │  │  ▲ ◀──┘ Heartbeat: the lease renewed
//	  │  │ Fail (attempts left):             │  │  │
//	  │  └─ backoff with jitter ─────────────┘  │  │ the lease lapsed (worker crashed
//	  │                                         │  │ or stalled): Claim takes it again
//	  │  Requeue (shutdown: no attempt counted) │  └───────────────────────────────
//	  └─────────────────────────────────────────┤
//	                                            ├── Complete ──▶ done
//	                                            └── Fail, no attempts left,
//	                                                or lapsed on the last one ──▶ dead
//
// Every change of a running task is a compare-and-set on (processor, fence,
// lease live) made in the same statement as the change of its lease, so a
// worker that lost its lease (it stalled past the TTL, the task was claimed
// again) is refused with ErrLeaseLost and can never complete the task: each
// task is done at most once, and one that is never completed is claimed
// again until it is done or dead.
package task
