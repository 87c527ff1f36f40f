// Package leasehold runs a Go program's background work and its
// "only one of us" jobs safely across many replicas, through leases stored
// in PostgreSQL: time-bounded exclusive ownership of a named resource, each
// acquisition with a fencing token greater than every one before.
//
// A Client gives a program
//
//   - tasks of its own kinds: typed arguments (TaskArgs), a Worker per kind
//     (AddWorker), queues with their own concurrency (Config.Queues),
//     Start and a graceful Stop. A worker claims only the kinds it has,
//     lowest (priority, scheduled_at, id) first, under a lease with a fence:
//     its Work gets the task with its Fence and Attempts and a context that
//     ends the moment the lease is lost or the task cancelled. Returning nil
//     completes the task; an error fails the attempt (the kind's backoff,
//     max attempts and timeout); Snooze and Cancel say more; a panic fails
//     it with its stack;
//   - inserts (Insert, InsertMany), also inside the program's own
//     transaction (InsertTx): a task inserted in a transaction that rolls
//     back never existed, one that commits is claimable at once, workers
//     woken by NOTIFY, never by polling; unique keys make an insert safe to
//     retry; Cancel, Retry and Get control tasks;
//   - leases (Client.Leases: Acquire, Renew, Release, Hold with a context
//     cancelled on loss) and leader election (Client.NewElector, with
//     client-go's callbacks).
//
// NewClient runs all of it on the program's own *pgxpool.Pool;
// NewRemoteClient on a leasehold service's REST API, with a token, for a
// program that has no database credentials: the same handlers, the same
// types. The types of leases and tasks are in packages lease and task; the
// tables come from `leasehold migrate` or Migrate.
//
// A worker in a few lines (the example programs of the repository's
// examples/ directory run whole ones):
//
//	type WelcomeEmail struct {
//		UserID int64 `json:"user_id"`
//	}
//
//	func (WelcomeEmail) Kind() string { return "welcome_email" }
//
//	workers := leasehold.NewWorkers()
//	err := leasehold.AddWorker(workers, leasehold.WorkFunc[WelcomeEmail](
//		func(ctx context.Context, t *leasehold.Task[WelcomeEmail]) error {
//			return send(ctx, t.Args.UserID, t.Fence)
//		}), leasehold.KindConfig{MaxAttempts: 10})
//	client, err := leasehold.NewClient(pool, leasehold.Config{Workers: workers})
//	err = client.Start(ctx)
//	defer client.Stop(context.Background())
//
//	tx, err := pool.Begin(ctx)
//	// ... insert the user in tx ...
//	_, err = client.InsertTx(ctx, tx, WelcomeEmail{UserID: id}, nil)
//	err = tx.Commit(ctx)
package leasehold
