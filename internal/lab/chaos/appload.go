package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// AppStats are what became of the applications' tasks.
type AppStats struct {
	// Done counts the done tasks of each of the applications' kinds; DoneBy, by the
	// application that completed them.
	Done   map[string]int
	DoneBy map[string]int
	// Cancelled, Dead: the applications' tasks in those states at the end.
	Cancelled, Dead int
	// Snoozed and Failed count the done tasks with a snoozed or failed attempt in
	// their history; Retried, those the soak retried after cancelling them.
	Snoozed, Failed, Retried int
	// Orders are the embedded application's orders, each inserted in one transaction
	// with its task.
	Orders int
}

// createAppTasks creates tasks of the applications' kinds over the API of random replicas
// until ctx ends, as createTasks does the demo's: digests, some asking to snooze, flaky
// sleeps, some failing their first attempt, and shell commands for the work processes,
// some failing their first attempt too.
func (s *soak) createAppTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 3))
	type body struct {
		Kind       string `json:"kind"`
		TaskData   any    `json:"task_data"`
		TTLSeconds int    `json:"ttl_seconds,omitempty"`
		// MaxAttempts is appAttempts: the leases the soak's faults take, an
		// attempt each, must not use up a task its workers would complete.
		MaxAttempts int `json:"max_attempts,omitempty"`
	}
	s.postTasks(ctx, rng, 200*time.Millisecond, func() any {
		batch := make([]body, 1+rng.IntN(maxBatch))
		for i := range batch {
			switch rng.IntN(3) {
			case 0:
				batch[i] = body{Kind: KindDigest, TaskData: DigestArgs{
					Text: fmt.Sprintf("text %d", rng.Uint64()), Rounds: 1 + rng.IntN(1000), Snooze: rng.IntN(4) == 0}}
			case 1:
				batch[i] = body{Kind: KindFlaky, TaskData: FlakyArgs{SleepMS: rng.IntN(800), FailFirst: rng.IntN(3) == 0}}
			default:
				batch[i] = body{Kind: KindShell, TaskData: ShellArgs{SleepMS: rng.IntN(800), FailFirst: rng.IntN(4) == 0},
					TTLSeconds: int(shellTTL / time.Second), MaxAttempts: appAttempts}
			}
		}
		return batch
	}, &s.appCreated)
}

// controlTasks is an operator at work: now and then it cancels one of the applications'
// recent tasks, or one of the recent lease-gated tasks or tasks on a key of k slots
// (whether pending or running: a running one's worker must stop, and its lock or slot is
// freed) and, half the time, retries it a moment later.
func (s *soak) controlTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 4))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500*time.Millisecond + jitter(rng, time.Second)):
		}
		s.mu.Lock()
		recent := s.appCreated
		if rng.IntN(3) == 0 {
			recent = s.gated
			if rng.IntN(2) == 0 {
				recent = s.slotted
			}
		}
		n := len(recent)
		var id int64
		if n > 0 {
			id = recent[n-1-rng.IntN(min(n, 20))]
		}
		s.mu.Unlock()
		addr := s.anyReplica(rng.IntN(len(s.replicas)))
		if id == 0 || addr == "" {
			continue
		}
		status, err := s.call(ctx, addr, http.MethodPost, fmt.Sprintf("/api/tasks/%d/cancel", id),
			map[string]string{"reason": "cancelled by the chaos soak's operator"}, nil)
		if err != nil || status != http.StatusAccepted || rng.IntN(2) == 0 {
			continue // 409: finished already
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(rng, 500*time.Millisecond)):
		}
		if addr = s.anyReplica(rng.IntN(len(s.replicas))); addr == "" {
			continue
		}
		if status, err := s.call(ctx, addr, http.MethodPost, fmt.Sprintf("/api/tasks/%d/retry", id), map[string]any{}, nil); err == nil &&
			status == http.StatusAccepted {
			s.mu.Lock()
			s.appStats.Retried++
			s.mu.Unlock()
		}
	}
}

// checkApps checks the applications' tasks once the soak is over: each done one was
// completed by an application (no replica runs those kinds) with the output its
// arguments call for, every failing-first one by a later attempt; and every order of
// the embedded application has its task, and every order task its order.
func (s *soak) checkApps(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats := AppStats{Done: map[string]int{}, DoneBy: map[string]int{}}
	rows, err := s.pool.Query(ctx, `
		SELECT id, kind, state, coalesce(processor, ''), coalesce(fence, 0), task_data, coalesce(task_output, 'null'), earlier_attempts
		FROM tasks WHERE kind = ANY($1) ORDER BY id`, []string{KindDigest, KindFlaky, KindShell})
	if err != nil {
		return err
	}
	defer rows.Close()
	var wrong []string
	bad := func(format string, args ...any) {
		if len(wrong) < 20 {
			wrong = append(wrong, fmt.Sprintf(format, args...))
		}
	}
	for rows.Next() {
		var (
			id                     int64
			kind, state, processor string
			data, output, attempts []byte
			history                []struct{ Processor, Outcome, Error string }
			digestArgs             DigestArgs
			flakyArgs              FlakyArgs
			digestOut              struct{ Digest string }
			flakyOut               struct {
				SleptMS int `json:"slept_ms"`
				Attempt int `json:"attempt"`
			}
			shellArgs               ShellArgs
			shellOut                ShellOutput
			fence                   int64
			snoozed, failedAttempts int
		)
		if err := rows.Scan(&id, &kind, &state, &processor, &fence, &data, &output, &attempts); err != nil {
			return err
		}
		if err := json.Unmarshal(attempts, &history); err != nil {
			return fmt.Errorf("task %d's earlier_attempts: %w", id, err)
		}
		for _, a := range history {
			switch a.Outcome {
			case "snoozed":
				snoozed++
			case "failed":
				failedAttempts++
			}
		}
		switch state {
		case "cancelled":
			stats.Cancelled++
			continue
		case "dead":
			stats.Dead++
			bad("task %d (%s) is dead: its workers should have completed it; its attempts: %s", id, kind, attemptsText(history))
			continue
		case "done":
		default:
			continue // the checker reports unfinished tasks
		}
		stats.Done[kind]++
		app, _, _ := strings.Cut(processor, "/")
		stats.DoneBy[app]++
		switch {
		case kind == KindShell && app != WorkA && app != WorkB:
			bad("task %d (%s) was completed by %q, not by a work process", id, kind, processor)
		case kind != KindShell && app != AppEmbedded && app != AppRemote:
			bad("task %d (%s) was completed by %q, not by an application", id, kind, processor)
		}
		if snoozed > 0 {
			stats.Snoozed++
		}
		if failedAttempts > 0 {
			stats.Failed++
		}
		switch kind {
		case KindDigest:
			if json.Unmarshal(data, &digestArgs) != nil || json.Unmarshal(output, &digestOut) != nil {
				bad("task %d: data %s, output %s do not decode", id, data, output)
			} else if want := Digest(digestArgs.Text, digestArgs.Rounds); digestOut.Digest != want {
				bad("task %d: output %s, want the digest %s", id, output, want)
			}
		case KindShell:
			// The output is the script's: its input, and the attempt and fence it ran
			// under, which must be the completed attempt's (a run whose lease was lost
			// reports nothing).
			if json.Unmarshal(data, &shellArgs) != nil || json.Unmarshal(output, &shellOut) != nil {
				bad("task %d: data %s, output %s do not decode", id, data, output)
			} else if shellOut.Data != shellArgs || shellOut.Fence != fence || shellOut.Attempt < 1 ||
				(shellArgs.FailFirst && shellOut.Attempt < 2) {
				bad("task %d: output %s, for %s under fence %d", id, output, data, fence)
			}
		case KindFlaky:
			if json.Unmarshal(data, &flakyArgs) != nil || json.Unmarshal(output, &flakyOut) != nil {
				bad("task %d: data %s, output %s do not decode", id, data, output)
			} else if flakyOut.SleptMS != flakyArgs.SleepMS || flakyOut.Attempt < 1 || (flakyArgs.FailFirst && flakyOut.Attempt < 2) {
				// A first attempt that fails as asked, or whose lease lapsed
				// (its process killed or paused), leaves the completion to a
				// later one.
				bad("task %d: output %s, for %s", id, output, data)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var orders, orphanOrders, orphanTasks int
	err = s.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM chaos_orders),
		       (SELECT count(*) FROM chaos_orders AS o
		        WHERE NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = o.task_id AND t.unique_key = 'order:' || o.id)),
		       (SELECT count(*) FROM tasks AS t
		        WHERE t.unique_key LIKE 'order:%' AND NOT EXISTS (SELECT 1 FROM chaos_orders AS o WHERE o.task_id = t.id))`).
		Scan(&orders, &orphanOrders, &orphanTasks)
	if err != nil {
		return err
	}
	stats.Orders = orders
	if orphanOrders > 0 || orphanTasks > 0 {
		bad("%d order(s) without their task, %d order task(s) without their order: InsertTx is not atomic", orphanOrders, orphanTasks)
	}
	switch {
	case orders == 0:
		bad("the embedded application inserted no order")
	case stats.DoneBy[AppEmbedded] == 0 || stats.DoneBy[AppRemote] == 0:
		bad("tasks completed by application: %v; want both to have completed some", stats.DoneBy)
	case stats.DoneBy[WorkA] == 0 || stats.DoneBy[WorkB] == 0:
		bad("tasks completed by work process: %v; want both to have completed some", stats.DoneBy)
	}
	s.mu.Lock()
	s.appStats.Done, s.appStats.DoneBy = stats.Done, stats.DoneBy
	s.appStats.Cancelled, s.appStats.Dead, s.appStats.Snoozed, s.appStats.Failed, s.appStats.Orders =
		stats.Cancelled, stats.Dead, stats.Snoozed, stats.Failed, stats.Orders
	s.report.Apps = s.appStats
	s.mu.Unlock()
	for _, w := range wrong {
		s.problem("applications: %s", w)
	}
	return nil
}

// attemptsText words a task's earlier attempts for a problem's line: each one's processor
// and outcome, and its error when it has one.
func attemptsText(history []struct{ Processor, Outcome, Error string }) string {
	var parts []string
	for _, a := range history {
		p := a.Processor + " " + a.Outcome
		if a.Error != "" {
			p += " (" + a.Error + ")"
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "none recorded"
	}
	return strings.Join(parts, "; ")
}
