// Package bench measures leasehold's hot paths against a real PostgreSQL: lease operations,
// draining and steady task throughput, pickup latency, the cost of the NOTIFY triggers and
// the dashboard's fan-out, with pgbench's simple-update as the machine's durable-commit
// ceiling. `leasehold bench` runs it; each scenario gets a fresh, migrated database of its
// own, dropped afterwards.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schema"
)

// Scenarios are the scenario names in the order Run runs them, by default.
var Scenarios = []string{"baseline", "leases", "drain", "steady", "latency", "notify-cost", "fanout", "bulk-insert"}

// Optional are the scenarios that run only when named: long ones.
var Optional = []string{"backlog", "longpoll", "capacity", "river", "pickup", "keys", "claim-parts"}

// Config is what to measure and how hard.
type Config struct {
	// DatabaseURL names a server and a database on it to connect to; every scenario
	// creates a database of its own beside it (CREATE DATABASE is needed).
	DatabaseURL string
	Scenarios   []string      // nil: all
	Duration    time.Duration // of each timed measurement (leases, steady, notify-cost, baseline)
	Clients     []int         // concurrency levels of leases and baseline
	Tasks       int           // tasks drain pre-inserts; also the transactions of capacity's pgbench yardstick
	Replicas    int           // replicas of drain, steady and latency
	Workers     int           // workers per replica
	Samples     int           // tasks latency inserts one at a time
	SteadyRate  int           // tasks per second steady inserts
	Fanout      int           // websocket clients of fanout
	// Backlog are the pending counts backlog drains (nil: DefaultBacklog), each with one
	// replica of BacklogWorkers workers (0: 100).
	Backlog        []int
	BacklogWorkers int
	// Waiters are the claims longpoll keeps waiting while it times wake-ups (0:
	// DefaultWaiters); IdleWaiters wait IdleHold while it counts what they cost (0:
	// DefaultIdleWaiters, DefaultIdleHold); RESTWorkers are its HTTP workers per replica,
	// and the slots of each of its `leasehold work` processes (0: DefaultRESTWorkers).
	Waiters, IdleWaiters, RESTWorkers int
	IdleHold                          time.Duration
	// CapacityLeases are the counts of leases capacity holds, renewing each every
	// RenewEvery (nil: DefaultCapacityLeases; 0: DefaultRenewEvery). The smallest is also
	// the count of running tasks it heartbeats as often.
	CapacityLeases []int
	RenewEvery     time.Duration
	// Work, when set, is a leasehold binary whose `work` command longpoll runs.
	Work string
	// Executable, when set, is a leasehold binary: drain then also runs its replicas as
	// processes of it (`serve --roles worker`), as production does.
	Executable string
	// RiverPeer is the River peer program (tools/riverpeer, built) that river runs;
	// RiverTasks are the pending counts it drains each way (nil: DefaultRiverTasks).
	RiverPeer  string
	RiverTasks []int
	// KeysTasks are the tasks each of keys' three drains takes in each of its KeysRounds rounds, with
	// one Client of KeysWorkers workers; its keyed drain puts task i on the key
	// key-<i mod KeysCount>, of KeysLimit slots (0: DefaultKeysTasks, DefaultKeysRounds,
	// DefaultKeysWorkers, DefaultKeysCount, DefaultKeysLimit).
	KeysTasks, KeysRounds, KeysWorkers, KeysCount, KeysLimit int
	// PartsTasks are the tasks of each of claim-parts' drains, in each of its PartsRounds
	// rounds (0: DefaultPartsTasks, DefaultPartsRounds).
	PartsTasks, PartsRounds int
	// PartsLoops are claim-parts' claimers, each claiming PartsBatch tasks a statement
	// (0: DefaultPartsLoops, DefaultPartsBatch).
	PartsLoops, PartsBatch int
	// Log receives progress lines (nil discards).
	Log io.Writer
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if len(c.Clients) == 0 {
		c.Clients = []int{1, 8, 32}
	}
	if c.Tasks == 0 {
		c.Tasks = 10000
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Samples == 0 {
		c.Samples = 1000
	}
	if c.SteadyRate == 0 {
		c.SteadyRate = 1000
	}
	if c.Fanout == 0 {
		c.Fanout = 200
	}
	if len(c.Backlog) == 0 {
		c.Backlog = DefaultBacklog
	}
	if c.BacklogWorkers == 0 {
		c.BacklogWorkers = 100
	}
	if c.Waiters == 0 {
		c.Waiters = DefaultWaiters
	}
	if c.IdleWaiters == 0 {
		c.IdleWaiters = DefaultIdleWaiters
	}
	if c.IdleHold == 0 {
		c.IdleHold = DefaultIdleHold
	}
	if c.RESTWorkers == 0 {
		c.RESTWorkers = DefaultRESTWorkers
	}
	if len(c.RiverTasks) == 0 {
		c.RiverTasks = DefaultRiverTasks
	}
	c.KeysTasks = cmp.Or(c.KeysTasks, DefaultKeysTasks)
	c.KeysRounds = cmp.Or(c.KeysRounds, DefaultKeysRounds)
	c.KeysWorkers = cmp.Or(c.KeysWorkers, DefaultKeysWorkers)
	c.KeysCount = cmp.Or(c.KeysCount, DefaultKeysCount)
	c.KeysLimit = cmp.Or(c.KeysLimit, DefaultKeysLimit)
	c.PartsTasks = cmp.Or(c.PartsTasks, DefaultPartsTasks)
	c.PartsRounds = cmp.Or(c.PartsRounds, DefaultPartsRounds)
	c.PartsLoops = cmp.Or(c.PartsLoops, DefaultPartsLoops)
	c.PartsBatch = cmp.Or(c.PartsBatch, DefaultPartsBatch)
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Validate says what is wrong with c, if anything.
func (c Config) Validate() error {
	var errs []error
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) && !slices.Contains(Optional, s) {
			errs = append(errs, fmt.Errorf("unknown scenario %q; choose from %s", s, strings.Join(append(slices.Clone(Scenarios), Optional...), ", ")))
		}
	}
	for _, n := range c.Backlog {
		if n < 1 || n > 10_000_000 {
			errs = append(errs, fmt.Errorf("backlog %d must be between 1 and 10000000", n))
		}
	}
	for _, n := range c.RiverTasks {
		if n < 1 || n > 10_000_000 {
			errs = append(errs, fmt.Errorf("river tasks %d must be between 1 and 10000000", n))
		}
	}
	for _, n := range c.Clients {
		if n < 1 || n > 256 {
			errs = append(errs, fmt.Errorf("clients %d must be between 1 and 256", n))
		}
	}
	for _, n := range c.CapacityLeases {
		if n < 1 || n > 1_000_000 {
			errs = append(errs, fmt.Errorf("capacity leases %d must be between 1 and 1000000", n))
		}
	}
	for _, k := range []struct {
		what   string
		n, top int
	}{
		{"keys tasks", c.KeysTasks, 10_000_000}, {"keys rounds", c.KeysRounds, 100}, {"keys workers", c.KeysWorkers, 10_000},
		{"keys count", c.KeysCount, 100_000}, {"keys limit", c.KeysLimit, lease.MaxSlots},
		{"claim-parts tasks", c.PartsTasks, 10_000_000}, {"claim-parts rounds", c.PartsRounds, 100},
		{"claim-parts loops", c.PartsLoops, 16}, {"claim-parts batch", c.PartsBatch, 1000},
	} {
		if k.n < 0 || k.n > k.top {
			errs = append(errs, fmt.Errorf("%s %d must be between 1 and %d (or 0, the default)", k.what, k.n, k.top))
		}
	}
	if c.RenewEvery < 0 || c.RenewEvery > 10*time.Minute {
		errs = append(errs, fmt.Errorf("renew every %s must be between 0 (the default, %s) and 10m", c.RenewEvery, DefaultRenewEvery))
	}
	if c.IdleHold > 270*time.Second {
		errs = append(errs, fmt.Errorf("idle hold %s must be at most 4m30s (a claim waits at most 300 s)", c.IdleHold))
	}
	if c.Waiters < 0 || c.IdleWaiters < 0 || c.RESTWorkers < 0 || c.IdleHold < 0 {
		errs = append(errs, errors.New("waiters, idle waiters, REST workers and the idle hold must not be negative"))
	}
	if c.Duration < 0 || c.Tasks < 0 || c.Replicas < 0 || c.Workers < 0 || c.Samples < 0 || c.SteadyRate < 0 || c.Fanout < 0 || c.BacklogWorkers < 0 {
		errs = append(errs, errors.New("durations and counts must not be negative"))
	}
	return errors.Join(errs...)
}

// Result is one measured figure.
type Result struct {
	Scenario string  `json:"scenario"`
	Case     string  `json:"case"` // what was measured, e.g. "acquire+release, in-process"
	Clients  int     `json:"clients,omitempty"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// VsBaseline is Value over pgbench -N's transactions per second at the same
	// concurrency, for figures counted in commits per second; 0 when not measured.
	VsBaseline float64 `json:"vs_baseline,omitempty"`
	Note       string  `json:"note,omitempty"`
}

// Report is a whole run.
type Report struct {
	Machine Machine  `json:"machine"`
	Results []Result `json:"results"`
}

// Machine is where the figures came from.
type Machine struct {
	CPUs              int    `json:"cpus"`
	GoVersion         string `json:"go"`
	OS                string `json:"os"`
	PostgreSQL        string `json:"postgresql"`
	SynchronousCommit string `json:"synchronous_commit"`
	// SynchronousStandbys is synchronous_standby_names: the standbys every commit waits for
	// (empty: none).
	SynchronousStandbys string `json:"synchronous_standby_names"`
	// Standbys is how many standbys were streaming from the server when the run began.
	Standbys  int    `json:"standbys"`
	Fsync     string `json:"fsync"`
	StartedAt string `json:"started_at"`
}

// Run runs the configured scenarios in order and returns their figures. A scenario that
// cannot run where it is (baseline without pgbench) reports why in a Result note.
func Run(ctx context.Context, c Config) (*Report, error) {
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{}
	m, err := machine(ctx, c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	rep.Machine = m
	for _, name := range append(slices.Clone(Scenarios), Optional...) {
		if !slices.Contains(c.Scenarios, name) {
			continue
		}
		fmt.Fprintf(c.Log, "bench: %s\n", name)
		results, err := scenarios[name](ctx, c, rep.Results)
		if err != nil {
			return rep, fmt.Errorf("scenario %s: %w", name, err)
		}
		for _, r := range results {
			fmt.Fprintf(c.Log, "bench:   %s: %s\n", r.label(), r.value())
		}
		rep.Results = append(rep.Results, results...)
	}
	return rep, nil
}

// scenarios run one scenario each; earlier holds the figures measured before it (the
// lease scenario divides by the baseline's).
var scenarios = map[string]func(ctx context.Context, c Config, earlier []Result) ([]Result, error){
	"baseline":    runBaseline,
	"leases":      runLeases,
	"drain":       runDrain,
	"steady":      runSteady,
	"latency":     runLatency,
	"notify-cost": runNotifyCost,
	"fanout":      runFanout,
	"bulk-insert": runBulkInsert,
	"backlog":     runBacklog,
	"longpoll":    runLongpoll,
	"capacity":    runCapacity,
	"river":       runRiver,
	"pickup":      runPickup,
	"keys":        runKeys,
	"claim-parts": runClaimParts,
}

func machine(ctx context.Context, dbURL string) (Machine, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return Machine{}, fmt.Errorf("connect to the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		StartedAt: time.Now().UTC().Format(time.RFC3339)}
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync'),
		current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming')`).
		Scan(&m.PostgreSQL, &m.SynchronousCommit, &m.Fsync, &m.SynchronousStandbys, &m.Standbys)
	return m, err
}

// freshDB creates a migrated database of its own on base's server and returns its pool and
// URL; cleanup drops it.
type freshDB struct {
	URL  string
	Pool *pgxpool.Pool
	drop func()
}

func newDB(ctx context.Context, base string, maxConns int32) (*freshDB, error) {
	return newTracedDB(ctx, base, maxConns, nil)
}

// newTracedDB is newDB with tracer, when not nil, tracing every statement of its pool.
func newTracedDB(ctx context.Context, base string, maxConns int32, tracer pgx.QueryTracer) (*freshDB, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "leasehold_bench_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create a database for the scenario (the role needs CREATEDB): %w", err)
	}
	u.Path = "/" + name
	d := &freshDB{URL: u.String()}
	d.drop = func() {
		ctx := context.WithoutCancel(ctx)
		if d.Pool != nil {
			d.Pool.Close()
		}
		if conn, err := pgx.Connect(ctx, base); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		d.drop()
		return nil, err
	}
	cfg.MaxConns = maxConns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	cfg.AfterConnect = schema.PrepareSession
	if d.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		d.drop()
		return nil, err
	}
	if _, err := schema.Migrate(ctx, d.Pool); err != nil {
		d.drop()
		return nil, err
	}
	return d, nil
}

func (d *freshDB) Close() { d.drop() }

// listen starts a LISTEN connection to the database on channels, which wg
// runs until ctx ends, and returns it once it listens (its first resync).
func (d *freshDB) listen(ctx context.Context, wg *sync.WaitGroup, channels ...string) (*notify.Listener, error) {
	l := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, d.URL) },
		zerolog.Nop(), channels...)
	ready := l.Subscribe(channels[0], 1)
	defer ready.Close()
	wg.Go(func() { _ = l.Run(ctx) })
	select {
	case <-ready.Resync():
		return l, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as a table for people.
func (r *Report) WriteTable(w io.Writer) error {
	m := r.Machine
	standbys := "no standby"
	if m.Standbys > 0 {
		standbys = fmt.Sprintf("%d streaming standby(s), synchronous_standby_names=%q", m.Standbys, m.SynchronousStandbys)
	}
	fmt.Fprintf(w, "machine: %d CPUs, %s %s, PostgreSQL %s (synchronous_commit=%s, fsync=%s, %s)\n\n",
		m.CPUs, m.GoVersion, m.OS, m.PostgreSQL, m.SynchronousCommit, m.Fsync, standbys)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCASE\tCLIENTS\tVALUE\tVS PGBENCH\tNOTE")
	for _, res := range r.Results {
		clients, ratio := "", ""
		if res.Clients > 0 {
			clients = fmt.Sprint(res.Clients)
		}
		if res.VsBaseline > 0 {
			ratio = fmt.Sprintf("%.2f×", res.VsBaseline)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", res.Scenario, res.Case, clients, res.value(), ratio, res.Note)
	}
	return tw.Flush()
}

func (r Result) label() string {
	if r.Clients > 0 {
		return fmt.Sprintf("%s, %d clients", r.Case, r.Clients)
	}
	return r.Case
}

func (r Result) value() string {
	switch {
	case r.Unit == "" && r.Value == 0:
		return "-"
	case r.Value >= 100:
		return fmt.Sprintf("%.0f %s", r.Value, r.Unit)
	default:
		return fmt.Sprintf("%.2f %s", r.Value, r.Unit)
	}
}

// baselineAt returns pgbench's tps at clients from earlier results, 0 when not measured.
func baselineAt(earlier []Result, clients int) float64 {
	for _, r := range earlier {
		if r.Scenario == "baseline" && r.Clients == clients && r.Unit == "tps" {
			return r.Value
		}
	}
	return 0
}

// timed runs work on n goroutines, each looping while more() says so, and returns the
// operations they counted and the time it took. more is true for d, and always for a
// client's first operation, so that every figure rests on at least one operation each;
// an operation under way when d ends is finished, not cut off. The first error stops all.
func timed(ctx context.Context, n int, d time.Duration, work func(ctx context.Context, client int, more func() bool) (ops int, err error)) (int, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		ops int
		err error
	}
	out := make(chan outcome, n)
	start := time.Now()
	end := start.Add(d)
	for i := range n {
		go func() {
			first := true
			more := func() bool {
				if ctx.Err() != nil {
					return false
				}
				ok := first || time.Now().Before(end)
				first = false
				return ok
			}
			ops, err := work(ctx, i, more)
			if err != nil {
				cancel()
			}
			out <- outcome{ops, err}
		}()
	}
	var total int
	var errs []error
	for range n {
		o := <-out
		total += o.ops
		if o.err != nil && !errors.Is(o.err, context.Canceled) {
			errs = append(errs, o.err)
		}
	}
	return total, time.Since(start), errors.Join(errs...)
}

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
