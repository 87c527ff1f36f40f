// Package worker runs a replica's task workers.
//
// A Pool has one dispatcher and Workers workers. Only the dispatcher talks
// to the queue to find work: when something may have changed it claims, in
// one statement, up to one task for each idle worker, and hands each task
// to the worker it was claimed for. Workers never poll, so a notification
// costs one claim per replica, however many workers wait.
//
//	leasehold_task inserted ────────────┐
//	leasehold_task requeued (failed,    │
//	  or lapsed: the reaper) ───────────┤
//	the listener (re)connected ─────────┼──▶ dispatcher ──▶ Claim(names of the idle workers)
//	the next scheduled_at is due ───────┤        │              got all it asked for: claim again
//	a worker idle, work waiting ────────┤        │              got fewer: sleep until woken
//	safety poll (30s, last resort) ─────┘        │ one task each
//	                        ┌────────────────────┼────────────────────┐
//	                        ▼                    ▼                    ▼
//	                    worker w1            worker w2     …      worker wN
//	                 run + heartbeat      run + heartbeat
//
// The wake-ups are coalesced: whatever arrives while the dispatcher is busy
// is one more claim, not one per notification.
//
// Inserts notify only while someone waits for them (schema/0008): every
// notifying commit holds PostgreSQL's global notification lock through its
// WAL flush, so inserters that notify cannot share a flush. When a claim
// leaves workers idle the dispatcher registers as a waiter (a notify.Waiter
// named "<Instance>/workers") if it is not registered already, and claims
// once more: that claim catches up with the inserts made while it was not
// registered, and every later insert notifies. It unregisters once all its
// workers have been busy for WaitLinger (a worker that finishes makes it
// claim anyway), and when it stops. A registration names the LISTEN
// session; after a reconnect the resync's claim registers again.
//
// Completions are recorded in batches by one completer per pool (one
// statement and one commit for all that arrived while the previous one
// ran; a second statement beside it once half the pool's workers, and at
// least minSecondBatch, wait, so that a large pool's drain keeps two in
// flight). While the queue has a backlog (the dispatcher's last claim got a
// task for every idle worker) the completer's statement also claims each
// completing worker's next task (task.Store.CompleteAndClaim, Wake
// WakeChained): a busy replica runs one statement per round of tasks, not
// a claim and a completion. A chained claim that comes back short ends
// the chaining; the workers left without a task go idle and the dispatcher
// takes over. A task chained to a worker after Run's context ended is
// handed back at once.
//
// A worker runs its task while a heartbeat goroutine, started when the
// first heartbeat is nearly due, renews the task's lease every TTL/3. The worker counts the lease lost when a heartbeat is refused,
// or when none succeeded before its own deadline (the time the claim or the
// last successful heartbeat was sent + TTL − margin, on this process's
// monotonic clock, so that it steps down before the database can give the
// task to another worker). Either way the task's context is cancelled at
// once and the worker leaves the task alone: it neither completes nor fails
// it, and another worker claims it once its lease has lapsed.
//
// While the database cannot be reached the dispatcher claims nothing: a
// failed statement is retried with backoff (100ms doubling to 5s), logged
// once as a warning and then at debug level. A running task whose
// heartbeats fail counts as lost at its local deadline, as above, so the
// worker stops before the database could give the task to another. When the
// database is back, the listener's reconnect (a resync) or the next retry
// claims whatever is due, the tasks inserted meanwhile and those whose
// leases lapsed included.
//
// When Run's context ends the dispatcher stops claiming at once; running
// tasks get ShutdownGrace to finish, then are cancelled and handed back with
// task.Store.Requeue (no attempt counted), so that another replica takes
// them at once instead of after the TTL.
package worker
