package leasehold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/internal/restclient"

	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/schedule"
)

// Schedules adds, replaces, reads and removes schedules: each makes one
// task per tick of its cron expression, exactly once per tick across every
// replica and client (package schedule). The ticks are enqueued by
// whichever process holds the scheduler lease: a `leasehold serve` replica
// with the scheduler role, or a Client on a pool with Config.Scheduler.
type Schedules struct {
	store *scheduler.Store   // on a pool
	rest  *restclient.Client // remote
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
	body := scheduleBody(p)
	path := "/api/schedules"
	if method == http.MethodPut {
		path = "/api/schedules/" + url.PathEscape(p.Name)
	}
	var sc schedule.Schedule
	_, err := s.rest.Do(ctx, method, path, nil, body, &sc, func(status int, eb restclient.ErrorBody) error {
		switch status {
		case http.StatusConflict:
			var cur schedule.Schedule
			if json.Unmarshal(eb.Schedule, &cur) != nil {
				cur = schedule.Schedule{Name: p.Name}
			}
			return &schedule.ExistsError{Schedule: cur}
		case http.StatusBadRequest:
			return fmt.Errorf("%w: %w", ErrInvalidArgument, &schedule.InvalidError{Reason: eb.Error})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &sc, nil
}

// scheduleBody is p as POST /api/schedules takes it.
func scheduleBody(p schedule.Params) any {
	p = p.WithDefaults()
	return struct {
		Name        string          `json:"name"`
		Cron        string          `json:"cron"`
		Zone        string          `json:"zone"`
		Kind        string          `json:"kind"`
		TaskData    json.RawMessage `json:"task_data"`
		Queue       string          `json:"queue"`
		Priority    int16           `json:"priority"`
		Unique      bool            `json:"unique"`
		Lock        string          `json:"lock,omitempty"`
		MaxAttempts int             `json:"max_attempts"`
		TTLSeconds  int64           `json:"ttl_seconds,omitempty"`
	}{p.Name, p.Cron, p.Zone, p.Kind, p.TaskData, p.Queue, p.Priority, p.Unique, p.Lock, p.MaxAttempts, int64(p.TTL / time.Second)}
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
	var sc schedule.Schedule
	_, err := s.rest.Do(ctx, http.MethodGet, "/api/schedules/"+url.PathEscape(name), nil, nil, &sc, notFound(schedule.ErrNotFound))
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
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after_name", after)
	}
	var list []schedule.Schedule
	if _, err := s.rest.Do(ctx, http.MethodGet, "/api/schedules", q, nil, &list, nil); err != nil {
		return nil, err
	}
	return list, nil
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
	var sc schedule.Schedule
	_, err := s.rest.Do(ctx, http.MethodDelete, "/api/schedules/"+url.PathEscape(name), nil, nil, &sc, notFound(schedule.ErrNotFound))
	if err != nil {
		return nil, err
	}
	return &sc, nil
}

// notFound is the refusal of a 404 as err.
func notFound(err error) restclient.Refusal {
	return func(status int, _ restclient.ErrorBody) error {
		if status == http.StatusNotFound {
			return err
		}
		return nil
	}
}

// errNoScheduler: Config.Scheduler on a remote client.
var errNoScheduler = errors.New("Config.Scheduler needs a client on a pool (NewClient): a remote client's service runs its own scheduler")
