// Package schedule holds the types of leasehold's periodic tasks: a
// Schedule makes one task per tick of a cron expression, and each tick
// becomes exactly one task, however many replicas run and whichever of
// them holds the scheduler lease when the tick falls due.
//
// A cron expression is the standard five fields (minute, hour, day of
// month, month, day of week), a descriptor (@hourly, @daily, @weekly,
// @monthly, @yearly), or @every with a whole number of seconds, at least
// one (@every 30s, @every 1h30m). Parse checks one and tells its ticks.
package schedule

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/name"
	"github.com/leasehold/leasehold/task"

	"github.com/robfig/cron/v3"

	"github.com/leasehold/leasehold/internal/apitime"
)

// Errors of schedules, for errors.Is.
var (
	// ErrNotFound: no schedule of that name.
	ErrNotFound = errors.New("schedule not found")
	// ErrExists: a schedule of that name exists with another definition
	// (the error is an *ExistsError with it).
	ErrExists = errors.New("a schedule of that name exists")
	// ErrInvalid: the schedule's definition is wrong (the error is an
	// *InvalidError saying what and how to fix it).
	ErrInvalid = errors.New("invalid schedule")
)

// ExistsError is ErrExists with the schedule that holds the name.
type ExistsError struct{ Schedule Schedule }

func (e *ExistsError) Error() string {
	return fmt.Sprintf("a schedule named %q exists with another definition (cron %q, kind %q); remove it first, or replace it (PUT)",
		e.Schedule.Name, e.Schedule.Cron, e.Schedule.Kind)
}

// Is makes errors.Is(err, ErrExists) true.
func (e *ExistsError) Is(target error) bool { return target == ErrExists }

// InvalidError is ErrInvalid with the field that is wrong and why.
type InvalidError struct {
	Field  string // the API's name of the field: "cron", "zone", "name"…
	Reason string // one sentence: what is wrong and how to fix it
}

func (e *InvalidError) Error() string { return e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Defaults of a schedule's tasks.
const (
	DefaultZone        = "UTC"
	DefaultMaxAttempts = 5
)

// Params is the definition of a schedule: what POST /api/schedules takes.
type Params struct {
	// Name names the schedule: 1 to 255 bytes, no control characters.
	Name string
	// Cron is when it ticks (see the package documentation).
	Cron string
	// Zone is the IANA time zone the cron fields are read in ("": UTC),
	// e.g. "Europe/Berlin": "0 9 * * *" then ticks at 09:00 there in summer
	// and in winter. Across a change of the clocks it ticks as cron(8)
	// does: a tick whose local time does not exist that day (02:30 when the
	// clocks go from 02:00 to 03:00) runs at the change, and one whose
	// local time happens twice runs once, the first time; a schedule whose
	// hour field is "*" runs every hour the clock shows.
	Zone string
	// Kind, TaskData, Queue, Priority, Lock, MaxAttempts and TTL are those
	// of each task it makes (TaskData nil: {}; Queue "": the default queue;
	// MaxAttempts 0: DefaultMaxAttempts; TTL 0: the claimer's default).
	Kind        string
	TaskData    json.RawMessage
	Queue       string
	Priority    int16
	Lock        string
	MaxAttempts int
	TTL         time.Duration
	// LockLimit, with Lock, makes Lock a key of that many slots if it has
	// no limit yet, as a task's lock_limit does: up to that many of the
	// schedule's tasks (and other holders of the key) run at once. The
	// limit is the key's, not the schedule's: it is not stored with the
	// schedule, and changes by the key's own means.
	LockLimit int
	// Unique, when set, makes no task for a tick while the schedule's
	// previous task is still pending or running: the tick is counted in
	// SkippedTicks instead, so that a slow task never piles up behind
	// itself.
	Unique bool
}

// Schedule is a schedule as the API shows it.
type Schedule struct {
	Name        string          `json:"name"`
	Cron        string          `json:"cron"`
	Zone        string          `json:"zone"`
	Kind        string          `json:"kind"`
	TaskData    json.RawMessage `json:"task_data"`
	Queue       string          `json:"queue"`
	Priority    int16           `json:"priority"`
	Unique      bool            `json:"unique"`
	Lock        string          `json:"lock"`
	MaxAttempts int32           `json:"max_attempts"`
	TTLSeconds  int32           `json:"ttl_seconds"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	// NextTick is the next tick to be made a task; LastTick the last one
	// made (or skipped), nil before the first.
	NextTick time.Time  `json:"next_tick"`
	LastTick *time.Time `json:"last_tick"`
	// LastTask is the last task the schedule made, nil before the first
	// (or once retention pruned it).
	LastTask *LastTask `json:"last_task"`
	// MissedTicks counts the ticks that fell due while no scheduler ran:
	// each such run of ticks was made one task, for the latest of them.
	MissedTicks int64 `json:"missed_ticks"`
	// SkippedTicks counts the ticks a Unique schedule made no task for.
	SkippedTicks int64 `json:"skipped_ticks"`
}

// LastTask is the last task of a schedule and its outcome so far.
type LastTask struct {
	ID          int64      `json:"id"`
	State       string     `json:"state"`
	ProcessedAt *time.Time `json:"processed_at"`
	LastError   string     `json:"last_error,omitempty"`
}

// scheduleWire is Schedule on the wire: times in the API's format, null
// for what is not set.
type scheduleWire struct {
	Name         string          `json:"name"`
	Cron         string          `json:"cron"`
	Zone         string          `json:"zone"`
	Kind         string          `json:"kind"`
	TaskData     json.RawMessage `json:"task_data"`
	Queue        string          `json:"queue"`
	Priority     int16           `json:"priority"`
	Unique       bool            `json:"unique"`
	Lock         *string         `json:"lock"`
	MaxAttempts  int32           `json:"max_attempts"`
	TTLSeconds   *int32          `json:"ttl_seconds"`
	CreatedAt    string          `json:"created_at"`
	UpdatedAt    string          `json:"updated_at"`
	NextTick     string          `json:"next_tick"`
	LastTick     *string         `json:"last_tick"`
	LastTask     *lastTaskWire   `json:"last_task"`
	MissedTicks  int64           `json:"missed_ticks"`
	SkippedTicks int64           `json:"skipped_ticks"`
}

type lastTaskWire struct {
	ID          int64   `json:"id"`
	State       string  `json:"state"`
	ProcessedAt *string `json:"processed_at"`
	LastError   *string `json:"last_error"`
}

// MarshalJSON writes the schedule as the API shows it.
func (s Schedule) MarshalJSON() ([]byte, error) {
	w := scheduleWire{
		Name: s.Name, Cron: s.Cron, Zone: s.Zone, Kind: s.Kind, TaskData: s.TaskData, Queue: s.Queue,
		Priority: s.Priority, Unique: s.Unique, Lock: nonZero(s.Lock), MaxAttempts: s.MaxAttempts,
		TTLSeconds: nonZero(s.TTLSeconds), CreatedAt: apitime.Format(s.CreatedAt),
		UpdatedAt: apitime.Format(s.UpdatedAt), NextTick: apitime.Format(s.NextTick),
		LastTick: apitime.FormatPtr(s.LastTick), MissedTicks: s.MissedTicks, SkippedTicks: s.SkippedTicks,
	}
	if len(w.TaskData) == 0 {
		w.TaskData = json.RawMessage("{}")
	}
	if t := s.LastTask; t != nil {
		w.LastTask = &lastTaskWire{ID: t.ID, State: t.State, ProcessedAt: apitime.FormatPtr(t.ProcessedAt), LastError: nonZero(t.LastError)}
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a schedule as the API shows it.
func (s *Schedule) UnmarshalJSON(b []byte) error {
	var w struct {
		scheduleWire
		CreatedAt time.Time  `json:"created_at"`
		UpdatedAt time.Time  `json:"updated_at"`
		NextTick  time.Time  `json:"next_tick"`
		LastTick  *time.Time `json:"last_tick"`
		LastTask  *struct {
			lastTaskWire
			ProcessedAt *time.Time `json:"processed_at"`
		} `json:"last_task"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = Schedule{
		Name: w.Name, Cron: w.Cron, Zone: w.Zone, Kind: w.Kind, TaskData: w.TaskData, Queue: w.Queue,
		Priority: w.Priority, Unique: w.Unique, Lock: deref(w.Lock), MaxAttempts: w.MaxAttempts,
		TTLSeconds: deref(w.TTLSeconds), CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt, NextTick: w.NextTick,
		LastTick: w.LastTick, MissedTicks: w.MissedTicks, SkippedTicks: w.SkippedTicks,
	}
	if t := w.LastTask; t != nil {
		s.LastTask = &LastTask{ID: t.ID, State: t.State, ProcessedAt: t.ProcessedAt, LastError: deref(t.LastError)}
	}
	return nil
}

// Same reports whether the schedule has the definition p (after p's
// defaults): a create of p is then a retry, not a conflict.
func (s Schedule) Same(p Params) bool {
	p = p.WithDefaults()
	return s.Name == p.Name && s.Cron == p.Cron && s.Zone == p.Zone && s.Kind == p.Kind &&
		sameJSON(s.TaskData, p.TaskData) && s.Queue == p.Queue && s.Priority == p.Priority &&
		s.Unique == p.Unique && s.Lock == p.Lock && int(s.MaxAttempts) == p.MaxAttempts &&
		time.Duration(s.TTLSeconds)*time.Second == p.TTL
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// WithDefaults is p with its zero values replaced by the defaults.
func (p Params) WithDefaults() Params {
	if p.Zone == "" {
		p.Zone = DefaultZone
	}
	if len(p.TaskData) == 0 {
		p.TaskData = json.RawMessage("{}")
	}
	if p.Queue == "" {
		p.Queue = "default"
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	return p
}

// Validate reports what is wrong with p, as an *InvalidError, or nil.
func (p Params) Validate() error {
	for _, f := range []struct{ field, v string }{{"name", p.Name}, {"kind", p.Kind}} {
		if f.v == "" {
			return invalid(f.field, "%q is required: name the schedule and the kind of task it makes, e.g. {\"name\": \"nightly-report\", \"cron\": \"0 3 * * *\", \"kind\": \"report\"}", f.field)
		}
	}
	for _, f := range []struct{ field, v string }{{"name", p.Name}, {"kind", p.Kind}, {"queue", p.Queue}, {"lock", p.Lock}} {
		if err := checkName(f.field, f.v); err != nil {
			return err
		}
	}
	if p.LockLimit != 0 && (p.Lock == "" || p.LockLimit < 1 || p.LockLimit > 1000) {
		return invalid("lock_limit", `"lock_limit" %d needs a "lock" and must be from 1 to 1000`, p.LockLimit)
	}
	if _, err := Parse(p.Cron, p.Zone); err != nil {
		return err
	}
	if len(p.TaskData) > task.MaxPayloadBytes {
		return invalid("task_data", `"task_data" is %d bytes of JSON; it holds at most %d (task.MaxPayloadBytes)`, len(p.TaskData), task.MaxPayloadBytes)
	}
	if len(p.TaskData) > 0 {
		var obj map[string]json.RawMessage
		if json.Unmarshal(p.TaskData, &obj) != nil || obj == nil {
			return invalid("task_data", `"task_data" must be a JSON object (the input of every task the schedule makes), e.g. {"report": "daily"}`)
		}
	}
	if p.MaxAttempts < 0 || p.MaxAttempts > 100 {
		return invalid("max_attempts", `"max_attempts" is %d; it must be between 1 and 100 (5 is the default)`, p.MaxAttempts)
	}
	if p.TTL != 0 && (p.TTL < time.Second || p.TTL > time.Hour || p.TTL%time.Second != 0) {
		return invalid("ttl_seconds", `"ttl_seconds" is %s; it must be a whole number of seconds from 1 to 3600`, p.TTL)
	}
	return nil
}

// checkName applies the one name rule (internal/name) to a field that is
// set; a lock must also lie outside the reserved namespace of leasehold's
// own leases.
func checkName(field, v string) error {
	if v == "" {
		return nil
	}
	if err := name.Check(strconv.Quote(field), v); err != nil {
		return invalid(field, "%s", err)
	}
	if field == "lock" && name.Reserved(v) {
		return invalid(field, "%q %q begins with %q, the namespace of leasehold's own leases; choose a lock outside it", field, v, name.ReservedPrefix)
	}
	return nil
}

// Spec is a parsed cron expression in its zone: it tells the ticks. It is
// safe for concurrent use.
type Spec struct {
	expr  string
	sched cron.Schedule
}

// parser reads the standard five fields and the descriptors (@every,
// @daily…); CRON_TZ is refused before it is reached (the zone is a field
// of its own).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse reads a cron expression in a zone ("": UTC). Its errors are
// *InvalidError with what to fix.
func Parse(expr, zone string) (*Spec, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, invalid("cron", `"cron" is required: give five fields (minute hour day-of-month month day-of-week), e.g. "*/5 * * * *", or "@every 30s"`)
	}
	if len(expr) > 255 {
		return nil, invalid("cron", `"cron" is %d bytes long; it must be at most 255 bytes`, len(expr))
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, invalid("cron", `"cron" %q names a zone; give the zone in "zone" instead, e.g. {"cron": "0 9 * * *", "zone": "Europe/Berlin"}`, expr)
	}
	loc, err := location(zone)
	if err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		switch {
		case err != nil:
			return nil, invalid("cron", `"cron" %q: %q is not a duration; give e.g. "@every 30s" or "@every 1h30m"`, expr, strings.TrimSpace(rest))
		case d < time.Second || d%time.Second != 0:
			return nil, invalid("cron", `"cron" %q: the interval must be a whole number of seconds, at least 1s`, expr)
		}
	}
	sched, err := parser.Parse(expr)
	if err != nil {
		return nil, invalid("cron", `"cron" %q is not a cron expression (%v); give five fields (minute hour day-of-month month day-of-week), e.g. "*/5 * * * *", a descriptor such as "@daily", or "@every 30s"`, expr, err)
	}
	if ss, ok := sched.(*cron.SpecSchedule); ok {
		ss.Location = loc
		if loc != time.UTC {
			sched = wallClock{spec: ss, loc: loc}
		}
	}
	s := &Spec{expr: expr, sched: sched}
	if s.Next(time.Now()).IsZero() {
		return nil, invalid("cron", `"cron" %q never ticks (no date matches it); check the day of month and the month`, expr)
	}
	return s, nil
}

func location(zone string) (*time.Location, error) {
	switch zone {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, invalid("zone", `"zone" "Local" would mean each replica's own zone; name an IANA zone, e.g. "Europe/Berlin", or leave it out for UTC`)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, invalid("zone", `"zone" %q is not a known IANA time zone; give one such as "Europe/Berlin" or "America/New_York", or leave it out for UTC`, zone)
	}
	return loc, nil
}

// Next is the first tick after t; the zero time when there is none in the
// next five years.
func (s *Spec) Next(t time.Time) time.Time {
	n := s.sched.Next(t)
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

// String is the expression as given.
func (s *Spec) String() string { return s.expr }

func nonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
