package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
)

// State is where a lease stands by the database clock.
type State string

// The states of a lease.
const (
	StateActive   State = "active"   // not released, expires_at in the future
	StateExpired  State = "expired"  // not released, expires_at passed
	StateReleased State = "released" // released by its holder
)

// Filters of List beyond the states: every lease, or those ever renewed.
const (
	FilterAll     = "all"
	FilterRenewed = "renewed"
)

// Errors of the lease service. A caller that lost its lease gets ErrNotHeld:
// a normal outcome, not a failure of the service.
var (
	ErrNotFound = errors.New("lease not found")
	ErrNotHeld  = errors.New("lease not held")
	ErrHeld     = errors.New("lease held by another holder")
)

// HeldError is ErrHeld with the lease of the current holder.
type HeldError struct{ Lease Lease }

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is held by %s until %s", e.Lease.Resource, e.Lease.Holder, e.Lease.ExpiresAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// UntilExpiry is the time from dbNow, the database clock when the
// acquisition was refused, until the holder's lease runs out on its own,
// and a little more, so that an acquisition sent then finds it expired.
func (e *HeldError) UntilExpiry(dbNow time.Time) time.Duration {
	return e.Lease.ExpiresAt.Sub(dbNow) + 10*time.Millisecond
}

// Lease is one lease as the API shows it.
type Lease struct {
	ID         int64      `json:"id"`
	Resource   string     `json:"resource"`
	Holder     string     `json:"holder"`
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
		CreatedAt:  FormatTime(l.CreatedAt),
		RenewedAt:  FormatTimePtr(l.RenewedAt),
		ReleasedAt: FormatTimePtr(l.ReleasedAt),
		ExpiresAt:  FormatTime(l.ExpiresAt),
	})
}

// Event is one entry of the audit history.
type Event struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	LeaseID   int64     `json:"lease_id"`
	Resource  string    `json:"resource"`
	Holder    string    `json:"holder"`
	Fence     int64     `json:"fence"`
	Kind      string    `json:"kind"`
	ExpiresAt time.Time `json:"expires_at"`
}

// MarshalJSON writes timestamps as RFC 3339 UTC with milliseconds.
func (e Event) MarshalJSON() ([]byte, error) {
	type plain Event
	return json.Marshal(struct {
		plain
		At        string `json:"at"`
		ExpiresAt string `json:"expires_at"`
	}{plain: plain(e), At: FormatTime(e.At), ExpiresAt: FormatTime(e.ExpiresAt)})
}

// FormatTime formats t as the API does: RFC 3339, UTC, milliseconds.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// FormatTimePtr is FormatTime of an optional time: nil stays nil.
func FormatTimePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := FormatTime(*t)
	return &s
}

// Store is the lease service on the database. Its acquisitions, renewals
// and releases that arrive together share commits (see committer), each
// made by the statement it would run alone.
type Store struct {
	q     *db.Queries
	group *committer
}

// NewStore returns a store on the pool.
func NewStore(pool *pgxpool.Pool) *Store {
	q := db.New(pool)
	return &Store{q: q, group: newCommitter(q)}
}

// AcquireParams names what to acquire, for whom and for how long.
type AcquireParams struct {
	Resource string
	Holder   string
	TTL      time.Duration // whole seconds, 1 s to 1 h
	// Wait is how long Client.Acquire waits for a resource that another
	// holder holds to become free (zero: not at all). Store.Acquire never
	// waits and ignores it; the server's API does the waiting.
	Wait time.Duration
}

// Acquisition is the outcome of an Acquire that did not fail.
type Acquisition struct {
	Lease Lease
	// New is true when this call took the lease with a new fence, false when
	// the holder already held it (an idempotent retry; the lease unchanged).
	New bool
	// DBNow is the database clock when the decision was made.
	DBNow time.Time
}

// Acquire takes the resource for the holder when it is free: it has never
// been leased, or its lease was released or expired. When another holder
// holds it, the error is a *HeldError carrying that holder's lease.
func (s *Store) Acquire(ctx context.Context, p AcquireParams) (Acquisition, error) {
	op := &groupOp{resource: p.Resource, kind: opAcquire, acquire: db.LeaseAcquireParams{
		Resource: p.Resource, Holder: p.Holder, TTLSeconds: ttlSeconds(p.TTL),
	}}
	s.group.do(ctx, op)
	switch {
	case errors.Is(op.err, pgx.ErrNoRows):
		// Every try found the lease changing between the statement's two
		// halves (taken by a concurrent insert, or expired).
		return Acquisition{}, fmt.Errorf("acquire %s: the lease kept changing under contention; retry", p.Resource)
	case op.err != nil:
		return Acquisition{}, fmt.Errorf("acquire %s: %w", p.Resource, op.err)
	}
	row := op.acquired
	l := Lease{
		ID: row.ID, Resource: row.Resource, Holder: row.Holder, Fence: row.Fence,
		State: StateActive, TTLSeconds: row.TTLSeconds, CreatedAt: row.CreatedAt,
		RenewedAt: row.RenewedAt, ReleasedAt: row.ReleasedAt, ExpiresAt: row.ExpiresAt,
	}
	switch {
	case row.Acquired:
		return Acquisition{Lease: l, New: true, DBNow: row.DBNow}, nil
	case row.Holder == p.Holder:
		return Acquisition{Lease: l, DBNow: row.DBNow}, nil
	default:
		return Acquisition{Lease: l, DBNow: row.DBNow}, &HeldError{Lease: l}
	}
}

func ttlSeconds(d time.Duration) int32 { return int32(d / time.Second) }

// RenewParams names the lease to renew. Fence, when not zero, must match
// the lease's fence; TTL, when not zero, replaces the lease's TTL.
type RenewParams struct {
	Resource string
	Holder   string
	Fence    int64
	TTL      time.Duration
}

// Renew extends the holder's active lease to now + TTL by the database
// clock. ErrNotHeld when the holder holds no active lease on the resource.
func (s *Store) Renew(ctx context.Context, p RenewParams) (Lease, error) {
	params := db.LeaseRenewParams{Resource: p.Resource, Holder: p.Holder, Fence: optional(p.Fence)}
	if p.TTL > 0 {
		ttl := ttlSeconds(p.TTL)
		params.TTLSeconds = &ttl
	}
	op := &groupOp{resource: p.Resource, kind: opRenew, renew: params}
	s.group.do(ctx, op)
	if op.err != nil {
		return Lease{}, notHeld("renew", p.Resource, op.err)
	}
	return fromRow(op.row, StateActive), nil
}

// ReleaseParams names the lease to release. Fence and ID, when not zero,
// must match too.
type ReleaseParams struct {
	Resource string
	Holder   string
	Fence    int64
	ID       int64
}

// Release ends the holder's active lease now. ErrNotHeld when the holder
// holds no active lease on the resource (a second release included).
func (s *Store) Release(ctx context.Context, p ReleaseParams) (Lease, error) {
	op := &groupOp{resource: p.Resource, kind: opRelease, release: db.LeaseReleaseParams{
		Resource: p.Resource, Holder: p.Holder, Fence: optional(p.Fence), ID: optional(p.ID),
	}}
	s.group.do(ctx, op)
	if op.err != nil {
		return Lease{}, notHeld("release", p.Resource, op.err)
	}
	return fromRow(op.row, StateReleased), nil
}

func notHeld(op, resource string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotHeld
	}
	return fmt.Errorf("%s %s: %w", op, resource, err)
}

func optional(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

func fromRow(r db.Lease, state State) Lease {
	return Lease{
		ID: r.ID, Resource: r.Resource, Holder: r.Holder, Fence: r.Fence, State: state,
		TTLSeconds: r.TTLSeconds, CreatedAt: r.CreatedAt, RenewedAt: r.RenewedAt,
		ReleasedAt: r.ReleasedAt, ExpiresAt: r.ExpiresAt,
	}
}

// Get returns the lease with the given id, ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id int64) (Lease, error) {
	row, err := s.q.LeaseGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, ErrNotFound
	}
	if err != nil {
		return Lease{}, fmt.Errorf("get lease %d: %w", id, err)
	}
	return fromListRow(db.LeaseListRow(row)), nil
}

// listRow is every query result that is a lease with its state: sqlc
// makes a type per query, all of the same shape.
type listRow interface {
	db.LeaseListRow | db.LeaseGetManyRow | db.LeaseListNewestRow
}

func fromListRows[R listRow](rows []R) []Lease {
	leases := make([]Lease, len(rows))
	for i, r := range rows {
		leases[i] = fromListRow(db.LeaseListRow(r))
	}
	return leases
}

func fromListRow(r db.LeaseListRow) Lease {
	return Lease{
		ID: r.ID, Resource: r.Resource, Holder: r.Holder, Fence: r.Fence, State: State(r.State),
		TTLSeconds: r.TTLSeconds, CreatedAt: r.CreatedAt, RenewedAt: r.RenewedAt,
		ReleasedAt: r.ReleasedAt, ExpiresAt: r.ExpiresAt,
	}
}

// GetMany returns the leases with the given ids (those that exist), in id
// order, with their states by the database clock.
func (s *Store) GetMany(ctx context.Context, ids []int64) ([]Lease, error) {
	rows, err := s.q.LeaseGetMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("get leases: %w", err)
	}
	return fromListRows(rows), nil
}

// Newest returns up to limit of the newest leases other than task leases,
// newest first.
func (s *Store) Newest(ctx context.Context, limit int32) ([]Lease, error) {
	rows, err := s.q.LeaseListNewest(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list newest leases: %w", err)
	}
	return fromListRows(rows), nil
}

// ListParams selects a page of leases.
type ListParams struct {
	Filter  string // FilterAll, FilterRenewed, or a State
	Prefix  string // resources starting with it; "" for all
	AfterID int64  // keyset paging: leases with a greater id
	Limit   int32
}

// List returns a page of leases in id order.
func (s *Store) List(ctx context.Context, p ListParams) ([]Lease, error) {
	rows, err := s.q.LeaseList(ctx, db.LeaseListParams{
		AfterID: p.AfterID, Prefix: p.Prefix, State: p.Filter, RowLimit: p.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return fromListRows(rows), nil
}

// EventsParams selects a page of the audit history.
type EventsParams struct {
	Resource string // "" for every resource
	AfterID  int64
	Limit    int32
}

// Events returns a page of the audit history in id order.
func (s *Store) Events(ctx context.Context, p EventsParams) ([]Event, error) {
	rows, err := s.q.LeaseEvents(ctx, db.LeaseEventsParams{AfterID: p.AfterID, Resource: p.Resource, RowLimit: p.Limit})
	return events(rows, err)
}

// Expiry is an expired lease the reaper announced, Lag after its expires_at.
type Expiry struct {
	Lease Lease
	Lag   time.Duration
}

// EventsByID returns the events with the given ids, in id order.
func (s *Store) EventsByID(ctx context.Context, ids []int64) ([]Event, error) {
	rows, err := s.q.LeaseEventsByIDs(ctx, ids)
	return events(rows, err)
}

// NonTaskEvents returns up to limit events of all but task leases after
// the event afterID, oldest first.
func (s *Store) NonTaskEvents(ctx context.Context, afterID int64, limit int32) ([]Event, error) {
	rows, err := s.q.LeaseEventsNonTask(ctx, db.LeaseEventsNonTaskParams{AfterID: afterID, RowLimit: limit})
	return events(rows, err)
}

// NewestNonTaskEvents returns the newest limit events of all but task
// leases, oldest first.
func (s *Store) NewestNonTaskEvents(ctx context.Context, limit int32) ([]Event, error) {
	rows, err := s.q.LeaseEventsNonTaskNewest(ctx, limit)
	evs, err := events(rows, err)
	slices.Reverse(evs)
	return evs, err
}

func events(rows []db.LeaseEvent, err error) ([]Event, error) {
	if err != nil {
		return nil, fmt.Errorf("list lease events: %w", err)
	}
	evs := make([]Event, len(rows))
	for i, r := range rows {
		evs[i] = Event(r)
	}
	return evs, nil
}

// MarkExpired announces up to batch expiries that are due: each gets an
// "expired" event and a NOTIFY.
func (s *Store) MarkExpired(ctx context.Context, batch int32) ([]Expiry, error) {
	rows, err := s.q.LeaseMarkExpired(ctx, batch)
	if err != nil {
		return nil, fmt.Errorf("mark expired leases: %w", err)
	}
	expiries := make([]Expiry, len(rows))
	for i, r := range rows {
		var lag time.Duration
		if r.ExpiredAt != nil {
			lag = r.ExpiredAt.Sub(r.ExpiresAt)
		}
		expiries[i] = Expiry{Lease: fromRow(r, StateExpired), Lag: lag}
	}
	return expiries, nil
}

// NextExpiry returns when the earliest unannounced expiry is due and the
// database clock now.
func (s *Store) NextExpiry(ctx context.Context) (next, dbNow time.Time, err error) {
	row, err := s.q.LeaseNextExpiry(ctx)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("next lease expiry: %w", err)
	}
	return row.NextExpiry, row.DBNow, nil
}
