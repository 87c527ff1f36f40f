package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/taskwait"
	"github.com/leasehold/leasehold/task"
)

// Limits of the task routes.
const (
	maxTasksPerRequest = 10000
	maxErrorBytes      = 4096
	maxAttemptsLimit   = 100
	defaultTaskLimit   = 100
	maxTaskLimit       = 1000
)

// errNothingReady is a claim that found no task ready: 204, counted as
// "empty" in the metrics.
var errNothingReady = errors.New("no task is ready")

// jsonValue is a request body read by parseBody as one JSON value of any
// kind, for a handler that decodes it further by its shape.
type jsonValue struct{ json.RawMessage }

func (jsonValue) validate() error { return nil }

// decodeValue decodes one JSON value, already read and checked, into a new
// T, refusing unknown fields, and a member given twice or as null, as
// parseBody does.
func decodeValue[T any](raw []byte) (T, error) {
	var v T
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, decodeError(err)
	}
	return v, checkMembers[T](raw)
}

// newTaskRequest is one task of POST /api/tasks.
type newTaskRequest struct {
	TaskData    json.RawMessage `json:"task_data"`
	Kind        opt[string]     `json:"kind,omitzero"`
	Queue       opt[string]     `json:"queue,omitzero"`
	Priority    opt[int64]      `json:"priority,omitzero"`
	UniqueKey   opt[string]     `json:"unique_key,omitzero"`
	Lock        opt[string]     `json:"lock,omitzero"`
	LockLimit   *int64          `json:"lock_limit,omitempty"`
	TTLSeconds  opt[int64]      `json:"ttl_seconds,omitzero"`
	ScheduledAt *string         `json:"scheduled_at,omitempty"`
	MaxAttempts *int64          `json:"max_attempts,omitempty"`
	// Metadata travels with the task to its workers (a trace context).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// scheduleMin and scheduleMax bound scheduled_at to what PostgreSQL stores
// and the API writes back as RFC 3339 (a four-digit year).
var (
	scheduleMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	scheduleMax = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// Bounds of a task's priority: a PostgreSQL smallint.
const (
	minPriority = -32768
	maxPriority = 32767
)

// newTask checks the request and returns the task to insert.
func (q newTaskRequest) newTask() (taskstore.NewTask, error) {
	// task_data is a JSON object, as the API promises: a worker reads named
	// fields from it (sleep_duration_seconds), and null or a bare value is
	// far more likely a client's mistake than a task.
	data := bytes.TrimSpace(q.TaskData)
	switch {
	case len(data) == 0:
		return taskstore.NewTask{}, badRequestf(`"task_data" is required; send the task's input as a JSON object, e.g. {"task_data": {"sleep_duration_seconds": 5}}`)
	case data[0] != '{':
		return taskstore.NewTask{}, badRequestf(`"task_data" must be a JSON object, not %s`, jsonKindOf(data))
	}
	if err := checkPayload(`"task_data"`, data); err != nil {
		return taskstore.NewTask{}, err
	}
	if err := checkJSON(`"task_data"`, data, true); err != nil {
		return taskstore.NewTask{}, err
	}
	if err := firstError(
		q.Kind.present("kind", func(v string) error { return checkName("kind", v) }),
		q.Queue.present("queue", func(v string) error { return checkName("queue", v) }),
		q.UniqueKey.present("unique_key", func(v string) error { return checkName("unique_key", v) }),
		q.Lock.present("lock", func(v string) error { return checkResource("lock", v) }),
		checkLockLimit(q.Lock.v, q.LockLimit),
		q.Priority.present("priority", func(v int64) error {
			if v < minPriority || v > maxPriority {
				return badRequestf(`"priority" is %d; it must be between %d and %d (lower runs first; 0 is the default)`, v, minPriority, maxPriority)
			}
			return nil
		}),
		q.TTLSeconds.present("ttl_seconds", func(v int64) error { return checkTTL(&v) }),
	); err != nil {
		return taskstore.NewTask{}, err
	}
	if err := task.CheckMetadata(q.Metadata); err != nil {
		return taskstore.NewTask{}, badRequestf(`"metadata": %s`, err)
	}
	nt := taskstore.NewTask{
		TaskData: data, Kind: q.Kind.v, Queue: q.Queue.v, Priority: int16(q.Priority.v),
		UniqueKey: q.UniqueKey.v, TTL: time.Duration(q.TTLSeconds.v) * time.Second, Lock: q.Lock.v,
		LockLimit: int(deref(q.LockLimit)),
		Metadata:  q.Metadata,
	}
	if q.ScheduledAt != nil {
		at, err := time.Parse(time.RFC3339Nano, *q.ScheduledAt)
		if err != nil {
			return taskstore.NewTask{}, badRequestf(`"scheduled_at" %q is not an RFC 3339 time; send e.g. "2030-01-02T15:04:05Z" or "2030-01-02T15:04:05.000+01:00"`, *q.ScheduledAt)
		}
		at = at.UTC()
		if at.Before(scheduleMin) || at.After(scheduleMax) {
			return taskstore.NewTask{}, badRequestf(`"scheduled_at" %q is out of range; it must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z`, *q.ScheduledAt)
		}
		nt.ScheduledAt = at
	}
	if q.MaxAttempts != nil {
		if *q.MaxAttempts < 1 || *q.MaxAttempts > maxAttemptsLimit {
			return taskstore.NewTask{}, badRequestf(`"max_attempts" is %d; it must be between 1 and %d`, *q.MaxAttempts, maxAttemptsLimit)
		}
		nt.MaxAttempts = int32(*q.MaxAttempts)
	}
	return nt, nil
}

// handleTaskCreate serves POST /api/tasks: one task object or an array of
// 1 to 10000 of them (the tasks, in the order sent), inserted in one
// statement, all or none. 201 when a task was inserted; 200 when none was,
// every one naming a unique key that another task of its kind holds: the
// answer is then that task (for an array, each element is the task
// inserted or the one that holds its key).
func handleTaskCreate(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nts, batch, err := decodeNewTasks(w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		for _, nt := range nts {
			if err := mayTask(r, or(nt.Queue, task.DefaultQueue), or(nt.Kind, taskstore.DefaultKind), "", nt.Lock); err != nil {
				writeError(w, r, d.Log, err)
				return
			}
		}
		inserted, err := d.Tasks.Insert(r.Context(), nts)
		d.Metrics.taskOp("insert", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		status := http.StatusOK
		tasks := make([]task.Task, len(inserted))
		for i, in := range inserted {
			tasks[i] = in.Task
			if !in.Duplicate {
				status = http.StatusCreated
			}
		}
		if !batch {
			encode(w, status, tasks[0])
			return
		}
		encode(w, status, tasks)
	})
}

// decodeNewTasks reads the body of POST /api/tasks (see parseNewTasks).
func decodeNewTasks(w http.ResponseWriter, r *http.Request) ([]taskstore.NewTask, bool, error) {
	body, err := readBody(w, r)
	if err != nil {
		return nil, false, err
	}
	return parseNewTasks(body)
}

// parseNewTasks parses the body of POST /api/tasks: one task object, or an
// array of 1 to maxTasksPerRequest of them (batch). Every error it returns
// is a *badRequest.
func parseNewTasks(body []byte) (nts []taskstore.NewTask, batch bool, err error) {
	raw, err := parseBody[jsonValue](body)
	if err != nil {
		return nil, false, err
	}
	value := raw.RawMessage
	switch value[0] {
	case '{':
		q, err := decodeValue[newTaskRequest](value)
		if err != nil {
			return nil, false, err
		}
		nt, err := q.newTask()
		return []taskstore.NewTask{nt}, false, err
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(value, &items); err != nil {
			return nil, true, decodeError(err)
		}
		if len(items) == 0 || len(items) > maxTasksPerRequest {
			return nil, true, badRequestf("the array has %d tasks; send 1 to %d tasks per request", len(items), maxTasksPerRequest)
		}
		nts = make([]taskstore.NewTask, len(items))
		for i, item := range items {
			if item[0] != '{' {
				return nil, true, badRequestf("item %d of the array (counting from 0) is %s; each item must be a task object like {\"task_data\": {...}}", i, jsonKindOf(item))
			}
			q, err := decodeValue[newTaskRequest](item)
			if err == nil {
				nts[i], err = q.newTask()
			}
			if bad := (*badRequest)(nil); errors.As(err, &bad) {
				return nil, true, badRequestf("item %d of the array (counting from 0): %s", i, bad.msg)
			}
			if err != nil {
				return nil, true, err
			}
		}
		return nts, true, nil
	default:
		return nil, false, badRequestf("request body must be a task object or an array of task objects, not %s", jsonKindOf(value))
	}
}

// claimRequest is the body of POST /api/tasks/next.
type claimRequest struct {
	Processor   string        `json:"processor"`
	Kinds       opt[[]string] `json:"kinds,omitzero"`
	Queues      opt[[]string] `json:"queues,omitzero"`
	WaitSeconds opt[int64]    `json:"wait_seconds,omitzero"`
}

// maxClaimNames bounds the kinds and the queues of one claim.
const maxClaimNames = 100

func (q claimRequest) validate() error {
	names := func(field string) func(v []string) error {
		return func(v []string) error {
			if len(v) == 0 || len(v) > maxClaimNames {
				return badRequestf(`%q has %d names; send 1 to %d, or leave it out for all`, field, len(v), maxClaimNames)
			}
			for i, n := range v {
				if err := checkName(fmt.Sprintf("%s[%d]", field, i), n); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return firstError(checkName("processor", q.Processor),
		q.Kinds.present("kinds", names("kinds")), q.Queues.present("queues", names("queues")),
		q.WaitSeconds.present("wait_seconds", func(v int64) error { return checkWait(&v) }))
}

// handleTaskClaim serves POST /api/tasks/next: 200 and the due task with
// the lowest (priority, scheduled_at, id) of the kinds and queues asked for
// (all when left out), claimed under a new lease (the task's TTL, else
// Deps.TaskTTL), or 204 when none is ready. With wait_seconds the request
// waits for one (claimWaiting).
func handleTaskClaim(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[claimRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if err := mayNames(r, req.Queues.v, req.Kinds.v, req.Processor); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		p := taskstore.ClaimParams{
			Processors: []string{req.Processor}, TTL: d.TaskTTL, Kinds: req.Kinds.v, Queues: req.Queues.v, WithLapsed: true,
		}
		var tasks []task.Task
		if req.WaitSeconds.v > 0 {
			tasks, err = claimWaiting(w, r, d, p, time.Duration(req.WaitSeconds.v)*time.Second)
		} else {
			tasks, err = d.Tasks.Claim(r.Context(), p)
		}
		if err == nil && len(tasks) == 0 {
			d.Metrics.taskOp("claim", errNothingReady)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		d.Metrics.taskOp("claim", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		// A client gone already, or a connection that breaks under the answer, never learns
		// of the task: hand it back rather than leave it held, unrun, for its TTL.
		if clientGone(r) || encodeFlushed(w, http.StatusOK, tasks[0]) != nil {
			handBackAbandoned(d, tasks)
		}
	})
}

// heartbeatRequest is the body of PUT /api/tasks/{id}/heartbeat; complete
// and fail add to its first two fields. (Not embedded: encoding/json would
// name a field of an embedded struct "heartbeatRequest.fence" in errors.)
// processorName is the processor the request acts as.
func (q heartbeatRequest) processorName() string { return q.Processor }

type heartbeatRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence,omitempty"`
	// WaitSeconds, when above 0, holds the answer after the renewal until
	// the wait passes or the task is cancelled (heartbeatWaiting).
	WaitSeconds opt[int64] `json:"wait_seconds,omitzero"`
}

func (q heartbeatRequest) validate() error {
	return firstError(checkProcessorFence(q.Processor, q.Fence),
		q.WaitSeconds.present("wait_seconds", func(v int64) error { return checkWait(&v) }))
}

func checkProcessorFence(processor string, fence *int64) error {
	if err := checkName("processor", processor); err != nil {
		return err
	}
	return checkFence(fence)
}

// processorName is the processor the request acts as.
func (q completeRequest) processorName() string { return q.Processor }

type completeRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence,omitempty"`
	// TaskOutput is required, though any JSON value (null included) will
	// do: a client that forgot it should hear so rather than have the task
	// completed, at most once, without its result.
	TaskOutput json.RawMessage `json:"task_output"`
}

func (q completeRequest) validate() error {
	if err := checkProcessorFence(q.Processor, q.Fence); err != nil {
		return err
	}
	if len(q.TaskOutput) == 0 {
		return badRequestf(`"task_output" is required; send the task's result as any JSON value (null when there is none)`)
	}
	if err := checkPayload(`"task_output"`, q.TaskOutput); err != nil {
		return err
	}
	return checkJSON(`"task_output"`, q.TaskOutput, true)
}

// processorName is the processor the request acts as.
func (q failRequest) processorName() string { return q.Processor }

type failRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence,omitempty"`
	Error     string `json:"error"`
	// RetryInSeconds, when set, replaces the default backoff: the worker's
	// own retry policy for the task's kind.
	RetryInSeconds opt[float64] `json:"retry_in_seconds,omitzero"`
}

// maxRetryInSeconds bounds a failure's retry_in_seconds and a snooze's
// delay_seconds: a week.
const maxRetryInSeconds = 7 * 24 * 3600

func checkDelay(field string) func(v float64) error {
	return func(v float64) error {
		if v < 0 || v > maxRetryInSeconds {
			return badRequestf(`%q is %v; it must be between 0 and %d seconds`, field, v, maxRetryInSeconds)
		}
		return nil
	}
}

func (q failRequest) validate() error {
	if err := firstError(checkProcessorFence(q.Processor, q.Fence),
		q.RetryInSeconds.present("retry_in_seconds", checkDelay("retry_in_seconds"))); err != nil {
		return err
	}
	if strings.TrimSpace(q.Error) == "" {
		return badRequestf(`"error" is required and must not be blank; say why the attempt failed`)
	}
	return checkErrorText("error", q.Error)
}

// checkErrorText checks a free text that lands in last_error: at most
// maxErrorBytes, no NUL.
func checkErrorText(field, v string) error {
	switch {
	case len(v) > maxErrorBytes:
		return badRequestf(`%q is %d bytes long; the limit is %d bytes`, field, len(v), maxErrorBytes)
	case strings.ContainsRune(v, 0):
		// PostgreSQL text cannot hold NUL; other control characters
		// (newlines in a stack trace) are fine.
		return badRequestf(`%q contains a NUL character; remove it`, field)
	}
	return nil
}

// handleTaskLeaseOp serves PUT /api/tasks/{id}/complete, /fail, /snooze
// and /requeue: decode a T, then op under the task's compare-and-set. 202
// with the task; 409 when the caller no longer holds it; 404 for an unknown
// id.
func handleTaskLeaseOp[T validator](d Deps, name string, op func(r *http.Request, id int64, req T) (task.Task, error)) http.Handler {
	return handleTaskOp(d, name, op)
}

// handleTaskOp serves a change of one task: decode a T, then op. 202 with
// the task; the error's status otherwise (writeError).
func handleTaskOp[T validator](d Deps, name string, op func(r *http.Request, id int64, req T) (task.Task, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		req, err := decode[T](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		processor := ""
		if p, ok := any(req).(interface{ processorName() string }); ok {
			processor = p.processorName()
		}
		if err := mayTaskID(r, d, id, processor); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		t, err := op(r, id, req)
		d.Metrics.taskOp(name, err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusAccepted, t)
	})
}

// handleTaskHeartbeat serves PUT /api/tasks/{id}/heartbeat: the lease
// renewed at once, 202 with the task; 409 when the processor does not hold
// it; 404 for an unknown id. With wait_seconds the 202 is held
// (heartbeatWaiting), so that a worker that is not in this process hears of
// its task's cancellation as soon as the server does.
func handleTaskHeartbeat(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		q, err := decode[heartbeatRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if err := mayTaskID(r, d, id, q.Processor); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		var t task.Task
		if q.WaitSeconds.v > 0 {
			t, err = heartbeatWaiting(w, r, d, id, q, time.Duration(q.WaitSeconds.v)*time.Second)
		} else {
			t, err = d.Tasks.Heartbeat(r.Context(), id, q.Processor, deref(q.Fence))
		}
		d.Metrics.taskOp("heartbeat", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusAccepted, t)
	})
}

// heartbeatBuffer is the buffer of a held heartbeat's subscription to the
// task channel: a burst beyond it costs one look at the task (a resync),
// not a lost cancellation.
const heartbeatBuffer = 64

// heartbeatWaiting renews the task's lease for a heartbeat with
// wait_seconds, at once and with the answers of a heartbeat without it
// (409, 404: answered at once), then holds the answer, 202 with the renewed
// task, until the wait passes. It is answered at once with the 409 of a
// heartbeat of a task the processor lost (task.ErrLeaseLost) when the task
// is cancelled meanwhile, on any replica: the cancellation's NOTIFY
// ("cancelled:<id>"), or a resync of the listener (which may have lost
// one), makes it read the task again. So a worker that heartbeats this way
// (leasehold work) hears of a cancellation at once, and polls nothing.
// Nothing else takes a live lease from its holder: a lease lapses only at
// must_heartbeat_before, and the wait ends before it.
//
// The wait ends early with the 202 when the replica shuts down (the
// renewal holds; the answer closes the connection, so that the client's
// next heartbeat, on a new one, reaches a replica that stays) and when the
// client goes away. It is at most the renewed lease's TTL less a tenth,
// counted from before the renewal was sent, so that a held answer always
// reaches the client before the lease could lapse. Without a listener it
// is just a wait. The wait, which holds no database connection, is not
// bounded by the API's database budget (see BoundRequest); each statement
// is.
func heartbeatWaiting(w http.ResponseWriter, r *http.Request, d Deps, id int64, q heartbeatRequest, wait time.Duration) (task.Task, error) {
	ctx, budget, stop := unbounded(r)
	defer stop()
	// Subscribed before the renewal: a cancellation that commits after it
	// is heard; one before it makes the renewal fail.
	var (
		changes <-chan notify.Notification
		resync  <-chan struct{}
	)
	if d.Listener != nil {
		sub := d.Listener.Subscribe(notify.ChannelTask, heartbeatBuffer)
		defer sub.Close()
		changes, resync = sub.C(), sub.Resync()
	}
	sent := time.Now()
	t, err := d.Tasks.Heartbeat(r.Context(), id, q.Processor, deref(q.Fence))
	if err != nil {
		return task.Task{}, err
	}
	if t.MustHeartbeatBefore != nil && t.LastHeartbeatAt != nil {
		// The lease as the renewal set it, by the database clock alone.
		ttl := t.MustHeartbeatBefore.Sub(*t.LastHeartbeatAt)
		wait = min(wait, ttl-ttl/10)
	}
	deadline := sent.Add(wait)
	holdOpen(w, deadline)
	log := d.Log.With().Int64("task", id).Str("processor", q.Processor).Int64("fence", t.Fence).Logger()
	log.Debug().Stringer("wait", time.Until(deadline)).Msg("heartbeat waits")
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return t, nil
		case <-d.Stopping:
			w.Header().Set("Connection", "close")
			log.Debug().Msg("heartbeat stopped waiting: the replica shuts down")
			return t, nil
		case <-ctx.Done():
			return task.Task{}, ctx.Err()
		case n := <-changes:
			if cancelled, ok := notify.ParseCancelled(n.Payload); !ok || cancelled != id {
				continue
			}
		case <-resync:
		}
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if budget > 0 {
			sctx, cancel = context.WithTimeout(ctx, budget)
		}
		cur, err := d.Tasks.Get(sctx, id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return task.Task{}, ctx.Err()
		case err != nil:
			// Whether the task is still held cannot be told now: the renewal
			// holds, and the client's next heartbeat will tell.
			log.Debug().Err(err).Msg("heartbeat stopped waiting: the task could not be read")
			return t, nil
		case cur.State != task.StateRunning || cur.Processor != t.Processor || cur.Fence != t.Fence:
			log.Debug().Str("state", cur.State).Msg("heartbeat stopped waiting: the lease was revoked")
			return task.Task{}, &task.LeaseLostError{State: cur.State}
		}
	}
}

func handleTaskComplete(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "complete", func(r *http.Request, id int64, q completeRequest) (task.Task, error) {
		return d.Tasks.Complete(r.Context(), id, q.Processor, deref(q.Fence), q.TaskOutput)
	})
}

func handleTaskFail(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "fail", func(r *http.Request, id int64, q failRequest) (task.Task, error) {
		retryIn := time.Duration(-1) // the default backoff
		if q.RetryInSeconds.set {
			retryIn = time.Duration(q.RetryInSeconds.v * float64(time.Second))
		}
		return d.Tasks.Fail(r.Context(), id, q.Processor, deref(q.Fence), q.Error, retryIn)
	})
}

// snoozeRequest is the body of PUT /api/tasks/{id}/snooze.
// processorName is the processor the request acts as.
func (q snoozeRequest) processorName() string { return q.Processor }

type snoozeRequest struct {
	Processor    string       `json:"processor"`
	Fence        *int64       `json:"fence,omitempty"`
	DelaySeconds opt[float64] `json:"delay_seconds,omitzero" required:"true"`
}

func (q snoozeRequest) validate() error {
	if !q.DelaySeconds.set && !q.DelaySeconds.null {
		return badRequestf(`"delay_seconds" is required: how long from now the task should wait before it runs again`)
	}
	return firstError(checkProcessorFence(q.Processor, q.Fence),
		q.DelaySeconds.present("delay_seconds", checkDelay("delay_seconds")))
}

// handleTaskSnooze serves PUT /api/tasks/{id}/snooze: the processor holding
// the task puts it back, due after delay_seconds, without counting the
// attempt (a handler asking to run again later). 202 · 409 · 404.
func handleTaskSnooze(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "snooze", func(r *http.Request, id int64, q snoozeRequest) (task.Task, error) {
		return d.Tasks.Snooze(r.Context(), id, q.Processor, deref(q.Fence), time.Duration(q.DelaySeconds.v*float64(time.Second)))
	})
}

// requeueRequest is the body of PUT /api/tasks/{id}/requeue.
// processorName is the processor the request acts as.
func (q requeueRequest) processorName() string { return q.Processor }

type requeueRequest struct {
	Processor string      `json:"processor"`
	Fence     *int64      `json:"fence,omitempty"`
	Reason    opt[string] `json:"reason,omitzero"`
}

func (q requeueRequest) validate() error {
	return firstError(checkProcessorFence(q.Processor, q.Fence),
		q.Reason.present("reason", func(v string) error { return checkErrorText("reason", v) }))
}

// defaultRequeueReason is the history's reason for a task handed back with
// none.
const defaultRequeueReason = "handed back by its worker"

// handleTaskRequeue serves PUT /api/tasks/{id}/requeue: the processor
// holding the task hands it back (a worker shutting down), due at once,
// without counting the attempt. 202 · 409 · 404.
func handleTaskRequeue(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "requeue", func(r *http.Request, id int64, q requeueRequest) (task.Task, error) {
		reason := defaultRequeueReason
		if q.Reason.set {
			reason = q.Reason.v
		}
		return d.Tasks.Requeue(r.Context(), id, q.Processor, deref(q.Fence), reason)
	})
}

// cancelRequest is the body of POST /api/tasks/{id}/cancel. With a
// processor, the cancellation is the holder's own (a worker giving up on
// its task): refused (409) unless the processor holds the task's live lease
// (with the fence, when given).
// processorName is the processor the cancellation acts as; "" for an
// operator's.
func (q cancelRequest) processorName() string { return q.Processor.v }

type cancelRequest struct {
	Reason    opt[string] `json:"reason,omitzero"`
	Processor opt[string] `json:"processor,omitzero"`
	Fence     *int64      `json:"fence,omitempty"`
}

// defaultCancelReason is the last_error of a task cancelled with no reason.
const defaultCancelReason = "cancelled"

func (q cancelRequest) validate() error {
	if q.Fence != nil && !q.Processor.set {
		return badRequestf(`"fence" needs "processor": a cancellation by the task's holder names both`)
	}
	return firstError(q.Reason.present("reason", func(v string) error { return checkErrorText("reason", v) }),
		q.Processor.present("processor", func(v string) error { return checkName("processor", v) }), checkFence(q.Fence))
}

// handleTaskCancel serves POST /api/tasks/{id}/cancel: 202 + the task,
// cancelled, when it was pending or running (a running task's lease is
// revoked at once, and its worker told); 409 when it is done, dead or
// cancelled already; 404.
func handleTaskCancel(d Deps) http.Handler {
	return handleTaskOp(d, "cancel", func(r *http.Request, id int64, q cancelRequest) (task.Task, error) {
		reason := defaultCancelReason
		if q.Reason.set {
			reason = q.Reason.v
		}
		// A worker's cancellation of the task it holds is work; anyone
		// else's is an operator's, producing.
		if q.Processor.set {
			if t := principal(r); t != nil && !t.may(ScopeWork) {
				return task.Task{}, forbiddenf("the token %q may not cancel a task as its processor: that needs the scope %q", t.Name, ScopeWork)
			}
			return d.Tasks.CancelHeld(r.Context(), id, q.Processor.v, deref(q.Fence), reason)
		}
		if t := principal(r); t != nil && !t.may(ScopeProduce) {
			return task.Task{}, forbiddenf("the token %q may not cancel tasks: that needs the scope %q", t.Name, ScopeProduce)
		}
		return d.Tasks.Cancel(r.Context(), id, reason)
	})
}

// retryRequest is the body of POST /api/tasks/{id}/retry: empty.
type retryRequest struct{}

func (retryRequest) validate() error { return nil }

// handleTaskRetry serves POST /api/tasks/{id}/retry: 202 + the task back
// to pending, due now, with a fresh budget of attempts, when it was dead or
// cancelled; 409 otherwise, or when another task of its kind holds its
// unique key; 404.
func handleTaskRetry(d Deps) http.Handler {
	return handleTaskOp(d, "retry", func(r *http.Request, id int64, _ retryRequest) (task.Task, error) {
		return d.Tasks.Retry(r.Context(), id)
	})
}

func handleTaskGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		wait, err := queryInt(r.URL.Query(), "wait_seconds", 0, 0, maxWaitSeconds)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		t, err := d.Tasks.Get(r.Context(), id)
		if err == nil && !mayRead(r, t.Queue, t.Kind) {
			err = mayTask(r, t.Queue, t.Kind, "", "")
		}
		if err == nil && wait > 0 && !taskwait.Finished(t.State) && d.taskWaits != nil {
			t, err = waitFinished(w, r, d, id, time.Duration(wait)*time.Second)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, t)
	})
}

// waitFinished holds GET /api/tasks/{id}?wait_seconds until the task is
// done, dead or cancelled, woken by NOTIFY (no polling), or the wait ends,
// or the replica shuts down: the answer is the task as it is then. The
// wait holds no database connection and is not bounded by the API's
// database budget; each read of the task is.
func waitFinished(w http.ResponseWriter, r *http.Request, d Deps, id int64, wait time.Duration) (task.Task, error) {
	ctx, budget, stop := unbounded(r)
	defer stop()
	deadline := time.Now().Add(wait)
	holdOpen(w, deadline)
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	go func() {
		select {
		case <-d.Stopping:
			cancel()
		case <-wctx.Done():
		}
	}()
	var last task.Task
	t, err := d.taskWaits.Wait(wctx, func(context.Context) (task.Task, error) {
		sctx, scancel := ctx, context.CancelFunc(func() {})
		if budget > 0 {
			sctx, scancel = context.WithTimeout(ctx, budget)
		}
		defer scancel()
		cur, err := d.Tasks.Get(sctx, id)
		if err == nil {
			last = cur
		}
		return cur, err
	})
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		// The wait is over (or the replica stops): the task as last read.
		if last.ID == 0 { // never read: the listener was down throughout
			sctx, scancel := context.WithTimeout(ctx, max(budget, 5*time.Second))
			defer scancel()
			return d.Tasks.Get(sctx, id)
		}
		return last, nil
	}
	return t, err
}

// mayTaskID refuses an operation on task id (as processor, when not empty)
// that the request's token's prefixes do not allow. The task is read only
// when the token is bounded to some queues or kinds.
func mayTaskID(r *http.Request, d Deps, id int64, processor string) error {
	t := principal(r)
	if t == nil {
		return nil
	}
	if len(t.Queues) == 0 && len(t.Kinds) == 0 {
		return mayTask(r, "", "", processor, "")
	}
	cur, err := d.Tasks.Get(r.Context(), id)
	if err != nil {
		return err
	}
	return mayTask(r, cur.Queue, cur.Kind, processor, "")
}

// taskListParams reads ?limit= (default 100, at most 1000), ?after_id=,
// and the filters ?state=, ?kind= and ?queue= of a task list.
func taskListParams(q url.Values) (taskstore.ListParams, error) {
	l, err := queryInt(q, "limit", defaultTaskLimit, 1, maxTaskLimit)
	if err != nil {
		return taskstore.ListParams{}, err
	}
	afterID, err := queryInt(q, "after_id", 0, 0, 1<<62)
	if err != nil {
		return taskstore.ListParams{}, err
	}
	p := taskstore.ListParams{AfterID: afterID, Limit: int32(l)}
	if st := q.Get("state"); st != "" {
		if !slices.Contains(taskStates, st) {
			return taskstore.ListParams{}, badRequestf("query parameter state=%q is not a task state; use one of %s", st, strings.Join(taskStates, ", "))
		}
		p.States = []string{st}
	}
	for _, f := range []struct {
		name string
		into *[]string
	}{{"kind", &p.Kinds}, {"queue", &p.Queues}} {
		v, err := queryName(q, f.name)
		if err != nil {
			return taskstore.ListParams{}, err
		}
		if v != "" {
			*f.into = []string{v}
		}
	}
	return p, nil
}

// taskStates are the states a list may filter by.
var taskStates = []string{task.StatePending, task.StateRunning, task.StateDone, task.StateDead, task.StateCancelled}

// The task lists beyond GET /api/tasks.
const (
	listAll       = "all"
	listProcessed = "processed" // done or dead
	listStarted   = "started"   // claimed at least once
)

// handleTaskList serves a task list: ?limit= tasks with ids after
// ?after_id=, oldest first, of the list's kind (all, processed, started)
// and the filters asked for.
func handleTaskList(d Deps, list string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := taskListParams(r.URL.Query())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		switch list {
		case listProcessed:
			processed := []string{task.StateDone, task.StateDead}
			if len(p.States) > 0 && !slices.Contains(processed, p.States[0]) {
				encode(w, http.StatusOK, []task.Task{}) // no processed task is in that state
				return
			}
			if p.States == nil {
				p.States = processed
			}
		case listStarted:
			p.Started = true
		}
		tasks, err := d.Tasks.List(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		writeTaskPage(w, r, tasks, int(p.Limit))
	})
}

// maxPageBytes bounds a page of tasks: a page ends before the task that
// would take it past this (it always holds one), whatever the tasks hold.
const maxPageBytes = 8 << 20

// writeTaskPage answers a list with tasks, cut short at maxPageBytes, and
// without the tasks the request's token may not read. When there may be
// more (the page is full, or was cut short), the answer says where the next
// page starts: a Link header with rel="next", the same query with after_id
// the last id the page looked at. A page without it is the last; a page
// may be short, or empty, and not be the last.
func writeTaskPage(w http.ResponseWriter, r *http.Request, tasks []task.Task, limit int) {
	var body bytes.Buffer
	body.WriteByte('[')
	shown, seen, last := 0, 0, int64(0)
	for _, t := range tasks {
		if !mayRead(r, t.Queue, t.Kind) {
			seen, last = seen+1, t.ID
			continue
		}
		b, err := json.Marshal(t)
		if err != nil {
			continue // cannot happen: a task always encodes
		}
		if shown > 0 && body.Len()+1+len(b)+2 > maxPageBytes {
			break
		}
		if shown > 0 {
			body.WriteByte(',')
		}
		body.Write(b)
		shown, seen, last = shown+1, seen+1, t.ID
	}
	body.WriteString("]\n")
	if seen > 0 && (seen < len(tasks) || seen >= limit) {
		q := r.URL.Query()
		q.Set("after_id", strconv.FormatInt(last, 10))
		w.Header().Set("Link", "<"+r.URL.Path+"?"+q.Encode()+`>; rel="next"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body.Bytes())
}

func handleTaskStats(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := d.Tasks.Stats(r.Context())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, s)
	})
}

// jsonKindOf names the kind of a JSON value for a message.
func jsonKindOf(v []byte) string {
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// PostgreSQL's numeric, which jsonb keeps numbers in, holds at most
// 131072 digits before the decimal point and 16383 after.
const (
	maxNumericDigitsBefore = 131072
	maxNumericDigitsAfter  = 16383
)

// maxNumberGrowth bounds how much longer than it was written a number may
// be as PostgreSQL prints it. jsonb keeps a number as a numeric, which it
// prints in full, without an exponent: 1e131071 is 8 bytes in and 131,072
// digits out, on every read, list and websocket message. 32 more
// characters than written lets every number a program really sends in
// (6.02e23, 1.5e-20, a float64's 17 significant digits) and bounds the
// answer to a small factor of the request.
const maxNumberGrowth = 32

// payloadTooLarge is a task_data or task_output over task.MaxPayloadBytes:
// 413, as for a body over 1 MiB.
type payloadTooLarge struct{ msg string }

func (e *payloadTooLarge) Error() string { return e.msg }

// checkPayload refuses a task_data or task_output over task.MaxPayloadBytes,
// the bound the library keeps too.
func checkPayload(what string, raw []byte) error {
	if len(raw) > task.MaxPayloadBytes {
		return &payloadTooLarge{fmt.Sprintf("%s is %d bytes of JSON; it holds at most %d: store large data elsewhere and send its key",
			what, len(raw), task.MaxPayloadBytes)}
	}
	return nil
}

// checkJSON refuses what PostgreSQL's jsonb and text refuse in valid JSON:
// the escape \u0000 and unpaired UTF-16 surrogate escapes in strings and,
// with numbers, numbers outside numeric's range or that PostgreSQL would
// print more than maxNumberGrowth characters longer than they were
// written. Without it they would be a 500 (or, in a Go string, a silent
// U+FFFD), or an answer thousands of times the request. raw must be valid
// JSON.
func checkJSON(what string, raw []byte, numbers bool) error {
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '"':
			end, err := checkString(what, raw, i)
			if err != nil {
				return err
			}
			i = end
		case c == '-' || ('0' <= c && c <= '9'):
			end := i + 1
			for end < len(raw) && strings.IndexByte("+-.0123456789eE", raw[end]) >= 0 {
				end++
			}
			if numbers && !numericFits(string(raw[i:end])) {
				return badRequestf("%s has the number %.40s, which is out of range: PostgreSQL stores at most %d digits before the decimal point and %d after",
					what, raw[i:end], maxNumericDigitsBefore, maxNumericDigitsAfter)
			}
			if n := end - i; numbers && printedLength(string(raw[i:end])) > int64(n)+maxNumberGrowth {
				return badRequestf("%s has the number %.40s, which PostgreSQL would store and print as %d characters, %d more than it was written: write it out in full, or send it as a string",
					what, raw[i:end], printedLength(string(raw[i:end])), printedLength(string(raw[i:end]))-int64(n))
			}
			i = end
		default:
			i++
		}
	}
	return nil
}

// checkString checks the JSON string starting at raw[start] (its opening
// quote) and returns the index after its closing quote.
func checkString(what string, raw []byte, start int) (int, error) {
	for i := start + 1; i < len(raw); {
		switch raw[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if raw[i+1] != 'u' {
				i += 2
				continue
			}
			r := hex4(raw[i+2 : i+6])
			i += 6
			switch {
			case r == 0:
				return 0, badRequestf(`%s has the escape \u0000 in a string; PostgreSQL cannot store a NUL character, remove it`, what)
			case 0xdc00 <= r && r <= 0xdfff:
				return 0, badRequestf(`%s has an unpaired UTF-16 surrogate escape (\u%04x) in a string; send valid Unicode`, what, r)
			case 0xd800 <= r && r <= 0xdbff:
				if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return 0, badRequestf(`%s has an unpaired UTF-16 surrogate escape (\u%04x) in a string; send valid Unicode`, what, r)
				}
				if low := hex4(raw[i+2 : i+6]); low < 0xdc00 || low > 0xdfff {
					return 0, badRequestf(`%s has an unpaired UTF-16 surrogate escape (\u%04x) in a string; send valid Unicode`, what, r)
				}
				i += 6
			}
		default:
			i++
		}
	}
	return len(raw), nil
}

func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b), 16, 32) // valid JSON: four hex digits
	return rune(v)
}

// printedLength is how many characters PostgreSQL prints for the JSON
// number n (valid JSON) once jsonb holds it as a numeric: the sign, the
// integer part without its leading zeros ("0" when there is none), and
// the fraction to the scale it was written with, all without an exponent.
// It is an upper bound (a negative zero prints without its sign).
func printedLength(n string) int64 {
	var length int64
	if strings.HasPrefix(n, "-") {
		n, length = n[1:], 1
	}
	mantissa, expPart, _ := strings.Cut(strings.ToLower(n), "e")
	intPart, fracPart, _ := strings.Cut(mantissa, ".")
	exp, err := strconv.ParseInt(expPart, 10, 64)
	if expPart != "" && err != nil {
		return math.MaxInt64 / 2 // an exponent past int64: out of range anyway
	}
	digits := intPart + fracPart
	lead := int64(len(digits) - len(strings.TrimLeft(digits, "0")))
	// The decimal point stands after point digits of digits.
	point := int64(len(intPart)) + exp
	intLen := max(point-lead, 1)
	if point <= 0 || lead == int64(len(digits)) { // no integer part, or zero
		intLen = 1
	}
	if scale := int64(len(fracPart)) - exp; scale > 0 {
		return length + intLen + 1 + scale
	}
	return length + intLen
}

// numericFits reports whether the JSON number n fits PostgreSQL's numeric:
// at most 16383 digits after the decimal point, counting trailing zeros
// (numeric keeps the scale it was given), and a leading digit no further
// than 131071 places before it.
func numericFits(n string) bool {
	n = strings.TrimPrefix(n, "-")
	mantissa, expPart, _ := strings.Cut(strings.ToLower(n), "e")
	intPart, fracPart, _ := strings.Cut(mantissa, ".")
	exp := int64(0)
	if expPart != "" {
		var err error
		// PostgreSQL refuses exponents of INT_MAX/2 and more outright.
		if exp, err = strconv.ParseInt(expPart, 10, 32); err != nil || exp >= 1<<30-1 || exp <= -(1<<30-1) {
			return false
		}
	}
	if int64(len(fracPart))-exp > maxNumericDigitsAfter {
		return false
	}
	digits := intPart + fracPart
	lead := len(digits) - len(strings.TrimLeft(digits, "0"))
	if lead == len(digits) {
		return true // zero
	}
	return int64(len(intPart)-1-lead)+exp < maxNumericDigitsBefore
}

// checkLockLimit validates an optional lock_limit, which needs a lock.
func checkLockLimit(lock string, limit *int64) error {
	if limit != nil && lock == "" {
		return badRequestf(`"lock_limit" is %d without a "lock"; name the key it limits in "lock"`, *limit)
	}
	return checkSlots("lock_limit", lock, limit)
}
