package leasehold

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/internal/schedulestore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/retention"
	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schema"
	"github.com/leasehold/leasehold/task"
)

// Config configures a Client. The zero value is a client that inserts and
// controls tasks and takes leases, and runs no workers.
type Config struct {
	// ID names this client among the others: its workers are the
	// processors "<ID>/w<N>" (or "<ID>/<queue>/w<N>") and its electors'
	// default holder. It must be unique among live clients. Default:
	// "<hostname>-<pid>" for the first client of a process given none, and
	// "<hostname>-<pid>-<n>" for the n-th such client from the second on.
	ID string
	// Workers are the kinds this client runs (nil: none). A worker claims
	// only the kinds it has; a task of a kind nobody runs waits, untouched.
	Workers *Workers
	// Queues are the queues the workers take tasks from, each with its own
	// concurrency. Default, when Workers is set: {"default": {MaxWorkers: 10}}.
	Queues map[string]QueueConfig
	// TaskTTL is the lease TTL of a claimed task whose insert named none:
	// its workers heartbeat every third of it, and another worker takes
	// the task this long after its worker died. Whole seconds, 1s to 1h;
	// default 30s. (A remote client's claims get the service's
	// --lease-ttl instead.)
	TaskTTL time.Duration
	// LeaseTTL is the TTL of an acquisition that names none, on a client
	// on a pool (a remote client's get the service's default). Default 30s.
	LeaseTTL time.Duration
	// ShutdownGrace bounds how long Stop lets running tasks finish when its
	// context has no deadline; default 10s.
	ShutdownGrace time.Duration
	// TaskRetention is how long a finished (done, dead or cancelled) task
	// is kept, and LeaseHistoryRetention how long lease events and the
	// rows of ended leases are, when this client is the elected reaper: it
	// prunes what is older, as a service replica's reaper does with its
	// --task-retention and --lease-history-retention. Zero: a week (168h),
	// the service's default; negative: kept forever. At least a minute
	// otherwise. Give every process on the database the same values.
	TaskRetention         time.Duration
	LeaseHistoryRetention time.Duration
	// Middleware wraps the client's inserts and its workers' attempts, the
	// first outermost (Middleware).
	Middleware []Middleware
	// AllowUnknownKinds lets a client with Workers insert tasks of kinds it
	// does not register (for other programs to run). Without it such an
	// insert fails with ErrUnknownKind: most often a typo.
	AllowUnknownKinds bool
	// Scheduler, on a client on a pool, makes Start campaign for the
	// scheduler lease too: while this client holds it, it enqueues the
	// ticks of every schedule (Client.Schedules), as a `leasehold serve`
	// replica with the scheduler role does. Any number of processes may
	// campaign; each tick is made one task whichever holds the lease.
	Scheduler bool
	// Logger receives the client's logs (nil: none). Warnings say when the
	// database or service cannot be reached and when it is back; errors,
	// what needs a human.
	Logger *slog.Logger
}

// QueueConfig is one queue's share of a client's workers.
type QueueConfig struct {
	// MaxWorkers is how many of the queue's tasks the client runs at once:
	// 1 to 10000.
	MaxWorkers int
}

// Defaults of Config.
const (
	DefaultTaskTTL       = 30 * time.Second
	DefaultLeaseTTL      = 30 * time.Second
	DefaultShutdownGrace = 10 * time.Second
	DefaultMaxWorkers    = 10
)

// Client is leasehold in a Go program: it inserts and controls tasks, runs
// the program's workers, and takes leases and elections. NewClient makes
// one on the program's own PostgreSQL pool (the tables of `leasehold
// migrate`, or Migrate); NewRemoteClient one on a leasehold service's REST
// API, for a program without database credentials. Both offer the same
// methods and types, but for InsertTx, which needs the database. A Client
// is safe for concurrent use; make one per process and share it: it owns
// one LISTEN connection for all its workers, leases and electors.
type Client struct {
	cfg   Config
	kinds []string
	funcs map[string]*kindWorker
	log   zerolog.Logger

	// On a pool: pool and the stores. Remote: rest.
	pool       *pgxpool.Pool
	store      *taskstore.Store
	leaseStore *leasestore.Store
	rest       *restclient.Client

	leases    *Leases
	schedules *Schedules

	// safetyPoll is the workers' last-resort poll (worker.Pool's SafetyPoll:
	// zero for its default); tests turn it off to prove nobody needs it.
	safetyPoll time.Duration

	// lifecycle is held by Start throughout and by Stop while it ends the
	// workers: they never run at once.
	lifecycle sync.Mutex
	started   bool
	stopped   bool
	stopRun   context.CancelFunc // ends the workers' claims
	abort     chan struct{}      // closed when Stop's context ended: running tasks are cancelled
	running   sync.WaitGroup     // the workers' pools

	// insertMW and workMW are Config.Middleware's, in order.
	insertMW []func(ctx context.Context, tasks []*InsertingTask, next func(context.Context) error) error
	workMW   []func(ctx context.Context, t *task.Task, next func(context.Context) error) error

	// waits are the client's WaitTask calls' watcher.
	waits waits
	// events are its workers' events, for Subscribe.
	events events

	// warnedQueues are the queues an insert went to that this client's
	// workers do not take: each is said once.
	warnedQueues sync.Map

	mu       sync.Mutex       // guards the listener
	listener *notify.Listener // started with the first user, nil before
	listenWG sync.WaitGroup
	stopLn   context.CancelFunc
	users    int // users of the listener
}

// NewClient returns a client on pool, leasehold's tables in the schema
// first on its search_path. It checks cfg and returns an error wrapping
// ErrInvalidConfig when it cannot work; it neither connects nor starts
// anything (Start runs the workers).
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: NewClient needs a *pgxpool.Pool, not nil", ErrInvalidConfig)
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	c.pool = pool
	c.store = taskstore.NewStore(pool)
	c.leaseStore = leasestore.NewStore(pool)
	c.leases = &Leases{svc: storeLeases{store: c.leaseStore, c: c}, ttl: c.cfg.LeaseTTL}
	c.schedules = &Schedules{store: schedulestore.NewStore(pool), kind: c.knownKind}
	return c, nil
}

// NewRemoteClient returns a client on the leasehold service that remote
// names. It checks remote and cfg and returns an error wrapping
// ErrInvalidConfig when they cannot work; it does not contact the service.
func NewRemoteClient(remote RemoteConfig, cfg Config) (*Client, error) {
	r, err := newREST(remote)
	if err != nil {
		return nil, err
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Scheduler {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errNoScheduler)
	}
	c.rest = r
	c.leases = &Leases{svc: restclient.Leases{C: r}}
	c.schedules = &Schedules{rest: r, kind: c.knownKind}
	return c, nil
}

// defaultIDs counts the clients of this process given the default ID.
var defaultIDs atomic.Int64

// newClient checks cfg and fills its defaults.
func newClient(cfg Config) (*Client, error) {
	if cfg.ID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "leasehold"
		}
		cfg.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
		// Two clients of one process would otherwise name the same
		// workers, and a worker's name is what holds its task's lease and
		// its key's slot: the second and later get a number of their own.
		if n := defaultIDs.Add(1); n > 1 {
			cfg.ID += fmt.Sprintf("-%d", n)
		}
	}
	if err := checkName("Config.ID", cfg.ID); err != nil {
		return nil, asConfig(err)
	}
	for field, d := range map[string]*time.Duration{"TaskTTL": &cfg.TaskTTL, "LeaseTTL": &cfg.LeaseTTL} {
		if *d == 0 {
			*d = DefaultTaskTTL // = DefaultLeaseTTL
		}
		if *d < time.Second || *d > time.Hour || *d%time.Second != 0 {
			return nil, fmt.Errorf("%w: Config.%s %s must be a whole number of seconds from 1s to 1h", ErrInvalidConfig, field, *d)
		}
	}
	if cfg.ShutdownGrace < 0 {
		return nil, fmt.Errorf("%w: Config.ShutdownGrace %s must not be negative", ErrInvalidConfig, cfg.ShutdownGrace)
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	for field, d := range map[string]time.Duration{"TaskRetention": cfg.TaskRetention, "LeaseHistoryRetention": cfg.LeaseHistoryRetention} {
		if err := retention.ValidateAge(retentionAge(d)); err != nil {
			return nil, fmt.Errorf("%w: Config.%s: %w (zero: a week; negative: keep forever)", ErrInvalidConfig, field, err)
		}
	}
	kinds, funcs := cfg.Workers.list()
	if cfg.Workers != nil && len(kinds) == 0 {
		return nil, fmt.Errorf("%w: Config.Workers has no kind; add one with AddWorker, or leave Workers nil", ErrInvalidConfig)
	}
	if len(kinds) > 0 && len(cfg.Queues) == 0 {
		cfg.Queues = map[string]QueueConfig{task.DefaultQueue: {MaxWorkers: DefaultMaxWorkers}}
	}
	if len(kinds) == 0 && len(cfg.Queues) > 0 {
		return nil, fmt.Errorf("%w: Config.Queues are set but Config.Workers is not: a queue needs workers to run its tasks", ErrInvalidConfig)
	}
	queues := make(map[string]QueueConfig, len(cfg.Queues))
	for name, q := range cfg.Queues {
		if err := checkName("Config.Queues: queue name", name); err != nil {
			return nil, asConfig(err)
		}
		if q.MaxWorkers < 1 || q.MaxWorkers > 10000 {
			return nil, fmt.Errorf("%w: queue %q: MaxWorkers %d must be 1 to 10000", ErrInvalidConfig, name, q.MaxWorkers)
		}
		queues[name] = q
	}
	cfg.Queues = queues
	c := &Client{cfg: cfg, kinds: kinds, funcs: funcs, log: zerologOf(cfg.Logger).With().Str("instance", cfg.ID).Logger()}
	for _, mw := range cfg.Middleware {
		if mw.Insert != nil {
			c.insertMW = append(c.insertMW, mw.Insert)
		}
		if mw.Work != nil {
			c.workMW = append(c.workMW, mw.Work)
		}
	}
	return c, nil
}

// ID returns the client's Config.ID.
func (c *Client) ID() string { return c.cfg.ID }

// Kinds returns the kinds the client's workers run, sorted (none for a
// client without Workers).
func (c *Client) Kinds() []string { return slices.Clone(c.kinds) }

// Queues returns the queues the client's workers take tasks from, sorted
// (none for a client without Workers).
func (c *Client) Queues() []string { return slices.Sorted(maps.Keys(c.cfg.Queues)) }

// Leases returns the client's leases.
func (c *Client) Leases() *Leases { return c.leases }

// listen returns the client's LISTEN connection, starting it for its first
// user, and a function to call when done with it: the last user's call
// stops it.
func (c *Client) listen() (*notify.Listener, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users == 0 {
		cc := c.pool.Config().ConnConfig.Copy()
		cc.RuntimeParams["application_name"] = "leasehold " + c.cfg.ID + " listener"
		l := notify.New(func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, cc.Copy())
		}, c.log, notify.ChannelLease, notify.ChannelTask, notify.ChannelSchedule)
		ctx, cancel := context.WithCancel(context.Background())
		c.listener, c.stopLn = l, cancel
		c.listenWG.Go(func() { _ = l.Run(ctx) })
	}
	c.users++
	var once sync.Once
	return c.listener, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.users--
			if c.users == 0 {
				c.stopLn()
				c.listenWG.Wait()
				c.listener = nil
			}
		})
	}
}

// Start runs the client's workers: for each queue, MaxWorkers of them,
// each claiming the next due task of the kinds the client registers (woken
// by NOTIFY on a pool, long-polling a remote service), running it under its
// lease, and recording what became of it. On a pool it returns once the
// workers can be woken by an insert (their first claim round is over, or
// 5 s or ctx passed), so that a task inserted right after Start is
// claimed at once; remote, it returns at once. The workers run until Stop. A client without Workers (and without
// Config.Scheduler) has nothing to start, and Start returns nil.
//
// A client on a pool also campaigns to be the reaper (the lease
// "leasehold:reaper", shared with every leasehold process on the
// database): the one elected puts a task whose worker died back in the
// queue, and announces an expired lease, within a second of its expiry.
// While it is, it also prunes finished tasks and lease history older than
// Config.TaskRetention and Config.LeaseHistoryRetention. With
// Config.Scheduler it also campaigns for the scheduler lease. On a
// database whose schema is older than this leasehold's, Start starts
// nothing and returns an error wrapping ErrNotMigrated, saying what to run.
func (c *Client) Start(ctx context.Context) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	switch {
	case c.stopped:
		return ErrStopped
	case c.started:
		return ErrStarted
	}
	if c.pool != nil && (len(c.kinds) > 0 || c.cfg.Scheduler) {
		if err := checkMigrated(ctx, c.pool); err != nil {
			return err
		}
	}
	c.started = true
	if len(c.kinds) == 0 && !c.cfg.Scheduler {
		return nil
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stopRun, c.abort = stop, make(chan struct{})
	if c.cfg.Scheduler {
		l, done := c.listen()
		s := &scheduler.Scheduler{
			Store: c.schedules.store, Leases: c.leaseStore, Listener: l, Instance: c.cfg.ID,
			Keep: lease.KeepConfig{TTL: schedulerTTL}, Log: c.log,
		}
		c.running.Go(func() {
			defer done()
			if err := s.Run(runCtx); err != nil {
				c.log.Error().Err(err).Msg("scheduler stopped")
			}
		})
	}
	if len(c.kinds) == 0 {
		return nil
	}
	handler := func(ctx context.Context, t task.Task) (json.RawMessage, error) {
		kw := c.funcs[t.Kind]
		if kw == nil { // cannot happen: a pool claims the kinds it has
			return nil, fmt.Errorf("no worker for kind %q", t.Kind)
		}
		return c.working(ctx, t, kw.run)
	}
	names := make([]string, 0, len(c.cfg.Queues))
	for name := range c.cfg.Queues {
		names = append(names, name)
	}
	sort.Strings(names)
	if c.pool != nil {
		l, done := c.listen()
		r := &reaper.Reaper{
			Store: c.leaseStore, Tasks: c.store, Listener: l, Instance: c.cfg.ID,
			Keep: lease.KeepConfig{TTL: reaperTTL}, Log: c.log,
			// While it is the reaper, it prunes as a replica's would: a
			// reaper that does not leaves the history to grow.
			Retention: &retention.Pruner{Store: retention.NewStore(c.pool), Log: c.log, Config: retention.Config{
				TaskAge: retentionAge(c.cfg.TaskRetention), LeaseHistoryAge: retentionAge(c.cfg.LeaseHistoryRetention),
			}},
		}
		c.running.Go(func() {
			defer done()
			if err := r.Run(runCtx); err != nil {
				c.log.Error().Err(err).Msg("reaper stopped")
			}
		})
	}
	var ready sync.WaitGroup // the embedded pools' first rounds
	for _, name := range names {
		q := c.cfg.Queues[name]
		if c.pool != nil {
			l, done := c.listen()
			ready.Add(1)
			isReady := sync.OnceFunc(ready.Done)
			p := &worker.Pool{
				Tasks: c.store, Listener: l, Instance: c.cfg.ID, Queue: name, Kinds: c.kinds, Handler: handler,
				Workers: q.MaxWorkers, TTL: c.cfg.TaskTTL, Abort: c.abort, Log: c.log, SafetyPoll: c.safetyPoll,
				OnEvent: c.events.publish, Ready: isReady,
			}
			c.running.Go(func() {
				defer done()
				defer isReady() // a pool that stopped before its first round is waited for no more
				if err := p.Run(runCtx); err != nil {
					c.log.Error().Err(err).Str("queue", name).Msg("workers stopped")
				}
			})
			continue
		}
		p := &worker.RemotePool{
			Tasks: restclient.Tasks{C: c.rest}, Instance: c.cfg.ID, Queues: []string{name}, Kinds: c.kinds, Handler: handler,
			Workers: q.MaxWorkers, TTL: c.cfg.TaskTTL, Abort: c.abort, Log: c.log, Transient: restclient.Transient,
			OnEvent: c.events.publish,
		}
		c.running.Go(func() {
			if err := p.Run(runCtx); err != nil {
				c.log.Error().Err(err).Str("queue", name).Msg("workers stopped")
			}
		})
	}
	// Start returns once the embedded workers can be woken by an insert: a
	// task inserted right after it is claimed at once, not by the first
	// round's catch-up. Bounded by ctx and startReadyWithin: a database that
	// is slow to answer delays the workers, not the caller.
	waitReady(ctx, &ready, startReadyWithin)
	return nil
}

// startReadyWithin bounds how long Start waits for the workers' first
// claim round.
const startReadyWithin = 5 * time.Second

// waitReady waits until wg is done, ctx ends or within has passed.
func waitReady(ctx context.Context, wg *sync.WaitGroup, within time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// defaultRetention is how long finished tasks and lease history are kept
// when Config says nothing: the service's default.
const defaultRetention = 7 * 24 * time.Hour

// retentionAge is a Config retention as the pruner takes it: zero is the
// default, negative is 0 (keep forever).
func retentionAge(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return defaultRetention
	case d < 0:
		return 0
	}
	return d
}

// checkMigrated refuses a database whose schema is older than this
// leasehold's: its workers would fail every claim, for ever.
func checkMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	latest, err := schema.Latest()
	if err != nil {
		return err
	}
	v, err := schema.Applied(ctx, pool)
	if err != nil {
		return fmt.Errorf("read the database's schema version: %w", err)
	}
	if v < latest {
		return fmt.Errorf("%w: it is at migration %d, this leasehold needs %d; run leasehold.Migrate(ctx, pool) or `leasehold migrate`",
			ErrNotMigrated, v, latest)
	}
	return nil
}

// reaperTTL and schedulerTTL are the TTLs of the reaper and scheduler
// leases, as the service's.
const (
	reaperTTL    = 5 * time.Second
	schedulerTTL = 5 * time.Second
)

// Stop stops the client gracefully: its workers claim nothing more, the
// tasks they run may finish until ctx ends (or Config.ShutdownGrace passes,
// when ctx has no deadline), and those still running then are cancelled
// and handed back to the queue, not counted as an attempt, for another
// worker to take at once. It returns when every goroutine of the client has
// exited: nil, or ctx's error when running tasks had to be cancelled. A
// stopped client cannot be started again; its inserts, controls and leases
// still work.
func (c *Client) Stop(ctx context.Context) error {
	c.lifecycle.Lock()
	if c.stopped {
		c.lifecycle.Unlock()
		return nil
	}
	c.stopped = true
	stop, abort := c.stopRun, c.abort
	c.lifecycle.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	grace := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		grace, cancel = context.WithTimeout(ctx, c.cfg.ShutdownGrace)
		defer cancel()
	}
	done := make(chan struct{})
	go func() {
		c.running.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-grace.Done():
		close(abort)
		<-done
		return context.Cause(grace)
	}
}

// storeLeases is the lease service on the client's pool: an acquisition
// that waits hears of a release through the client's LISTEN connection.
type storeLeases struct {
	store *leasestore.Store
	c     *Client
}

func (s storeLeases) Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	if p.Wait <= 0 {
		return s.store.Acquire(ctx, p)
	}
	l, done := s.c.listen()
	defer done()
	return s.store.AcquireWaiting(ctx, p, leasestore.WaitParams{Listener: l})
}

func (s storeLeases) Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error) {
	return s.store.Renew(ctx, p)
}

func (s storeLeases) Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error) {
	return s.store.Release(ctx, p)
}

func (s storeLeases) Get(ctx context.Context, id int64) (lease.Lease, error) {
	return s.store.Get(ctx, id)
}

func (s storeLeases) List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error) {
	return s.store.List(ctx, p)
}

func (s storeLeases) Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error) {
	return s.store.Events(ctx, p)
}

func (s storeLeases) SetLimit(ctx context.Context, key string, slots int) (lease.Limit, error) {
	return s.store.SetLimit(ctx, key, slots)
}

func (s storeLeases) SetRate(ctx context.Context, key string, starts int, period time.Duration) (lease.Limit, error) {
	return s.store.SetRate(ctx, key, starts, period)
}

func (s storeLeases) Limit(ctx context.Context, key string) (lease.Limit, error) {
	return s.store.Limit(ctx, key)
}

func (s storeLeases) Limits(ctx context.Context, after string, limit int32) ([]lease.Limit, error) {
	return s.store.Limits(ctx, after, limit)
}
