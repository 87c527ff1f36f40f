package leasehold

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keepalive"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/name"
	"github.com/leasehold/leasehold/lease"
)

// leaseService is what Leases needs of a backend: the Store on the
// client's pool, or the REST API.
type leaseService interface {
	leasing.Service
	Get(ctx context.Context, id int64) (lease.Lease, error)
	List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error)
	Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error)
	SetLimit(ctx context.Context, key string, slots int) (lease.Limit, error)
	SetRate(ctx context.Context, key string, starts int, period time.Duration) (lease.Limit, error)
	Limit(ctx context.Context, key string) (lease.Limit, error)
	Limits(ctx context.Context, after string, limit int32) ([]lease.Limit, error)
}

// Leases takes, renews and releases leases: time-bounded exclusive
// ownership of a named resource, each acquisition with a fencing token
// greater than every one handed out before. Get it from Client.Leases: the
// same methods and the same types serve a client on a PostgreSQL pool and
// one on a leasehold service's REST API. It is safe for concurrent use.
//
// The errors callers test for are package lease's: a *lease.HeldError
// (errors.Is lease.ErrHeld) when another holder holds the resource,
// lease.ErrNotHeld when a renewal or release finds the holder no longer
// holds it, lease.ErrNotFound for an unknown id; ErrInvalidArgument for a
// bad name or TTL, before anything is sent. A remote client's other
// failures are a *StatusError or a network error (IsTransient).
type Leases struct {
	svc leaseService
	// ttl is the TTL of an acquisition that names none (zero: the
	// service's default, for a remote client).
	ttl time.Duration

	// holdings are this process's live holdings, one per (resource,
	// holder): a second is refused or waits (HoldingError, HoldWait).
	mu       sync.Mutex
	holdings map[holdingKey]*holdingSlot
}

type holdingKey struct{ resource, holder string }

// holdingSlot is a (resource, holder) taken by a holding, from before its
// acquisition until its goroutine exits; h is set once it holds.
type holdingSlot struct {
	done chan struct{}
	h    *Holding
}

// reserve takes the slot of (resource, holder), or returns the slot that
// has it.
func (l *Leases) reserve(k holdingKey) (mine, other *holdingSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.holdings[k]; s != nil {
		return nil, s
	}
	if l.holdings == nil {
		l.holdings = map[holdingKey]*holdingSlot{}
	}
	s := &holdingSlot{done: make(chan struct{})}
	l.holdings[k] = s
	return s, nil
}

// free gives the slot of k up, if s still has it.
func (l *Leases) free(k holdingKey, s *holdingSlot) {
	l.mu.Lock()
	if l.holdings[k] == s {
		delete(l.holdings, k)
	}
	l.mu.Unlock()
	close(s.done)
}

// holdingOf is the live holding of (resource, holder) in this process.
func (l *Leases) holdingOf(k holdingKey) *Holding {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.holdings[k]; s != nil {
		return s.h
	}
	return nil
}

// checkName refuses what the REST API refuses in a name (internal/name's
// rule): empty, over 255 bytes, invalid UTF-8, a control or format
// character, blank, not in NFC.
func checkName(field, v string) error {
	if err := name.Check(field, v); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return nil
}

// checkResource is checkName of a lease's resource (a lock's included),
// which must also lie outside the reserved namespace: lease.ErrReserved.
func checkResource(field, v string) error {
	if err := checkName(field, v); err != nil {
		return err
	}
	if name.Reserved(v) {
		return fmt.Errorf("%w: %s %q begins with %q, the namespace of leasehold's own leases; choose a resource outside it",
			lease.ErrReserved, field, v, lease.ReservedPrefix)
	}
	return nil
}

// checkTTL refuses a TTL the service would: not whole seconds, or outside
// 1s..1h. Zero passes (the default).
func checkTTL(field string, ttl time.Duration) error {
	if ttl != 0 && (ttl < time.Second || ttl > time.Hour || ttl%time.Second != 0) {
		return fmt.Errorf("%w: %s %s must be a whole number of seconds from 1s to 1h", ErrInvalidArgument, field, ttl)
	}
	return nil
}

// MaxWait is the longest one Acquire may wait for a held resource: 300 s,
// lease.MaxWait.
const MaxWait = lease.MaxWait

// Acquire takes p.Resource for p.Holder with p.TTL (zero: the client's
// default, Config.LeaseTTL, or the service's for a remote client).
// Acquisition.New is true when the lease is new, with a new fence; false
// when the holder already held it (an idempotent retry: the lease
// unchanged). When another holder holds it the error is a *lease.HeldError
// carrying that holder's lease. With p.Wait (at most MaxWait), a held
// resource is waited for, woken by its release or expiry (NOTIFY, not
// polling), and the answer comes as soon as the lease is taken or the wait
// runs out.
//
// With p.Slots, p.Resource is a key of that many slots (a semaphore): the
// lease is one slot's, lease.SlotName(p.Resource, n), with a fence of its
// own, and renewed and released by that name; refused with a
// *lease.HeldError, carrying the slot that expires first, when every slot
// is held.
func (l *Leases) Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	if err := firstErr(checkResource("resource", p.Resource), checkName("holder", p.Holder), checkTTL("lease TTL", p.TTL),
		checkSlots("slots", p.Resource, p.Slots, false)); err != nil {
		return lease.Acquisition{}, err
	}
	if p.Wait < 0 || p.Wait > MaxWait {
		return lease.Acquisition{}, fmt.Errorf("%w: lease wait %s must be between 0 and %s", ErrInvalidArgument, p.Wait, MaxWait)
	}
	if p.TTL == 0 {
		p.TTL = l.ttl
	}
	return l.svc.Acquire(ctx, p)
}

// Renew extends the holder's active lease to now + TTL by the service's
// clock; p.TTL, when not zero, replaces the lease's TTL, and p.Fence, when
// not zero, must match. lease.ErrNotHeld when the holder holds no active
// lease on the resource (with that fence).
func (l *Leases) Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error) {
	if err := firstErr(checkResource("resource", p.Resource), checkName("holder", p.Holder), checkTTL("lease TTL", p.TTL)); err != nil {
		return lease.Lease{}, err
	}
	return l.svc.Renew(ctx, p)
}

// Release ends the holder's active lease now and returns it released.
// p.Fence and p.ID, when not zero, must match too. lease.ErrNotHeld when the
// holder holds no active lease on the resource: a second release included.
//
// A Holding of this process that holds the lease learns at once: its
// Context ends, with lease.ErrNotHeld.
func (l *Leases) Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error) {
	if err := firstErr(checkResource("resource", p.Resource), checkName("holder", p.Holder)); err != nil {
		return lease.Lease{}, err
	}
	released, err := l.svc.Release(ctx, p)
	if err == nil {
		h := l.holdingOf(holdingKey{p.Resource, p.Holder})
		if key, ok := lease.SlotKey(p.Resource); ok && h == nil {
			if h = l.holdingOf(holdingKey{key, p.Holder}); h != nil && h.Lease().Resource != p.Resource {
				h = nil
			}
		}
		if h != nil && (p.Fence == 0 || p.Fence == h.Lease().Fence) {
			h.releasedUnder()
		}
	}
	return released, err
}

// Get returns the lease with the given id, lease.ErrNotFound when there is
// none.
func (l *Leases) Get(ctx context.Context, id int64) (lease.Lease, error) {
	if id < 1 {
		return lease.Lease{}, fmt.Errorf("%w: lease id %d is not positive", ErrInvalidArgument, id)
	}
	return l.svc.Get(ctx, id)
}

// List returns a page of leases in id order. For the next page, call
// again with AfterID set to the last id.
func (l *Leases) List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error) {
	switch p.Filter {
	case "", lease.FilterAll, string(lease.StateActive), string(lease.StateExpired), string(lease.StateReleased), lease.FilterRenewed:
	default:
		return nil, fmt.Errorf("%w: lease filter %q; use all, active, expired, released or renewed", ErrInvalidArgument, p.Filter)
	}
	if p.Limit < 0 || p.Limit > 10000 || p.AfterID < 0 {
		return nil, fmt.Errorf("%w: limit %d must be 0 (the default) to 10000, after_id %d not negative", ErrInvalidArgument, p.Limit, p.AfterID)
	}
	if p.Limit == 0 {
		p.Limit = 1000
	}
	return l.svc.List(ctx, p)
}

// Events returns a page of the audit history in id order: of p.Resource, or
// of every resource when it is empty.
func (l *Leases) Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error) {
	if p.Limit < 0 || p.Limit > 10000 || p.AfterID < 0 {
		return nil, fmt.Errorf("%w: limit %d must be 0 (the default) to 10000, after_id %d not negative", ErrInvalidArgument, p.Limit, p.AfterID)
	}
	if p.Limit == 0 {
		p.Limit = 1000
	}
	return l.svc.Events(ctx, p)
}

// checkSlots refuses a number of slots out of range (zero passes unless
// required), and a key too long for its slots' names.
func checkSlots(field, key string, slots int, required bool) error {
	if slots == 0 && !required {
		return nil
	}
	if slots < 1 || slots > lease.MaxSlots {
		return fmt.Errorf("%w: %s %d must be from 1 to %d", ErrInvalidArgument, field, slots, lease.MaxSlots)
	}
	if n := len(lease.SlotName(key, lease.MaxSlots)); n > name.MaxBytes {
		return fmt.Errorf("%w: the key %q is %d bytes too long for its slots' names (KEY#N, at most %d bytes); shorten it",
			ErrInvalidArgument, key, n-name.MaxBytes, name.MaxBytes)
	}
	return nil
}

// SetLimit sets the limit of key to slots (1 to lease.MaxSlots). Raising it
// wakes the tasks waiting on the key at once; lowering it lets the holders
// above it finish and grants no slot until fewer than slots are held. A
// key's first limit may also come from the first acquisition or task that
// names one (lease.AcquireParams.Slots, InsertOpts.LockLimit).
func (l *Leases) SetLimit(ctx context.Context, key string, slots int) (lease.Limit, error) {
	if err := firstErr(checkResource("key", key), checkSlots("slots", key, slots, true)); err != nil {
		return lease.Limit{}, err
	}
	return l.svc.SetLimit(ctx, key, slots)
}

// MaxRatePeriod is the longest period of a rate.
const MaxRatePeriod = 24 * time.Hour

// SetRate gives key a rate: at most starts of its tasks (those whose Lock
// is key) start in any period, by the database clock, however many
// processes claim; starts 0 removes the rate. The claim that finds the
// rate spent leaves the key's tasks pending, and idle workers wake when
// the next start is allowed (no polling). A key with no limit yet gets the
// most slots, lease.MaxSlots: a rate alone bounds how often its tasks
// start, not how many run. starts 1 to lease.MaxSlots, period whole
// seconds from 1s to MaxRatePeriod.
func (l *Leases) SetRate(ctx context.Context, key string, starts int, period time.Duration) (lease.Limit, error) {
	if err := checkResource("key", key); err != nil {
		return lease.Limit{}, err
	}
	if starts < 0 || starts > lease.MaxSlots {
		return lease.Limit{}, fmt.Errorf("%w: rate starts %d must be from 1 to %d (0: no rate)", ErrInvalidArgument, starts, lease.MaxSlots)
	}
	if starts > 0 && (period < time.Second || period > MaxRatePeriod || period%time.Second != 0) {
		return lease.Limit{}, fmt.Errorf("%w: rate period %s must be whole seconds from 1s to %s", ErrInvalidArgument, period, MaxRatePeriod)
	}
	return l.svc.SetRate(ctx, key, starts, period)
}

// Limit returns key's limit, with its live slots and waiting tasks;
// lease.ErrNotFound when the key has none.
func (l *Leases) Limit(ctx context.Context, key string) (lease.Limit, error) {
	if err := checkResource("key", key); err != nil {
		return lease.Limit{}, err
	}
	return l.svc.Limit(ctx, key)
}

// Limits returns a page of the limited keys in name order, after the key
// after ("" from the first); limit 0 is the default, 100, at most 1000.
func (l *Leases) Limits(ctx context.Context, after string, limit int) ([]lease.Limit, error) {
	if limit < 0 || limit > 1000 {
		return nil, fmt.Errorf("%w: limit %d must be 0 (the default) to 1000", ErrInvalidArgument, limit)
	}
	if limit == 0 {
		limit = 100
	}
	return l.svc.Limits(ctx, after, int32(limit))
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseTimeout bounds the release a Holding sends on its own when the
// context given to Hold ends.
const releaseTimeout = 5 * time.Second

// Hold acquires the lease on resource for holder and keeps it alive in
// the background until Release is called, ctx ends, or the lease is lost.
// cfg's zero fields take the defaults: the TTL is the client's
// Config.LeaseTTL (the service's default, for a remote client without
// one), the intervals follow it (lease.KeepConfig). A cfg under which the
// lease could not be kept is refused before anything is sent, with an
// error wrapping ErrInvalidArgument. Hold does not wait for a resource
// another holder holds: that is a *lease.HeldError, whose lease says until
// when it is held (HoldWait waits).
//
// One holder holds a lease once: a second Hold of the same resource and
// holder in this process, while the first holds it, is refused with a
// *lease.HoldingError (errors.Is lease.ErrHeld), since both would believe
// they alone held it. Give each holding a holder name of its own (say
// client.ID() and what the holding is for), or wait for the first to end.
//
// The holding renews about every cfg.RenewInterval (default TTL/3, with
// jitter) and retries a failed renewal every cfg.RetryInterval. It counts
// the lease lost, and cancels its Context, as soon as a renewal is refused
// (the cause wraps lease.ErrNotHeld), the program releases the lease itself
// (Leases.Release: lease.ErrNotHeld too), or its deadline passes without a
// successful renewal (lease.ErrDeadline): the time the last successful
// renewal (or the acquisition) was sent + cfg.Window() (TTL − Margin −
// Grace) on this process's monotonic clock, so the holding gives up before
// the service can hand the lease to anyone else, however late the answers
// came.
//
// A holding that gave up at its deadline cannot know whether its last
// renewal arrived (its answer may have been lost on the way back), so it
// releases the lease under its fence, best effort, once the caller has
// stopped: when Release is called, or cfg.Grace after the deadline (at once
// with no Grace). Another holder then takes the lease at once rather than
// at an expiry nobody can tell; a release the service refuses (the lease
// lapsed or was taken) changes nothing.
//
// When ctx ends the holding stops renewing and releases the lease (bounded
// by a few seconds); Release then reports how that went.
//
// When holder already holds the lease and no holding of this process does
// (a retry after an answer that got lost, a restarted process), Hold takes
// it over, fence unchanged, and renews it at once so that its deadline
// counts from a request it sent.
func (l *Leases) Hold(ctx context.Context, resource, holder string, cfg lease.KeepConfig) (*Holding, error) {
	return l.HoldWait(ctx, resource, holder, 0, cfg)
}

// HoldWait is Hold that waits up to wait for the lease while another holder
// holds it, or another holding of this process with the same holder: the
// moment it is released or expires, the wait wins it. A wait longer than
// one request may wait (MaxWait) asks again as each ends. When wait passes
// it returns the refusal, a *lease.HeldError or a *lease.HoldingError.
func (l *Leases) HoldWait(ctx context.Context, resource, holder string, wait time.Duration, cfg lease.KeepConfig) (*Holding, error) {
	return l.hold(ctx, resource, holder, 0, wait, cfg)
}

// HoldSlot is HoldWait of a slot of key, a key of slots slots (a
// semaphore, see lease.AcquireParams.Slots): the holding keeps whichever
// slot it won, lease.SlotName(key, n), with that slot's fence. At most
// slots holders hold the key at once, by the database clock, whatever
// dies, pauses or fails over. While every slot is held it waits up to wait
// for one to be freed, then returns the *lease.HeldError of the slot that
// expires first. One holder holds one slot of a key in this process.
func (l *Leases) HoldSlot(ctx context.Context, key, holder string, slots int, wait time.Duration, cfg lease.KeepConfig) (*Holding, error) {
	if err := checkSlots("slots", key, slots, true); err != nil {
		return nil, err
	}
	return l.hold(ctx, key, holder, slots, wait, cfg)
}

func (l *Leases) hold(ctx context.Context, resource, holder string, slots int, wait time.Duration, cfg lease.KeepConfig) (*Holding, error) {
	if wait < 0 {
		return nil, fmt.Errorf("%w: wait %s must not be negative", ErrInvalidArgument, wait)
	}
	if err := firstErr(checkResource("resource", resource), checkName("holder", holder), checkTTL("KeepConfig.TTL", cfg.TTL)); err != nil {
		return nil, err
	}
	if cfg.TTL == 0 {
		cfg.TTL = l.ttl
	}
	if cfg.TTL != 0 {
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	deadline := time.Now().Add(wait)
	k := holdingKey{resource, holder}
	slot, err := l.reserveWaiting(ctx, k, deadline)
	if err != nil {
		return nil, err
	}
	h, err := l.acquireAndKeep(ctx, k, slots, slot, deadline, cfg)
	if err != nil {
		l.free(k, slot)
		return nil, err
	}
	return h, nil
}

// reserveWaiting takes the slot of k, waiting until deadline while another
// holding of this process has it.
func (l *Leases) reserveWaiting(ctx context.Context, k holdingKey, deadline time.Time) (*holdingSlot, error) {
	for {
		mine, other := l.reserve(k)
		if mine != nil {
			return mine, nil
		}
		refusal := &lease.HoldingError{Lease: lease.Lease{Resource: k.resource, Holder: k.holder}}
		if other.h != nil {
			refusal.Lease = other.h.Lease()
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, refusal
		}
		timer := time.NewTimer(left)
		select {
		case <-other.done:
			timer.Stop()
		case <-timer.C:
			return nil, refusal
		case <-ctx.Done():
			timer.Stop()
			return nil, context.Cause(ctx)
		}
	}
}

// acquireAndKeep acquires the lease for the holding of slot, waiting until
// deadline while another holder has it, and keeps it.
func (l *Leases) acquireAndKeep(ctx context.Context, k holdingKey, slots int, slot *holdingSlot, deadline time.Time, cfg lease.KeepConfig) (*Holding, error) {
	for {
		sent := time.Now()
		wait := min(max(time.Until(deadline), 0), MaxWait).Truncate(time.Second)
		acq, err := l.Acquire(ctx, lease.AcquireParams{Resource: k.resource, Holder: k.holder, TTL: cfg.TTL, Wait: wait, Slots: slots})
		var held *lease.HeldError
		if errors.As(err, &held) && ctx.Err() == nil && time.Until(deadline) >= time.Second {
			continue
		}
		if err != nil {
			return nil, err
		}
		ls := acq.Lease
		if cfg.TTL == 0 { // a remote client without a LeaseTTL: the service's default
			cfg.TTL = ls.TTL()
			if verr := cfg.Validate(); verr != nil {
				_, _ = l.svc.Release(context.WithoutCancel(ctx), lease.ReleaseParams{Resource: ls.Resource, Holder: ls.Holder, Fence: ls.Fence})
				return nil, fmt.Errorf("%w: with the service's default TTL %s: %w", ErrInvalidArgument, cfg.TTL, verr)
			}
		}
		if !acq.New || wait > 0 {
			// Held already (taken over), or won after a wait: renewed now, so
			// that the deadline counts from a request sent now.
			sent = time.Now()
			ls, err = l.svc.Renew(ctx, lease.RenewParams{Resource: ls.Resource, Holder: k.holder, Fence: ls.Fence, TTL: cfg.TTL})
			if err != nil {
				return nil, fmt.Errorf("renew the lease %s held by %s: %w", acq.Lease.Resource, k.holder, err)
			}
		}
		return l.keep(ctx, k, slot, ls, sent, cfg), nil
	}
}

// Keep is Hold of a lease the caller has just acquired or renewed itself:
// ls as that answer gave it, and sent when its request was sent, from which
// the holding's first deadline counts (so an acquisition that waited for
// the lease should be renewed first: its request was sent before the
// wait). cfg's TTL must be the lease's (zero: it is). As with Hold, a
// second holding of the lease in this process is refused.
func (l *Leases) Keep(ctx context.Context, ls lease.Lease, sent time.Time, cfg lease.KeepConfig) (*Holding, error) {
	if cfg.TTL == 0 {
		cfg.TTL = ls.TTL()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	k := holdingKey{ls.Resource, ls.Holder}
	slot, other := l.reserve(k)
	if slot == nil {
		refusal := &lease.HoldingError{Lease: ls}
		if other.h != nil {
			refusal.Lease = other.h.Lease()
		}
		return nil, refusal
	}
	return l.keep(ctx, k, slot, ls, sent, cfg), nil
}

// keep starts the holding of ls in slot.
func (l *Leases) keep(ctx context.Context, k holdingKey, slot *holdingSlot, ls lease.Lease, sent time.Time, cfg lease.KeepConfig) *Holding {
	hctx, cancel := context.WithCancelCause(ctx)
	h := &Holding{leases: l, ctx: hctx, cancel: cancel, done: make(chan struct{}), asked: make(chan struct{}), lease: ls,
		free: sync.OnceFunc(func() { l.free(k, slot) })}
	l.mu.Lock()
	slot.h = h
	l.mu.Unlock()
	go func() {
		h.run(ctx, cfg, sent)
		// The slot is free once the lease is no longer held: now, unless
		// Release is to release it (it frees the slot once it has).
		h.mu.Lock()
		owned := h.releaseOwned
		h.mu.Unlock()
		if !owned {
			h.free()
		}
	}()
	return h
}

// Holding is a lease kept alive in the background, made by Leases.Hold.
// Pass Lease().Fence to whatever the lease protects, and stop using it when
// Context() is done. Its methods are safe for concurrent use.
//
// Its one goroutine exits when Release is called, the context given to Hold
// ends (after releasing the lease), or the lease is lost (after releasing
// it, unless a renewal was refused); Release waits for it.
type Holding struct {
	leases *Leases
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the goroutine exited
	asked  chan struct{} // closed by the first Release
	ask    sync.Once

	// free gives the holding's (resource, holder) up, for another holding
	// of this process.
	free func()

	mu           sync.Mutex
	lease        lease.Lease
	releaseOwned bool  // Release releases the lease, and frees the slot after
	stopping     bool  // Release was called, or the goroutine releases on its own
	autoDone     bool  // the goroutine released and Release has not reported it yet
	autoErr      error // how the goroutine's release went
}

// Lease returns the lease as last acquired, renewed or released.
func (h *Holding) Lease() lease.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Context returns a context that is cancelled as soon as the lease can no
// longer be counted on: it was lost, Release was called, or the context
// given to Hold ended. context.Cause (or Err) says which.
func (h *Holding) Context() context.Context { return h.ctx }

// Err returns nil while the lease is held; then why it is not: an error
// wrapping lease.ErrNotHeld (a renewal was refused) or lease.ErrDeadline
// (no renewal succeeded in time), lease.ErrReleased (Release was called),
// or the cause of the context given to Hold ending.
func (h *Holding) Err() error { return context.Cause(h.ctx) }

// Release stops renewing, waits for the background goroutine to exit, and
// releases the lease. It returns lease.ErrNotHeld when the lease was no
// longer held (lost, or released before: a second Release included), and
// an error that IsTransient when the service could not be reached, in
// which case calling it again tries again. When the holding already
// released the lease itself (the context given to Hold ended, or it gave
// the lease up at its deadline), the first Release returns how that went.
func (h *Holding) Release(ctx context.Context) error {
	h.mu.Lock()
	owner := !h.stopping // nobody else releases the lease
	if owner {
		h.releaseOwned = true
	}
	h.stopping = true
	h.mu.Unlock()
	h.ask.Do(func() { close(h.asked) })
	h.cancel(lease.ErrReleased)
	select {
	case <-h.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	h.mu.Lock()
	if h.autoDone {
		h.autoDone = false
		err := h.autoErr
		h.mu.Unlock()
		return err
	}
	l := h.lease
	owned := h.releaseOwned
	h.mu.Unlock()
	err := h.release(ctx, l)
	if owned {
		h.free()
	}
	return err
}

func (h *Holding) release(ctx context.Context, l lease.Lease) error {
	released, err := h.leases.svc.Release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.lease = released
	h.mu.Unlock()
	return nil
}

// releasedUnder is the program's own release of the lease (Leases.Release):
// the holding stops at once, and releases nothing more.
func (h *Holding) releasedUnder() {
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	h.cancel(fmt.Errorf("%w: the lease was released by Leases.Release", lease.ErrNotHeld))
}

// run renews the lease until the holding's context ends or the lease is
// lost; parent is the context given to Hold.
func (h *Holding) run(parent context.Context, cfg lease.KeepConfig, sent time.Time) {
	defer close(h.done)
	l := h.Lease()
	loop := keepalive.Loop{
		Config: cfg,
		Renew: func(rctx context.Context) error {
			renewed, err := h.leases.svc.Renew(rctx, lease.RenewParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence, TTL: cfg.TTL})
			if err != nil {
				return err
			}
			h.mu.Lock()
			h.lease = renewed
			h.mu.Unlock()
			return nil
		},
		Refused: keepalive.Refusal(lease.ErrNotHeld),
		Lost:    h.cancel,
	}
	_, reason := loop.Run(h.ctx, sent)
	switch {
	case reason == nil:
		// The holding's context ended: Release was called, or parent ended
		// and nobody will call Release in time to free the resource.
	case errors.Is(reason, lease.ErrDeadline):
		// Given up at the deadline: the last renewal may have renewed the
		// lease although its answer never came. Released once the caller
		// has stopped using it: at Release, or a grace after the deadline.
		if cfg.Grace > 0 {
			timer := time.NewTimer(cfg.Grace)
			select {
			case <-timer.C:
			case <-h.asked:
			}
			timer.Stop()
		}
	default:
		return // refused: the service says the lease is not held
	}
	h.mu.Lock()
	auto := !h.stopping
	h.stopping = true
	h.mu.Unlock()
	if !auto {
		return // Release releases it
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(parent), min(releaseTimeout, cfg.TTL))
	err := h.release(rctx, l)
	cancel()
	h.mu.Lock()
	h.autoDone, h.autoErr = true, err
	h.mu.Unlock()
}
