package leasehold

import (
	"context"
	"errors"
	"fmt"
	"net/http"

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
}

// Schedules returns the client's schedules.
func (c *Client) Schedules() *Schedules { return c.schedules }

// Add adds the schedule p; its first tick is the first after now, by the
// database clock. Adding one that exists with the same definition returns
// it (a retry is safe). Errors: an *schedule.ExistsError (errors.Is
// schedule.ErrExists) when the name is taken with another definition; an
// error wrapping ErrInvalidArgument and a *schedule.InvalidError when p is
// wrong (a bad cron expression, an unknown zone…), which changes nothing.
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
