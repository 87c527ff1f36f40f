package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
)

// The soak's applications: programs of a user's, as the library runs them beside the
// replicas, under the same faults. Each runs the workers of two kinds of its own, which
// "leasehold serve" does not run, in the default queue and in the paused one (pausedQueue);
// one is embedded on its own pool (and also inserts tasks in transactions of its own), the
// other remote, on the replicas' REST API through a front door.
const (
	// KindDigest: sha256 of text, applied rounds times; with snooze, the first run
	// asks to run again later.
	KindDigest = "chaos_digest"
	// KindFlaky: sleeps, honouring its context; with fail_first, its first attempt
	// fails and a retry after the kind's backoff completes it.
	KindFlaky = "chaos_flaky"

	// KindShell: run by `leasehold work` processes as a shell command (shellScript):
	// it sleeps, fails its first attempt when asked to, and prints its input with the
	// attempt and fence it ran under.
	KindShell = "chaos_shell"

	// AppEmbedded and AppRemote are the two applications' names (their Config.ID).
	AppEmbedded = "app-embedded"
	AppRemote   = "app-remote"
	// WorkA and WorkB are the two `leasehold work` processes (their --processor), on
	// the front door, each with workSlots slots, taking tasks of the default queue and
	// of pausedQueue.
	WorkA = "work-a"
	WorkB = "work-b"
	// workSlots is each work process's --concurrency.
	workSlots = 4
	// shellTTL is the lease TTL of a KindShell task. A work process gives its task's lease
	// up TTL/10 + its kill grace (shutdownGrace) before the TTL runs out, so that the
	// command is gone before another worker can claim the task: with the soak's 2 s TTL
	// that left 0.8 s for a heartbeat through the front door and a replica, which a loaded
	// machine overran, each loss an attempt. With 4 s it has 2.6 s, more than the
	// applications' 1.8 s.
	shellTTL = 4 * time.Second
	// appAttempts is the max_attempts of the applications' kinds and of KindShell: on a
	// loaded machine a kill, a pause and a failover can each cost one task an attempt,
	// and KindShell's default 5 was seen used up so.
	appAttempts = 20

	// appWorkers is each application's concurrency.
	appWorkers = 4
	// ordersEvery is how often the embedded application inserts an order and its task
	// in one transaction of its own.
	ordersEvery = 250 * time.Millisecond
	// snoozeFor is how long a digest task asking for it snoozes.
	snoozeFor = 500 * time.Millisecond
	// maxRounds bounds a digest's rounds.
	maxRounds = 10000
)

// DigestArgs are the arguments of a KindDigest task.
type DigestArgs struct {
	Text   string `json:"text"`
	Rounds int    `json:"rounds"`
	Snooze bool   `json:"snooze,omitempty"`
}

// Kind names the kind.
func (DigestArgs) Kind() string { return KindDigest }

// FlakyArgs are the arguments of a KindFlaky task.
type FlakyArgs struct {
	SleepMS   int  `json:"sleep_ms"`
	FailFirst bool `json:"fail_first,omitempty"`
}

// Kind names the kind.
func (FlakyArgs) Kind() string { return KindFlaky }

// ShellArgs are the arguments of a KindShell task.
type ShellArgs struct {
	SleepMS   int  `json:"sleep_ms"` // below 1000
	FailFirst bool `json:"fail_first"`
}

// ShellOutput is what a KindShell task's output must be: its arguments, and the
// attempt and fence of the run that printed them.
type ShellOutput struct {
	Data    ShellArgs `json:"data"`
	Attempt int       `json:"attempt"`
	Fence   int64     `json:"fence"`
}

// shellScript is the command of the work processes: plain sh, as a user's script
// would be. It reads the task's data from stdin and its attempt and fence from the
// environment leasehold work gives it.
const shellScript = `data=$(cat)
ms=$(printf '%s' "$data" | sed -n 's/.*"sleep_ms": *\([0-9]*\).*/\1/p')
sleep "$(printf '0.%03d' "${ms:-0}")"
case "$data" in
*'"fail_first": true'* | *'"fail_first":true'*)
	if [ "$LEASEHOLD_ATTEMPT" = 1 ]; then
		echo "failing the first attempt, as asked" >&2
		exit 3
	fi ;;
esac
printf '{"data": %s, "attempt": %s, "fence": %s}\n' "$data" "$LEASEHOLD_ATTEMPT" "$LEASEHOLD_FENCE"
`

// Digest is what a KindDigest task's output must be.
func Digest(text string, rounds int) string {
	sum := sha256.Sum256([]byte(text))
	for range rounds - 1 {
		sum = sha256.Sum256(sum[:])
	}
	return hex.EncodeToString(sum[:])
}

// AppOptions configure one application process (RunApp).
type AppOptions struct {
	// Name is the application's Config.ID: AppEmbedded or AppRemote.
	Name string
	// Addr is where it answers GET /readyz, once its client has started.
	Addr string
	// DatabaseURL, for the embedded one; ServiceURL (a front door), for the remote one.
	DatabaseURL, ServiceURL string
	// TaskTTL is its tasks' lease TTL; ShutdownGrace its Stop's.
	TaskTTL, ShutdownGrace time.Duration
	// Log is its client's Config.Logger (nil: it logs nothing).
	Log *slog.Logger
}

// workersOf are the two kinds' workers.
func workersOf() (*leasehold.Workers, error) {
	w := leasehold.NewWorkers()
	err := leasehold.AddWorker(w, leasehold.WorkFunc[DigestArgs](func(ctx context.Context, t *leasehold.Task[DigestArgs]) error {
		if t.Args.Rounds < 1 || t.Args.Rounds > maxRounds {
			return leasehold.Cancel(fmt.Errorf("rounds %d: want 1 to %d", t.Args.Rounds, maxRounds))
		}
		if t.Args.Snooze && time.Since(t.CreatedAt) < snoozeFor {
			return leasehold.Snooze(snoozeFor)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return leasehold.RecordOutput(ctx, map[string]string{"digest": Digest(t.Args.Text, t.Args.Rounds)})
	}), leasehold.KindConfig{MaxAttempts: appAttempts, Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	err = leasehold.AddWorker(w, leasehold.WorkFunc[FlakyArgs](func(ctx context.Context, t *leasehold.Task[FlakyArgs]) error {
		timer := time.NewTimer(time.Duration(t.Args.SleepMS) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-timer.C:
		}
		if t.Args.FailFirst && t.Attempts == 1 {
			return errors.New("the first attempt fails, as the task asks")
		}
		return leasehold.RecordOutput(ctx, map[string]any{"slept_ms": t.Args.SleepMS, "attempt": t.Attempts})
	}), leasehold.KindConfig{MaxAttempts: appAttempts, Timeout: 10 * time.Second,
		Backoff: func(int) time.Duration { return 100 * time.Millisecond }})
	return w, err
}

// RunApp runs one application until ctx ends, then stops its client gracefully.
func RunApp(ctx context.Context, o AppOptions) error {
	workers, err := workersOf()
	if err != nil {
		return err
	}
	cfg := leasehold.Config{
		ID: o.Name, Workers: workers, TaskTTL: o.TaskTTL, ShutdownGrace: o.ShutdownGrace, Logger: o.Log,
		Queues: map[string]leasehold.QueueConfig{"default": {MaxWorkers: appWorkers}, pausedQueue: {MaxWorkers: pausedWorkers}},
	}
	var (
		client *leasehold.Client
		pool   *pgxpool.Pool
	)
	switch {
	case o.DatabaseURL != "":
		pc, err := pgxpool.ParseConfig(o.DatabaseURL)
		if err != nil {
			return err
		}
		// The name the disconnect fault looks for.
		pc.ConnConfig.RuntimeParams["application_name"] = "leasehold " + o.Name
		// As a program on the library does (docs/operations/postgresql-and-failover.md): after a failover, the fences of
		// the new primary's timeline lie above the old one's before this pool grants any.
		pc.AfterConnect = leasehold.PrepareSession
		if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return err
		}
		defer pool.Close()
		client, err = leasehold.NewClient(pool, cfg)
		if err != nil {
			return err
		}
	case o.ServiceURL != "":
		client, err = leasehold.NewRemoteClient(leasehold.RemoteConfig{URL: o.ServiceURL}, cfg)
		if err != nil {
			return err
		}
	default:
		return errors.New("chaos app: neither a database nor a service URL")
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		_ = client.Stop(context.WithoutCancel(ctx))
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	if pool != nil {
		go insertOrders(ctx, pool, client)
	}
	<-ctx.Done()
	_ = srv.Close()
	return client.Stop(context.WithoutCancel(ctx))
}

// insertOrders inserts, every ordersEvery until ctx ends, an order and its digest task in
// one transaction: the soak checks at the end that every order has its task and every
// such task its order, whatever the faults did to the transactions under way.
func insertOrders(ctx context.Context, pool *pgxpool.Pool, client *leasehold.Client) {
	tick := time.NewTicker(ordersEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The soak stops the orders before it drains the queue
			// (stopOrders): it waits for this row, and no order comes after.
			var stopped bool
			if err := tx.QueryRow(ctx, `SELECT stopped FROM chaos_orders_control FOR SHARE`).Scan(&stopped); err != nil || stopped {
				return err
			}
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO chaos_orders DEFAULT VALUES RETURNING id`).Scan(&id); err != nil {
				return err
			}
			res, err := client.InsertTx(ctx, tx, DigestArgs{Text: fmt.Sprintf("order %d", id), Rounds: 100},
				&leasehold.InsertOpts{UniqueKey: fmt.Sprintf("order:%d", id)})
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE chaos_orders SET task_id = $1 WHERE id = $2`, res.Task.ID, id)
			return err
		})
	}
}

// ordersTable is the embedded application's own table, created with the soak's database,
// and the row that says whether the applications still insert orders.
const ordersTable = `CREATE TABLE chaos_orders (id bigserial PRIMARY KEY, task_id bigint UNIQUE);
CREATE TABLE chaos_orders_control (stopped boolean NOT NULL);
INSERT INTO chaos_orders_control VALUES (false)`

// stopOrders makes the applications insert no more orders, once every order under way is
// committed or rolled back (their transactions hold the control row FOR SHARE), so that the
// drain that follows sees each of their tasks. An application restarted later stops too: the
// flag is in the database.
func stopOrders(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `UPDATE chaos_orders_control SET stopped = true`)
	return err
}
