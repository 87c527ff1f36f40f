package restclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/schedule"
)

// Schedules are the schedules over the REST API.
type Schedules struct{ C *Client }

// schedulePath is the API's path of the schedule name, which may hold any
// character but a control character.
func schedulePath(name string) string { return "/api/schedules/" + url.PathEscape(name) }

// scheduleBody is p as POST /api/schedules and PUT /api/schedules/{name}
// take it, its defaults filled in.
type scheduleBody struct {
	Name        string          `json:"name"`
	Cron        string          `json:"cron"`
	Zone        string          `json:"zone"`
	Kind        string          `json:"kind"`
	TaskData    json.RawMessage `json:"task_data"`
	Queue       string          `json:"queue"`
	Priority    int16           `json:"priority"`
	Unique      bool            `json:"unique"`
	Lock        string          `json:"lock,omitempty"`
	LockLimit   int             `json:"lock_limit,omitempty"`
	MaxAttempts int             `json:"max_attempts"`
	TTLSeconds  int64           `json:"ttl_seconds,omitempty"`
}

// scheduleRefusals maps the refusals of the schedule routes: 409 is a
// *schedule.ExistsError (with the schedule that holds the name, when the
// answer carries it), 400 a *schedule.InvalidError with the service's
// sentence, 404 schedule.ErrNotFound.
func scheduleRefusals(name string) Refusal {
	return func(status int, body ErrorBody) error {
		switch status {
		case http.StatusConflict:
			cur := schedule.Schedule{Name: name}
			if len(body.Schedule) > 0 {
				_ = json.Unmarshal(body.Schedule, &cur)
			}
			return &schedule.ExistsError{Schedule: cur}
		case http.StatusBadRequest:
			return &schedule.InvalidError{Reason: body.Error}
		case http.StatusNotFound:
			return schedule.ErrNotFound
		}
		return nil
	}
}

// Add adds the schedule p (POST /api/schedules); existed says that one of
// its name had the same definition already, and nothing changed.
func (r Schedules) Add(ctx context.Context, p schedule.Params) (s schedule.Schedule, existed bool, err error) {
	status, err := r.C.Do(ctx, http.MethodPost, "/api/schedules", nil, bodyOfSchedule(p), &s, scheduleRefusals(p.Name))
	return s, status == http.StatusOK, err
}

// Replace adds the schedule p or replaces the definition of the one of its
// name (PUT /api/schedules/{name}).
func (r Schedules) Replace(ctx context.Context, p schedule.Params) (schedule.Schedule, error) {
	var s schedule.Schedule
	_, err := r.C.Do(ctx, http.MethodPut, schedulePath(p.Name), nil, bodyOfSchedule(p), &s, scheduleRefusals(p.Name))
	return s, err
}

func bodyOfSchedule(p schedule.Params) scheduleBody {
	p = p.WithDefaults()
	return scheduleBody{
		Name: p.Name, Cron: p.Cron, Zone: p.Zone, Kind: p.Kind, TaskData: p.TaskData, Queue: p.Queue, Priority: p.Priority,
		Unique: p.Unique, Lock: p.Lock, LockLimit: p.LockLimit, MaxAttempts: p.MaxAttempts, TTLSeconds: int64(p.TTL / time.Second),
	}
}

// Get reads the schedule of that name; schedule.ErrNotFound when there is
// none.
func (r Schedules) Get(ctx context.Context, name string) (schedule.Schedule, error) {
	var s schedule.Schedule
	_, err := r.C.Do(ctx, http.MethodGet, schedulePath(name), nil, nil, &s, scheduleRefusals(name))
	return s, err
}

// Delete removes the schedule of that name and returns it;
// schedule.ErrNotFound when there is none.
func (r Schedules) Delete(ctx context.Context, name string) (schedule.Schedule, error) {
	var s schedule.Schedule
	_, err := r.C.Do(ctx, http.MethodDelete, schedulePath(name), nil, nil, &s, scheduleRefusals(name))
	return s, err
}

// List reads up to limit schedules (0: the service's default page) in name
// order, after the name given ("": from the first).
func (r Schedules) List(ctx context.Context, after string, limit int) ([]schedule.Schedule, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after_name", after)
	}
	var list []schedule.Schedule
	if _, err := r.C.Do(ctx, http.MethodGet, "/api/schedules", q, nil, &list, nil); err != nil {
		return nil, err
	}
	return list, nil
}
