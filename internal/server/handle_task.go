package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/task"
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
// T, refusing unknown fields.
func decodeValue[T any](raw []byte) (T, error) {
	var v T
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, decodeError(err)
	}
	return v, nil
}

// newTaskRequest is one task of POST /api/tasks.
type newTaskRequest struct {
	TaskData    json.RawMessage `json:"task_data"`
	ScheduledAt *string         `json:"scheduled_at"`
	MaxAttempts *int64          `json:"max_attempts"`
}

// scheduleMin and scheduleMax bound scheduled_at to what PostgreSQL stores
// and the API writes back as RFC 3339 (a four-digit year).
var (
	scheduleMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	scheduleMax = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// newTask checks the request and returns the task to insert.
func (q newTaskRequest) newTask() (task.NewTask, error) {
	// task_data is a JSON object, as in the contract: a worker reads named
	// fields from it (sleep_duration_seconds), and null or a bare value is
	// far more likely a client's mistake than a task.
	data := bytes.TrimSpace(q.TaskData)
	switch {
	case len(data) == 0:
		return task.NewTask{}, badRequestf(`"task_data" is required; send the task's input as a JSON object, e.g. {"task_data": {"sleep_duration_seconds": 5}}`)
	case data[0] != '{':
		return task.NewTask{}, badRequestf(`"task_data" must be a JSON object, not %s`, jsonKindOf(data))
	}
	if err := checkJSON(`"task_data"`, data, true); err != nil {
		return task.NewTask{}, err
	}
	nt := task.NewTask{TaskData: data}
	if q.ScheduledAt != nil {
		at, err := time.Parse(time.RFC3339Nano, *q.ScheduledAt)
		if err != nil {
			return task.NewTask{}, badRequestf(`"scheduled_at" %q is not an RFC 3339 time; send e.g. "2030-01-02T15:04:05Z" or "2030-01-02T15:04:05.000+01:00"`, *q.ScheduledAt)
		}
		at = at.UTC()
		if at.Before(scheduleMin) || at.After(scheduleMax) {
			return task.NewTask{}, badRequestf(`"scheduled_at" %q is out of range; it must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z`, *q.ScheduledAt)
		}
		nt.ScheduledAt = at
	}
	if q.MaxAttempts != nil {
		if *q.MaxAttempts < 1 || *q.MaxAttempts > maxAttemptsLimit {
			return task.NewTask{}, badRequestf(`"max_attempts" is %d; it must be between 1 and %d`, *q.MaxAttempts, maxAttemptsLimit)
		}
		nt.MaxAttempts = int32(*q.MaxAttempts)
	}
	return nt, nil
}

// handleTaskCreate serves POST /api/tasks: one task object (201 + task) or
// an array of 1 to 10000 of them (201 + the tasks, in the order sent),
// inserted in one statement, all or none.
func handleTaskCreate(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nts, batch, err := decodeNewTasks(w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		tasks, err := d.Tasks.Insert(r.Context(), nts)
		d.Metrics.taskOp("insert", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if !batch {
			encode(w, http.StatusCreated, tasks[0])
			return
		}
		encode(w, http.StatusCreated, tasks)
	})
}

// decodeNewTasks reads the body of POST /api/tasks (see parseNewTasks).
func decodeNewTasks(w http.ResponseWriter, r *http.Request) ([]task.NewTask, bool, error) {
	body, err := readBody(w, r)
	if err != nil {
		return nil, false, err
	}
	return parseNewTasks(body)
}

// parseNewTasks parses the body of POST /api/tasks: one task object, or an
// array of 1 to maxTasksPerRequest of them (batch). Every error it returns
// is a *badRequest.
func parseNewTasks(body []byte) (nts []task.NewTask, batch bool, err error) {
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
		return []task.NewTask{nt}, false, err
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(value, &items); err != nil {
			return nil, true, decodeError(err)
		}
		if len(items) == 0 || len(items) > maxTasksPerRequest {
			return nil, true, badRequestf("the array has %d tasks; send 1 to %d tasks per request", len(items), maxTasksPerRequest)
		}
		nts = make([]task.NewTask, len(items))
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

type claimRequest struct {
	Processor string `json:"processor"`
}

func (q claimRequest) validate() error { return checkName("processor", q.Processor) }

// handleTaskClaim serves POST /api/tasks/next: 200 and the task claimed
// under a new lease of Deps.TaskTTL, or 204 when none is ready.
func handleTaskClaim(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[claimRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		tasks, err := d.Tasks.Claim(r.Context(), []string{req.Processor}, d.TaskTTL)
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
		encode(w, http.StatusOK, tasks[0])
	})
}

// heartbeatRequest is the body of PUT /api/tasks/{id}/heartbeat; complete
// and fail add to the same two fields. (Not embedded: encoding/json would
// name a field of an embedded struct "heartbeatRequest.fence" in errors.)
type heartbeatRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence"`
}

func (q heartbeatRequest) validate() error { return checkProcessorFence(q.Processor, q.Fence) }

func checkProcessorFence(processor string, fence *int64) error {
	if err := checkName("processor", processor); err != nil {
		return err
	}
	return checkFence(fence)
}

type completeRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence"`
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
	return checkJSON(`"task_output"`, q.TaskOutput, true)
}

type failRequest struct {
	Processor string `json:"processor"`
	Fence     *int64 `json:"fence"`
	Error     string `json:"error"`
}

func (q failRequest) validate() error {
	if err := checkProcessorFence(q.Processor, q.Fence); err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(q.Error) == "":
		return badRequestf(`"error" is required and must not be blank; say why the attempt failed`)
	case len(q.Error) > maxErrorBytes:
		return badRequestf(`"error" is %d bytes long; the limit is %d bytes`, len(q.Error), maxErrorBytes)
	case strings.ContainsRune(q.Error, 0):
		// PostgreSQL text cannot hold NUL; other control characters
		// (newlines in a stack trace) are fine.
		return badRequestf(`"error" contains a NUL character; remove it`)
	}
	return nil
}

// handleTaskLeaseOp serves PUT /api/tasks/{id}/heartbeat, /complete and
// /fail: decode a T, then op under the task's compare-and-set. 202 with the
// task; 409 when the caller no longer holds it; 404 for an unknown id.
func handleTaskLeaseOp[T validator](d Deps, name string, op func(r *http.Request, id int64, req T) (task.Task, error)) http.Handler {
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
		t, err := op(r, id, req)
		d.Metrics.taskOp(name, err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusAccepted, t)
	})
}

func handleTaskHeartbeat(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "heartbeat", func(r *http.Request, id int64, q heartbeatRequest) (task.Task, error) {
		return d.Tasks.Heartbeat(r.Context(), id, q.Processor, deref(q.Fence))
	})
}

func handleTaskComplete(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "complete", func(r *http.Request, id int64, q completeRequest) (task.Task, error) {
		return d.Tasks.Complete(r.Context(), id, q.Processor, deref(q.Fence), q.TaskOutput)
	})
}

func handleTaskFail(d Deps) http.Handler {
	return handleTaskLeaseOp(d, "fail", func(r *http.Request, id int64, q failRequest) (task.Task, error) {
		return d.Tasks.Fail(r.Context(), id, q.Processor, deref(q.Fence), q.Error)
	})
}

func handleTaskGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		t, err := d.Tasks.Get(r.Context(), id)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, t)
	})
}

// taskListParams reads ?limit= (default 100, at most 1000) and ?after_id=
// of a task list.
func taskListParams(q url.Values) (afterID int64, limit int32, err error) {
	l, err := queryInt(q, "limit", defaultTaskLimit, 1, maxTaskLimit)
	if err != nil {
		return 0, 0, err
	}
	afterID, err = queryInt(q, "after_id", 0, 0, 1<<62)
	if err != nil {
		return 0, 0, err
	}
	return afterID, int32(l), nil
}

// handleTaskList serves a task list: ?limit= tasks with ids after
// ?after_id=, oldest first.
func handleTaskList(d Deps, filter string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		after, limit, err := taskListParams(r.URL.Query())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		tasks, err := d.Tasks.List(r.Context(), filter, after, limit)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, tasks)
	})
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

// checkJSON refuses what PostgreSQL's jsonb and text refuse in valid JSON:
// the escape \u0000 and unpaired UTF-16 surrogate escapes in strings and,
// with numbers, numbers outside numeric's range. Without it they would be
// a 500 (or, in a Go string, a silent U+FFFD). raw must be valid JSON.
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
