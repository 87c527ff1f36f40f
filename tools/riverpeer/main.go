// Command riverpeer is the peer that leasehold's benchmark compares its drain
// with: it inserts and then drains no-op jobs with River
// (github.com/riverqueue/river), so that leasehold's drain figures can be set
// beside those of a well-known PostgreSQL job queue on the same machine and
// database server.
//
// It lives in a Go module of its own (tools/riverpeer/go.mod) so that River
// never enters leasehold's go.mod. The bench builds it with
//
//	go build -C tools/riverpeer -o PATH .
//
// Usage:
//
//	riverpeer insert --database-url URL --jobs N [--batch 1000] [--fast]
//	riverpeer drain  --database-url URL --jobs N [--workers 100] [--timeout 1h]
//	                 [--fetch-cooldown D] [--insert [--batch 1000] [--fast]]
//
// insert runs River's migrations up, then inserts N jobs of kind "bench_noop"
// through an insert-only client's InsertMany (InsertManyFast with --fast) in
// batches of --batch, and prints {"inserted":N,"seconds":S}; S counts the
// inserts only, not the migrations.
//
// drain expects exactly N available jobs, starts a client whose queue
// "default" has --workers workers and whose bench_noop worker returns nil at
// once, and measures from just before Client.Start until no job is available
// or running any more (polled every 10 ms). It then checks that exactly N jobs
// are completed, stops the client and prints
// {"jobs":N,"workers":W,"seconds":S,"jobs_per_second":R}. With --insert it
// first does the insert phase in the same process, outside the measured time.
//
// Only the JSON line goes to stdout; River's own logs go to stderr at warn
// level.
//
// River's settings are its defaults but for the queue's MaxWorkers. Note that
// River fetches at most MaxWorkers minus the running jobs per fetch, and
// fetches at most once per FetchCooldown (100 ms by default), so with no-op
// jobs its drain rate cannot exceed about MaxWorkers/FetchCooldown, 1,000
// jobs/s for 100 workers; --fetch-cooldown changes that setting for a run.
//
// Exit status is 0 on success, 1 on failure and 2 on bad usage. Use a
// database of its own: drain fails if other jobs are in river_job.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	// noopKind is the River job kind that riverpeer inserts and drains.
	noopKind = "bench_noop"

	// pollInterval is how often drain checks whether jobs are left.
	pollInterval = 10 * time.Millisecond

	// stopTimeout bounds the graceful Client.Stop after the drain.
	stopTimeout = 30 * time.Second

	// poolSpare is how many connections the drain pool has beyond --workers.
	poolSpare = 10

	// pendingQuery tells whether any job is left to work. It must be served
	// by an index (river_job_prioritized_fetching_index leads with state);
	// checkPendingPlan verifies this before the drain starts.
	pendingQuery = `SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN ('available', 'running'))`

	// countsQuery counts the completed jobs and all jobs.
	countsQuery = `SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM river_job`

	// availableQuery counts the jobs waiting to be worked.
	availableQuery = `SELECT count(*) FROM river_job WHERE state = 'available'`

	// statesQuery breaks river_job down by state, for error messages.
	statesQuery = `SELECT state::text, count(*) FROM river_job GROUP BY state ORDER BY state`
)

// noopArgs are the arguments of a bench_noop job: none.
type noopArgs struct{}

// Kind returns the River job kind of noopArgs.
func (noopArgs) Kind() string { return noopKind }

// noopWorker works bench_noop jobs by doing nothing.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

// Work returns nil at once, so that the job is completed.
func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// usageError is a command line that riverpeer cannot run; it exits 2.
// printed tells that the flag package has already reported it.
type usageError struct {
	msg     string
	printed bool
}

// Error returns the usage problem.
func (e *usageError) Error() string { return e.msg }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// insertOptions are the flags of the insert phase.
type insertOptions struct {
	databaseURL string
	jobs        int
	batch       int
	fast        bool
}

// drainOptions are the flags of the drain subcommand.
type drainOptions struct {
	insertOptions
	workers       int
	timeout       time.Duration
	insert        bool
	fetchCooldown time.Duration
}

// insertResult is the JSON line printed by insert.
type insertResult struct {
	Inserted int     `json:"inserted"`
	Seconds  float64 `json:"seconds"`
}

// drainResult is the JSON line printed by drain.
type drainResult struct {
	Jobs          int     `json:"jobs"`
	Workers       int     `json:"workers"`
	Seconds       float64 `json:"seconds"`
	JobsPerSecond float64 `json:"jobs_per_second"`
}

// topUsage is printed for a missing or unknown subcommand.
const topUsage = `usage:
  riverpeer insert --database-url URL --jobs N [--batch 1000] [--fast]
  riverpeer drain  --database-url URL --jobs N [--workers 100] [--timeout 1h] [--fetch-cooldown D] [--insert [--batch 1000] [--fast]]
Run "riverpeer insert -h" or "riverpeer drain -h" for the flags.
`

// main runs riverpeer and exits with its status.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit status: 0 on
// success, 1 on failure, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "riverpeer: missing subcommand\n"+topUsage)
		return 2
	}
	var err error
	switch args[0] {
	case "insert":
		err = runInsert(ctx, args[1:], stdout, stderr)
	case "drain":
		err = runDrain(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, topUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "riverpeer: unknown subcommand %q\n%s", args[0], topUsage)
		return 2
	}
	var uerr *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &uerr) && uerr.printed:
		return 2
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "riverpeer %s: %v\nRun \"riverpeer %s -h\" for the flags.\n", args[0], err, args[0])
		return 2
	default:
		fmt.Fprintf(stderr, "riverpeer %s: %v\n", args[0], err)
		return 1
	}
}

// newFlagSet returns a flag set for subcommand name that reports its errors
// to run instead of exiting, and prints its usage on stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("riverpeer "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: riverpeer %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs and turns a flag error into a usageError;
// the flag package has already printed the problem and the usage then.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error(), printed: true}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// addInsertFlags defines the insert phase's flags on fs, filling o.
func addInsertFlags(fs *flag.FlagSet, o *insertOptions) {
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection `URL` (required)")
	fs.IntVar(&o.jobs, "jobs", 0, "number of jobs `N` (required, at least 1)")
	fs.IntVar(&o.batch, "batch", 1000, "jobs per InsertMany call")
	fs.BoolVar(&o.fast, "fast", false, "insert with InsertManyFast (COPY FROM) instead of InsertMany")
}

// validate checks the insert phase's flags.
func (o *insertOptions) validate() error {
	if o.databaseURL == "" {
		return usagef("--database-url is required")
	}
	if o.jobs < 1 {
		return usagef("--jobs must be at least 1, got %d", o.jobs)
	}
	if o.batch < 1 {
		return usagef("--batch must be at least 1, got %d", o.batch)
	}
	return nil
}

// runInsert is the insert subcommand.
func runInsert(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o insertOptions
	fs := newFlagSet("insert", "--database-url URL --jobs N [--batch 1000] [--fast]", stderr)
	addInsertFlags(fs, &o)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return usagef("bad --database-url: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open pool: %w", err)
	}
	defer pool.Close()

	logger := newLogger(stderr)
	elapsed, err := migrateAndInsert(ctx, pool, logger, o)
	if err != nil {
		return err
	}
	return writeJSON(stdout, insertResult{Inserted: o.jobs, Seconds: elapsed.Seconds()})
}

// newLogger returns the slog logger handed to River: text on w, warn level
// and above, so that River does not flood the output.
func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// migrateAndInsert runs River's migrations up on pool's database, then
// inserts o.jobs bench_noop jobs through an insert-only client. It returns
// how long the inserts took, migrations excluded.
func migrateAndInsert(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, o insertOptions) (time.Duration, error) {
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: logger})
	if err != nil {
		return 0, fmt.Errorf("create River migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, fmt.Errorf("migrate River schema up: %w", err)
	}

	// No Queues and no Workers: River allows an insert-only client so.
	client, err := river.NewClient(driver, &river.Config{Logger: logger})
	if err != nil {
		return 0, fmt.Errorf("create insert-only River client: %w", err)
	}

	params := make([]river.InsertManyParams, min(o.batch, o.jobs))
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}}
	}
	start := time.Now()
	for done := 0; done < o.jobs; {
		batch := params[:min(len(params), o.jobs-done)]
		var n int
		if o.fast {
			n, err = client.InsertManyFast(ctx, batch)
		} else {
			res, ierr := client.InsertMany(ctx, batch)
			n, err = len(res), ierr
		}
		if err != nil {
			return 0, fmt.Errorf("insert jobs %d to %d of %d: %w", done+1, done+len(batch), o.jobs, err)
		}
		if n != len(batch) {
			return 0, fmt.Errorf("insert jobs %d to %d of %d: River inserted %d of a batch of %d",
				done+1, done+len(batch), o.jobs, n, len(batch))
		}
		done += n
	}
	return time.Since(start), nil
}

// runDrain is the drain subcommand.
func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o drainOptions
	fs := newFlagSet("drain",
		"--database-url URL --jobs N [--workers 100] [--timeout 1h] [--fetch-cooldown D] [--insert [--batch 1000] [--fast]]", stderr)
	addInsertFlags(fs, &o.insertOptions)
	fs.IntVar(&o.workers, "workers", 100, fmt.Sprintf("MaxWorkers of queue %q (1 to %d)", river.QueueDefault, river.QueueNumWorkersMax))
	fs.DurationVar(&o.timeout, "timeout", time.Hour, "give up if the jobs are not drained within this time (River with 100 workers drains at most about 1,000 jobs/s by default)")
	fs.BoolVar(&o.insert, "insert", false, "migrate and insert the jobs first (not counted in the drain time)")
	fs.DurationVar(&o.fetchCooldown, "fetch-cooldown", 0,
		fmt.Sprintf("River's Config.FetchCooldown; 0 keeps River's default (%v)", river.FetchCooldownDefault))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	if o.workers < 1 || o.workers > river.QueueNumWorkersMax {
		return usagef("--workers must be between 1 and %d, got %d", river.QueueNumWorkersMax, o.workers)
	}
	if o.timeout <= 0 {
		return usagef("--timeout must be positive, got %v", o.timeout)
	}
	if o.fetchCooldown != 0 && o.fetchCooldown < river.FetchCooldownMin {
		return usagef("--fetch-cooldown must be 0 or at least %v, got %v", river.FetchCooldownMin, o.fetchCooldown)
	}
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return usagef("bad --database-url: %v", err)
	}
	cfg.MaxConns = int32(o.workers + poolSpare) // workers <= 10_000: no overflow
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open pool: %w", err)
	}
	defer pool.Close()

	logger := newLogger(stderr)
	if o.insert {
		if _, err := migrateAndInsert(ctx, pool, logger, o.insertOptions); err != nil {
			return err
		}
	}
	res, err := drain(ctx, pool, logger, o)
	if err != nil {
		return err
	}
	return writeJSON(stdout, res)
}

// drain works the o.jobs available bench_noop jobs with a River client of
// o.workers workers and measures how long it takes.
func drain(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, o drainOptions) (drainResult, error) {
	// The poll runs on a connection of its own, outside River's pool, where
	// sequential scans are off: once most jobs are completed, a sequential
	// scan for the few left would read the whole table every 10 ms.
	pollCfg := pool.Config().ConnConfig.Copy()
	pollCfg.RuntimeParams["enable_seqscan"] = "off"
	poll, err := pgx.ConnectConfig(ctx, pollCfg)
	if err != nil {
		return drainResult{}, fmt.Errorf("open poll connection: %w", err)
	}
	defer poll.Close(context.WithoutCancel(ctx))
	if err := checkPendingPlan(ctx, poll); err != nil {
		return drainResult{}, err
	}
	var available int64
	if err := poll.QueryRow(ctx, availableQuery).Scan(&available); err != nil {
		return drainResult{}, fmt.Errorf("count available jobs: %w", err)
	}
	if available != int64(o.jobs) {
		return drainResult{}, fmt.Errorf("expected %d available jobs before the drain, found %d (jobs by state: %s)",
			o.jobs, available, jobStates(ctx, poll))
	}

	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, noopWorker{}); err != nil {
		return drainResult{}, fmt.Errorf("register %s worker: %w", noopKind, err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown: o.fetchCooldown, // 0: River's default
		Logger:        logger,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.workers}},
		Workers:       workers,
	})
	if err != nil {
		return drainResult{}, fmt.Errorf("create River client: %w", err)
	}

	waitCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return drainResult{}, fmt.Errorf("start River client: %w", err)
	}
	elapsed, waitErr := waitDrained(waitCtx, poll, start)

	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer stopCancel()
	stopErr := client.Stop(stopCtx)
	if waitErr != nil {
		return drainResult{}, errors.Join(waitErr, wrapIf("stop River client", stopErr))
	}
	if stopErr != nil {
		return drainResult{}, fmt.Errorf("stop River client: %w", stopErr)
	}

	var completed, total int64
	if err := poll.QueryRow(ctx, countsQuery).Scan(&completed, &total); err != nil {
		return drainResult{}, fmt.Errorf("count completed jobs: %w", err)
	}
	if completed != int64(o.jobs) || total != int64(o.jobs) {
		return drainResult{}, fmt.Errorf("after the drain %d of %d jobs are completed, expected all %d (jobs by state: %s)",
			completed, total, o.jobs, jobStates(ctx, poll))
	}
	secs := elapsed.Seconds()
	return drainResult{
		Jobs:          o.jobs,
		Workers:       o.workers,
		Seconds:       secs,
		JobsPerSecond: float64(o.jobs) / secs,
	}, nil
}

// waitDrained polls every pollInterval until no job is available or running,
// and returns the time since start at which it saw so.
func waitDrained(ctx context.Context, conn *pgx.Conn, start time.Time) (time.Duration, error) {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		var pending bool
		if err := conn.QueryRow(ctx, pendingQuery).Scan(&pending); err != nil {
			return 0, fmt.Errorf("poll for pending jobs after %v: %w", time.Since(start).Round(time.Millisecond), err)
		}
		if !pending {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("jobs not drained after %v (jobs by state: %s): %w",
				time.Since(start).Round(time.Millisecond), jobStates(context.WithoutCancel(ctx), conn), context.Cause(ctx))
		case <-ticker.C:
		}
	}
}

// checkPendingPlan makes sure that pendingQuery is answered from an index
// on conn rather than by a sequential scan of river_job.
func checkPendingPlan(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, "EXPLAIN "+pendingQuery)
	if err != nil {
		return fmt.Errorf("explain poll query: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("explain poll query: %w", err)
	}
	plan := strings.Join(lines, "\n")
	if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index") {
		return fmt.Errorf("poll query does not use an index on river_job; plan:\n%s", plan)
	}
	return nil
}

// jobStates describes how many river_job rows are in each state, for error
// messages; it never fails, describing its own error instead.
func jobStates(ctx context.Context, conn *pgx.Conn) string {
	rows, err := conn.Query(ctx, statesQuery)
	if err != nil {
		return "unknown: " + err.Error()
	}
	type stateCount struct {
		State string
		Count int64
	}
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stateCount])
	if err != nil {
		return "unknown: " + err.Error()
	}
	if len(counts) == 0 {
		return "none"
	}
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = fmt.Sprintf("%s=%d", c.State, c.Count)
	}
	return strings.Join(parts, " ")
}

// wrapIf wraps err with msg, or returns nil if err is nil.
func wrapIf(msg string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// writeJSON prints v as one JSON line on w.
func writeJSON(w io.Writer, v any) error {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}
