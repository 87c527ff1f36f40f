package leasehold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/internal/schedulestore"

	"github.com/leasehold/leasehold/schedule"
)

// Schedules adds, replaces, reads and removes schedules: each makes one
// task per tick of its cron expression, exactly once per tick across every
// replica and client (package schedule). The ticks are enqueued by
// whichever process holds the scheduler lease: a `leasehold serve` replica
// with the scheduler role, or a Client on a pool with Config.Scheduler.
type Schedules struct {
	store *schedulestore.Store // on a pool
	rest  *restclient.Client   // remote
	// kind refuses a schedule's kind as an insert's would: a client with
	// Workers knows the kinds it runs (ErrUnknownKind).
	kind func(kind string) error
}

// Schedules returns the client's schedules.
func (c *Client) Schedules() *Schedules { return c.schedules }

// Add adds the schedule p; its first tick is the first after now, by the
// database clock. Adding one that exists with the same definition returns
// it (a retry is safe). Errors: an *schedule.ExistsError (errors.Is
// schedule.ErrExists) when the name is taken with another definition; an
// error wrapping ErrInvalidArgument and a *schedule.InvalidError when p is
// wrong (a bad cron expression, an unknown zone…), which changes nothing;
// ErrUnknownKind, on a client with Workers, for a kind they do not run
// (unless Config.AllowUnknownKinds), as for an insert. NewSchedule makes p
// from typed task args.
func (s *Schedules) Add(ctx context.Context, p schedule.Params) (*schedule.Schedule, error) {
	return s.write(ctx, http.MethodPost, p)
}

// Replace adds the schedule p or replaces the definition of the one of
// its name; its next tick is then the first after now (its counters and
// last task stay). Errors as Add's, but for ErrExists.
func (s *Schedules) Replace(ctx context.Context, p schedule.Params) (*schedule.Schedule, error) {
	return s.write(ctx, http.MethodPut, p)
}

func (s *Schedules) write(ctx context.Context, method string, p schedule.Params) (*schedule.Schedule, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if s.kind != nil {
		if err := s.kind(p.Kind); err != nil {
			return nil, fmt.Errorf("schedule %q: %w", p.Name, err)
		}
	}
	if s.store != nil {
		var (
			sc  schedule.Schedule
			err error
		)
		if method == http.MethodPut {
			sc, _, err = s.store.Replace(ctx, p)
		} else {
			sc, _, err = s.store.Create(ctx, p)
		}
		if err != nil {
			return nil, err
		}
		return &sc, nil
	}
	api := restclient.Schedules{C: s.rest}
	var (
		sc  schedule.Schedule
		err error
	)
	if method == http.MethodPut {
		sc, err = api.Replace(ctx, p)
	} else {
		sc, _, err = api.Add(ctx, p)
	}
	if inv, ok := errors.AsType[*schedule.InvalidError](err); ok {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, inv)
	}
	if err != nil {
		return nil, err
	}
	return &sc, nil
}

// ScheduleOpts are the options of a schedule made from task args
// (NewSchedule): its zone, Unique, and those of each task it makes.
type ScheduleOpts struct {
	// Zone is the IANA time zone the cron fields are read in ("": UTC).
	Zone string
	// Unique makes no task for a tick while the previous one is pending or
	// running (schedule.Params.Unique).
	Unique bool
	// Queue, Priority, Lock, MaxAttempts and TTL are each task's, as
	// InsertOpts's; zero values take the args' InsertOpts (when they
	// provide them), then the defaults.
	Queue       string
	Priority    int16
	Lock        string
	MaxAttempts int
	TTL         time.Duration
	// LockLimit, with Lock, lets that many of its tasks run at once
	// (schedule.Params.LockLimit, InsertOpts.LockLimit).
	LockLimit int
}

// NewSchedule is the definition of a schedule named name whose every tick
// of cron makes a task of args: its kind args' Kind, its task_data args'
// JSON, typed as an insert's are. Add it with Schedules.Add. Its error
// wraps ErrInvalidArgument when args do not encode as a JSON object or the
// definition is wrong (a bad cron expression, an unknown zone…).
func NewSchedule(name, cron string, args TaskArgs, opts *ScheduleOpts) (schedule.Params, error) {
	if args == nil {
		return schedule.Params{}, fmt.Errorf("%w: schedule %q: no task args (nil)", ErrInvalidArgument, name)
	}
	kind, err := safeKind(args)
	if err != nil {
		return schedule.Params{}, err
	}
	data, err := json.Marshal(args)
	if err != nil {
		return schedule.Params{}, fmt.Errorf("%w: schedule %q: encode the args of kind %q: %w", ErrInvalidArgument, name, kind, err)
	}
	var o ScheduleOpts
	if opts != nil {
		o = *opts
	}
	if dp, ok := args.(InsertOptsProvider); ok {
		d := dp.InsertOpts()
		o.Queue, o.Priority, o.Lock = or(o.Queue, d.Queue), orInt(o.Priority, d.Priority), or(o.Lock, d.Lock)
		o.MaxAttempts, o.TTL = orInt(o.MaxAttempts, d.MaxAttempts), orInt(o.TTL, d.TTL)
	}
	p := schedule.Params{
		Name: name, Cron: cron, Zone: o.Zone, Kind: kind, TaskData: data, Queue: o.Queue, Priority: o.Priority,
		Lock: o.Lock, MaxAttempts: o.MaxAttempts, TTL: o.TTL, Unique: o.Unique, LockLimit: o.LockLimit,
	}
	if err := p.Validate(); err != nil {
		return schedule.Params{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return p, nil
}

// or is v, or def when v is empty.
func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// orInt is v, or def when v is zero.
func orInt[T int | int16 | time.Duration](v, def T) T {
	if v != 0 {
		return v
	}
	return def
}

// Get returns the schedule of that name, with its next tick and its last
// task; schedule.ErrNotFound when there is none.
func (s *Schedules) Get(ctx context.Context, name string) (*schedule.Schedule, error) {
	if err := checkName("schedule name", name); err != nil {
		return nil, err
	}
	if s.store != nil {
		sc, err := s.store.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		return &sc, nil
	}
	sc, err := restclient.Schedules{C: s.rest}.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	return &sc, nil
}

// List returns up to limit schedules (0: 1000; at most 10000) in name
// order, after the name given ("": from the first).
func (s *Schedules) List(ctx context.Context, after string, limit int) ([]schedule.Schedule, error) {
	if limit == 0 {
		limit = 1000
	}
	if limit < 1 || limit > 10000 {
		return nil, fmt.Errorf("%w: limit %d must be 1 to 10000 (0: 1000)", ErrInvalidArgument, limit)
	}
	if s.store != nil {
		return s.store.List(ctx, after, int32(limit))
	}
	return restclient.Schedules{C: s.rest}.List(ctx, after, limit)
}

// Delete removes the schedule of that name and returns it: no tick of it
// is enqueued from then on (its tasks made so far stay).
// schedule.ErrNotFound when there is none.
func (s *Schedules) Delete(ctx context.Context, name string) (*schedule.Schedule, error) {
	if err := checkName("schedule name", name); err != nil {
		return nil, err
	}
	if s.store != nil {
		sc, err := s.store.Delete(ctx, name)
		if err != nil {
			return nil, err
		}
		return &sc, nil
	}
	sc, err := restclient.Schedules{C: s.rest}.Delete(ctx, name)
	if err != nil {
		return nil, err
	}
	return &sc, nil
}

// errNoScheduler: Config.Scheduler on a remote client.
var errNoScheduler = errors.New("Config.Scheduler needs a client on a pool (NewClient): a remote client's service runs its own scheduler")
