package restclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// Tasks is the task queue over the REST API: what a remote client inserts
// and controls, and what its workers write under their tasks' leases
// (worker.RemoteTasks).
type Tasks struct{ C *Client }

func taskPath(id int64, op string) string {
	p := "/api/tasks/" + strconv.FormatInt(id, 10)
	if op != "" {
		p += "/" + op
	}
	return p
}

// leaseOpRefusals maps the refusals of the routes a task's holder calls:
// 409 is task.ErrLeaseLost (a *task.LeaseLostError, which is
// task.ErrCancelled too when the server says the task was cancelled), 404
// task.ErrNotFound.
func leaseOpRefusals(status int, body ErrorBody) error {
	switch status {
	case http.StatusConflict:
		return &task.LeaseLostError{State: body.TaskState}
	case http.StatusNotFound:
		return task.ErrNotFound
	}
	return nil
}

type newTaskBody struct {
	TaskData    json.RawMessage `json:"task_data"`
	Kind        string          `json:"kind"`
	Queue       string          `json:"queue,omitempty"`
	Priority    int16           `json:"priority,omitempty"`
	UniqueKey   string          `json:"unique_key,omitempty"`
	Lock        string          `json:"lock,omitempty"`
	TTLSeconds  int64           `json:"ttl_seconds,omitempty"`
	ScheduledAt string          `json:"scheduled_at,omitempty"`
	MaxAttempts int32           `json:"max_attempts,omitempty"`
}

func bodyOf(nt taskstore.NewTask) newTaskBody {
	b := newTaskBody{
		TaskData: nt.TaskData, Kind: nt.Kind, Queue: nt.Queue, Priority: nt.Priority, UniqueKey: nt.UniqueKey,
		TTLSeconds: int64(nt.TTL / time.Second), MaxAttempts: nt.MaxAttempts, Lock: nt.Lock,
	}
	if !nt.ScheduledAt.IsZero() {
		b.ScheduledAt = apitime.Format(nt.ScheduledAt)
	}
	return b
}

// Insert posts the tasks: those without a unique key in one batch, each
// with one in a request of its own, whose status (201 or 200) says whether
// it was inserted (a batch's says only whether any was).
func (r Tasks) Insert(ctx context.Context, nts []taskstore.NewTask) ([]taskstore.Inserted, error) {
	out := make([]taskstore.Inserted, len(nts))
	var plain []int
	for i, nt := range nts {
		if nt.UniqueKey == "" {
			plain = append(plain, i)
			continue
		}
		var t task.Task
		status, err := r.C.Do(ctx, http.MethodPost, "/api/tasks", nil, bodyOf(nt), &t, nil)
		if err != nil {
			return nil, err
		}
		out[i] = taskstore.Inserted{Task: t, Duplicate: status == http.StatusOK}
	}
	if len(plain) == 0 {
		return out, nil
	}
	bodies := make([]newTaskBody, len(plain))
	for j, i := range plain {
		bodies[j] = bodyOf(nts[i])
	}
	var ts []task.Task
	if _, err := r.C.Do(ctx, http.MethodPost, "/api/tasks", nil, bodies, &ts, nil); err != nil {
		return nil, err
	}
	for j, i := range plain {
		out[i] = taskstore.Inserted{Task: ts[j]}
	}
	return out, nil
}

// Get reads one task; task.ErrNotFound when there is none.
func (r Tasks) Get(ctx context.Context, id int64) (task.Task, error) {
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodGet, taskPath(id, ""), nil, nil, &t, func(status int, _ ErrorBody) error {
		if status == http.StatusNotFound {
			return task.ErrNotFound
		}
		return nil
	})
	return t, err
}

// Cancel cancels a task; task.ErrNotCancellable once it has finished.
func (r Tasks) Cancel(ctx context.Context, id int64, reason string) (task.Task, error) {
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPost, taskPath(id, "cancel"), nil, map[string]string{"reason": reason}, &t,
		func(status int, _ ErrorBody) error {
			switch status {
			case http.StatusConflict:
				return task.ErrNotCancellable
			case http.StatusNotFound:
				return task.ErrNotFound
			}
			return nil
		})
	return t, err
}

// Retry makes a failed, discarded or cancelled task available again.
func (r Tasks) Retry(ctx context.Context, id int64) (task.Task, error) {
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPost, taskPath(id, "retry"), nil, struct{}{}, &t,
		func(status int, body ErrorBody) error {
			switch {
			case status == http.StatusConflict && strings.Contains(body.Error, "unique key"):
				return task.ErrUniqueKeyTaken
			case status == http.StatusConflict:
				return task.ErrNotRetryable
			case status == http.StatusNotFound:
				return task.ErrNotFound
			}
			return nil
		})
	return t, err
}

// Claim long-polls POST /api/tasks/next.
func (r Tasks) Claim(ctx context.Context, processor, queue string, kinds []string, wait time.Duration) (task.Task, bool, error) {
	body := struct {
		Processor   string   `json:"processor"`
		Kinds       []string `json:"kinds"`
		Queues      []string `json:"queues"`
		WaitSeconds int64    `json:"wait_seconds,omitempty"`
	}{processor, kinds, []string{queue}, int64(wait / time.Second)}
	var t task.Task
	status, err := r.C.Waiting(wait).Do(ctx, http.MethodPost, "/api/tasks/next", nil, body, &t, nil)
	if err != nil || status == http.StatusNoContent {
		return task.Task{}, false, err
	}
	return t, true, nil
}

// HeldBy pages GET /api/tasks?state=running&queue=… for the tasks of queue held by one of
// processors.
func (r Tasks) HeldBy(ctx context.Context, queue string, processors []string) ([]task.Task, error) {
	const page = 1000
	q := url.Values{"state": {task.StateRunning}, "queue": {queue}, "limit": {strconv.Itoa(page)}}
	var held []task.Task
	for {
		var ts []task.Task
		if _, err := r.C.Do(ctx, http.MethodGet, "/api/tasks", q, nil, &ts, nil); err != nil {
			return held, err
		}
		for _, t := range ts {
			if slices.Contains(processors, t.Processor) {
				held = append(held, t)
			}
		}
		// Until an empty page: a page may end short of the limit when its
		// tasks are large (the server bounds its size).
		if len(ts) == 0 {
			return held, nil
		}
		q.Set("after_id", strconv.FormatInt(ts[len(ts)-1].ID, 10))
	}
}

type holderBody struct {
	Processor string `json:"processor"`
	Fence     int64  `json:"fence,omitempty"`
}

// Heartbeat extends a held task's lease under its fence.
func (r Tasks) Heartbeat(ctx context.Context, id int64, processor string, fence int64) (task.Task, error) {
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPut, taskPath(id, "heartbeat"), nil, holderBody{processor, fence}, &t, leaseOpRefusals)
	return t, err
}

// HeartbeatWait renews the lease and has the service hold its answer up to
// wait (whole seconds), answering at once when the task is cancelled: how a
// remote worker hears of a cancellation without polling.
func (r Tasks) HeartbeatWait(ctx context.Context, id int64, processor string, fence int64, wait time.Duration) (task.Task, error) {
	body := struct {
		holderBody
		WaitSeconds int64 `json:"wait_seconds,omitempty"`
	}{holderBody{processor, fence}, int64(wait / time.Second)}
	var t task.Task
	_, err := r.C.Waiting(wait).Do(ctx, http.MethodPut, taskPath(id, "heartbeat"), nil, body, &t, leaseOpRefusals)
	return t, err
}

// Complete records a held task as completed with its output.
func (r Tasks) Complete(ctx context.Context, id int64, processor string, fence int64, output json.RawMessage) (task.Task, error) {
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	body := struct {
		holderBody
		TaskOutput json.RawMessage `json:"task_output"`
	}{holderBody{processor, fence}, output}
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPut, taskPath(id, "complete"), nil, body, &t, leaseOpRefusals)
	return t, err
}

// Fail records a failed attempt of a held task, retried after retryIn
// when it has attempts left (zero lets the server choose).
func (r Tasks) Fail(ctx context.Context, id int64, processor string, fence int64, reason string, retryIn time.Duration) (task.Task, error) {
	body := struct {
		holderBody
		Error          string   `json:"error"`
		RetryInSeconds *float64 `json:"retry_in_seconds,omitempty"`
	}{holderBody: holderBody{processor, fence}, Error: reason}
	if retryIn >= 0 {
		secs := retryIn.Seconds()
		body.RetryInSeconds = &secs
	}
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPut, taskPath(id, "fail"), nil, body, &t, leaseOpRefusals)
	return t, err
}

// Requeue hands a held task back without spending an attempt.
func (r Tasks) Requeue(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error) {
	body := struct {
		holderBody
		Reason string `json:"reason,omitempty"`
	}{holderBody{processor, fence}, reason}
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPut, taskPath(id, "requeue"), nil, body, &t, leaseOpRefusals)
	return t, err
}

// Snooze puts a held task back to run after delay.
func (r Tasks) Snooze(ctx context.Context, id int64, processor string, fence int64, delay time.Duration) (task.Task, error) {
	body := struct {
		holderBody
		DelaySeconds float64 `json:"delay_seconds"`
	}{holderBody{processor, fence}, max(delay, 0).Seconds()}
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPut, taskPath(id, "snooze"), nil, body, &t, leaseOpRefusals)
	return t, err
}

// CancelHeld cancels a held task from inside its handler.
func (r Tasks) CancelHeld(ctx context.Context, id int64, processor string, fence int64, reason string) (task.Task, error) {
	body := struct {
		holderBody
		Reason string `json:"reason"`
	}{holderBody{processor, fence}, reason}
	var t task.Task
	_, err := r.C.Do(ctx, http.MethodPost, taskPath(id, "cancel"), nil, body, &t, leaseOpRefusals)
	return t, err
}
