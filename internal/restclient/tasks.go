package restclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	TaskData    json.RawMessage   `json:"task_data"`
	Kind        string            `json:"kind,omitempty"` // empty: the service's default
	Queue       string            `json:"queue,omitempty"`
	Priority    int16             `json:"priority,omitempty"`
	UniqueKey   string            `json:"unique_key,omitempty"`
	Lock        string            `json:"lock,omitempty"`
	LockLimit   int               `json:"lock_limit,omitempty"`
	TTLSeconds  int64             `json:"ttl_seconds,omitempty"`
	ScheduledAt string            `json:"scheduled_at,omitempty"`
	MaxAttempts int32             `json:"max_attempts,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

func bodyOf(nt taskstore.NewTask) newTaskBody {
	b := newTaskBody{
		TaskData: nt.TaskData, Kind: nt.Kind, Queue: nt.Queue, Priority: nt.Priority, UniqueKey: nt.UniqueKey,
		TTLSeconds: int64(nt.TTL / time.Second), MaxAttempts: nt.MaxAttempts, Lock: nt.Lock, LockLimit: nt.LockLimit, Metadata: nt.Metadata,
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
		ins, err := r.InsertOne(ctx, nt)
		if err != nil {
			return nil, err
		}
		out[i] = ins
	}
	if len(plain) == 0 {
		return out, nil
	}
	// In batches of at most one request's body each: every batch is one
	// statement on the service, all or nothing; the batches are not.
	var batch []json.RawMessage
	var at []int // the index in nts of each of batch
	size := 2
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		var ts []task.Task
		if _, err := r.C.Do(ctx, http.MethodPost, "/api/tasks", nil, batch, &ts, nil); err != nil {
			return err
		}
		if len(ts) != len(batch) {
			return fmt.Errorf("POST /api/tasks: %d tasks sent, %d in the answer", len(batch), len(ts))
		}
		for j, i := range at {
			out[i] = taskstore.Inserted{Task: ts[j]}
		}
		batch, at, size = batch[:0], at[:0], 2
		return nil
	}
	for _, i := range plain {
		b, err := json.Marshal(bodyOf(nts[i]))
		if err != nil {
			return nil, fmt.Errorf("POST /api/tasks: encode the task: %w", err)
		}
		if size+len(b)+1 > MaxBodyBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		batch, at, size = append(batch, b), append(at, i), size+len(b)+1
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// MaxBodyBytes is the most a request body of the REST API may hold.
const MaxBodyBytes = 1 << 20

// InsertOne posts one task; Duplicate says that nothing was inserted, as
// a task of its kind holds its unique key (the task returned).
func (r Tasks) InsertOne(ctx context.Context, nt taskstore.NewTask) (taskstore.Inserted, error) {
	var t task.Task
	status, err := r.C.Do(ctx, http.MethodPost, "/api/tasks", nil, bodyOf(nt), &t, nil)
	if err != nil {
		return taskstore.Inserted{}, err
	}
	return taskstore.Inserted{Task: t, Duplicate: status == http.StatusOK}, nil
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
	body := map[string]string{}
	if reason != "" { // else the service's default reason
		body["reason"] = reason
	}
	_, err := r.C.Do(ctx, http.MethodPost, taskPath(id, "cancel"), nil, body, &t,
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
func (r Tasks) Claim(ctx context.Context, processor string, queues, kinds []string, wait time.Duration) (task.Task, bool, error) {
	body := struct {
		Processor   string   `json:"processor"`
		Kinds       []string `json:"kinds"`
		Queues      []string `json:"queues"`
		WaitSeconds int64    `json:"wait_seconds,omitempty"`
	}{processor, kinds, queues, int64(wait / time.Second)}
	var t task.Task
	status, err := r.C.Waiting(wait).Do(ctx, http.MethodPost, "/api/tasks/next", nil, body, &t, nil)
	if err != nil || status == http.StatusNoContent {
		return task.Task{}, false, err
	}
	return t, true, nil
}

// HeldBy pages GET /api/tasks?state=running&queue=… for the tasks of queues held by one of
// processors.
func (r Tasks) HeldBy(ctx context.Context, queues, processors []string) ([]task.Task, error) {
	var held []task.Task
	for _, queue := range queues {
		err := r.List(ctx, ListFilter{State: task.StateRunning, Queue: queue, Limit: MaxListLimit}, func(ts []task.Task) {
			for _, t := range ts {
				if slices.Contains(processors, t.Processor) {
					held = append(held, t)
				}
			}
		})
		if err != nil {
			return held, err
		}
	}
	return held, nil
}

// ListFilter narrows GET /api/tasks: a state, a kind, a queue (empty: any),
// the tasks after an id; Limit tasks a page (0: the service's default,
// 100; at most MaxListLimit).
type ListFilter struct {
	State, Kind, Queue string
	AfterID            int64
	Limit              int
}

// MaxListLimit is the most tasks GET /api/tasks answers in one page.
const MaxListLimit = 1000

func (f ListFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"state": f.State, "kind": f.Kind, "queue": f.Queue} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.AfterID > 0 {
		q.Set("after_id", strconv.FormatInt(f.AfterID, 10))
	}
	return q
}

// Page reads one page of the tasks f selects, oldest id first, and the
// answer as it came (for a caller that prints the API's own JSON).
func (r Tasks) Page(ctx context.Context, f ListFilter) ([]task.Task, json.RawMessage, error) {
	var raw json.RawMessage
	if _, err := r.C.Do(ctx, http.MethodGet, "/api/tasks", f.query(), nil, &raw, nil); err != nil {
		return nil, nil, err
	}
	var ts []task.Task
	if err := json.Unmarshal(raw, &ts); err != nil {
		return nil, nil, fmt.Errorf("GET /api/tasks: the answer is not a list of tasks: %w", err)
	}
	return ts, raw, nil
}

// List calls page with every page of the tasks f selects, from f.AfterID
// on, until one comes empty (a page may end short of its limit when its
// tasks are large: the service bounds a page's size).
func (r Tasks) List(ctx context.Context, f ListFilter, page func([]task.Task)) error {
	for {
		ts, _, err := r.Page(ctx, f)
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			return nil
		}
		page(ts)
		f.AfterID = ts[len(ts)-1].ID
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

// waitRequest is how long one GET of Wait is held on the service.
const waitRequest = 30 * time.Second

// Wait returns the task once it is done, dead or cancelled: it long-polls
// GET /api/tasks/{id}?wait_seconds=30, held by the service until the task
// finishes (woken by NOTIFY), again and again until it has, or until ctx
// ends (ctx's error, with the task as last read).
func (r Tasks) Wait(ctx context.Context, id int64) (task.Task, error) {
	q := url.Values{"wait_seconds": {strconv.Itoa(int(waitRequest / time.Second))}}
	for {
		var t task.Task
		sent := time.Now()
		_, err := r.C.Waiting(waitRequest).Do(ctx, http.MethodGet, taskPath(id, ""), q, nil, &t, func(status int, _ ErrorBody) error {
			if status == http.StatusNotFound {
				return task.ErrNotFound
			}
			return nil
		})
		switch {
		case err != nil && ctx.Err() != nil:
			return t, context.Cause(ctx)
		case err != nil:
			return t, err
		case t.State == task.StateDone || t.State == task.StateDead || t.State == task.StateCancelled:
			return t, nil
		}
		// Answered early and unfinished (a replica that shuts down, or one
		// that does not hold the request): not asked again in a loop.
		if early := time.Second - time.Since(sent); early > 0 {
			timer := time.NewTimer(early)
			select {
			case <-ctx.Done():
				timer.Stop()
				return t, context.Cause(ctx)
			case <-timer.C:
			}
		}
	}
}

// PauseQueue pauses a queue (PUT /api/queues/{queue}/pause); a zero until:
// until resumed.
func (r Tasks) PauseQueue(ctx context.Context, queue string, until time.Time, reason string) (task.QueuePause, error) {
	body := struct {
		Until  string `json:"until,omitempty"`
		Reason string `json:"reason,omitempty"`
	}{Reason: reason}
	if !until.IsZero() {
		body.Until = until.UTC().Format(time.RFC3339Nano)
	}
	var p task.QueuePause
	_, err := r.C.Do(ctx, http.MethodPut, "/api/queues/"+url.PathEscape(queue)+"/pause", nil, body, &p, nil)
	return p, err
}

// ResumeQueue resumes a paused queue (DELETE /api/queues/{queue}/pause);
// false when it was not paused.
func (r Tasks) ResumeQueue(ctx context.Context, queue string) (bool, error) {
	notPaused := false
	_, err := r.C.Do(ctx, http.MethodDelete, "/api/queues/"+url.PathEscape(queue)+"/pause", nil, nil, nil,
		func(status int, _ ErrorBody) error {
			if status == http.StatusNotFound {
				notPaused = true
				return errNotPaused
			}
			return nil
		})
	if notPaused {
		return false, nil
	}
	return err == nil, err
}

// errNotPaused is the 404 of a resume, which ResumeQueue answers false.
var errNotPaused = errors.New("the queue is not paused")

// PausedQueues lists the paused queues (GET /api/queues/paused).
func (r Tasks) PausedQueues(ctx context.Context) ([]task.QueuePause, error) {
	var ps []task.QueuePause
	_, err := r.C.Do(ctx, http.MethodGet, "/api/queues/paused", nil, nil, &ps, nil)
	return ps, err
}
