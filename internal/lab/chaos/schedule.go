package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/schedule"
)

// The soak's locks: the resources its lease-gated tasks and gated schedules name. The
// first two are the lease clients' shared resources too, so that gated tasks contend
// with other holders as well as with each other; the third is the gated tasks' alone.
var gateLocks = []string{sharedResource(1), sharedResource(2), "chaos:gate-3"}

// sharedResource is the name of the lease clients' n-th shared resource, from 1.
func sharedResource(n int) string { return fmt.Sprintf("chaos:shared-%d", n) }

// soakSchedule is a schedule the soak creates at its start and removes at the end of
// the load, through the API.
type soakSchedule struct {
	Name     string          `json:"name"`
	Cron     string          `json:"cron"`
	Zone     string          `json:"zone,omitempty"`
	Kind     string          `json:"kind"`
	TaskData json.RawMessage `json:"task_data"`
	Lock     string          `json:"lock,omitempty"`
	Unique   bool            `json:"unique,omitempty"`
}

// schedules are the soak's: one every second for the replicas' workers; gated ones, of
// each kind of worker, on the soak's locks, one of them unique, so that a tick whose
// previous task waits for the lock is skipped; and one of five fields, in a zone of its
// own.
var schedules = []soakSchedule{
	{Name: "chaos-every-1s", Cron: "@every 1s", Kind: demo.Kind, TaskData: json.RawMessage(`{"sleep_duration_seconds": 0.1}`)},
	{Name: "chaos-gated-every-2s", Cron: "@every 2s", Kind: KindShell, Lock: gateLocks[0],
		TaskData: json.RawMessage(`{"sleep_ms": 200, "fail_first": false}`)},
	{Name: "chaos-unique-every-1s", Cron: "@every 1s", Kind: demo.Kind, Lock: gateLocks[1], Unique: true,
		TaskData: json.RawMessage(`{"sleep_duration_seconds": 0.3}`)},
	{Name: "chaos-minutely", Cron: "* * * * *", Zone: "Europe/Berlin", Kind: KindFlaky, Lock: gateLocks[2],
		TaskData: json.RawMessage(`{"sleep_ms": 300, "fail_first": true}`)},
}

// ScheduleRun is one of the soak's schedules, as it defined it, and how its ticks
// fared (the checker's figures, by name, in Check.Schedules).
type ScheduleRun struct {
	Name, Cron, Zone, Kind, Lock string
	Unique                       bool
}

// scheduleTimeout bounds each of the requests of a schedule's creation or removal,
// retried on every replica in turn, and the wait for the scheduler to catch up at the
// end of the load.
const scheduleTimeout = 30 * time.Second

// createSchedules creates the soak's schedules over the API and records each one's
// first tick, which the checker counts from.
func (s *soak) createSchedules(ctx context.Context) error {
	for _, def := range schedules {
		var got schedule.Schedule
		status, err := s.retry(ctx, http.MethodPost, "/api/schedules", def, &got, http.StatusCreated, http.StatusOK)
		if err != nil {
			return fmt.Errorf("chaos: create the schedule %s: %w", def.Name, err)
		}
		if status == http.StatusOK && got.LastTick != nil {
			// An earlier request was answered 201 but the answer lost, and a tick
			// was made since: the first is not known.
			return fmt.Errorf("chaos: create the schedule %s: created by a request whose answer was lost, and ticked since", def.Name)
		}
		s.mu.Lock()
		s.schedules = append(s.schedules, checker.Schedule{Name: got.Name, Cron: got.Cron, Zone: got.Zone, First: got.NextTick})
		s.report.Schedules = append(s.report.Schedules, ScheduleRun{
			Name: def.Name, Cron: def.Cron, Zone: got.Zone, Kind: def.Kind, Lock: def.Lock, Unique: def.Unique})
		s.mu.Unlock()
		s.log.Info().Str("schedule", got.Name).Str("cron", got.Cron).Time("first_tick", got.NextTick).
			Msgf("chaos: schedule %s (%s) created, first tick %s", got.Name, got.Cron, clock(got.NextTick))
	}
	return nil
}

// removeSchedules ends the soak's schedules once the load is over: it waits until the
// scheduler has made (or counted) every tick due by now, then removes each schedule
// over the API and keeps what the removal answered, its next tick and its counters,
// for the checker. Its end is when the removal was first sent, by the database clock:
// every tick due by then was made, but perhaps the last, in flight.
func (s *soak) removeSchedules(ctx context.Context) {
	s.mu.Lock()
	runs := s.schedules
	s.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		s.problem("schedules: read the database clock: %v", err)
		return
	}
	s.waitTicks(ctx, runs, now)
	for i := range runs {
		r := &runs[i]
		if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&r.End); err != nil {
			s.problem("schedules: read the database clock: %v", err)
			continue
		}
		var got schedule.Schedule
		status, err := s.retry(ctx, http.MethodDelete, "/api/schedules/"+url.PathEscape(r.Name), nil, &got, http.StatusOK, http.StatusNotFound)
		switch {
		case err != nil:
			s.problem("schedules: remove %s: %v", r.Name, err)
			continue
		case status == http.StatusNotFound:
			s.problem("schedules: %s was removed by a request whose answer was lost: its ticks are not counted", r.Name)
			continue
		}
		r.Next, r.Missed, r.Skipped = got.NextTick, got.MissedTicks, got.SkippedTicks
		s.log.Info().Str("schedule", r.Name).Msgf("chaos: schedule %s removed: next tick %s, %d missed, %d skipped",
			r.Name, clock(got.NextTick), got.MissedTicks, got.SkippedTicks)
	}
	s.mu.Lock()
	s.schedules = runs
	s.mu.Unlock()
}

// waitTicks waits until every schedule of runs has its next tick after now: the
// scheduler has dealt with every tick due by then. A scheduler killed or paused just
// before the load ended is replaced within its lease's TTL. Polling is fine here, as in
// drain.
func (s *soak) waitTicks(ctx context.Context, runs []checker.Schedule, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, scheduleTimeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	behind := map[string]bool{}
	for _, r := range runs {
		behind[r.Name] = true
	}
	for len(behind) > 0 {
		var list []schedule.Schedule
		if addr := s.anyReplica(rand.N(len(s.replicas))); addr != "" {
			if status, err := s.call(ctx, addr, http.MethodGet, "/api/schedules", nil, &list); err == nil && status == http.StatusOK {
				for _, got := range list {
					if got.NextTick.After(now) {
						delete(behind, got.Name)
					}
				}
			}
		}
		if len(behind) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.problem("schedules: the scheduler had not made the ticks due at %s of %v %v later",
				clock(now), sortedKeys(behind), scheduleTimeout)
			return
		case <-tick.C:
		}
	}
}

// retry sends a request to running replicas in turn until one answers one of want, or
// scheduleTimeout passes, and returns the status.
func (s *soak) retry(ctx context.Context, method, path string, body, out any, want ...int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, scheduleTimeout)
	defer cancel()
	var last error
	for i := 0; ; i++ {
		if addr := s.anyReplica(i); addr == "" {
			last = fmt.Errorf("no replica is running")
		} else {
			status, err := s.call(ctx, addr, method, path, body, out)
			if err == nil {
				for _, w := range want {
					if status == w {
						return status, nil
					}
				}
				err = fmt.Errorf("%s %s: %d", method, path, status)
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
