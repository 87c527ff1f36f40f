// Package chaos is a soak of leasehold as it runs in production: replicas of the real
// binary, each a process of its own, on a PostgreSQL cluster of their own, loaded by the
// generator, by schedules, by API clients creating tasks (lease-gated ones among them, on
// locks that lease clients contend for too, tasks on keys of 1 and 3 slots, whose
// slots slot clients take too, as leasehold exec --slots does, bursts of tasks on a key
// with a rate, above it, and a trickle of tasks in a queue that the soak pauses and
// resumes over the API now and then) and by lease clients contending for shared
// resources, while faults are injected at random intervals, one at a time:
//
//	kill        kill -9 of a replica, preferably one running tasks; measures how long until
//	            each task it was running is claimed again by a worker
//	pause       SIGSTOP of a replica for longer than the lease TTL, then SIGCONT: a stale
//	            holder wakes up believing it still holds its leases
//	disconnect  pg_terminate_backend of every connection of a replica, its LISTEN
//	            connection included
//	term        SIGTERM of a replica (a clean shutdown); measures how long until every lease
//	            it held is free
//	db-restart  PostgreSQL stopped (cleanly, or as a power cut would) and started again a
//	            moment later; the down window is an outage for the checker, until the
//	            reaper renews its lease on the database again
//	failover    with a standby (Options.Standby) only: the primary stopped hard (immediate
//	            mode or SIGKILL), the standby promoted, and the old primary rebuilt as the
//	            new standby, so that it can happen again; measures how long from the
//	            primary's death to the first lease the new one grants; from the death
//	            until the reaper's first lease event on the new primary is an outage
//
// With a standby the soak's database is a primary and a synchronous streaming standby
// (localpg.Pair), and every replica, application and the soak itself connect with one
// multi-host URL naming both (target_session_attrs=read-write), so that they follow a
// promotion by themselves. db-restart is left out then: the failover's hard stop of the
// primary is its harsher form.
//
// A replica that exits, of a fault or of a simulated crash, is restarted, as a hosting
// platform would. At the end the faults and the load stop, the schedules are removed once
// the scheduler has made every tick due, the replicas drain the queue and stop, and
// internal/lab/checker verifies leasehold's guarantees (those of leases and tasks, of schedules and
// lease-gated tasks, never more holders of a key of k slots than k, never more starts of
// the rated key's tasks in a window of its period than its rate, and no start in the
// paused queue while a pause bound every claim, by the pauses the soak recorded as it made
// them; it resumes the queue before the drain) over the whole history the database
// recorded. The lease clients also check mutual exclusion from the outside: no client is
// granted a resource (a slot, for the slot clients) while another could rightly believe,
// by its own clock, that it still holds it.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/demo/frontdoor"
	"github.com/leasehold/leasehold/internal/demo/supervise"
	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/schema"
)

// Kind is a kind of fault.
type Kind string

// The kinds of fault.
const (
	KindKill       Kind = "kill"
	KindPause      Kind = "pause"
	KindDisconnect Kind = "disconnect"
	KindTerm       Kind = "term"
	KindDBRestart  Kind = "db-restart"
	KindFailover   Kind = "failover"
)

// AllKinds lists every kind of fault of a soak on a single cluster, in the order the short
// soak forces them.
var AllKinds = []Kind{KindKill, KindPause, KindDisconnect, KindTerm, KindDBRestart}

// StandbyKinds lists every kind of fault of a soak with a standby (Options.Standby).
var StandbyKinds = []Kind{KindKill, KindPause, KindDisconnect, KindTerm, KindFailover}

// knownKinds are the kinds ParseKinds accepts.
var knownKinds = append(slices.Clone(AllKinds), KindFailover)

// StandbySync is the Options.Standby of a primary with a synchronous standby. (An
// asynchronous one is not offered: a failover loses its last commits, and the checker would
// have to read the union of both primaries' histories.)
const StandbySync = "sync"

// ParseKinds parses a comma-separated list of kinds, such as "kill,term".
func ParseKinds(s string) ([]Kind, error) {
	var kinds []Kind
	for _, name := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(name))
		if k == "" {
			continue
		}
		if !slices.Contains(knownKinds, k) {
			return nil, fmt.Errorf("unknown fault %q: use some of %s", k, joinKinds(knownKinds))
		}
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return nil, fmt.Errorf("no fault named: use some of %s", joinKinds(knownKinds))
	}
	return kinds, nil
}

func joinKinds(kinds []Kind) string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ",")
}

// Options configure a soak. Zero values take the defaults named.
type Options struct {
	// Binary is the leasehold executable the replicas and workers run.
	// Required.
	Binary string
	// AppBinary is the soak's command (internal/lab/cmd/soak), whose "app"
	// runs the soak's applications on the Go library. Required.
	AppBinary string
	// Duration is how long the load and the faults last at least; default 1 minute.
	// Draining the queue and checking the history come after it.
	Duration time.Duration
	// MaxDuration bounds the load and the faults when the Forced faults are not all in
	// after Duration: the soak goes on until the last of them has been injected, for at
	// most MaxDuration, and a soak that ran out of it reports the faults it missed as a
	// problem (one begun within it counts, however long it takes to end). Default
	// 4 × Duration, and at least Duration + 2 minutes.
	MaxDuration time.Duration
	// Replicas is the number of replicas, 1 to 26; default 3.
	Replicas int
	// FaultInterval is the mean pause between two faults (each pause is drawn uniformly
	// from half to one and a half of it); default 5 s.
	FaultInterval time.Duration
	// Kinds are the faults drawn at random; default AllKinds, or StandbyKinds with a
	// standby.
	Kinds []Kind
	// Forced are injected first, in this order, before any drawn at random: a short soak
	// forces AllKinds so that every kind is exercised.
	Forced []Kind
	// Standby is "" for a single PostgreSQL cluster (Cluster), or StandbySync for a primary
	// and a synchronous standby of a temporary directory of their own, which the failover
	// fault needs.
	Standby string
	// FailoverEvery is, with a standby and failover among the Kinds, the longest the soak
	// goes without a failover: one is injected in place of the fault drawn once that long
	// has passed since the last (or the start); default 1 minute, so that a soak of ten
	// minutes fails over at least nine times.
	FailoverEvery time.Duration
	// Seed seeds the choice of faults, victims and pauses (the timing of the processes is
	// not reproducible); 0 draws a seed, which the report names.
	Seed uint64
	// LeaseTTL is the replicas' lease TTL (task leases included): whole seconds, 1 s to
	// 1 min; default 2 s.
	LeaseTTL time.Duration
	// DrainTimeout bounds the wait for the replicas to finish every task once the load
	// has stopped; default 2 minutes.
	DrainTimeout time.Duration
	// Cluster names the PostgreSQL cluster of the soak (localpg.Open); default "chaos".
	// Its leasehold database is dropped and created again at the start of every run.
	// Unused with a standby.
	Cluster string
	// KeepCluster leaves the cluster (or the primary and standby) running at the end, for a
	// look at the history.
	KeepCluster bool
	// Log receives the soak's own lines: one per fault, with its time, one per start and
	// exit of a replica, and PostgreSQL's start and stop steps.
	Log zerolog.Logger
	// Output receives the replicas' logs, each line prefixed with the replica's name. Nil
	// discards.
	Output io.Writer
	// ReplicaLogLevel is the replicas' --log-level, and the applications' on the
	// library; default "warn".
	ReplicaLogLevel string
}

// Defaults of Options, and the settings of the replicas and the load.
const (
	defaultDuration      = time.Minute
	defaultReplicas      = 3
	maxReplicas          = 26
	defaultFaultInterval = 5 * time.Second
	defaultLeaseTTL      = 2 * time.Second
	defaultDrainTimeout  = 2 * time.Minute
	defaultCluster       = "chaos"
	defaultFailoverEvery = time.Minute

	// workers per replica; the load below keeps about half of them busy.
	workers = 4
	// shutdownGrace is the replicas' --shutdown-grace: short, so that a SIGTERM hands
	// back long tasks rather than waiting for them.
	shutdownGrace = time.Second
	// generatorRate and generatorSleep: thousands of short tasks over a long soak.
	generatorRate  = "20"
	generatorSleep = "0s-300ms"
	// simCrashRate (per task) and simSpikeRate (per heartbeat) are the replicas' own
	// simulated faults: about one crash every 25 s at the generator's rate.
	simCrashRate = "0.002"
	simSpikeRate = "0.02"
	// roleLeaseTTL is the TTL of a replica's generator and reaper leases (the replica
	// sets it): a pause longer than it makes a stale generator or reaper.
	roleLeaseTTL = 5 * time.Second
	// readyTimeout bounds the wait for every replica to answer /readyz at the start.
	readyTimeout = 2 * time.Minute
	// checkTimeout bounds the checker.
	checkTimeout = 5 * time.Minute
)

func (o *Options) setDefaults() error {
	if o.AppBinary == "" {
		return errors.New("chaos: Options.AppBinary names no soak executable")
	}
	if o.Binary == "" {
		return errors.New("chaos: Options.Binary names no leasehold executable")
	}
	if o.Duration == 0 {
		o.Duration = defaultDuration
	}
	if o.MaxDuration == 0 {
		o.MaxDuration = max(4*o.Duration, o.Duration+2*time.Minute)
	}
	if o.Replicas == 0 {
		o.Replicas = defaultReplicas
	}
	if o.FaultInterval == 0 {
		o.FaultInterval = defaultFaultInterval
	}
	if len(o.Kinds) == 0 {
		o.Kinds = AllKinds
		if o.Standby != "" {
			o.Kinds = StandbyKinds
		}
	}
	if o.FailoverEvery == 0 {
		o.FailoverEvery = defaultFailoverEvery
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = defaultLeaseTTL
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = defaultDrainTimeout
	}
	if o.Cluster == "" {
		o.Cluster = defaultCluster
	}
	if o.ReplicaLogLevel == "" {
		o.ReplicaLogLevel = "warn"
	}
	if o.Output == nil {
		o.Output = io.Discard
	}
	for o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	switch {
	case o.Duration < 0:
		return fmt.Errorf("chaos: duration %v is negative", o.Duration)
	case o.MaxDuration < o.Duration:
		return fmt.Errorf("chaos: max duration %v is shorter than the duration %v", o.MaxDuration, o.Duration)
	case o.Replicas < 1 || o.Replicas > maxReplicas:
		return fmt.Errorf("chaos: %d replicas: want 1 to %d", o.Replicas, maxReplicas)
	case o.FaultInterval < 0:
		return fmt.Errorf("chaos: fault interval %v is negative", o.FaultInterval)
	case o.LeaseTTL < time.Second || o.LeaseTTL > time.Minute || o.LeaseTTL%time.Second != 0:
		return fmt.Errorf("chaos: lease TTL %v must be whole seconds from 1s to 1m", o.LeaseTTL)
	case o.DrainTimeout < 0:
		return fmt.Errorf("chaos: drain timeout %v is negative", o.DrainTimeout)
	case o.FailoverEvery < 0:
		return fmt.Errorf("chaos: failover interval %v is negative", o.FailoverEvery)
	case o.Standby == "async":
		return errors.New("chaos: an asynchronous standby is not supported: a failover loses its last commits, " +
			"which the checker, reading the new primary's history only, cannot judge; use a synchronous one (" + StandbySync + ")")
	case o.Standby != "" && o.Standby != StandbySync:
		return fmt.Errorf("chaos: standby %q: want %q or none", o.Standby, StandbySync)
	}
	for _, k := range slices.Concat(o.Kinds, o.Forced) {
		switch {
		case !slices.Contains(knownKinds, k):
			return fmt.Errorf("chaos: unknown fault %q", k)
		case k == KindFailover && o.Standby == "":
			return errors.New("chaos: the failover fault needs a standby to promote (Options.Standby)")
		case k == KindDBRestart && o.Standby != "":
			return errors.New("chaos: db-restart restarts a single cluster; with a standby, use failover")
		}
	}
	return nil
}

// soak is one run.
type soak struct {
	opts    Options
	log     zerolog.Logger
	cluster *localpg.Cluster // without a standby
	pair    *localpg.Pair    // with one
	// dbURL is the database's URL for the replicas and the applications: the cluster's,
	// or the pair's multi-host one.
	dbURL string
	// standbyLost: a failover's rebuild failed, so the next one must rebuild the standby
	// first; failoverBroken: one could not stop the primary or promote the standby, so no
	// other is tried. Only the fault injector touches them.
	standbyLost, failoverBroken bool
	pool                        *pgxpool.Pool // the soak's own connections, for measurements and the end
	sup                         *supervise.Supervisor
	replicas                    []*replica
	apps                        []*replica // the applications on the library (app.go), faulted alike
	client                      *http.Client
	// doorURL is the front door over the replicas' REST API, for the remote
	// application: a replica's port changes with each restart.
	doorURL  string
	backends []*frontdoor.Backend

	mu      sync.Mutex // guards what follows, written by the faults and the load
	report  Report
	created []int64 // ids of the tasks the soak created, answered 201
	// appCreated are those of the applications' kinds; appStats, what became of them.
	appCreated []int64
	appStats   AppStats
	grants     []grant // the lease clients' acquisitions
	// gated are the ids of the lease-gated tasks the soak created, answered 201;
	// slotted, of the tasks on the keys of k slots; rated, of those on rateKey;
	// pausedTasks, of those in pausedQueue.
	gated, slotted, rated, pausedTasks []int64
	// pauses are the pauses of pausedQueue the soak made, as the checker judges them.
	pauses []checker.Pause
	// schedules are the soak's schedules as the checker judges them: from their
	// creation, then from their removal.
	schedules []checker.Schedule
}

// Run runs a soak and returns its report. It returns an error, and no report, only when the
// soak could not start (no PostgreSQL, replicas that never became ready); a soak that ran
// and found something wrong returns a report that is not OK. When ctx ends early the soak
// stops its faults and its load, skips the drain, stops the replicas and still checks the
// history; the report says it was interrupted.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &soak{
		opts: opts,
		log:  opts.Log,
		// Its own transport, so that nothing of it outlives the soak.
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: requestTimeout},
	}
	defer s.client.CloseIdleConnections()
	s.report = Report{Seed: opts.Seed, Replicas: opts.Replicas, LeaseTTL: opts.LeaseTTL, FaultInterval: opts.FaultInterval,
		Standby: opts.Standby}

	where := fmt.Sprintf("PostgreSQL cluster %q", opts.Cluster)
	if opts.Standby != "" {
		// A new pair has an empty leasehold database.
		where = "a primary and a synchronous standby"
		pair, err := localpg.NewPair(ctx, localpg.PairConfig{Synchronous: true, Log: logLines{s.log}})
		if err != nil {
			return nil, fmt.Errorf("chaos: bring up a primary and a standby: %w", err)
		}
		s.pair, s.dbURL = pair, pair.URL()
	} else {
		cluster, err := localpg.Open(ctx, opts.Cluster, logLines{s.log})
		if err != nil {
			return nil, fmt.Errorf("chaos: bring up PostgreSQL cluster %q: %w", opts.Cluster, err)
		}
		s.cluster, s.dbURL = cluster, cluster.URL()
	}
	defer s.closeCluster(ctx)
	if s.cluster != nil {
		if err := resetDatabase(ctx, s.cluster); err != nil {
			return nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return nil, err
	}
	// Not "leasehold <instance>": the disconnect fault must never cut the soak's own.
	cfg.ConnConfig.RuntimeParams["application_name"] = "chaos soak"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: database: %w", err)
	}
	defer pool.Close()
	s.pool = pool
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return nil, fmt.Errorf("chaos: migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, ordersTable); err != nil {
		return nil, fmt.Errorf("chaos: the embedded application's table: %w", err)
	}
	s.log.Info().Str("url", redact(s.dbURL)).Uint64("seed", opts.Seed).
		Msgf("chaos: fresh database on %s; seed %d", where, opts.Seed)
	return s.run(ctx)
}

// run starts the replicas and goes through the phases of the soak.
func (s *soak) run(ctx context.Context) (*Report, error) {
	s.sup = &supervise.Supervisor{
		Output:      s.opts.Output,
		Log:         s.log,
		ExitReasons: map[int]string{demo.CrashStatus: "simulated crash"},
		Grace:       shutdownGrace + 20*time.Second,
		// Restart at once: a hosting platform would, and a long backoff after a few
		// faults in a row would leave the soak with fewer replicas than it says.
		Backoff:    200 * time.Millisecond,
		MaxBackoff: 2 * time.Second,
	}
	children := make([]supervise.Child, s.opts.Replicas)
	for i := range children {
		r := &replica{name: "replica-" + string(rune('a'+i)), exited: make(chan struct{})}
		close(r.exited) // not started yet
		s.replicas = append(s.replicas, r)
		b := frontdoor.NewBackend(r.name, "")
		s.backends = append(s.backends, b)
		children[i] = s.child(r, b)
	}
	door, err := s.startFrontDoor()
	if err != nil {
		return nil, err
	}
	defer door.Close()
	for _, name := range []string{AppEmbedded, AppRemote} {
		r := &replica{name: name, exited: make(chan struct{})}
		close(r.exited)
		s.apps = append(s.apps, r)
		children = append(children, s.appChild(r))
	}
	for _, name := range []string{WorkA, WorkB} {
		r := &replica{name: name, command: true, exited: make(chan struct{})}
		close(r.exited)
		s.apps = append(s.apps, r)
		children = append(children, s.workChild(r))
	}
	supCtx, stopReplicas := context.WithCancel(context.WithoutCancel(ctx))
	supDone := make(chan error, 1)
	go func() { supDone <- s.sup.Run(supCtx, children) }()
	stop := sync.OnceValue(func() error {
		stopReplicas()
		return <-supDone
	})
	defer stop() //nolint:errcheck // on an early return; the normal path checks what it returns

	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	if err := s.setGenerator(ctx, true); err != nil {
		return nil, err
	}
	if err := s.createSchedules(ctx); err != nil {
		return nil, err
	}
	if err := s.setRate(ctx); err != nil {
		return nil, err
	}

	s.log.Info().Dur("duration", s.opts.Duration).Dur("fault_interval", s.opts.FaultInterval).
		Msgf("chaos: load and faults for %v (and until the %d forced fault(s) are in, for at most %v), a fault every %v on average",
			s.opts.Duration, len(s.opts.Forced), s.opts.MaxDuration, s.opts.FaultInterval)
	phase, endPhase := context.WithTimeout(ctx, s.opts.MaxDuration)
	defer endPhase()
	started := time.Now()
	forcedIn := make(chan struct{}) // closed once every forced fault has been injected
	var wg sync.WaitGroup
	wg.Go(func() { s.injectFaults(ctx, phase.Done(), forcedIn) })
	wg.Go(func() { s.createTasks(phase) })
	wg.Go(func() { s.createAppTasks(phase) })
	wg.Go(func() { s.controlTasks(phase) })
	wg.Go(func() { s.createGatedTasks(phase) })
	wg.Go(func() { s.createSlotTasks(phase) })
	wg.Go(func() { s.createRateTasks(phase) })
	wg.Go(func() { s.createPausedTasks(phase) })
	wg.Go(func() { s.pauseQueue(phase) }) // ends its last pause before the drain
	for i := range leaseClients {
		wg.Go(func() { s.leaseClient(phase, i) })
	}
	for i := range slotClients {
		wg.Go(func() { s.slotClient(phase, i) })
	}
	ranOut := s.endPhase(phase, endPhase, forcedIn)
	wg.Wait() // a fault under way is finished: a paused replica continued, PostgreSQL up
	if ranOut {
		s.forcedMissed(forcedIn)
	}
	interrupted := ctx.Err() != nil
	s.mu.Lock()
	s.report.Started, s.report.Elapsed, s.report.Interrupted = started, time.Since(started), interrupted
	s.mu.Unlock()

	// Wind down: nothing new, then every task finished, then the replicas stopped.
	endCtx := context.WithoutCancel(ctx)
	genCtx, cancel := context.WithTimeout(endCtx, 30*time.Second)
	if err := s.setGenerator(genCtx, false); err != nil {
		s.problem("could not stop the generator: %v", err)
	}
	cancel()
	s.removeSchedules(endCtx)
	ordersCtx, cancel := context.WithTimeout(endCtx, 30*time.Second)
	if err := stopOrders(ordersCtx, s.pool); err != nil {
		s.problem("could not stop the applications' orders: %v", err)
	}
	cancel()
	if !interrupted {
		drained := s.drain(ctx)
		s.mu.Lock()
		s.report.Drained = drained
		s.mu.Unlock()
	}
	s.log.Info().Msg("chaos: stopping the replicas (SIGTERM)")
	if err := stop(); err != nil {
		s.problem("supervisor: %v", err)
	}

	if err := s.countTasks(endCtx); err != nil {
		s.problem("count the tasks: %v", err)
	}
	if err := s.countSlots(endCtx); err != nil {
		s.problem("count the tasks on the keys of k slots: %v", err)
	}
	if err := s.countFlow(endCtx); err != nil {
		s.problem("count the tasks of %s and %s: %v", rateKey, pausedQueue, err)
	}
	if err := s.checkApps(endCtx); err != nil {
		s.problem("check the applications' tasks: %v", err)
	}
	s.checkGrants()
	checkCtx, cancel := context.WithTimeout(endCtx, checkTimeout)
	defer cancel()
	s.mu.Lock()
	opts := checker.Options{
		Outages:         slices.Clone(s.report.Outages),
		ExpectedTasks:   slices.Clone(s.created),
		AllowUnfinished: interrupted,
		Limits:          slotLimits(),
		Rates:           map[string]checker.Rate{rateKey: {Starts: rateStarts, Period: ratePeriod}},
		Pauses:          slices.Clone(s.pauses),
	}
	for _, r := range s.members() {
		opts.Exits = append(opts.Exits, r.exitsAs()...)
	}
	for _, sc := range s.schedules {
		// A schedule whose removal failed is still ticking: only its duplicates are judged.
		if !sc.End.IsZero() && !sc.Next.IsZero() {
			opts.Schedules = append(opts.Schedules, sc)
		}
	}
	s.mu.Unlock()
	s.log.Info().Int("expected_tasks", len(opts.ExpectedTasks)).Int("outages", len(opts.Outages)).Msg("chaos: checking the history")
	check, err := checker.Check(checkCtx, s.pool, opts)
	if err != nil {
		s.problem("the checker failed: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Check = check
	rep := s.report
	return &rep, nil
}

// endPhase ends the load and the faults once Duration has passed and every forced fault is
// in, or when phase ends (MaxDuration, or the soak's context): counted in events, not only in
// seconds, so that a slow machine does not end a soak before what it was asked to do. It
// reports whether MaxDuration ran out first.
func (s *soak) endPhase(phase context.Context, end context.CancelFunc, forcedIn <-chan struct{}) (ranOut bool) {
	defer end()
	timer := time.NewTimer(s.opts.Duration)
	defer timer.Stop()
	select {
	case <-phase.Done():
		return false // the soak's context ended before Duration: nothing ran out
	case <-timer.C:
	}
	select {
	case <-forcedIn:
		return false
	default:
	}
	s.log.Info().Msg("chaos: the duration is over; going on until the forced faults are in")
	select {
	case <-forcedIn:
		return false
	case <-phase.Done():
		return errors.Is(phase.Err(), context.DeadlineExceeded)
	}
}

// forcedMissed reports as a problem the forced faults not injected by the end of the
// faults (forcedIn not closed). A fault begun within MaxDuration counts, however long
// its end takes (a failover's rebuild of the standby on a loaded machine).
func (s *soak) forcedMissed(forcedIn <-chan struct{}) {
	select {
	case <-forcedIn:
		return
	default:
	}
	s.mu.Lock()
	var got []string
	for _, f := range s.report.Faults {
		got = append(got, string(f.Kind))
	}
	s.mu.Unlock()
	s.problem("the forced faults %s were not all injected within the max duration %v: the soak injected %s",
		joinKinds(s.opts.Forced), s.opts.MaxDuration, strings.Join(got, ","))
}

// resetDatabase drops the cluster's leasehold database, with any session still on it, and
// creates it again: every run starts from an empty history.
func resetDatabase(ctx context.Context, c *localpg.Cluster) error {
	conn, err := pgx.Connect(ctx, localpg.URL(c.Port(), "postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to reset the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := pgx.Identifier{localpg.Database}.Sanitize()
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("chaos: reset the database: %s: %w", sql, err)
		}
	}
	return nil
}

// closeCluster stops the cluster, or the primary and standby (removing their data
// directories), unless they are to be kept.
func (s *soak) closeCluster(ctx context.Context) {
	if s.opts.KeepCluster {
		what := fmt.Sprintf("PostgreSQL cluster %q", s.opts.Cluster)
		if s.pair != nil {
			what = "the primary and the standby"
		}
		s.log.Info().Str("url", redact(s.dbURL)).Msgf("chaos: %s left running", what)
		if s.cluster != nil {
			_ = s.cluster.Close(ctx, false)
		}
		return
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	stop := func(ctx context.Context) error { return s.cluster.Close(ctx, true) }
	if s.pair != nil {
		stop = s.pair.Close
	}
	if err := stop(stopCtx); err != nil {
		s.log.Error().Err(err).Msg("chaos: stop PostgreSQL")
	}
}

// drain waits until no task is pending or running, for at most DrainTimeout. Polling is
// fine here: the soak is a test tool, and the queue's own wake-ups are what is under test.
func (s *soak) drain(ctx context.Context) bool {
	s.log.Info().Dur("timeout", s.opts.DrainTimeout).Msg("chaos: load stopped; waiting for the replicas to finish every task")
	ctx, cancel := context.WithTimeout(ctx, s.opts.DrainTimeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var left int64 = -1
	for {
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state IN ('pending', 'running')`).Scan(&left)
		if err == nil && left == 0 {
			s.log.Info().Msg("chaos: queue drained")
			return true
		}
		select {
		case <-ctx.Done():
			s.problem("the queue did not drain within %v: %d task(s) still pending or running", s.opts.DrainTimeout, left)
			return false
		case <-tick.C:
		}
	}
}

// countTasks fills the report's task counts from the database.
func (s *soak) countTasks(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var done, dead, cancelled, unfinished, generated int
	var g GatedStats
	err := s.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE state = 'done'),
		       count(*) FILTER (WHERE state = 'dead'),
		       count(*) FILTER (WHERE state = 'cancelled'),
		       count(*) FILTER (WHERE state IN ('pending', 'running')),
		       count(*) FILTER (WHERE generator_fence IS NOT NULL),
		       count(*) FILTER (WHERE lock_resource IS NOT NULL),
		       count(*) FILTER (WHERE lock_resource IS NOT NULL AND state = 'done'),
		       count(*) FILTER (WHERE lock_resource IS NOT NULL AND schedule IS NOT NULL),
		       count(*) FILTER (WHERE schedule IS NOT NULL)
		FROM tasks`).Scan(&done, &dead, &cancelled, &unfinished, &generated, &g.Tasks, &g.Done, &g.Scheduled, &g.ScheduleTasks)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.TasksDone, s.report.TasksDead, s.report.TasksUnfinished, s.report.TasksGenerated = done, dead, unfinished, generated
	s.report.TasksCancelled = cancelled
	s.report.TasksCreated = len(s.created)
	g.Created = len(s.gated)
	s.report.Gated = g
	return nil
}

// problem records a failure of the soak that is not a broken guarantee.
func (s *soak) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Error().Msg("chaos: " + msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Problems = append(s.report.Problems, msg)
}

// logLines writes each line written to it to a log, at level info.
type logLines struct{ log zerolog.Logger }

func (l logLines) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		if line = strings.TrimSpace(line); line != "" {
			l.log.Info().Msg(line)
		}
	}
	return len(p), nil
}

// redact hides the password of a database URL, for the log.
func redact(url string) string {
	return strings.Replace(url, ":"+localpg.Password+"@", ":xxxxx@", 1)
}
