package leasehold

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/lease"
)

// ElectorConfig configures an Elector (Client.NewElector).
type ElectorConfig struct {
	// Resource is the lease the candidates campaign for, e.g.
	// "leader:nightly-report".
	Resource string
	// Holder names this candidate: Config.ID when empty. Candidates need
	// distinct names.
	Holder string
	// Keep is how the leader keeps the lease: its TTL (default 15s) is how
	// long the others wait for a leader that died; it renews every
	// RenewInterval (default TTL/3) and steps down at its deadline (see
	// lease.KeepConfig). Validated by NewElector.
	Keep lease.KeepConfig
	// Callbacks are called as leadership comes and goes.
	Callbacks Callbacks
}

// DefaultElectionTTL is the TTL of an Elector's lease when Keep names none.
const DefaultElectionTTL = 15 * time.Second

// Callbacks hear of an Elector's leadership, in order: OnStartedLeading,
// then OnStoppedLeading once its context has ended, then (after a new win)
// OnStartedLeading again. As client-go's leaderelection's.
type Callbacks struct {
	// OnStartedLeading is called, in a goroutine of its own, each time the
	// candidate wins the lease, with the lease (its Fence is the
	// leadership's fencing token: pass it to what the leader writes) and a
	// context cancelled the moment the lease is lost, released or the
	// elector stops. Required. The lease is kept until then, whether or not
	// it returns earlier.
	OnStartedLeading func(ctx context.Context, l lease.Lease)
	// OnStoppedLeading, if set, is called each time leadership ends, after
	// OnStartedLeading returned and the lease was released or counted lost.
	OnStoppedLeading func()
	// OnNewLeader, if set, is called with the holder each time a campaign
	// finds another candidate leading (once per holder in a row).
	OnNewLeader func(holder string)
}

// Elector is one candidate of a leader election on a lease: at most one
// candidate of those campaigning for the resource leads at any moment (the
// lease's mutual exclusion), and each leadership gets a fence strictly
// greater than every one before. A follower takes over as soon as the
// leader releases the lease (woken by NOTIFY on a pool, by the service for
// a remote client) or, when the leader died, when its lease expires.
type Elector struct {
	c       *Client
	cfg     ElectorConfig
	leading atomic.Bool
	running atomic.Bool
}

// NewElector returns a candidate for cfg.Resource. It checks cfg and
// returns an error wrapping ErrInvalidConfig when it cannot work
// (client-go's NewLeaderElector); it starts nothing (Run campaigns).
func (c *Client) NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.Holder == "" {
		cfg.Holder = c.cfg.ID
	}
	if cfg.Keep.TTL == 0 {
		cfg.Keep.TTL = DefaultElectionTTL
	}
	if err := firstErr(checkResource("ElectorConfig.Resource", cfg.Resource), checkName("ElectorConfig.Holder", cfg.Holder)); err != nil {
		return nil, asConfig(err)
	}
	if err := cfg.Keep.Validate(); err != nil {
		return nil, fmt.Errorf("%w: ElectorConfig.Keep: %w", ErrInvalidConfig, err)
	}
	if cfg.Callbacks.OnStartedLeading == nil {
		return nil, fmt.Errorf("%w: ElectorConfig.Callbacks.OnStartedLeading is nil: say what the leader does", ErrInvalidConfig)
	}
	return &Elector{c: c, cfg: cfg}, nil
}

// IsLeader reports whether the candidate leads now.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// Run campaigns until ctx ends: each time the candidate wins it runs
// OnStartedLeading, keeps the lease while its context lasts, and releases
// it when ctx ends (so that a follower takes over at once); then it
// campaigns again. It returns nil when ctx ends, and an error only when
// Run is already running.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: the elector of %s runs already", ErrInvalidArgument, e.cfg.Resource)
	}
	defer e.running.Store(false)
	inner := &leasing.Elector{
		Leases: e.c.leases.svc, Resource: e.cfg.Resource, Holder: e.cfg.Holder, Keep: e.cfg.Keep, Log: e.c.log,
	}
	if e.c.pool != nil {
		l, done := e.c.listen()
		defer done()
		inner.Listener = l
	}
	var last string
	inner.Observed = func(holder string) {
		if holder != last && e.cfg.Callbacks.OnNewLeader != nil {
			e.cfg.Callbacks.OnNewLeader(holder)
		}
		last = holder
	}
	inner.Stopped = func(lease.Lease, error) {
		e.leading.Store(false)
		if e.cfg.Callbacks.OnStoppedLeading != nil {
			e.cfg.Callbacks.OnStoppedLeading()
		}
	}
	return inner.Run(ctx, func(ctx context.Context, l lease.Lease) {
		last = l.Holder
		e.leading.Store(true)
		var wg sync.WaitGroup
		wg.Go(func() { e.cfg.Callbacks.OnStartedLeading(ctx, l) })
		<-ctx.Done()
		wg.Wait()
	})
}
