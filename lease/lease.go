// Package lease holds the types of leasehold's leases: what an acquisition,
// a renewal and a release take and return, the errors a caller tests for,
// and how a holder keeps a lease alive (KeepConfig). The same types serve a
// lease taken in-process on a PostgreSQL pool and one taken over a
// leasehold service's REST API (package leasehold's Client.Leases).
//
// A lease on a resource moves through these states, every decision made by
// the database clock:
//
//	           Acquire (a new fence)
//	free ───────────────────────────▶ active ──┐
//	 ▲                                 │  │ ◀──┘ Renew by the holder:
//	 │                                 │  │      expires_at = now + TTL
//	 │               Release by holder │  │ expires_at passes
//	 │                                 ▼  ▼
//	 └──── (free again) ────────── released, expired
//
//	An Acquire by the holder of an active lease is an idempotent no-op.
//
// A released or expired lease is free: the next Acquire takes it over with a
// fence greater than every fence handed out before, for any resource. Renew
// and Release are compare-and-sets on (resource, holder, fence when given,
// still active), so a holder that lost its lease learns it as ErrNotHeld,
// never by overwriting the new holder. Pass the fence to whatever the lease
// protects, so that it can refuse a holder that lost the lease without
// knowing it.
package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
)

// State is where a lease stands by the database clock.
type State string

// The states of a lease.
const (
	StateActive   State = "active"   // not released, expires_at in the future
	StateExpired  State = "expired"  // not released, expires_at passed
	StateReleased State = "released" // released by its holder
)

// Filters of a lease list beyond the states: every lease, or those ever
// renewed.
const (
	FilterAll     = "all"
	FilterRenewed = "renewed"
)

// MaxWait is the longest one acquisition may wait for a held resource (the
// REST API's wait_seconds bound, 300 s); a caller that means to wait
// longer asks again.
const MaxWait = 300 * time.Second

// Errors of the lease service. A caller that lost its lease gets ErrNotHeld:
// a normal outcome, not a failure of the service.
var (
	// ErrNotFound: no lease has the id asked for.
	ErrNotFound = errors.New("lease not found")
	// ErrNotHeld: the holder holds no active lease on the resource (with
	// that fence, or id): it expired, was released, was taken over, or was
	// never taken.
	ErrNotHeld = errors.New("lease not held")
	// ErrHeld: another holder holds the resource. The error is a
	// *HeldError, which carries that holder's lease.
	ErrHeld = errors.New("lease held by another holder")
	// ErrReserved: the resource begins with ReservedPrefix, the namespace
	// of leasehold's own leases (its reaper's, scheduler's, generator's and
	// each replica's), which no client may acquire, renew or release. A
	// REST API answers it with 403.
	ErrReserved = errors.New("resource in leasehold's reserved namespace")
)

// ReservedPrefix begins the resources of leasehold's own leases; see
// ErrReserved.
const ReservedPrefix = "leasehold:"

// HeldError is ErrHeld with the lease of the current holder.
type HeldError struct{ Lease Lease }

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is held by %s until %s", e.Lease.Resource, e.Lease.Holder, e.Lease.ExpiresAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// HoldingError is the refusal of a second holding of one lease by one
// holder in one process (Leases.Hold, Leases.Keep): the two would share one
// lease, and each believe it alone held it. Give each holding a holder name
// of its own, or wait for the other to end (Leases.HoldWait). errors.Is(err,
// ErrHeld) is true, as for a lease another holder holds.
type HoldingError struct{ Lease Lease }

func (e *HoldingError) Error() string {
	return fmt.Sprintf("%s is held by %s through another holding of this process; give each holding a holder name of its own, or wait for that one to end",
		e.Lease.Resource, e.Lease.Holder)
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HoldingError) Is(target error) bool { return target == ErrHeld }

// UntilExpiry is the time from dbNow, the database clock when the
// acquisition was refused, until the holder's lease runs out on its own,
// and a little more, so that an acquisition sent then finds it expired.
func (e *HeldError) UntilExpiry(dbNow time.Time) time.Duration {
	return e.Lease.ExpiresAt.Sub(dbNow) + 10*time.Millisecond
}

// Lease is one lease as the API shows it.
type Lease struct {
	ID       int64  `json:"id"`
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	// Fence is the fencing token of the acquisition: greater than every
	// fence handed out before it.
	Fence      int64      `json:"fence"`
	State      State      `json:"state"`
	TTLSeconds int32      `json:"ttl_seconds"`
	CreatedAt  time.Time  `json:"created_at"`
	RenewedAt  *time.Time `json:"renewed_at"`
	ReleasedAt *time.Time `json:"released_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
}

// TTL is the lease's time to live as a duration.
func (l Lease) TTL() time.Duration { return time.Duration(l.TTLSeconds) * time.Second }

// MarshalJSON writes timestamps as RFC 3339 UTC with milliseconds.
func (l Lease) MarshalJSON() ([]byte, error) {
	type plain Lease
	return json.Marshal(struct {
		plain
		CreatedAt  string  `json:"created_at"`
		RenewedAt  *string `json:"renewed_at"`
		ReleasedAt *string `json:"released_at"`
		ExpiresAt  string  `json:"expires_at"`
	}{
		plain:      plain(l),
		CreatedAt:  apitime.Format(l.CreatedAt),
		RenewedAt:  apitime.FormatPtr(l.RenewedAt),
		ReleasedAt: apitime.FormatPtr(l.ReleasedAt),
		ExpiresAt:  apitime.Format(l.ExpiresAt),
	})
}

// Event is one entry of the audit history.
type Event struct {
	ID       int64     `json:"id"`
	At       time.Time `json:"at"`
	LeaseID  int64     `json:"lease_id"`
	Resource string    `json:"resource"`
	Holder   string    `json:"holder"`
	Fence    int64     `json:"fence"`
	// Kind is acquired, renewed, released or expired.
	Kind string `json:"kind"`
	// ExpiresAt is the lease's expiry after the change.
	ExpiresAt time.Time `json:"expires_at"`
}

// MarshalJSON writes timestamps as RFC 3339 UTC with milliseconds.
func (e Event) MarshalJSON() ([]byte, error) {
	type plain Event
	return json.Marshal(struct {
		plain
		At        string `json:"at"`
		ExpiresAt string `json:"expires_at"`
	}{plain: plain(e), At: apitime.Format(e.At), ExpiresAt: apitime.Format(e.ExpiresAt)})
}

// AcquireParams names what to acquire, for whom and for how long.
type AcquireParams struct {
	Resource string
	Holder   string
	// TTL is the lease's time to live: whole seconds, 1s to 1h; zero for
	// the service's default.
	TTL time.Duration
	// Wait is how long to wait for a resource that another holder holds to
	// become free (zero: not at all), woken by its release or expiry.
	Wait time.Duration
	// Slots, when not zero, makes Resource a key of that many slots (a
	// semaphore): the acquisition takes any free slot, a lease of its own
	// named SlotName(Resource, n), and is refused with a *HeldError
	// carrying the slot that expires first when every slot is held. Slots
	// is the key's limit if it has none yet; once set, a key's limit
	// changes only by SetLimit. 1 to MaxSlots.
	Slots int
}

// MaxSlots is the most slots a key may have.
const MaxSlots = 1000

// SlotName is the resource of slot n (from 1) of key: "key#n".
func SlotName(key string, n int) string { return fmt.Sprintf("%s#%d", key, n) }

// SlotKey returns the key a slot's resource belongs to and true, or ""
// and false when resource is not named as a slot.
func SlotKey(resource string) (string, bool) {
	i := strings.LastIndexByte(resource, '#')
	if i <= 0 || i == len(resource)-1 {
		return "", false
	}
	for _, c := range resource[i+1:] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return resource[:i], true
}

// Limit is a key's limit: how many holders may hold its slots at once,
// and how often its tasks may start, with how many hold one now and how
// many tasks wait on it.
type Limit struct {
	Resource string
	// Slots is the limit.
	Slots int
	// Held is the number of live slots, which may exceed Slots for a while
	// after the limit was lowered: those holders finish, and no slot is
	// granted until fewer than Slots are held.
	Held int
	// Waiting is the number of pending tasks whose lock is the key
	// (counted up to 10,000).
	Waiting int
	// RateStarts and RatePeriod are the key's rate: at most RateStarts of
	// its tasks start in any RatePeriod, by the database clock. Zero: no
	// rate.
	RateStarts int
	RatePeriod time.Duration
	// RateSpent is the starts within the last RatePeriod.
	RateSpent int
	// RateNextAt, when not nil, is when the rate lets the next task
	// start; nil: it lets one start now.
	RateNextAt *time.Time
	UpdatedAt  time.Time
}

// limitJSON is Limit as the API shows it.
type limitJSON struct {
	Resource          string  `json:"resource"`
	Slots             int     `json:"slots"`
	Held              int     `json:"held"`
	Waiting           int     `json:"waiting"`
	RateStarts        int     `json:"rate_starts"`
	RatePeriodSeconds int64   `json:"rate_period_seconds"`
	RateSpent         int     `json:"rate_spent"`
	RateNextAt        *string `json:"rate_next_at"`
	UpdatedAt         string  `json:"updated_at"`
}

// MarshalJSON writes the limit as the API shows it: the rate's period in
// seconds, times as RFC 3339 UTC with milliseconds.
func (l Limit) MarshalJSON() ([]byte, error) {
	return json.Marshal(limitJSON{
		Resource: l.Resource, Slots: l.Slots, Held: l.Held, Waiting: l.Waiting,
		RateStarts: l.RateStarts, RatePeriodSeconds: int64(l.RatePeriod / time.Second), RateSpent: l.RateSpent,
		RateNextAt: apitime.FormatPtr(l.RateNextAt), UpdatedAt: apitime.Format(l.UpdatedAt),
	})
}

// UnmarshalJSON reads the limit as the API shows it.
func (l *Limit) UnmarshalJSON(b []byte) error {
	var j limitJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	updated, err := time.Parse(time.RFC3339Nano, j.UpdatedAt)
	if err != nil {
		return fmt.Errorf("limit updated_at: %w", err)
	}
	*l = Limit{Resource: j.Resource, Slots: j.Slots, Held: j.Held, Waiting: j.Waiting,
		RateStarts: j.RateStarts, RatePeriod: time.Duration(j.RatePeriodSeconds) * time.Second,
		RateSpent: j.RateSpent, UpdatedAt: updated}
	if j.RateNextAt != nil {
		next, err := time.Parse(time.RFC3339Nano, *j.RateNextAt)
		if err != nil {
			return fmt.Errorf("limit rate_next_at: %w", err)
		}
		l.RateNextAt = &next
	}
	return nil
}

// Acquisition is the outcome of an Acquire that did not fail.
type Acquisition struct {
	Lease Lease
	// New is true when this call took the lease with a new fence, false when
	// the holder already held it (an idempotent retry; the lease unchanged).
	New bool
	// DBNow is the database clock when the decision was made; zero when
	// the answer came over the REST API, which does not report it.
	DBNow time.Time
}

// RenewParams names the lease to renew. Fence, when not zero, must match
// the lease's fence; TTL, when not zero, replaces the lease's TTL.
type RenewParams struct {
	Resource string
	Holder   string
	Fence    int64
	TTL      time.Duration
}

// ReleaseParams names the lease to release. Fence and ID, when not zero,
// must match too.
type ReleaseParams struct {
	Resource string
	Holder   string
	Fence    int64
	ID       int64
}

// ListParams selects a page of leases, in id order.
type ListParams struct {
	Filter  string // FilterAll (or ""), FilterRenewed, or a State
	Prefix  string // resources starting with it; "" for all
	AfterID int64  // keyset paging: leases with a greater id
	Limit   int32  // zero: the default (1000); at most 10000
}

// EventsParams selects a page of the audit history, in id order.
type EventsParams struct {
	Resource string // "" for every resource
	AfterID  int64
	Limit    int32 // zero: the default (1000); at most 10000
}
