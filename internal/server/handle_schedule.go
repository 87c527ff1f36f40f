package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/schedule"
)

// Limits of the schedule list.
const (
	defaultScheduleLimit = 1000
	maxScheduleLimit     = 10000
)

// scheduleRequest is the body of POST /api/schedules and PUT
// /api/schedules/{name} (where name comes from the path).
type scheduleRequest struct {
	Name        opt[string]     `json:"name,omitzero"`
	Cron        opt[string]     `json:"cron,omitzero"`
	Zone        opt[string]     `json:"zone,omitzero"`
	Kind        opt[string]     `json:"kind,omitzero"`
	TaskData    json.RawMessage `json:"task_data,omitempty"`
	Queue       opt[string]     `json:"queue,omitzero"`
	Priority    opt[int64]      `json:"priority,omitzero"`
	Unique      opt[bool]       `json:"unique,omitzero"`
	Lock        opt[string]     `json:"lock,omitzero"`
	LockLimit   *int64          `json:"lock_limit,omitempty"`
	MaxAttempts opt[int64]      `json:"max_attempts,omitzero"`
	TTLSeconds  opt[int64]      `json:"ttl_seconds,omitzero"`
}

func (q scheduleRequest) validate() error {
	return firstError(
		q.Name.present("name", func(v string) error { return checkName("name", v) }),
		q.Cron.present("cron", func(string) error { return nil }),
		q.Zone.present("zone", func(string) error { return nil }),
		q.Kind.present("kind", func(v string) error { return checkName("kind", v) }),
		q.Queue.present("queue", func(v string) error { return checkName("queue", v) }),
		q.Lock.present("lock", func(v string) error { return checkResource("lock", v) }),
		checkLockLimit(q.Lock.v, q.LockLimit),
		q.Unique.present("unique", func(bool) error { return nil }),
		q.Priority.present("priority", func(v int64) error {
			if v < minPriority || v > maxPriority {
				return badRequestf(`"priority" is %d; it must be between %d and %d (lower runs first; 0 is the default)`, v, minPriority, maxPriority)
			}
			return nil
		}),
		q.MaxAttempts.present("max_attempts", func(v int64) error {
			if v < 1 || v > maxAttemptsLimit {
				return badRequestf(`"max_attempts" is %d; it must be between 1 and %d (5 is the default)`, v, maxAttemptsLimit)
			}
			return nil
		}),
		q.TTLSeconds.present("ttl_seconds", func(v int64) error { return checkTTL(&v) }),
	)
}

// params is the request as a schedule's definition, checked: a bad one
// is a 400 saying what to fix.
func (q scheduleRequest) params() (schedule.Params, error) {
	if len(q.TaskData) > 0 {
		if err := checkPayload(`"task_data"`, q.TaskData); err != nil {
			return schedule.Params{}, err
		}
		if err := checkJSON(`"task_data"`, q.TaskData, true); err != nil {
			return schedule.Params{}, err
		}
	}
	p := schedule.Params{
		Name: q.Name.v, Cron: q.Cron.v, Zone: q.Zone.v, Kind: q.Kind.v, TaskData: q.TaskData, Queue: q.Queue.v,
		Priority: int16(q.Priority.v), Unique: q.Unique.v, Lock: q.Lock.v, MaxAttempts: int(q.MaxAttempts.v),
		TTL: time.Duration(q.TTLSeconds.v) * time.Second, LockLimit: int(deref(q.LockLimit)),
	}
	if err := p.Validate(); err != nil {
		return schedule.Params{}, scheduleError(err)
	}
	return p, nil
}

// scheduleError makes a definition's error a 400.
func scheduleError(err error) error {
	var inv *schedule.InvalidError
	if errors.As(err, &inv) {
		return badRequestf("%s", inv.Reason)
	}
	return err
}

// handleScheduleCreate serves POST /api/schedules: 201 and the schedule;
// 200 and the existing one when one of that name has the same definition
// (a retry); 409 and the existing one when its definition differs.
func handleScheduleCreate(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := decode[scheduleRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		p, err := q.params()
		if err == nil {
			err = maySchedule(r, p.Queue, p.Kind, p.Lock)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		s, created, err := d.Schedules.Create(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, scheduleError(err))
			return
		}
		encode(w, map[bool]int{true: http.StatusCreated, false: http.StatusOK}[created], s)
	})
}

// handleScheduleReplace serves PUT /api/schedules/{name}: the schedule
// added (201) or its definition replaced (200), its next tick the first
// after now.
func handleScheduleReplace(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := pathName(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		q, err := decode[scheduleRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if q.Name.set && q.Name.v != name {
			writeError(w, r, d.Log, badRequestf(`"name" %q differs from the path's %q; leave it out, or send the same name`, q.Name.v, name))
			return
		}
		q.Name = opt[string]{v: name, set: true}
		p, err := q.params()
		if err == nil {
			err = maySchedule(r, p.Queue, p.Kind, p.Lock)
		}
		if err == nil {
			// The schedule replaced must be the token's to change too.
			if cur, gerr := d.Schedules.Get(r.Context(), name); gerr == nil {
				err = maySchedule(r, cur.Queue, cur.Kind, cur.Lock)
			}
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		s, created, err := d.Schedules.Replace(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, scheduleError(err))
			return
		}
		encode(w, map[bool]int{true: http.StatusCreated, false: http.StatusOK}[created], s)
	})
}

// pathName is the {name} of a schedule's path, checked as a name.
func pathName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if name == "" {
		return "", badRequestf("the schedule's name is missing from the path; use /api/schedules/{name}")
	}
	if err := checkName("name", name); err != nil {
		return "", err
	}
	return name, nil
}

func handleScheduleGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := pathName(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		s, err := d.Schedules.Get(r.Context(), name)
		if err == nil && !mayRead(r, s.Queue, s.Kind) {
			err = maySchedule(r, s.Queue, s.Kind, "")
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, s)
	})
}

// handleScheduleDelete serves DELETE /api/schedules/{name}: 200 and the
// schedule removed (its tasks stay); 404 when there is none. The body says
// nothing and is ignored, but is held to the 1 MiB of every body.
func handleScheduleDelete(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBody(w, r); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		name, err := pathName(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if cur, err := d.Schedules.Get(r.Context(), name); err == nil {
			if err := maySchedule(r, cur.Queue, cur.Kind, cur.Lock); err != nil {
				writeError(w, r, d.Log, err)
				return
			}
		}
		s, err := d.Schedules.Delete(r.Context(), name)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, s)
	})
}

// handleScheduleList serves GET /api/schedules: the schedules in name
// order, ?limit= (default 1000, at most 10000) after ?after_name=.
func handleScheduleList(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit, err := queryInt(q, "limit", defaultScheduleLimit, 1, maxScheduleLimit)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		after, err := queryName(q, "after_name")
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		list, err := d.Schedules.List(r.Context(), after, int32(limit))
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		// Without the schedules the token may not read.
		list = slices.DeleteFunc(list, func(s schedule.Schedule) bool { return !mayRead(r, s.Queue, s.Kind) })
		encode(w, http.StatusOK, list)
	})
}

// maySchedule refuses a schedule of queue, kind and lock that the request's
// token's prefixes do not allow.
func maySchedule(r *http.Request, queue, kind, lock string) error {
	return mayTask(r, or(queue, task.DefaultQueue), kind, "", lock)
}
