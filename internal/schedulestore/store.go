// Package schedulestore is the schedule store: it adds, replaces, reads
// and removes schedules on PostgreSQL, reads every schedule's next tick
// for the scheduler, and makes a tick's task under the scheduler's
// fenced lease (Enqueue: a compare-and-set on the schedule's next tick).
// Package schedule holds the types; package scheduler enqueues the ticks.
package schedulestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/schedule"
)

// Store reads and writes schedules.
type Store struct {
	pool *pgxpool.Pool
	q    *db.Queries

	mu    sync.Mutex
	specs map[[2]string]parsed // by (cron, zone): the scheduler reads every schedule each round
}

// parsed is a definition parsed once.
type parsed struct {
	spec *schedule.Spec
	err  error
}

// maxSpecs bounds Store.specs; past it the cache starts afresh.
const maxSpecs = 10_000

// spec parses cron in zone, or returns the result of an earlier parse of them.
func (s *Store) spec(cron, zone string) (*schedule.Spec, error) {
	key := [2]string{cron, zone}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.specs[key]; ok {
		return p.spec, p.err
	}
	if s.specs == nil || len(s.specs) >= maxSpecs {
		s.specs = make(map[[2]string]parsed)
	}
	spec, err := schedule.Parse(cron, zone)
	s.specs[key] = parsed{spec, err}
	return spec, err
}

// NewStore returns a Store on the pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool, q: db.New(pool)} }

// Create adds the schedule p. created is false when one of that name with
// the same definition exists already (a retry): that one comes back. One
// with another definition is an *schedule.ExistsError; a bad definition
// an *schedule.InvalidError. Its first tick is the first after now, by the
// database clock.
func (s *Store) Create(ctx context.Context, p schedule.Params) (sc schedule.Schedule, created bool, err error) {
	args, err := s.params(ctx, p)
	if err != nil {
		return schedule.Schedule{}, false, err
	}
	if err := s.seedLimit(ctx, p); err != nil {
		return schedule.Schedule{}, false, err
	}
	row, err := s.q.ScheduleCreate(ctx, args)
	if err == nil {
		return fromRow(row, nil, nil, nil), true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return schedule.Schedule{}, false, fmt.Errorf("create schedule %q: %w", p.Name, err)
	}
	cur, err := s.Get(ctx, p.Name)
	switch {
	case errors.Is(err, schedule.ErrNotFound):
		return schedule.Schedule{}, false, fmt.Errorf("create schedule %q: it was removed while being created; retry", p.Name)
	case err != nil:
		return schedule.Schedule{}, false, err
	case cur.Same(p):
		return cur, false, nil
	}
	return schedule.Schedule{}, false, &schedule.ExistsError{Schedule: cur}
}

// Replace adds the schedule p or replaces the definition of the one of
// that name; its next tick is then the first after now. Its counters and
// last task stay.
func (s *Store) Replace(ctx context.Context, p schedule.Params) (sc schedule.Schedule, created bool, err error) {
	args, err := s.params(ctx, p)
	if err != nil {
		return schedule.Schedule{}, false, err
	}
	if err := s.seedLimit(ctx, p); err != nil {
		return schedule.Schedule{}, false, err
	}
	row, err := s.q.ScheduleReplace(ctx, db.ScheduleReplaceParams(args))
	if err != nil {
		return schedule.Schedule{}, false, fmt.Errorf("replace schedule %q: %w", p.Name, err)
	}
	cur, err := s.Get(ctx, p.Name)
	if err != nil {
		// Removed right after: answer with what was written.
		return fromRow(row.Schedule, nil, nil, nil), row.Inserted, nil
	}
	return cur, row.Inserted, nil
}

// seedLimit gives p's lock the limit p.LockLimit unless it has one.
func (s *Store) seedLimit(ctx context.Context, p schedule.Params) error {
	if p.Lock == "" || p.LockLimit == 0 {
		return nil
	}
	if err := s.q.LimitSeed(ctx, db.LimitSeedParams{Resources: []string{p.Lock}, Slots: []int32{int32(p.LockLimit)}}); err != nil {
		return fmt.Errorf("schedule %q: set the limit of its lock %s: %w", p.Name, p.Lock, err)
	}
	return nil
}

// params checks p and returns the row to write, its first tick computed
// from the database clock.
func (s *Store) params(ctx context.Context, p schedule.Params) (db.ScheduleCreateParams, error) {
	if err := p.Validate(); err != nil {
		return db.ScheduleCreateParams{}, err
	}
	p = p.WithDefaults()
	spec, err := schedule.Parse(p.Cron, p.Zone)
	if err != nil {
		return db.ScheduleCreateParams{}, err
	}
	now, err := s.q.DBNow(ctx)
	if err != nil {
		return db.ScheduleCreateParams{}, fmt.Errorf("read the database clock: %w", err)
	}
	args := db.ScheduleCreateParams{
		Name: p.Name, Cron: p.Cron, Zone: p.Zone, Kind: p.Kind, TaskData: p.TaskData, Queue: p.Queue,
		Priority: p.Priority, UniqueTicks: p.Unique, MaxAttempts: int32(p.MaxAttempts), NextTickAt: spec.Next(now),
	}
	if p.Lock != "" {
		args.LockResource = &p.Lock
	}
	if p.TTL != 0 {
		ttl := int32(p.TTL / time.Second)
		args.TTLSeconds = &ttl
	}
	return args, nil
}

// Get returns the schedule of that name, or schedule.ErrNotFound.
func (s *Store) Get(ctx context.Context, name string) (schedule.Schedule, error) {
	r, err := s.q.ScheduleGet(ctx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return schedule.Schedule{}, fmt.Errorf("%w: %q", schedule.ErrNotFound, name)
	}
	if err != nil {
		return schedule.Schedule{}, fmt.Errorf("get schedule %q: %w", name, err)
	}
	return fromRow(r.Schedule, r.LastTaskState, r.LastTaskProcessedAt, r.LastTaskError), nil
}

// List returns up to limit schedules in name order, after the name given
// ("": from the first).
func (s *Store) List(ctx context.Context, after string, limit int32) ([]schedule.Schedule, error) {
	rows, err := s.q.ScheduleList(ctx, db.ScheduleListParams{AfterName: after, RowLimit: limit})
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	out := make([]schedule.Schedule, len(rows))
	for i, r := range rows {
		out[i] = fromRow(r.Schedule, r.LastTaskState, r.LastTaskProcessedAt, r.LastTaskError)
	}
	return out, nil
}

// Delete removes the schedule of that name and returns it; its tasks stay.
func (s *Store) Delete(ctx context.Context, name string) (schedule.Schedule, error) {
	r, err := s.q.ScheduleDelete(ctx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return schedule.Schedule{}, fmt.Errorf("%w: %q", schedule.ErrNotFound, name)
	}
	if err != nil {
		return schedule.Schedule{}, fmt.Errorf("delete schedule %q: %w", name, err)
	}
	return fromRow(r, nil, nil, nil), nil
}

func fromRow(r db.Schedule, lastState *string, lastProcessed *time.Time, lastError *string) schedule.Schedule {
	s := schedule.Schedule{
		Name: r.Name, Cron: r.Cron, Zone: r.Zone, Kind: r.Kind, TaskData: r.TaskData, Queue: r.Queue,
		Priority: r.Priority, Unique: r.UniqueTicks, Lock: deref(r.LockResource), MaxAttempts: r.MaxAttempts,
		TTLSeconds: deref(r.TTLSeconds), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, NextTick: r.NextTickAt,
		LastTick: r.LastTickAt, MissedTicks: r.MissedTicks, SkippedTicks: r.SkippedTicks,
	}
	if r.LastTaskID != nil && lastState != nil {
		s.LastTask = &schedule.LastTask{ID: *r.LastTaskID, State: *lastState, ProcessedAt: lastProcessed, LastError: deref(lastError)}
	}
	return s
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// Due is one schedule as the scheduler sees it: its next tick, and its
// cron expression parsed (SpecErr when it cannot be).
type Due struct {
	ID      int64
	Name    string
	Spec    *schedule.Spec
	SpecErr error
	Next    time.Time
}

// Times reads every schedule's next tick and the database clock.
func (s *Store) Times(ctx context.Context) ([]Due, time.Time, error) {
	rows, err := s.q.ScheduleTimes(ctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read the schedules: %w", err)
	}
	out := make([]Due, len(rows))
	var now time.Time
	for i, r := range rows {
		spec, err := s.spec(r.Cron, r.Zone)
		out[i] = Due{ID: r.ID, Name: r.Name, Spec: spec, SpecErr: err, Next: r.NextTickAt}
		now = r.DBNow
	}
	if len(rows) == 0 {
		if now, err = s.q.DBNow(ctx); err != nil {
			return nil, time.Time{}, fmt.Errorf("read the database clock: %w", err)
		}
	}
	return out, now, nil
}

// Enqueued is what one Enqueue did.
type Enqueued struct {
	OK      bool  // the compare-and-set held: the schedule moved on
	TaskID  int64 // 0: no task (a tick made already, or skipped)
	Skipped bool
}

// Enqueue makes the task of tick, moving the schedule's next tick from
// expect to next, under the holder's scheduler lease with fence.
func (s *Store) Enqueue(ctx context.Context, holder string, fence, id int64, expect, tick, next time.Time, missed int64) (Enqueued, error) {
	r, err := s.q.ScheduleEnqueue(ctx, db.ScheduleEnqueueParams{
		Holder: holder, Fence: fence, ID: id, ExpectTick: expect, Tick: tick, NextTick: next, Missed: missed,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Enqueued{}, nil
	}
	if err != nil {
		return Enqueued{}, fmt.Errorf("enqueue the tick %s: %w", tick.Format(time.RFC3339), err)
	}
	return Enqueued{OK: true, TaskID: r.TaskID, Skipped: r.Skipped > 0}, nil
}
