package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/checker"
)

// The soak's flow control: a key with a rate, whose tasks come in bursts above it, and a
// queue paused and resumed now and then, beside everything else and under the same faults.
const (
	// rateKey has a rate of rateStarts starts per ratePeriod, and no limit of its own
	// (a rate alone gives it 1000 slots).
	rateKey    = "chaos:rate"
	rateStarts = 5
	ratePeriod = 2 * time.Second
	// rateBurstsEvery: a burst of rateStarts+1 to 2×rateStarts−1 tasks on rateKey every 2
	// to 6 s. Each burst is more than the rate lets start at once, so the rate binds; on
	// average they come at 1.9 a second (some attempts fail once and start again), below
	// the rate's 2.5, so the backlog drains.
	rateBurstsEvery = 2 * time.Second

	// pausedQueue is paused now and then; the applications (pausedWorkers each) and
	// the work processes take its tasks beside the default queue's.
	pausedQueue   = "chaos-paused"
	pausedWorkers = 2
	// pausedTasksEvery: a task for pausedQueue every 0.5 to 1.5 s.
	pausedTasksEvery = 500 * time.Millisecond
	// The queue runs for pauseRest to twice that, then is paused for pauseLength to
	// twice that: resumed over the API, or, every other time, given an until that
	// ends the pause on its own.
	pauseRest   = 2 * time.Second
	pauseLength = 2 * time.Second
)

// RateStats are what became of the soak's key with a rate; the checker's figures of its
// starts are in Check.RateKeys.
type RateStats struct {
	Key  string
	Rate checker.Rate
	// Created are its tasks the soak created over the API, answered 201; Tasks, all of
	// them at the end; Done, those done.
	Created, Tasks, Done int
}

// PauseStats are what became of the soak's paused queue; the checker's figures of its
// tasks' starts are in Check.PausedQueues.
type PauseStats struct {
	Queue string
	// Pauses are the pauses made over the API: Timed given an until that passed, the
	// others resumed. Paused is how long they lasted in all, each from its paused_at to
	// its until.
	Pauses, Timed int
	Paused        time.Duration
	// Created are its tasks the soak created over the API, answered 201; Tasks, all of
	// them at the end; Done, those done.
	Created, Tasks, Done int
}

// setRate gives rateKey its rate over the API, before any task on it is created.
func (s *soak) setRate(ctx context.Context) error {
	body := map[string]any{"rate_starts": rateStarts, "rate_period_seconds": int(ratePeriod / time.Second)}
	if _, err := s.retry(ctx, http.MethodPut, "/api/limits/"+url.PathEscape(rateKey), body, nil, http.StatusOK); err != nil {
		return fmt.Errorf("chaos: set the rate of %s: %w", rateKey, err)
	}
	s.log.Info().Str("key", rateKey).Msgf("chaos: %s may start %d tasks per %v", rateKey, rateStarts, ratePeriod)
	return nil
}

// flowTask is a task the soak creates on rateKey or in pausedQueue: of a kind that the
// replicas, the applications or the work processes run.
type flowTask struct {
	Kind        string `json:"kind"`
	TaskData    any    `json:"task_data"`
	Queue       string `json:"queue,omitempty"`
	Lock        string `json:"lock,omitempty"`
	TTLSeconds  int    `json:"ttl_seconds,omitempty"`
	MaxAttempts int    `json:"max_attempts,omitempty"`
}

// shortTask is a task of a kind drawn from kinds, sleeping up to 300 ms, failing its first
// attempt one time in four.
func shortTask(rng *rand.Rand, kinds ...string) flowTask {
	var t flowTask
	switch sleep, failFirst := rng.IntN(300), rng.IntN(4) == 0; kinds[rng.IntN(len(kinds))] {
	case demo.Kind:
		t.Kind, t.TaskData = demo.Kind, map[string]float64{"sleep_duration_seconds": float64(sleep) / 1000}
	case KindFlaky:
		t.Kind, t.TaskData, t.MaxAttempts = KindFlaky, FlakyArgs{SleepMS: sleep, FailFirst: failFirst}, appAttempts
	default:
		t.Kind, t.TaskData = KindShell, ShellArgs{SleepMS: sleep, FailFirst: failFirst}
		t.TTLSeconds, t.MaxAttempts = int(shellTTL/time.Second), appAttempts
	}
	return t
}

// createRateTasks creates bursts of tasks on rateKey over the API of random replicas until
// ctx ends, half of them the replicas' kind.
func (s *soak) createRateTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 7))
	s.postTasks(ctx, rng, rateBurstsEvery, func() any {
		burst := make([]flowTask, rateStarts+1+rng.IntN(rateStarts-1))
		for i := range burst {
			burst[i] = shortTask(rng, demo.Kind, demo.Kind, KindFlaky, KindShell)
			burst[i].Lock = rateKey
		}
		return burst
	}, &s.rated)
}

// createPausedTasks creates tasks in pausedQueue over the API of random replicas until ctx
// ends, one at a time, of the applications' and the work processes' kinds; one in four
// is gated by the third of gateLocks.
func (s *soak) createPausedTasks(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 8))
	s.postTasks(ctx, rng, pausedTasksEvery, func() any {
		t := shortTask(rng, KindFlaky, KindShell)
		t.Queue = pausedQueue
		if rng.IntN(4) == 0 {
			t.Lock = gateLocks[2]
		}
		return []flowTask{t}
	}, &s.pausedTasks)
}

// pauseQueue pauses pausedQueue over the API now and then until ctx ends, and resumes it
// (or lets the pause's until pass); the last pause ends before it returns, so that the
// queue drains. It records each pause for the checker (RuleQueuePaused) by the database
// clock, as checker.PauseMade and PauseEnded read it: the pause's row keeps only the latest.
func (s *soak) pauseQueue(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.opts.Seed, 9))
	for n := 0; sleepFor(ctx, pauseRest+jitter(rng, pauseRest)); n++ {
		s.pauseOnce(ctx, pauseLength+jitter(rng, pauseLength), n%2 == 1)
	}
}

// pauseOnce pauses pausedQueue for length: with timed, until the database clock's now +
// length; otherwise until it resumes it, length later. When ctx ends first it resumes the
// queue at once.
func (s *soak) pauseOnce(ctx context.Context, length time.Duration, timed bool) {
	// The requests outlive the load: a pause made must be ended and recorded.
	bg := context.WithoutCancel(ctx)
	path := "/api/queues/" + url.PathEscape(pausedQueue) + "/pause"
	body := map[string]string{"reason": "the chaos soak pauses it"}
	if timed {
		var now time.Time
		if err := s.pool.QueryRow(bg, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			s.log.Warn().Err(err).Msg("chaos: read the database clock for a timed pause; none made")
			return
		}
		body["until"] = now.Add(length).Format(time.RFC3339Nano)
	}
	sent := time.Now()
	if _, err := s.retry(bg, http.MethodPut, path, body, nil, http.StatusOK); err != nil {
		// Answered or not, it may have been made: resume it.
		s.problem("pause %s: %v", pausedQueue, err)
		s.resume(bg, path)
		return
	}
	// PauseMade waits for the claims under way at the pause's commit; those that outlast
	// the pause leave it unjudged.
	bindCtx, cancel := context.WithDeadline(ctx, sent.Add(length))
	p, err := checker.PauseMade(bindCtx, s.pool, pausedQueue)
	cancel()
	if err != nil {
		s.log.Warn().Err(err).Msgf("chaos: the pause of %s is not judged", pausedQueue)
	}
	end := sent.Add(length)
	if timed && !p.Until.IsZero() {
		end = p.Until // by the database clock, which is this machine's
	}
	ownEnd := timed && sleepFor(ctx, time.Until(end))
	if !ownEnd {
		if timed {
			s.log.Info().Msgf("chaos: the load is over: %s resumed before its until", pausedQueue)
		} else {
			sleepFor(ctx, time.Until(end))
		}
		s.resume(bg, path)
	}
	s.endPause(bg, p, ownEnd)
}

// resume resumes pausedQueue over the API; 404 says it was not paused: an earlier resume
// whose answer was lost, or a pause whose until passed.
func (s *soak) resume(ctx context.Context, path string) {
	if _, err := s.retry(ctx, http.MethodDelete, path, nil, nil, http.StatusNoContent, http.StatusNotFound); err != nil {
		s.problem("resume %s: %v", pausedQueue, err)
	}
}

// endPause reads when p ended and records it, for the checker and the report; ownEnd: its
// until passed, rather than a resume.
func (s *soak) endPause(ctx context.Context, p checker.Pause, ownEnd bool) {
	ctx, cancel := context.WithTimeout(ctx, scheduleTimeout)
	defer cancel()
	for {
		ended, err := checker.PauseEnded(ctx, s.pool, p)
		if err == nil {
			p = ended
			break
		}
		select {
		case <-ctx.Done():
			s.problem("the end of a pause of %s: %v", pausedQueue, err)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	binding := "never seen binding every claim: not judged"
	if !p.From.IsZero() {
		binding = fmt.Sprintf("binding every claim %v later", round(p.From.Sub(p.At)))
	}
	how := "resumed"
	if ownEnd {
		how = "its until passed"
	}
	s.log.Info().Str("queue", pausedQueue).Time("paused_at", p.At).Time("until", p.Until).
		Msgf("chaos: %s paused at %s (%s) until %s (%s)", pausedQueue, clock(p.At), binding, clock(p.Until), how)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pauses = append(s.pauses, p)
	st := &s.report.PausedQueue
	st.Pauses++
	if ownEnd {
		st.Timed++
	}
	st.Paused += p.Until.Sub(p.At)
}

// countFlow fills the report's figures of rateKey's and pausedQueue's tasks.
func (s *soak) countFlow(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.mu.Lock()
	rated, paused := slices.Clone(s.rated), slices.Clone(s.pausedTasks)
	s.mu.Unlock()
	r := RateStats{Key: rateKey, Rate: checker.Rate{Starts: rateStarts, Period: ratePeriod}}
	var p PauseStats
	err := s.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE lock_resource = $1 AND id = ANY ($3)),
		       count(*) FILTER (WHERE lock_resource = $1),
		       count(*) FILTER (WHERE lock_resource = $1 AND state = 'done'),
		       count(*) FILTER (WHERE queue = $2 AND id = ANY ($4)),
		       count(*) FILTER (WHERE queue = $2),
		       count(*) FILTER (WHERE queue = $2 AND state = 'done')
		FROM tasks WHERE lock_resource = $1 OR queue = $2`, rateKey, pausedQueue, rated, paused).
		Scan(&r.Created, &r.Tasks, &r.Done, &p.Created, &p.Tasks, &p.Done)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Rate = r
	st := &s.report.PausedQueue
	st.Queue, st.Created, st.Tasks, st.Done = pausedQueue, p.Created, p.Tasks, p.Done
	return nil
}
