package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// Kind is the demo's kind of task, whose task_data is
// {"sleep_duration_seconds": N}: what the demo's workers run, and what a
// task inserted over the REST API without a kind is.
const Kind = taskstore.DefaultKind

// CrashStatus is the exit status of a demo replica's simulated crash.
const CrashStatus = 3

// MaxSleep bounds a sleep task's sleep_duration_seconds.
const MaxSleep = 3600

// sleepStep is how long a task sleeps between looks at its context.
const sleepStep = 100 * time.Millisecond

// sleepData is the task_data of the demo kind, Kind.
type sleepData struct {
	SleepDurationSeconds *float64 `json:"sleep_duration_seconds"`
}

// sleepOutput is the output of a completed sleep task.
type sleepOutput struct {
	SleptSeconds float64 `json:"slept_seconds"`
	Processor    string  `json:"processor"`
}

// parseSleep returns how long a task sleeps, or an error saying what is
// wrong with its task_data.
func parseSleep(raw json.RawMessage) (float64, error) {
	const want = `want an object like {"sleep_duration_seconds": 5}`
	var d sleepData
	if err := json.Unmarshal(raw, &d); err != nil {
		return 0, fmt.Errorf("task_data %.100s is not valid: %w; %s", raw, err, want)
	}
	switch {
	case d.SleepDurationSeconds == nil:
		return 0, fmt.Errorf("task_data %.100s has no sleep_duration_seconds: %s", raw, want)
	case *d.SleepDurationSeconds < 0 || *d.SleepDurationSeconds > MaxSleep:
		return 0, fmt.Errorf("sleep_duration_seconds %v is out of range: want 0 to %d", *d.SleepDurationSeconds, MaxSleep)
	}
	return *d.SleepDurationSeconds, nil
}

// Sleep is the handler of the demo kind (Kind, "sleep"):
// it sleeps sleep_duration_seconds, honouring ctx, and returns
// {"slept_seconds": N, "processor": "<processor>"}. With crashRate, per
// task, it "crashes" midway: it calls crash, which by default (nil) exits
// the process at once (status 3) with no cleanup; when crash returns (a
// test's hook) the handler returns worker.ErrAbandon, so that the worker
// leaves the task as a dead process would.
func Sleep(crashRate float64, crash func()) (worker.Handler, error) {
	if crashRate < 0 || crashRate > 1 {
		return nil, fmt.Errorf("simulated crash rate %v must be between 0 and 1", crashRate)
	}
	if crash == nil {
		crash = func() { os.Exit(CrashStatus) }
	}
	return func(ctx context.Context, t task.Task) (json.RawMessage, error) {
		secs, err := parseSleep(t.TaskData)
		if err != nil {
			return nil, err
		}
		d := time.Duration(secs * float64(time.Second))
		if crashRate > 0 && rand.Float64() < crashRate {
			if err := sleep(ctx, d/2); err != nil {
				return nil, err
			}
			crash()
			return nil, worker.ErrAbandon
		}
		if err := sleep(ctx, d); err != nil {
			return nil, err
		}
		return json.Marshal(sleepOutput{SleptSeconds: secs, Processor: t.Processor})
	}, nil
}

// sleep waits d in small steps, returning ctx's error as soon as it ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err() // no timer for no sleep
	}
	end := time.Now().Add(d)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		timer.Reset(min(left, sleepStep))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// SpikyHeartbeats returns ops whose heartbeats stall, each with the chance
// rate, until the lease's deadline has passed: the demo's simulated
// latency spike (a long GC pause, a congested network), after which the
// worker must count the lease lost and abandon its task.
func SpikyHeartbeats(ops worker.Ops, rate float64, log zerolog.Logger) (worker.Ops, error) {
	if rate < 0 || rate > 1 {
		return nil, fmt.Errorf("simulated spike rate %v must be between 0 and 1", rate)
	}
	if rate == 0 {
		return ops, nil
	}
	return spiky{Ops: ops, rate: rate, log: log}, nil
}

type spiky struct {
	worker.Ops
	rate float64
	log  zerolog.Logger
}

// Heartbeat stalls until ctx, bounded by the lease's local deadline, ends,
// or else renews.
func (s spiky) Heartbeat(ctx context.Context, id int64, processor string, fence int64) (task.Task, error) {
	if _, bounded := ctx.Deadline(); bounded && rand.Float64() < s.rate {
		s.log.Warn().Int64("task", id).Str("processor", processor).Msg("simulated latency spike: this heartbeat stalls past the lease's deadline")
		<-ctx.Done()
		return task.Task{}, ctx.Err()
	}
	return s.Ops.Heartbeat(ctx, id, processor, fence)
}
