package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/retention"
	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/schema"
)

func runServe(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return runReplica(ctx, "leasehold serve", productionReplica, args, getenv, stderr)
}

// runReplica is serve, and "leasehold demo replica": one replica of the
// kind given, until ctx ends.
func runReplica(ctx context.Context, cmd string, kind replicaKind, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	finish := configFlags(fs, getenv, kind)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	c, err := finish()
	if err != nil {
		return err
	}
	if c.DatabaseURL == "" {
		return usagef("no database: set DATABASE_URL or pass --database-url postgres://user:pass@host:5432/db")
	}
	return serve(ctx, c, stderr, nil)
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold migrate", flag.ContinueOnError)
	url := fs.String("database-url", getenv("DATABASE_URL"), "PostgreSQL URL (env DATABASE_URL)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *url == "" {
		return usagef("no database: set DATABASE_URL or pass --database-url postgres://user:pass@host:5432/db")
	}
	cfg, err := poolConfig(*url, "leasehold migrate")
	if err != nil {
		return err
	}
	applied, err := migrate(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %d migration(s) %v\n", len(applied), applied)
	return nil
}

// defaultConnectTimeout bounds the making of a database connection when
// the URL sets no connect_timeout: without it a connection to a server
// that does not answer (a host down, packets dropped) waits for the
// kernel to give up, minutes later.
const defaultConnectTimeout = 5 * time.Second

// writeTimeout is how long the server may take to answer a request; no
// request waits on the database for longer.
const writeTimeout = 30 * time.Second

// poolConfig parses the database URL into a pool configuration whose
// sessions call themselves app, with a bounded connect timeout.
func poolConfig(url, app string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.AfterConnect = schema.PrepareSession
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	return cfg, nil
}

// migrate applies the migrations in a session of its own, with no
// statement_timeout: waiting for the advisory lock while another replica
// migrates, or a migration that rewrites a big table, may take long.
func migrate(ctx context.Context, cfg *pgxpool.Config) ([]int64, error) {
	cfg = cfg.Copy()
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "0"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	return schema.Migrate(ctx, pool)
}

const localDBUsage = `usage: leasehold localdb [--stop]

Starts leasehold's local development PostgreSQL, or reuses it when it runs
already, and prints its URL: a cluster of its own on 127.0.0.1, port
LEASEHOLD_PG_PORT (default 54329), which keeps running after the command
(go tool task test and run use it too). --stop stops it; its data stays,
for the next start.

flags:
`

func runLocalDB(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold localdb", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), localDBUsage)
		fs.PrintDefaults()
	}
	stop := fs.Bool("stop", false, "stop the local PostgreSQL instead of starting it")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *stop {
		if err := localpg.Stop(ctx, stderr); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "the local PostgreSQL is stopped")
		return nil
	}
	url, err := localpg.Ensure(ctx, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, url)
	return nil
}

func newLogger(c config, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(c.LogLevel)
	if err != nil || level == zerolog.NoLevel {
		return zerolog.Nop(), usagef("--log-level %q must be debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Str("instance", c.Instance).Logger(), nil
}

// serve runs one replica until ctx ends. ready, if not nil, receives the
// address the server listens on once it accepts connections.
//
// On shutdown (ctx ends: SIGTERM or Ctrl-C) the replica stops claiming
// tasks, gives running tasks ShutdownGrace to finish and hands the rest
// back, then releases every lease it holds (reaper, scheduler, instance; a demo
// replica's generator too) so
// that other replicas take over at once; the API answers until then.
//
// While the database cannot be reached the replica keeps running: /readyz
// and every API request that needs the database answer 503 (within the
// API budget, never hanging), the workers stop claiming, and the leases it
// holds count as lost at their local deadlines. When the database is back
// the pool and the listener reconnect, the listener's resync makes every
// component catch up, and the leases are won again; nothing needs a restart.
func serve(ctx context.Context, c config, stderr io.Writer, ready chan<- string) error {
	log, err := newLogger(c, stderr)
	if err != nil {
		return err
	}
	// The service's workers run the built-in demo kind only; every other
	// kind is for the programs that bring its handler (the Go library,
	// leasehold work, any REST client).
	sleep, err := demo.Sleep(c.SimCrashRate, nil)
	if err != nil {
		return usagef("--sim-crash-rate: %v", err)
	}
	poolCfg, err := poolConfig(c.DatabaseURL, "leasehold "+c.Instance)
	if err != nil {
		return err
	}
	// The migrations' advisory lock and LISTEN need a session of their
	// own: --listen-database-url's when given.
	sessionCfg, err := sessionConfig(ctx, c, poolCfg)
	if err != nil {
		return err
	}
	applied, err := migrate(ctx, sessionCfg)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		log.Info().Ints64("versions", applied).Msg("applied migrations")
	}
	latest, err := schema.Latest()
	if err != nil {
		return err
	}

	// The LISTEN session runs no statements worth a timeout; it idles, so
	// TCP keepalives are what tell it that the server has gone silent.
	listenCfg := sessionCfg.ConnConfig.Copy()
	listenCfg.RuntimeParams["application_name"] = "leasehold " + c.Instance + " listener"
	listenCfg.DialFunc = listenDialer.DialContext
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, listenCfg)
	}, log, notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator, notify.ChannelSchedule)

	if c.StatementTimeout > 0 {
		poolCfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(c.StatementTimeout.Milliseconds(), 10)
	}
	// Workers each hold a connection only for a statement; the API and the
	// background loops need a few more.
	poolCfg.MaxConns = max(poolCfg.MaxConns, int32(c.Workers+8))
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()

	leases := leasestore.NewStore(pool)
	tasks := taskstore.NewStore(pool)
	genState := demo.NewState(pool)
	schedules := schedulestore.NewStore(pool)
	instances := instance.NewStore(pool)
	metrics := server.NewMetrics(listener.Connected, listener.Reconnects)
	metrics.WatchDatabase(pool, metricsDBTimeout, metricsDBCache)
	startedAt := time.Now().UTC()
	wsHub := hub.New(hub.Deps{
		Leases: leases, Tasks: tasks, Generator: genState, Instances: instances, Listener: listener,
		Instance: c.Instance, AllowedOrigins: c.AllowedOrigins, Log: log, NotifyLag: metrics.NotifyLag,
	})
	metrics.WatchClients(wsHub.Clients)
	// Background work runs until shutdown, not until ctx: the API goes on
	// answering while the workers drain and the leases are released. A
	// component that stops before then stops the replica (see components).
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	comps := newComponents(bgCtx, log)
	background := comps.Go
	defer stopBackground()
	stopping := make(chan struct{})
	readyz := &readiness{pool: pool, connected: listener.Connected, latest: latest, failed: comps.Err, log: log}
	var workersReady atomic.Bool // the worker pool's first round is over: an insert wakes it
	if c.hasRole("worker") && c.Workers > 0 {
		readyz.workers = workersReady.Load
	}
	handler := server.NewServer(server.Deps{
		Leases:     leases,
		Tasks:      tasks,
		Generator:  genState,
		Instances:  instances,
		Schedules:  schedules,
		Instance:   server.Instance{ID: c.Instance, StartedAt: startedAt, Roles: c.Roles, Version: version},
		DefaultTTL: c.LeaseTTL,
		APIToken:   c.APIToken,
		Tokens:     c.Tokens, SecureCookie: c.SecureCookie,
		AllowedHosts: c.allowedHosts(), AllowedOrigins: c.AllowedOrigins,
		RateLimit: c.RateLimit, RateBurst: c.RateBurst, TrustedProxies: c.TrustedProxies,
		Hub:     wsHub,
		Log:     log,
		Metrics: metrics,
		// Acquisitions with wait_seconds hear of releases through the
		// listener, and stop waiting when the replica shuts down.
		Listener: listener, Stopping: stopping,
		// What /readyz says is public: the details go to the log.
		Ready: readyz.check,
	})

	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Addr, err)
	}
	srv := &http.Server{
		Handler:           boundAPIRequests(servedRoutes(handler, c.Roles), apiBudget(c, poolCfg.ConnConfig.ConnectTimeout)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       120 * time.Second,
	}
	if err := instances.Register(ctx, instance.Instance{
		ID: c.Instance, Addr: ln.Addr().String(), Roles: c.Roles, Version: version,
	}); err != nil {
		ln.Close()
		return err
	}

	background("listener", listener.Run)
	// The dashboards' websockets are closed when background work stops:
	// srv.Shutdown does not wait for hijacked connections.
	background("hub", wsHub.Run)
	// The replica is live while it holds its instance lease.
	background("instance lease", (&leasing.Elector{
		Leases: leases, Listener: listener, Resource: instance.LeaseResource(c.Instance),
		Holder: c.Instance, Log: log,
		Keep: lease.KeepConfig{TTL: 10 * time.Second, Observer: metrics.KeepObserver(server.HolderInstance)},
	}).RunUntilDone)
	if c.hasRole("reaper") {
		background("reaper", (&reaper.Reaper{
			Store: leases, Tasks: tasks, Listener: listener, Instance: c.Instance, Log: log,
			Keep:   lease.KeepConfig{TTL: 5 * time.Second, Observer: metrics.KeepObserver(server.HolderReaper)},
			Marked: metrics.ExpiryAnnounced,
			// While it is the reaper: finished tasks and lease history
			// older than their retention go, a batch at a time.
			Retention: &retention.Pruner{Store: retention.NewStore(pool), Log: log, Config: retention.Config{
				TaskAge: c.TaskRetention, LeaseHistoryAge: c.LeaseHistoryRetention,
			}},
		}).Run)
	}
	if c.hasRole("generator") {
		background("generator", (&demo.Generator{
			State: genState, Tasks: tasks, Leases: leases, Listener: listener, Instance: c.Instance,
			Keep: lease.KeepConfig{TTL: 5 * time.Second, Observer: metrics.KeepObserver(server.HolderGenerator)},
			Rate: c.GeneratorRate, MinSleep: c.GeneratorSleepMin, MaxSleep: c.GeneratorSleepMax, Log: log,
		}).Run)
	}
	if c.hasRole("scheduler") {
		background("scheduler", (&scheduler.Scheduler{
			Store: schedules, Leases: leases, Listener: listener, Instance: c.Instance, Log: log,
			Keep:     lease.KeepConfig{TTL: 5 * time.Second, Observer: metrics.KeepObserver(server.HolderScheduler)},
			Enqueued: metrics.ScheduleTicked,
		}).Run)
	}
	if c.hasRole("worker") && c.Workers > 0 {
		grace := c.ShutdownGrace
		if grace == 0 {
			grace = -1 // the pool's "no grace"
		}
		ops, err := demo.SpikyHeartbeats(tasks, c.SimSpikeRate, log)
		if err != nil {
			return usagef("--sim-spike-rate: %v", err)
		}
		background("workers", (&worker.Pool{
			Tasks: tasks, Ops: ops, Listener: listener, Instance: c.Instance, Workers: c.Workers, TTL: c.LeaseTTL,
			Kinds: []string{demo.Kind}, Handler: sleep,
			ShutdownGrace: grace, Log: log, OnEvent: metrics.WorkerEvent,
			Ready: func() { workersReady.Store(true) },
		}).Run)
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Strs("roles", c.Roles).Strs("components", comps.Names()).Int("workers", c.Workers).Msg("serving")
	if !c.secured() && !loopback(c.Addr) {
		log.Warn().Str("addr", ln.Addr().String()).
			Msg("serving without an API token on an address beyond this machine (--insecure): anyone who can reach it may drive the API")
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	case <-comps.Failed():
		err = comps.Err()
		log.Error().Err(err).Msg("a background component stopped: the replica shuts down, for its supervisor to start it again")
	}
	log.Info().Msg("shutting down")
	close(stopping)
	stopBackground()
	comps.Wait()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutdownCtx); serr != nil && err == nil {
		err = serr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info().Msg("stopped")
	return err
}

// metricsDBTimeout bounds the statement a /metrics scrape runs for the
// database gauges: a scrape while the database does not answer still
// answers, with leasehold_db_up 0.
const metricsDBTimeout = 2 * time.Second

// metricsDBCache is how long a reading of the database gauges serves
// /metrics: eight scrapers every second cost the database one query every
// few seconds, not eight a second (the endpoint needs no token).
const metricsDBCache = 5 * time.Second

// listenDialer dials the LISTEN session with TCP keepalives that notice a
// silent server within about 30 s (15 s idle, then 3 probes 5 s apart), so
// that the listener reconnects instead of waiting forever for a
// notification over a dead connection.
var listenDialer = &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
	Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3,
}}

// apiBudget is how long an API request may wait on the database: time to
// connect and for one statement to run out its statement_timeout. Without
// a statement timeout, as long as the server may take to answer at all.
func apiBudget(c config, connectTimeout time.Duration) time.Duration {
	if c.StatementTimeout == 0 {
		return writeTimeout
	}
	return min(connectTimeout+c.StatementTimeout, writeTimeout)
}

// boundAPIRequests gives every /api/ request a deadline budget away, so
// that none waits forever on a database that does not answer: when the
// deadline passes the request is answered 503. The websocket, which lives
// long, and the probes, which bound themselves, are left alone. An
// acquisition with wait_seconds waits past the deadline, each of its
// statements bounded by the budget (server.BoundRequest).
func boundAPIRequests(next http.Handler, budget time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		r, cancel := server.BoundRequest(r, budget)
		defer cancel()
		next.ServeHTTP(w, r)
	})
}
