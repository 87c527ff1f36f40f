package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/reaper"
)

// Measurements poll the database this often: the soak is a test tool, and what it measures
// (a claim, a release) is the product's work, not its own.
const measureEvery = 20 * time.Millisecond

// injectFaults injects one fault after each pause until stop is closed or ctx ends: the
// forced kinds first, in order (forcedIn is closed once they are all in), then kinds drawn
// at random, but a failover in place of the
// kind drawn once FailoverEvery has passed without one (when failover is among the kinds).
// A fault is over (a paused replica continued, PostgreSQL up again, its effect measured)
// before the next pause.
func (s *soak) injectFaults(ctx context.Context, stop <-chan struct{}, forcedIn chan<- struct{}) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 1))
	forced := s.opts.Forced
	if len(forced) == 0 {
		close(forcedIn)
	}
	lastFailover := time.Now()
	for {
		wait := s.opts.FaultInterval/2 + jitter(rng, s.opts.FaultInterval)
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		kind := s.opts.Kinds[rng.IntN(len(s.opts.Kinds))]
		switch {
		case len(forced) > 0:
			kind = forced[0]
		case slices.Contains(s.opts.Kinds, KindFailover) && time.Since(lastFailover) >= s.opts.FailoverEvery:
			kind = KindFailover
		}
		f, ok := s.inject(ctx, rng, kind)
		if !ok {
			continue // tried again after the next pause, should it be forced
		}
		if len(forced) > 0 {
			if forced = forced[1:]; len(forced) == 0 {
				close(forcedIn)
			}
		}
		if kind == KindFailover {
			lastFailover = time.Now()
		}
		s.mu.Lock()
		s.report.Faults = append(s.report.Faults, f)
		s.mu.Unlock()
		s.log.Info().Str("fault", string(f.Kind)).Str("victim", f.Victim).Msg("chaos: " + f.Detail)
	}
}

// inject injects one fault of kind and returns it; false when it could not (no replica
// runs to be its victim).
func (s *soak) inject(ctx context.Context, rng *rand.Rand, kind Kind) (Fault, bool) {
	switch kind {
	case KindDBRestart:
		return s.restartDB(ctx, rng), true
	case KindFailover:
		return s.failover(ctx, rng)
	}
	// A kill and a SIGTERM measure what their victim held: one that runs tasks if any does.
	victim := s.pickVictim(ctx, rng, kind == KindKill || kind == KindTerm, kind == KindDisconnect)
	if victim == nil {
		s.log.Info().Str("fault", string(kind)).Msg("chaos: no replica is running; fault skipped")
		return Fault{}, false
	}
	switch kind {
	case KindKill:
		return s.kill(ctx, victim)
	case KindPause:
		return s.pause(ctx, rng, victim)
	case KindDisconnect:
		return s.disconnect(ctx, victim)
	case KindTerm:
		return s.term(ctx, victim)
	}
	panic("chaos: unknown fault " + string(kind))
}

// pickVictim returns a running replica at random; with busy, one running tasks if any is;
// with connected, one with connections to the database of its own (not a work process).
func (s *soak) pickVictim(ctx context.Context, rng *rand.Rand, busy, connected bool) *replica {
	var running []*replica
	for _, r := range s.members() {
		if r.running() != "" && (!connected || !r.command) {
			running = append(running, r)
		}
	}
	if busy {
		var names []string
		err := s.pool.QueryRow(ctx, `
			SELECT coalesce(array_agg(DISTINCT split_part(processor, '/', 1)), '{}') FROM tasks
			WHERE state = 'running' AND must_heartbeat_before > clock_timestamp()`).Scan(&names)
		if busiest := slices.DeleteFunc(slices.Clone(running), func(r *replica) bool {
			return !slices.Contains(names, r.name)
		}); err == nil && len(busiest) > 0 {
			running = busiest
		}
	}
	if len(running) == 0 {
		return nil
	}
	return running[rng.IntN(len(running))]
}

// logFault writes the fault's line, with its time, as it is injected.
func (s *soak) logFault(f Fault, format string, args ...any) {
	s.log.Warn().Time("at", f.At).Str("fault", string(f.Kind)).Str("victim", f.Victim).Int("pid", f.PID).
		Msgf("chaos: fault at %s: "+format, append([]any{clock(f.At)}, args...)...)
}

// kill is kill -9 of r; it measures how long until each task r was running is claimed
// again by a worker. Tasks still running under the lease of an earlier process of r (one
// that crashed) are left out: their claim or last heartbeat is older than r's start. So
// are lease-gated tasks: a claim takes one again only once its lock is free, which a
// lease client may hold for seconds after the lapse (their reclaim is the drain's).
func (s *soak) kill(ctx context.Context, r *replica) (Fault, bool) {
	var at time.Time
	var ids, fences []int64
	err := s.pool.QueryRow(ctx, `
		SELECT clock_timestamp(), coalesce(array_agg(id ORDER BY id), '{}'), coalesce(array_agg(fence ORDER BY id), '{}')
		FROM tasks
		WHERE state = 'running' AND starts_with(processor, $1) AND must_heartbeat_before > clock_timestamp()
		  AND last_heartbeat_at >= $2 AND lock_resource IS NULL`,
		r.name+"/", r.startedAt()).Scan(&at, &ids, &fences)
	pid, kerr := s.sup.Kill(r.name)
	if kerr != nil {
		s.log.Info().Err(kerr).Msg("chaos: kill skipped")
		return Fault{}, false
	}
	f := Fault{At: time.Now(), Kind: KindKill, Victim: r.name, PID: pid}
	s.logFault(f, "kill -9 %s pid=%d (running %d task(s) %v)", r.name, pid, len(ids), ids)
	switch {
	case err != nil:
		f.Detail = fmt.Sprintf("kill -9 %s pid=%d; its running tasks are unknown (%v)", r.name, pid, err)
	case len(ids) == 0:
		f.Detail = fmt.Sprintf("kill -9 %s pid=%d; it was running no task", r.name, pid)
	default:
		f.Detail = fmt.Sprintf("kill -9 %s pid=%d; %s", r.name, pid, s.watchReclaim(ctx, r.name, ids, fences, at))
	}
	return f, true
}

// watchReclaim waits until every task of ids (each running under its fence on the killed
// victim) is claimed again, and records the longest wait from killedAt (the database clock)
// to the new claim's started_at. It returns what it saw.
func (s *soak) watchReclaim(ctx context.Context, victim string, ids, fences []int64, killedAt time.Time) string {
	limit := 10*s.opts.LeaseTTL + 10*time.Second
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	waiting := map[int64]int64{}
	for i, id := range ids {
		waiting[id] = fences[i]
	}
	var longest time.Duration
	var longestID int64
	reclaimed, finished := 0, 0
	tick := time.NewTicker(measureEvery)
	defer tick.Stop()
	for len(waiting) > 0 && ctx.Err() == nil {
		rows, err := s.pool.Query(ctx, `SELECT id, fence, state, started_at FROM tasks WHERE id = ANY($1)`, ids)
		if err == nil {
			for rows.Next() {
				var id, fence int64
				var state string
				var startedAt time.Time
				if err := rows.Scan(&id, &fence, &state, &startedAt); err != nil {
					break
				}
				old, ok := waiting[id]
				switch {
				case !ok:
				case fence != old:
					delete(waiting, id)
					reclaimed++
					if d := startedAt.Sub(killedAt); d > longest || longestID == 0 {
						longest, longestID = d, id
					}
				case state == "done" || state == "dead" || state == "cancelled":
					// Finished under the victim's fence: completed just before the kill,
					// declared dead by a claim when its attempts were used up, or
					// cancelled by the soak's operator before anyone claimed it again.
					delete(waiting, id)
					finished++
				}
			}
			rows.Close()
		}
		if len(waiting) > 0 {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}
	if len(waiting) > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		left := slices.Sorted(maps.Keys(waiting))
		s.problem("%d task(s) %v that %s ran when it was killed at %s were not claimed again within %v",
			len(left), left, victim, clock(killedAt), limit)
	}
	what := fmt.Sprintf("%d of its %d running task(s) claimed again", reclaimed, len(ids))
	if reclaimed > 0 {
		what += fmt.Sprintf(", the last %v after the kill (task %d)", round(longest), longestID)
		s.mu.Lock()
		s.report.Reclaim.add(longest, fmt.Sprintf("task %d of %s killed at %s", longestID, victim, clock(killedAt)))
		s.mu.Unlock()
	}
	if finished > 0 {
		what += fmt.Sprintf(", %d finished under its own fence", finished)
	}
	return what
}

// pause stops r with SIGSTOP for longer than the lease TTL, then continues it: it wakes up
// a stale holder of its task leases and locks and, when the pause outlasts roleLeaseTTL,
// of the generator, reaper or scheduler lease it held. Should r be the reaper, no expiry
// can be announced while it is stopped and its reaper lease lives on: the pause is an
// outage for the checker.
func (s *soak) pause(ctx context.Context, rng *rand.Rand, r *replica) (Fault, bool) {
	d := s.opts.LeaseTTL + 500*time.Millisecond + jitter(rng, max(s.opts.LeaseTTL, roleLeaseTTL))
	var reaperHolder string
	err := s.pool.QueryRow(ctx, `
		SELECT holder FROM leases
		WHERE resource = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`, reaper.Resource).Scan(&reaperHolder)
	// Not knowing the reaper, count the pause as an outage: that judges fewer expiries,
	// where the other way round would report ones no reaper could have announced.
	isReaper := reaperHolder == r.name || (err != nil && !errors.Is(err, pgx.ErrNoRows))
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		s.log.Warn().Err(err).Msg("chaos: which replica is the reaper is unknown; the pause counts as an outage")
	}
	pid, err := s.sup.Signal(r.name, syscall.SIGSTOP)
	if err != nil {
		s.log.Info().Err(err).Msg("chaos: pause skipped")
		return Fault{}, false
	}
	f := Fault{At: time.Now(), Kind: KindPause, Victim: r.name, PID: pid}
	role := ""
	if isReaper {
		role = ", the reaper"
	}
	s.logFault(f, "SIGSTOP %s%s pid=%d for %v (lease TTL %v)", r.name, role, pid, round(d), s.opts.LeaseTTL)
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	// A stopped process cannot exit, but one already exiting as the SIGSTOP came (a
	// simulated crash) does: the supervisor then runs its successor, which is not stopped
	// and must not be signalled.
	exited := s.sup.PIDs()[r.name] != pid
	if !exited {
		if cpid, err := s.sup.Signal(r.name, syscall.SIGCONT); err != nil || cpid != pid {
			s.problem("SIGCONT to %s pid=%d: sent to pid %d: %v", r.name, pid, cpid, err)
		}
	}
	resumed := time.Now()
	cont := "SIGCONT"
	if exited {
		cont = "it exited on its own as it was stopped; no SIGCONT"
	}
	f.Detail = fmt.Sprintf("SIGSTOP %s%s pid=%d, %s %v later", r.name, role, pid, cont, round(resumed.Sub(f.At)))
	if isReaper {
		s.mu.Lock()
		s.report.Outages = append(s.report.Outages, checker.Window{From: f.At, To: resumed})
		s.mu.Unlock()
	}
	return f, true
}

// disconnect terminates every database connection of r, its LISTEN connection included.
func (s *soak) disconnect(ctx context.Context, r *replica) (Fault, bool) {
	pid := s.sup.PIDs()[r.name]
	f := Fault{At: time.Now(), Kind: KindDisconnect, Victim: r.name, PID: pid}
	s.logFault(f, "pg_terminate_backend of every connection of %s", r.name)
	app := "leasehold " + r.name
	rows, err := s.pool.Query(ctx, `
		SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name IN ($1, $2)`, app, app+" listener")
	var pool, listener int
	if err == nil {
		for rows.Next() {
			var name string
			var ok bool
			if err = rows.Scan(&name, &ok); err != nil {
				break
			}
			switch {
			case ok && name == app:
				pool++
			case ok:
				listener++
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		f.Detail = fmt.Sprintf("terminating the connections of %s failed: %v", r.name, err)
	} else {
		f.Detail = fmt.Sprintf("terminated %d pool and %d LISTEN connection(s) of %s", pool, listener, r.name)
	}
	return f, true
}

// term sends SIGTERM to r (it is restarted once it has exited) and measures how long until
// every lease it held is free. A lease it left live behind it when it exited breaks the
// guarantee that a clean shutdown releases its leases. Its leases are those of the leases
// table held in its name or in its workers' (the locks of its lease-gated tasks, held by
// "<replica>/…") and its task leases (the running tasks of its workers), each acquired or
// renewed since it started: an earlier process of r that crashed may have left leases of
// the same name to lapse. It returns false, sending nothing, when r holds no lease: there
// would be nothing to measure.
func (s *soak) term(ctx context.Context, r *replica) (Fault, bool) {
	at, leases, err := s.heldBy(ctx, r)
	if err == nil && len(leases) == 0 {
		// Nothing to watch being freed: a SIGTERM now would measure nothing.
		// Not injected; the next fault may be this one again (a forced one is).
		s.log.Info().Str("victim", r.name).Msg("chaos: term skipped: its victim holds no lease")
		return Fault{}, false
	}
	exited := r.current()
	pid, serr := s.sup.Signal(r.name, syscall.SIGTERM)
	if serr != nil {
		s.log.Info().Err(serr).Msg("chaos: term skipped")
		return Fault{}, false
	}
	f := Fault{At: time.Now(), Kind: KindTerm, Victim: r.name, PID: pid}
	s.logFault(f, "SIGTERM %s pid=%d (holding %d lease(s))", r.name, pid, len(leases))
	if err != nil {
		f.Detail = fmt.Sprintf("SIGTERM %s pid=%d; the leases it held are unknown (%v)", r.name, pid, err)
		return f, true
	}
	limit := shutdownGrace + 10*s.opts.LeaseTTL + 10*time.Second
	var exitedAt time.Time
	select {
	case <-exited:
		exitedAt = time.Now()
	case <-time.After(limit):
		s.problem("%s pid=%d still running %v after SIGTERM", r.name, pid, limit)
		f.Detail = fmt.Sprintf("SIGTERM %s pid=%d; still running %v later", r.name, pid, limit)
		return f, true
	}
	if err := r.lastExit(); err != nil {
		// It died before its shutdown was through (a simulated crash in the
		// grace period): a crash, not a clean shutdown. Its leases are left
		// to expire, or to its successor of the same name, which renews
		// them; the SIGTERM measurement is of clean shutdowns only.
		f.Detail = fmt.Sprintf("SIGTERM %s pid=%d; it crashed (%v) %v later, before its shutdown was through: not measured",
			r.name, pid, err, round(exitedAt.Sub(f.At)))
		return f, true
	}
	f.Detail = fmt.Sprintf("SIGTERM %s pid=%d; it exited (exit status 0) %v later; %s", r.name, pid, round(exitedAt.Sub(f.At)),
		s.watchFree(ctx, r.name, leases, at, exitedAt))
	return f, true
}

// heldLease is a live lease a replica holds: one of the leases table, or a task's lease,
// which lives in the task's row.
type heldLease struct {
	resource string // as the report names it: taskstore.LeaseResource for a task's lease
	task     int64  // the task whose lease it is; 0 for a lease of the leases table
	fence    int64
}

// heldBy returns the database clock and the live leases r's current process holds (see
// term): those of the leases table by resource, then its task leases by task.
func (s *soak) heldBy(ctx context.Context, r *replica) (time.Time, []heldLease, error) {
	var at time.Time
	var resources []string
	var tasks, fences []int64
	err := s.pool.QueryRow(ctx, `
		WITH h AS (
		    SELECT resource, 0::bigint AS task, fence FROM leases
		    WHERE (holder = $1 OR starts_with(holder, $1 || '/')) AND released_at IS NULL AND expires_at > clock_timestamp()
		      AND coalesce(renewed_at, created_at) >= $2
		    UNION ALL
		    SELECT '', id, fence FROM tasks
		    WHERE state = 'running' AND starts_with(processor, $1 || '/')
		      AND must_heartbeat_before > clock_timestamp() AND last_heartbeat_at >= $2)
		SELECT clock_timestamp(), coalesce(array_agg(resource ORDER BY task, resource), '{}'),
		       coalesce(array_agg(task ORDER BY task, resource), '{}'), coalesce(array_agg(fence ORDER BY task, resource), '{}')
		FROM h`, r.name, r.startedAt()).Scan(&at, &resources, &tasks, &fences)
	if err != nil {
		return time.Time{}, nil, err
	}
	held := make([]heldLease, len(resources))
	for i := range held {
		held[i] = heldLease{resource: resources[i], task: tasks[i], fence: fences[i]}
		if tasks[i] != 0 {
			held[i].resource = taskstore.LeaseResource(tasks[i])
		}
	}
	return at, held, nil
}

// leaseEnd is how a held lease became free: released (or, for a task's, handed back,
// failed or completed) at, or expired at.
type leaseEnd struct {
	at       time.Time
	released bool
}

// watchFree waits until every lease of held (held by victim when it was sent SIGTERM at
// termAt, by the database clock) is released or expired, and records the longest wait. The
// victim exited cleanly, at exitedAt: a lease still live then and left to expire is a
// violation.
func (s *soak) watchFree(ctx context.Context, victim string, held []heldLease, termAt, exitedAt time.Time) string {
	if len(held) == 0 {
		return "it held no lease"
	}
	limit := 10*s.opts.LeaseTTL + 10*time.Second
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	ends := map[string]leaseEnd{}
	var lastErr error // of a read, asked again at the next tick
	tick := time.NewTicker(measureEvery)
	defer tick.Stop()
	for len(ends) < len(held) && ctx.Err() == nil {
		if err := s.addFree(ctx, held, ends); err != nil {
			lastErr = err
		}
		if len(ends) < len(held) {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}
	if len(ends) < len(held) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s.problem("the leases %s held when it was sent SIGTERM at %s were not all free %v later (the last error reading them: %v)",
				victim, clock(termAt), limit, lastErr)
		}
		return fmt.Sprintf("%d of its %d lease(s) not free within %v", len(held)-len(ends), len(held), limit)
	}
	var longest time.Duration
	var last string
	var expired, leftHeld []string
	tasks := 0
	for _, l := range held {
		if l.task != 0 {
			tasks++
		}
		e := ends[l.resource]
		if d := e.at.Sub(termAt); d > longest || last == "" {
			longest, last = d, l.resource
		}
		if !e.released {
			expired = append(expired, l.resource)
			if e.at.After(exitedAt) {
				leftHeld = append(leftHeld, l.resource)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Release.add(longest, fmt.Sprintf("%s of %s, SIGTERM at %s", last, victim, clock(termAt)))
	if len(leftHeld) > 0 {
		s.report.Violations = append(s.report.Violations, checker.Violation{Rule: "shutdown-release", Detail: fmt.Sprintf(
			"%s exited cleanly after SIGTERM at %s but left %d lease(s) live, to expire instead of being released: %s",
			victim, clock(termAt), len(leftHeld), strings.Join(leftHeld, ", "))})
	}
	what := fmt.Sprintf("its %d lease(s) (%d of tasks) free %v after the SIGTERM (the last: %s)",
		len(held), tasks, round(longest), last)
	if len(expired) > 0 {
		what += fmt.Sprintf("; %d expired rather than released: %s", len(expired), strings.Join(expired, ", "))
	}
	return what
}

// addFree adds to ends each lease of held that is free by now, keyed by its resource.
func (s *soak) addFree(ctx context.Context, held []heldLease, ends map[string]leaseEnd) error {
	var resources []string
	var fences, ids, taskFences []int64
	for _, l := range held {
		if l.task != 0 {
			ids, taskFences = append(ids, l.task), append(taskFences, l.fence)
		} else {
			resources, fences = append(resources, l.resource), append(fences, l.fence)
		}
	}
	var err error
	if len(resources) > 0 {
		err = s.leasesFree(ctx, resources, fences, ends)
	}
	if len(ids) > 0 {
		err = errors.Join(err, s.taskLeasesFree(ctx, ids, taskFences, ends))
	}
	return err
}

// leasesFree adds to ends each lease of resources (each under its fence) that is free: its
// last event is a release, an expiry, or one whose expires_at has passed.
func (s *soak) leasesFree(ctx context.Context, resources []string, fences []int64, ends map[string]leaseEnd) error {
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (e.resource) e.resource, e.kind, e.at, e.expires_at, e.expires_at <= clock_timestamp()
		FROM lease_events AS e
		JOIN unnest($1::text[], $2::bigint[]) AS h (resource, fence) ON h.resource = e.resource AND h.fence = e.fence
		ORDER BY e.resource, e.id DESC`, resources, fences)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var resource, kind string
		var eventAt, expiresAt time.Time
		var past bool
		if err := rows.Scan(&resource, &kind, &eventAt, &expiresAt, &past); err != nil {
			return err
		}
		switch {
		case kind == "released":
			ends[resource] = leaseEnd{at: eventAt, released: true}
		case kind == "expired" || past:
			ends[resource] = leaseEnd{at: expiresAt}
		}
	}
	return rows.Err()
}

// taskLeasesFree adds to ends the lease of each task of ids (each under its fence) that is
// free: the attempt under that fence ended otherwise than by the completion (it is in the
// task's earlier_attempts: handed back, failed or expired), the task was completed under
// that fence, or that fence's lease is still the task's but lapsed.
func (s *soak) taskLeasesFree(ctx context.Context, ids, fences []int64, ends map[string]leaseEnd) error {
	rows, err := s.pool.Query(ctx, `
		SELECT t.id, t.state, coalesce(t.fence = h.fence, false), t.processed_at, t.must_heartbeat_before,
		       coalesce(t.must_heartbeat_before <= clock_timestamp(), false),
		       (SELECT e FROM jsonb_array_elements(t.earlier_attempts) AS e
		        WHERE (e ->> 'fence')::bigint = h.fence LIMIT 1)
		FROM unnest($1::bigint[], $2::bigint[]) AS h (id, fence)
		JOIN tasks AS t ON t.id = h.id`, ids, fences)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var state string
		var current, lapsed bool
		var processedAt, expiresAt *time.Time
		var ended []byte // the held fence's entry of earlier_attempts; nil when it has none
		if err := rows.Scan(&id, &state, &current, &processedAt, &expiresAt, &lapsed, &ended); err != nil {
			return err
		}
		name := taskstore.LeaseResource(id)
		switch {
		case ended != nil:
			var a task.Attempt
			if err := json.Unmarshal(ended, &a); err != nil {
				return fmt.Errorf("task %d: an entry of earlier_attempts: %w", id, err)
			}
			if a.Outcome == task.OutcomeExpired {
				ends[name] = leaseEnd{at: a.ExpiresAt}
			} else {
				ends[name] = leaseEnd{at: a.EndedAt, released: true}
			}
		case current && state == task.StateDone && processedAt != nil:
			ends[name] = leaseEnd{at: *processedAt, released: true}
		case current && state == task.StateRunning && lapsed && expiresAt != nil:
			ends[name] = leaseEnd{at: *expiresAt}
		}
	}
	return rows.Err()
}

// restartDB stops PostgreSQL, cleanly or as a power cut would, and starts it again after a
// moment. The window from the stop to the end of the start is an outage for the checker.
func (s *soak) restartDB(ctx context.Context, rng *rand.Rand) Fault {
	crash := rng.IntN(2) == 0
	down := 500*time.Millisecond + jitter(rng, 2*time.Second)
	how, halt := "stop (fast)", s.cluster.Stop
	if crash {
		how, halt = "crash (immediate)", s.cluster.Crash
	}
	lastEvent := s.lastLeaseEvent(ctx)
	f := Fault{At: time.Now(), Kind: KindDBRestart}
	s.logFault(f, "PostgreSQL %s, down for %v", how, round(down))
	// The database must come back whatever happens to ctx: the soak still needs it.
	pgCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := halt(pgCtx); err != nil {
		s.problem("PostgreSQL %s: %v", how, err)
	}
	halted := time.Since(f.At)
	select {
	case <-time.After(down):
	case <-ctx.Done():
	}
	restart := time.Now()
	var err error
	for range 3 {
		if err = s.cluster.Start(pgCtx); err == nil {
			break
		}
		s.log.Error().Err(err).Msg("chaos: start PostgreSQL again")
	}
	to := time.Now()
	if err != nil {
		s.problem("PostgreSQL did not start again: %v", err)
	}
	// The soak's own connections died with the server.
	s.pool.Reset()
	to = s.untilReaperBack(ctx, lastEvent, f.At, to, "restart at "+clock(f.At))
	s.mu.Lock()
	s.report.Outages = append(s.report.Outages, checker.Window{From: f.At, To: to})
	s.report.DBDown += to.Sub(f.At)
	s.report.DBRestarts++
	s.mu.Unlock()
	f.Detail = fmt.Sprintf("PostgreSQL %s (%v), started again (%v): down from %s to %s (%v)",
		how, round(halted), round(to.Sub(restart)), clock(f.At), clock(to), round(to.Sub(f.At)))
	return f
}

// jitter returns a duration drawn uniformly from [0, d).
func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(d)))
}

// clock formats t as a time of day with milliseconds, in UTC like the database's timestamps.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// round rounds d to milliseconds, for reading.
func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// failover stops the primary hard, as a dead machine would (immediate mode or SIGKILL),
// promotes the standby, measures how long from the primary's death to the first lease the
// new primary grants, then rebuilds the old primary as the new standby (pg_rewind, or
// pg_basebackup when that fails) so that the next failover finds one. The window from the
// death to that first lease (or to the promotion, should no lease be seen) is an outage for
// the checker: no expiry can be announced without a primary. It returns false, injecting
// nothing, when the standby is not streaming because an earlier rebuild failed and
// rebuilding it again fails too, or when an earlier failover could not stop the primary or
// promote the standby (a problem of the report already).
func (s *soak) failover(ctx context.Context, rng *rand.Rand) (Fault, bool) {
	// PostgreSQL must be whole again whatever happens to ctx: the soak still needs it.
	pgCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if s.failoverBroken {
		s.log.Info().Msg("chaos: failover skipped: an earlier one left no primary to fail over from")
		return Fault{}, false
	}
	if s.standbyLost {
		if _, err := s.pair.Rebuild(pgCtx); err != nil {
			s.log.Error().Err(err).Msg("chaos: failover skipped: no standby, and rebuilding it failed again")
			return Fault{}, false
		}
		s.standbyLost = false
	}
	primary, standby := s.pair.Primary(), s.pair.Standby()
	// The events from here on: the first lease granted after the death is among them.
	lastEvent := s.lastLeaseEvent(ctx)
	how, halt := "stopped (immediate)", primary.Crash
	if rng.IntN(2) == 0 {
		how, halt = "killed (SIGKILL)", primary.Kill
	}
	f := Fault{At: time.Now(), Kind: KindFailover, Victim: "primary " + primary.Name()}
	s.logFault(f, "PostgreSQL primary %s %s; promoting %s", primary.Name(), how, standby.Name())
	if err := halt(pgCtx); err != nil {
		// It may still run: promoting the standby would make two primaries.
		s.problem("failover: primary %s %s: %v", primary.Name(), how, err)
		s.failoverBroken = true
		f.Detail = fmt.Sprintf("primary %s %s failed (%v): the standby was not promoted", primary.Name(), how, err)
		return f, true
	}
	died := time.Now()
	if err := s.pair.Promote(pgCtx); err != nil {
		// Without a primary the soak cannot go on, nor can the next failover.
		s.problem("failover: promote %s: %v", standby.Name(), err)
		s.failoverBroken = true
		f.Detail = fmt.Sprintf("primary %s %s; promoting %s failed: %v", primary.Name(), how, standby.Name(), err)
		s.addFailover(f.At, time.Now(), 0, "")
		return f, true
	}
	promoted := time.Now()
	// The soak's own connections died with the old primary.
	s.pool.Reset()
	granted, gerr := s.firstGrant(ctx, lastEvent, died)
	end := promoted
	if gerr == nil {
		end = granted
	}
	end = s.untilReaperBack(ctx, lastEvent, died, end, "failover at "+clock(died))
	var what string
	if gerr != nil {
		s.addFailover(f.At, end, 0, "")
		what = fmt.Sprintf("no lease granted seen (%v)", gerr)
	} else {
		s.addFailover(f.At, end, granted.Sub(died), clock(died))
		what = fmt.Sprintf("first lease granted %v after the primary's death", round(granted.Sub(died)))
	}
	rebuildAt := time.Now()
	rewound, err := s.pair.Rebuild(pgCtx)
	rebuild := fmt.Sprintf("%s rebuilt as the standby by pg_basebackup (%v)", primary.Name(), round(time.Since(rebuildAt)))
	switch {
	case err != nil:
		s.problem("failover: rebuild %s as the standby of %s: %v", primary.Name(), standby.Name(), err)
		s.standbyLost = true
		rebuild = fmt.Sprintf("rebuilding %s as the standby failed: %v", primary.Name(), err)
	case rewound:
		rebuild = fmt.Sprintf("%s rebuilt as the standby by pg_rewind (%v)", primary.Name(), round(time.Since(rebuildAt)))
		s.mu.Lock()
		s.report.Rewound++
		s.mu.Unlock()
	}
	f.Detail = fmt.Sprintf("primary %s %s (%v); %s promoted %v later; %s; %s",
		primary.Name(), how, round(died.Sub(f.At)), standby.Name(), round(promoted.Sub(died)), what, rebuild)
	return f, true
}

// addFailover records a failover whose primary died at from and whose successor served
// again at to, as an outage; grant, when of is not empty, is the wait from the death to the
// first lease granted.
func (s *soak) addFailover(from, to time.Time, grant time.Duration, of string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Outages = append(s.report.Outages, checker.Window{From: from, To: to})
	s.report.DBDown += to.Sub(from)
	s.report.Failovers++
	if of != "" {
		s.report.FailoverGrant.add(grant, "failover at "+of)
	}
}

// lastLeaseEvent returns the id of the newest lease event, or 0 when it cannot be read
// (then every event is searched).
func (s *soak) lastLeaseEvent(ctx context.Context) int64 {
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM lease_events`).Scan(&id); err != nil {
		s.log.Warn().Err(err).Msg("chaos: the last lease event before the fault is unknown; all are searched")
		return 0
	}
	return id
}

// untilReaperBack returns when an outage that began at since ends for the checker: at end
// (the database serves again), or later, when the reaper reaches it again. It records the
// wait from end to the reaper's return; a reaper that never returns is a problem.
func (s *soak) untilReaperBack(ctx context.Context, lastEvent int64, since, end time.Time, of string) time.Time {
	back, err := s.reaperBack(ctx, lastEvent, since)
	if err != nil {
		s.problem("no reaper reached the database again after the %s: %v", of, err)
		return end
	}
	s.mu.Lock()
	s.report.ReaperBack.add(max(0, back.Sub(end)), of)
	s.mu.Unlock()
	if back.After(end) {
		return back
	}
	return end
}

// firstGrant waits for the first lease acquired after died among the lease events after
// lastEvent, and returns when it was granted (the database clock, which is the machine's).
func (s *soak) firstGrant(ctx context.Context, lastEvent int64, died time.Time) (time.Time, error) {
	return s.firstEvent(ctx, lastEvent, died, "")
}

// reaperBack waits for the reaper's first lease event (acquired or renewed, by whichever
// replica) at or after since among the lease events after lastEvent: the first sign that
// a reaper reaches the database again. A replica finds the database again on its own
// schedule, later than the first one under load, and until its reaper does, no expiry can
// be announced: an outage for the checker lasts until then.
func (s *soak) reaperBack(ctx context.Context, lastEvent int64, since time.Time) (time.Time, error) {
	return s.firstEvent(ctx, lastEvent, since, reaper.Resource)
}

// firstEvent waits for the first lease event after lastEvent at or after since: an
// acquisition of any lease when resource is empty, else an acquisition or renewal of
// resource.
func (s *soak) firstEvent(ctx context.Context, lastEvent int64, since time.Time, resource string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*s.opts.LeaseTTL+10*time.Second)
	defer cancel()
	tick := time.NewTicker(measureEvery)
	defer tick.Stop()
	var lastErr error
	for {
		var at *time.Time
		err := s.pool.QueryRow(ctx, `
			SELECT min(at) FROM lease_events
			WHERE id > $1 AND at >= $2
			  AND CASE WHEN $3 = '' THEN kind = 'acquired'
			           ELSE resource = $3 AND kind IN ('acquired', 'renewed') END`,
			lastEvent, since, resource).Scan(&at)
		switch {
		case err == nil && at != nil:
			return *at, nil
		case err != nil:
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return time.Time{}, fmt.Errorf("%w (the last error: %w)", ctx.Err(), lastErr)
			}
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
}
