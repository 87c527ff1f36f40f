package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
)

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

// Acquire takes the resource for the holder when it is free: it has never
// been leased, or its lease was released or expired. When another holder
// holds it, the error is a *HeldError carrying that holder's lease.
func (s *Store) Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	if p.Slots > 0 {
		return s.acquireSlot(ctx, p)
	}
	op := &groupOp{resource: p.Resource, kind: opAcquire, acquire: db.LeaseAcquireParams{
		Resource: p.Resource, Holder: p.Holder, TTLSeconds: ttlSeconds(p.TTL),
	}}
	s.group.do(ctx, op)
	switch {
	case errors.Is(op.err, pgx.ErrNoRows):
		// Every try found the lease changing between the statement's two
		// halves (taken by a concurrent insert, or expired).
		return lease.Acquisition{}, fmt.Errorf("acquire %s: the lease kept changing under contention; retry", p.Resource)
	case op.err != nil:
		return lease.Acquisition{}, fmt.Errorf("acquire %s: %w", p.Resource, op.err)
	}
	row := op.acquired
	return acquisition(lease.Lease{
		ID: row.ID, Resource: row.Resource, Holder: row.Holder, Fence: row.Fence,
		State: lease.StateActive, TTLSeconds: row.TTLSeconds, CreatedAt: row.CreatedAt,
		RenewedAt: row.RenewedAt, ReleasedAt: row.ReleasedAt, ExpiresAt: row.ExpiresAt,
	}, row.Acquired, p.Holder, row.DBNow)
}

// acquisition is the outcome of an acquisition by holder that answered
// with l: taken now (acquired), held by holder already (an idempotent
// retry), or another holder's (a *lease.HeldError).
func acquisition(l lease.Lease, acquired bool, holder string, dbNow time.Time) (lease.Acquisition, error) {
	switch {
	case acquired:
		return lease.Acquisition{Lease: l, New: true, DBNow: dbNow}, nil
	case l.Holder == holder:
		return lease.Acquisition{Lease: l, DBNow: dbNow}, nil
	default:
		return lease.Acquisition{Lease: l, DBNow: dbNow}, &lease.HeldError{Lease: l}
	}
}

// acquireSlot takes a free slot of the key p.Resource (lease_slot_acquire):
// not grouped, since it locks the key's limit row for the grant.
func (s *Store) acquireSlot(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	slots := int32(p.Slots)
	row, err := s.q.LeaseSlotAcquire(ctx, db.LeaseSlotAcquireParams{
		Resource: p.Resource, Holder: p.Holder, TTLSeconds: ttlSeconds(p.TTL), Slots: &slots,
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lease.Acquisition{}, fmt.Errorf("acquire a slot of %s: the key has no limit", p.Resource)
	case err != nil:
		return lease.Acquisition{}, fmt.Errorf("acquire a slot of %s: %w", p.Resource, err)
	}
	return acquisition(lease.Lease{
		ID: row.ID, Resource: row.Resource, Holder: row.Holder, Fence: row.Fence,
		State: lease.StateActive, TTLSeconds: row.TTLSeconds, CreatedAt: row.CreatedAt,
		RenewedAt: timeOf(row.RenewedAt), ReleasedAt: timeOf(row.ReleasedAt), ExpiresAt: row.ExpiresAt,
	}, row.Acquired, p.Holder, row.DBNow)
}

// timeOf is a nullable timestamptz a function's result gave sqlc no type
// for.
func timeOf(v any) *time.Time {
	if t, ok := v.(time.Time); ok {
		return &t
	}
	return nil
}

// SetLimit sets the limit of key to slots: raising it wakes the tasks that
// wait on the key at once; lowering it lets the holders above it finish.
func (s *Store) SetLimit(ctx context.Context, key string, slots int) (lease.Limit, error) {
	if _, err := s.q.LimitSet(ctx, db.LimitSetParams{Resource: key, Slots: int32(slots)}); err != nil {
		return lease.Limit{}, fmt.Errorf("set the limit of %s: %w", key, err)
	}
	return s.Limit(ctx, key)
}

// SetRate gives key a rate: at most starts of its tasks start in any
// period (starts 0: no rate). A key without a limit gets the most slots,
// lease.MaxSlots: a rate alone bounds how often its tasks start, not how
// many run.
func (s *Store) SetRate(ctx context.Context, key string, starts int, period time.Duration) (lease.Limit, error) {
	var p db.RateSetParams
	p.Resource = key
	if starts > 0 {
		n, secs := int32(starts), int32(period/time.Second)
		p.Starts, p.PeriodSeconds = &n, &secs
	}
	if err := s.q.RateSet(ctx, p); err != nil {
		return lease.Limit{}, fmt.Errorf("set the rate of %s: %w", key, err)
	}
	return s.Limit(ctx, key)
}

// Limit returns key's limit with its holders, waiting tasks and rate;
// ErrNotFound when it has none.
func (s *Store) Limit(ctx context.Context, key string) (lease.Limit, error) {
	r, err := s.q.LimitGet(ctx, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return lease.Limit{}, lease.ErrNotFound
	}
	if err != nil {
		return lease.Limit{}, fmt.Errorf("read the limit of %s: %w", key, err)
	}
	return limitOf(r), nil
}

// Limits returns up to limit keys' limits after the key after, in name
// order.
func (s *Store) Limits(ctx context.Context, after string, limit int32) ([]lease.Limit, error) {
	rows, err := s.q.LimitList(ctx, db.LimitListParams{After: after, RowLimit: limit})
	if err != nil {
		return nil, fmt.Errorf("list limits: %w", err)
	}
	out := make([]lease.Limit, len(rows))
	for i, r := range rows {
		out[i] = limitOf(r)
	}
	return out, nil
}

func limitOf(r db.LeaseLimitStatus) lease.Limit {
	return lease.Limit{
		Resource: r.Resource, Slots: int(r.Slots), Held: int(r.Held), Waiting: int(r.Waiting),
		RateStarts: int(r.RateStarts), RatePeriod: time.Duration(r.RatePeriodSeconds) * time.Second,
		RateSpent: int(r.RateSpent), RateNextAt: r.RateNext, UpdatedAt: r.UpdatedAt,
	}
}

func ttlSeconds(d time.Duration) int32 { return int32(d / time.Second) }

// Renew extends the holder's active lease to now + TTL by the database
// clock. ErrNotHeld when the holder holds no active lease on the resource.
func (s *Store) Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error) {
	params := db.LeaseRenewParams{Resource: p.Resource, Holder: p.Holder, Fence: optional(p.Fence)}
	if p.TTL > 0 {
		ttl := ttlSeconds(p.TTL)
		params.TTLSeconds = &ttl
	}
	op := &groupOp{resource: p.Resource, kind: opRenew, renew: params}
	s.group.do(ctx, op)
	if op.err != nil {
		return lease.Lease{}, notHeld("renew", p.Resource, op.err)
	}
	return fromRow(op.row, lease.StateActive), nil
}

// Release ends the holder's active lease now. ErrNotHeld when the holder
// holds no active lease on the resource (a second release included).
func (s *Store) Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error) {
	op := &groupOp{resource: p.Resource, kind: opRelease, release: db.LeaseReleaseParams{
		Resource: p.Resource, Holder: p.Holder, Fence: optional(p.Fence), ID: optional(p.ID),
	}}
	s.group.do(ctx, op)
	if op.err != nil {
		return lease.Lease{}, notHeld("release", p.Resource, op.err)
	}
	return fromRow(op.row, lease.StateReleased), nil
}

func notHeld(op, resource string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return lease.ErrNotHeld
	}
	return fmt.Errorf("%s %s: %w", op, resource, err)
}

func optional(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

func fromRow(r db.Lease, state lease.State) lease.Lease {
	return lease.Lease{
		ID: r.ID, Resource: r.Resource, Holder: r.Holder, Fence: r.Fence, State: state,
		TTLSeconds: r.TTLSeconds, CreatedAt: r.CreatedAt, RenewedAt: r.RenewedAt,
		ReleasedAt: r.ReleasedAt, ExpiresAt: r.ExpiresAt,
	}
}

// Get returns the lease with the given id, ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id int64) (lease.Lease, error) {
	row, err := s.q.LeaseGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return lease.Lease{}, lease.ErrNotFound
	}
	if err != nil {
		return lease.Lease{}, fmt.Errorf("get lease %d: %w", id, err)
	}
	return fromListRow(db.LeaseListRow(row)), nil
}

// listRow is every query result that is a lease with its state: sqlc
// makes a type per query, all of the same shape.
type listRow interface {
	db.LeaseListRow | db.LeaseGetManyRow | db.LeaseListNewestRow
}

func fromListRows[R listRow](rows []R) []lease.Lease {
	leases := make([]lease.Lease, len(rows))
	for i, r := range rows {
		leases[i] = fromListRow(db.LeaseListRow(r))
	}
	return leases
}

func fromListRow(r db.LeaseListRow) lease.Lease {
	return lease.Lease{
		ID: r.ID, Resource: r.Resource, Holder: r.Holder, Fence: r.Fence, State: lease.State(r.State),
		TTLSeconds: r.TTLSeconds, CreatedAt: r.CreatedAt, RenewedAt: r.RenewedAt,
		ReleasedAt: r.ReleasedAt, ExpiresAt: r.ExpiresAt,
	}
}

// GetMany returns the leases with the given ids (those that exist), in id
// order, with their states by the database clock.
func (s *Store) GetMany(ctx context.Context, ids []int64) ([]lease.Lease, error) {
	rows, err := s.q.LeaseGetMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("get leases: %w", err)
	}
	return fromListRows(rows), nil
}

// Newest returns up to limit of the newest leases other than task leases,
// newest first.
func (s *Store) Newest(ctx context.Context, limit int32) ([]lease.Lease, error) {
	rows, err := s.q.LeaseListNewest(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list newest leases: %w", err)
	}
	return fromListRows(rows), nil
}

// List returns a page of leases in id order.
func (s *Store) List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error) {
	rows, err := s.q.LeaseList(ctx, db.LeaseListParams{
		AfterID: p.AfterID, Prefix: p.Prefix, State: p.Filter, RowLimit: p.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return fromListRows(rows), nil
}

// Events returns a page of the audit history in id order.
func (s *Store) Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error) {
	rows, err := s.q.LeaseEvents(ctx, db.LeaseEventsParams{AfterID: p.AfterID, Resource: p.Resource, RowLimit: p.Limit})
	return events(rows, err)
}

// Expiry is an expired lease the reaper announced, Lag after its expires_at.
type Expiry struct {
	Lease lease.Lease
	Lag   time.Duration
}

// EventsByID returns the events with the given ids, in id order.
func (s *Store) EventsByID(ctx context.Context, ids []int64) ([]lease.Event, error) {
	rows, err := s.q.LeaseEventsByIDs(ctx, ids)
	return events(rows, err)
}

// NonTaskEvents returns up to limit events of all but task leases after
// the event afterID, oldest first.
func (s *Store) NonTaskEvents(ctx context.Context, afterID int64, limit int32) ([]lease.Event, error) {
	rows, err := s.q.LeaseEventsNonTask(ctx, db.LeaseEventsNonTaskParams{AfterID: afterID, RowLimit: limit})
	return events(rows, err)
}

// NewestNonTaskEvents returns the newest limit events of all but task
// leases, oldest first.
func (s *Store) NewestNonTaskEvents(ctx context.Context, limit int32) ([]lease.Event, error) {
	rows, err := s.q.LeaseEventsNonTaskNewest(ctx, limit)
	evs, err := events(rows, err)
	slices.Reverse(evs)
	return evs, err
}

func events(rows []db.LeaseEvent, err error) ([]lease.Event, error) {
	if err != nil {
		return nil, fmt.Errorf("list lease events: %w", err)
	}
	evs := make([]lease.Event, len(rows))
	for i, r := range rows {
		evs[i] = lease.Event(r)
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
		expiries[i] = Expiry{Lease: fromRow(r, lease.StateExpired), Lag: lag}
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
