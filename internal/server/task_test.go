package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"

	"github.com/leasehold/leasehold/internal/server"
)

func withTaskTTL(ttl time.Duration) option { return func(d *server.Deps) { d.TaskTTL = ttl } }

// taskJSON is the REST API's task object, with its timestamps as sent
// (created_at and earlier_attempts are the task package's
// additions).
type taskJSON struct {
	ID                  int64             `json:"id"`
	Kind                string            `json:"kind"`
	Queue               string            `json:"queue"`
	Priority            int               `json:"priority"`
	TaskData            json.RawMessage   `json:"task_data"`
	State               string            `json:"state"`
	UniqueKey           *string           `json:"unique_key"`
	ScheduledAt         string            `json:"scheduled_at"`
	Processor           *string           `json:"processor"`
	Fence               *int64            `json:"fence"`
	TTLSeconds          *int              `json:"ttl_seconds"`
	Attempts            int               `json:"attempts"`
	MaxAttempts         int               `json:"max_attempts"`
	LastHeartbeatAt     *string           `json:"last_heartbeat_at"`
	MustHeartbeatBefore *string           `json:"must_heartbeat_before"`
	StartedAt           *string           `json:"started_at"`
	ProcessedAt         *string           `json:"processed_at"`
	TaskOutput          json.RawMessage   `json:"task_output"`
	LastError           *string           `json:"last_error"`
	CreatedAt           string            `json:"created_at"`
	Lock                *string           `json:"lock"`
	Schedule            *string           `json:"schedule"`
	ScheduleTick        *string           `json:"schedule_tick"`
	EarlierAttempts     []attemptJSON     `json:"earlier_attempts"`
	Metadata            map[string]string `json:"metadata"`
}

// attemptJSON is an entry of a task's earlier_attempts, as sent.
type attemptJSON struct {
	Processor string  `json:"processor"`
	Fence     int64   `json:"fence"`
	StartedAt string  `json:"started_at"`
	ExpiresAt string  `json:"expires_at"`
	EndedAt   string  `json:"ended_at"`
	Outcome   string  `json:"outcome"`
	Error     *string `json:"error"`
}

func (tk taskJSON) String() string {
	b, _ := json.Marshal(tk)
	return string(b)
}

// fence returns the task's fence, failing the test when it has none.
func (tk taskJSON) fence(t *testing.T) int64 {
	t.Helper()
	if tk.Fence == nil {
		t.Fatalf("task %v has no fence", tk)
	}
	return *tk.Fence
}

// checkTask checks the task's timestamps and that its fields hang together.
func checkTask(t *testing.T, tk taskJSON) {
	t.Helper()
	parseTime(t, "created_at", tk.CreatedAt)
	parseTime(t, "scheduled_at", tk.ScheduledAt)
	for name, p := range map[string]*string{
		"last_heartbeat_at": tk.LastHeartbeatAt, "must_heartbeat_before": tk.MustHeartbeatBefore,
		"started_at": tk.StartedAt, "processed_at": tk.ProcessedAt,
	} {
		if p != nil {
			parseTime(t, name, *p)
		}
	}
	if tk.EarlierAttempts == nil {
		t.Errorf("task %v: earlier_attempts missing or null, want a list ([] when none)", tk)
	}
	for i, a := range tk.EarlierAttempts {
		started := parseTime(t, fmt.Sprintf("earlier_attempts[%d].started_at", i), a.StartedAt)
		parseTime(t, fmt.Sprintf("earlier_attempts[%d].expires_at", i), a.ExpiresAt)
		ended := parseTime(t, fmt.Sprintf("earlier_attempts[%d].ended_at", i), a.EndedAt)
		if a.Processor == "" || a.Fence < 1 || ended.Before(started) || !slices.Contains(
			[]string{task.OutcomeExpired, task.OutcomeFailed, task.OutcomeRequeued, task.OutcomeSnoozed, task.OutcomeCancelled}, a.Outcome) {
			t.Errorf("task %d: earlier_attempts[%d] %+v, want a processor, a fence, an end after its start and a known outcome", tk.ID, i, a)
		}
	}
	if tk.ID < 1 || tk.MaxAttempts < 1 || tk.MaxAttempts > 100 || tk.Attempts < 0 || tk.Attempts > tk.MaxAttempts {
		t.Errorf("task %v: want a positive id, max_attempts in 1..100, attempts in 0..max_attempts", tk)
	}
	if len(tk.TaskData) == 0 || tk.TaskData[0] != '{' {
		t.Errorf("task %d: task_data %s, want an object", tk.ID, tk.TaskData)
	}
	if tk.State != "done" && string(tk.TaskOutput) != "null" {
		t.Errorf("task %d is %s with task_output %s, want null", tk.ID, tk.State, tk.TaskOutput)
	}
	switch tk.State {
	case "pending":
		if tk.ProcessedAt != nil || tk.MustHeartbeatBefore != nil {
			t.Errorf("pending task %v: want processed_at and must_heartbeat_before null", tk)
		}
	case "running":
		if tk.Processor == nil || tk.Fence == nil || tk.StartedAt == nil || tk.LastHeartbeatAt == nil ||
			tk.MustHeartbeatBefore == nil || tk.ProcessedAt != nil || tk.Attempts < 1 {
			t.Errorf("running task %v: want processor, fence, started_at, last_heartbeat_at, must_heartbeat_before, attempts ≥ 1, and no processed_at", tk)
		}
	case "done":
		// The completion ended the attempt's lease, which lives in the
		// task's row: the task keeps its holder, fence and the expiry it had
		// then, which was after the completion.
		if tk.Processor == nil || tk.Fence == nil || tk.StartedAt == nil || tk.ProcessedAt == nil || tk.MustHeartbeatBefore == nil || tk.Attempts < 1 {
			t.Errorf("done task %v: want processor, fence, started_at, processed_at, must_heartbeat_before and attempts ≥ 1", tk)
		} else if parseTime(t, "must_heartbeat_before", *tk.MustHeartbeatBefore).Before(parseTime(t, "processed_at", *tk.ProcessedAt)) {
			t.Errorf("done task %v: must_heartbeat_before before processed_at, want it completed within its lease", tk)
		}
	case "dead":
		// A failure, or the reaper, ends the lease (must_heartbeat_before
		// null); a claim that buries a task keeps the expiry that lapsed.
		if tk.ProcessedAt == nil {
			t.Errorf("dead task %v: want processed_at", tk)
		} else if tk.MustHeartbeatBefore != nil && parseTime(t, "must_heartbeat_before", *tk.MustHeartbeatBefore).After(parseTime(t, "processed_at", *tk.ProcessedAt)) {
			t.Errorf("dead task %v: must_heartbeat_before after processed_at, want null or the expiry that lapsed", tk)
		}
	case "cancelled":
		if tk.ProcessedAt == nil || tk.LastError == nil {
			t.Errorf("cancelled task %v: want processed_at and the reason as last_error", tk)
		}
	default:
		t.Errorf("task %d: state %q, want pending, running, done, dead or cancelled", tk.ID, tk.State)
	}
}

func (r response) task(t *testing.T, what string) taskJSON {
	t.Helper()
	tk := decodeStrict[taskJSON](t, what, r)
	checkTask(t, tk)
	return tk
}

func (r response) tasks(t *testing.T, what string) []taskJSON {
	t.Helper()
	ts := decodeStrict[[]taskJSON](t, what, r)
	if ts == nil {
		t.Errorf("%s: got %s, want a JSON array (not null)", what, r)
	}
	for _, tk := range ts {
		checkTask(t, tk)
	}
	return ts
}

func (b bundle) createTask(t *testing.T, body string) taskJSON {
	t.Helper()
	what := "POST /api/tasks " + body
	return b.do(t, "POST", "/api/tasks", body).want(t, what, http.StatusCreated).task(t, what)
}

func (b bundle) claimTask(t *testing.T, processor string) taskJSON {
	t.Helper()
	what := "claim by " + processor
	return b.do(t, "POST", "/api/tasks/next", jsonBody(t, obj{"processor": processor})).want(t, what, http.StatusOK).task(t, what)
}

func (b bundle) getTask(t *testing.T, id int64) taskJSON {
	t.Helper()
	path := fmt.Sprintf("/api/tasks/%d", id)
	return b.do(t, "GET", path, "").want(t, path, http.StatusOK).task(t, path)
}

// taskOp sends PUT /api/tasks/{id}/{op} with body.
func (b bundle) taskOp(t *testing.T, id int64, op string, body obj) response {
	t.Helper()
	return b.do(t, "PUT", fmt.Sprintf("/api/tasks/%d/%s", id, op), jsonBody(t, body))
}

// sqlExec runs test setup that stands in for waiting (a lease running out,
// a backoff passing).
func (b bundle) sqlExec(t *testing.T, sql string, args ...any) {
	t.Helper()
	tag, err := b.db.Pool.Exec(t.Context(), sql, args...)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("%s %v: %v (%d rows)", sql, args, err, tag.RowsAffected())
	}
}

// expireTaskLease moves the task's lease expiry into the past. The lease
// lives in the task's row (schema/0009).
func (b bundle) expireTaskLease(t *testing.T, id int64) {
	t.Helper()
	b.sqlExec(t, `UPDATE tasks SET must_heartbeat_before = now() - interval '1 second', started_at = now() - interval '2 seconds' WHERE id = $1`, id)
}

// earlierAttempts returns the task's attempts that ended otherwise than
// by its completion, as the database keeps them (the API shows them as
// earlier_attempts).
func (b bundle) earlierAttempts(t *testing.T, id int64) []task.Attempt {
	t.Helper()
	var raw []byte
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT earlier_attempts FROM tasks WHERE id = $1`, id).Scan(&raw); err != nil {
		t.Fatalf("earlier attempts of task %d: %v", id, err)
	}
	var as []task.Attempt
	if err := json.Unmarshal(raw, &as); err != nil {
		t.Fatalf("earlier attempts of task %d: %s: %v", id, raw, err)
	}
	return as
}

// wantNoTaskLeaseRows checks that the task's lease shows nowhere in the
// lease API: it lives in the task's row, not in a lease task:<id>, and
// writes no lease history.
func (b bundle) wantNoTaskLeaseRows(t *testing.T, what string, id int64) {
	t.Helper()
	r := b.do(t, "GET", "/api/leases?prefix=task:", "").want(t, what+": GET /api/leases?prefix=task:", http.StatusOK)
	list := decodeStrict[struct {
		Instance json.RawMessage `json:"instance"`
		Leases   []leaseJSON     `json:"leases"`
	}](t, what, r)
	if len(list.Leases) != 0 {
		t.Errorf("%s: task leases %v, want none: a task's lease lives in its row", what, list.Leases)
	}
	path := "/api/leases/events?resource=" + taskstore.LeaseResource(id)
	if events := decodeStrict[[]eventJSON](t, what, b.do(t, "GET", path, "").want(t, what+": GET "+path, http.StatusOK)); len(events) != 0 {
		t.Errorf("%s: lease events of %s %v, want none", what, taskstore.LeaseResource(id), events)
	}
}

// jsonEqual reports whether a and b are the same JSON value (jsonb
// reorders keys and drops whitespace).
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func wantConflict(t *testing.T, what string, r response) {
	t.Helper()
	r.want(t, what, http.StatusConflict)
	if body := checkError(t, what, r); body["lease"] != nil {
		t.Errorf("%s: a task 409 has only \"error\", got %s", what, r.body)
	}
}

func TestTaskLifecycle(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// Nothing to claim yet: 204 and no body.
	r := b.do(t, "POST", "/api/tasks/next", `{"processor":"replica-a/w1"}`).want(t, "claim from an empty queue", http.StatusNoContent)
	if len(r.body) != 0 {
		t.Errorf("204: got body %q, want none", r.body)
	}

	created := b.createTask(t, `{"task_data": {"sleep_duration_seconds": 5, "tags": ["a", "b"]}}`)
	if created.State != "pending" || created.Attempts != 0 || created.MaxAttempts != 5 || created.Processor != nil ||
		created.Fence != nil || created.StartedAt != nil || created.LastError != nil {
		t.Errorf("created task %v: want pending, 0 of 5 attempts, no processor, fence, started_at or last_error", created)
	}
	if !jsonEqual(t, created.TaskData, []byte(`{"sleep_duration_seconds": 5, "tags": ["a", "b"]}`)) {
		t.Errorf("created task_data %s, want the one sent", created.TaskData)
	}
	if created.ScheduledAt != created.CreatedAt {
		t.Errorf("created task without scheduled_at: scheduled_at %s, want created_at %s", created.ScheduledAt, created.CreatedAt)
	}
	if got := b.getTask(t, created.ID); got.String() != created.String() {
		t.Errorf("GET after create: got %v, want %v", got, created)
	}

	// Claim: running, this processor, a fence, the lease with the default
	// TTL, all in the task's row.
	claimed := b.claimTask(t, "replica-a/w1")
	if claimed.ID != created.ID || claimed.State != "running" || *claimed.Processor != "replica-a/w1" || claimed.Attempts != 1 {
		t.Fatalf("claimed %v: want task %d running for replica-a/w1, attempt 1", claimed, created.ID)
	}
	hb := parseTime(t, "last_heartbeat_at", *claimed.LastHeartbeatAt)
	if got := parseTime(t, "must_heartbeat_before", *claimed.MustHeartbeatBefore).Sub(hb); got != 30*time.Second {
		t.Errorf("claim: must_heartbeat_before - last_heartbeat_at = %v, want the default TTL 30s", got)
	}
	if claimed.fence(t) < 1 || parseTime(t, "started_at", *claimed.StartedAt) != hb {
		t.Errorf("claimed %v: want a fence, and started_at the claim's last_heartbeat_at", claimed)
	}
	b.wantNoTaskLeaseRows(t, "after claim", claimed.ID)
	b.do(t, "POST", "/api/tasks/next", `{"processor":"replica-b/w1"}`).want(t, "claim with the only task running", http.StatusNoContent)

	// Heartbeat: 202, the lease renewed; with or without the fence.
	fence := claimed.fence(t)
	beat := b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-a/w1", "fence": fence}).want(t, "heartbeat", http.StatusAccepted).task(t, "heartbeat")
	if beat.State != "running" || beat.fence(t) != fence || beat.Attempts != 1 {
		t.Errorf("heartbeat: got %v, want running with fence %d, attempt 1", beat, fence)
	}
	beatAt := parseTime(t, "last_heartbeat_at", *beat.LastHeartbeatAt)
	if beatAt.Before(hb) || parseTime(t, "must_heartbeat_before", *beat.MustHeartbeatBefore).Sub(beatAt) != 30*time.Second {
		t.Errorf("heartbeat: last_heartbeat_at %s, must_heartbeat_before %s; want the lease renewed for 30s from now", *beat.LastHeartbeatAt, *beat.MustHeartbeatBefore)
	}
	lastBeat := b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-a/w1"}).
		want(t, "heartbeat without a fence", http.StatusAccepted).task(t, "heartbeat without a fence")

	// The compare-and-set refuses anyone else, and knows unknown ids.
	wantConflict(t, "heartbeat by another processor", b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-b/w1"}))
	wantConflict(t, "heartbeat with another fence", b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-a/w1", "fence": fence + 1}))
	wantConflict(t, "complete by another processor", b.taskOp(t, claimed.ID, "complete", obj{"processor": "replica-b/w1", "task_output": 1}))
	wantConflict(t, "complete with another fence", b.taskOp(t, claimed.ID, "complete", obj{"processor": "replica-a/w1", "fence": fence + 1, "task_output": 1}))
	wantConflict(t, "fail by another processor", b.taskOp(t, claimed.ID, "fail", obj{"processor": "replica-b/w1", "error": "x"}))
	for op, body := range map[string]obj{
		"heartbeat": {"processor": "replica-a/w1"},
		"complete":  {"processor": "replica-a/w1", "task_output": nil},
		"fail":      {"processor": "replica-a/w1", "error": "x"},
	} {
		r := b.taskOp(t, 999999, op, body).want(t, op+" of an unknown task", http.StatusNotFound)
		checkError(t, op+" of an unknown task", r)
	}
	if got := b.getTask(t, claimed.ID); got.State != "running" || *got.Processor != "replica-a/w1" || got.fence(t) != fence || got.Attempts != 1 {
		t.Errorf("after refused requests: got %v, want it running for replica-a/w1 as before", got)
	}

	// Complete: done, with the output, its lease ended (the task keeps the
	// expiry of the last heartbeat); at most once.
	done := b.taskOp(t, claimed.ID, "complete", obj{"processor": "replica-a/w1", "fence": fence, "task_output": obj{"slept": 5, "ok": true}}).
		want(t, "complete", http.StatusAccepted).task(t, "complete")
	if done.State != "done" || done.fence(t) != fence || !jsonEqual(t, done.TaskOutput, []byte(`{"slept": 5, "ok": true}`)) || done.ProcessedAt == nil {
		t.Errorf("complete: got %v, want done with the output and processed_at", done)
	}
	if *done.Processor != "replica-a/w1" || done.Attempts != 1 || *done.MustHeartbeatBefore != *lastBeat.MustHeartbeatBefore {
		t.Errorf("complete: got %v, want replica-a/w1's attempt 1 with must_heartbeat_before %s, the last heartbeat's", done, *lastBeat.MustHeartbeatBefore)
	}
	if got := b.getTask(t, claimed.ID); got.String() != done.String() {
		t.Errorf("GET after complete: got %v, want %v", got, done)
	}
	wantConflict(t, "second complete", b.taskOp(t, claimed.ID, "complete", obj{"processor": "replica-a/w1", "fence": fence, "task_output": 2}))
	wantConflict(t, "heartbeat after complete", b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-a/w1", "fence": fence}))
	wantConflict(t, "fail after complete", b.taskOp(t, claimed.ID, "fail", obj{"processor": "replica-a/w1", "fence": fence, "error": "late"}))
	if got := b.getTask(t, claimed.ID); got.String() != done.String() {
		t.Errorf("GET after the refused second complete: got %v, want %v", got, done)
	}
	if hist := b.earlierAttempts(t, claimed.ID); len(hist) != 0 {
		t.Errorf("after complete: earlier attempts %+v, want none: the one attempt completed", hist)
	}
	b.wantNoTaskLeaseRows(t, "after complete", claimed.ID)
	b.do(t, "POST", "/api/tasks/next", `{"processor":"replica-b/w1"}`).want(t, "claim after complete", http.StatusNoContent)

	// task_output may be null, but must be sent.
	b.createTask(t, `{"task_data": {}}`)
	next := b.claimTask(t, "replica-b/w1")
	nullOut := b.taskOp(t, next.ID, "complete", obj{"processor": "replica-b/w1", "task_output": nil}).want(t, "complete with null output", http.StatusAccepted).task(t, "complete with null output")
	if nullOut.State != "done" || string(nullOut.TaskOutput) != "null" {
		t.Errorf("complete with task_output null: got %v, want done with null output", nullOut)
	}

	metrics := string(b.do(t, "GET", "/metrics", "").want(t, "GET /metrics", http.StatusOK).body)
	for _, want := range []string{
		`leasehold_task_operations_total{op="claim",outcome="empty"} 3`,
		`leasehold_task_operations_total{op="claim",outcome="ok"} 2`,
		`leasehold_task_operations_total{op="complete",outcome="lease_lost"} 3`,
		`leasehold_task_operations_total{op="heartbeat",outcome="not_found"} 1`,
		`leasehold_task_operations_total{op="insert",outcome="ok"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("GET /metrics: no line %q in\n%s", want, grep(metrics, "leasehold_task_"))
		}
	}
}

func TestTaskFailRetriesThenDies(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	created := b.createTask(t, `{"task_data": {"n": 1}, "max_attempts": 2}`)
	if created.MaxAttempts != 2 {
		t.Fatalf("created %v: want max_attempts 2", created)
	}

	// Attempt 1 fails: back to pending, due after a backoff of 1s × [0.5, 1).
	first := b.claimTask(t, "p")
	failed := b.taskOp(t, first.ID, "fail", obj{"processor": "p", "fence": first.fence(t), "error": "boom\nat line 3"}).
		want(t, "fail attempt 1", http.StatusAccepted).task(t, "fail attempt 1")
	if failed.State != "pending" || failed.Attempts != 1 || failed.LastError == nil || *failed.LastError != "boom\nat line 3" || failed.ProcessedAt != nil {
		t.Errorf("fail attempt 1: got %v, want pending, attempts 1, last_error the one sent, no processed_at", failed)
	}
	// The failure ended the attempt's lease and went to the task's history;
	// the backoff runs from it (both by the database clock).
	hist := b.earlierAttempts(t, first.ID)
	if len(hist) != 1 || hist[0].Processor != "p" || hist[0].Fence != first.fence(t) || hist[0].Outcome != task.OutcomeFailed ||
		apitime.Format(hist[0].ExpiresAt) != *first.MustHeartbeatBefore {
		t.Fatalf("after fail: earlier attempts %+v, want p's attempt with fence %d, failed, its lease expiring at %s", hist, first.fence(t), *first.MustHeartbeatBefore)
	}
	backoff := parseTime(t, "scheduled_at", failed.ScheduledAt).Sub(hist[0].EndedAt)
	if backoff < 499*time.Millisecond || backoff > time.Second { // 1ms for the rounding to milliseconds
		t.Errorf("fail attempt 1: scheduled_at %s is %v after the failure at %s, want 0.5s to 1s", failed.ScheduledAt, backoff, hist[0].EndedAt)
	}
	wantConflict(t, "second fail of the same attempt", b.taskOp(t, first.ID, "fail", obj{"processor": "p", "fence": first.fence(t), "error": "again"}))

	// Attempt 2, by the same processor: a new fence, and the old one is refused.
	b.sqlExec(t, `UPDATE tasks SET scheduled_at = now() WHERE id = $1`, first.ID)
	second := b.claimTask(t, "p")
	if second.ID != first.ID || second.Attempts != 2 || second.fence(t) <= first.fence(t) {
		t.Fatalf("claim attempt 2: got %v, want task %d, attempts 2, fence > %d", second, first.ID, first.fence(t))
	}
	old := obj{"processor": "p", "fence": first.fence(t)}
	wantConflict(t, "heartbeat with the stale fence", b.taskOp(t, first.ID, "heartbeat", old))
	wantConflict(t, "complete with the stale fence", b.taskOp(t, first.ID, "complete", obj{"processor": "p", "fence": first.fence(t), "task_output": 1}))
	wantConflict(t, "fail with the stale fence", b.taskOp(t, first.ID, "fail", obj{"processor": "p", "fence": first.fence(t), "error": "x"}))

	// Attempt 2 fails too: dead, for good.
	dead := b.taskOp(t, first.ID, "fail", obj{"processor": "p", "fence": second.fence(t), "error": "boom again"}).
		want(t, "fail attempt 2", http.StatusAccepted).task(t, "fail attempt 2")
	if dead.State != "dead" || dead.Attempts != 2 || dead.ProcessedAt == nil || *dead.LastError != "boom again" {
		t.Errorf("fail of the last attempt: got %v, want dead after 2 attempts, processed_at, last_error", dead)
	}
	b.sqlExec(t, `UPDATE tasks SET scheduled_at = now() - interval '1 hour' WHERE id = $1`, first.ID)
	b.do(t, "POST", "/api/tasks/next", `{"processor":"p"}`).want(t, "claim with the task dead", http.StatusNoContent)
	wantConflict(t, "fail after dead", b.taskOp(t, first.ID, "fail", obj{"processor": "p", "fence": second.fence(t), "error": "x"}))
	wantConflict(t, "complete after dead", b.taskOp(t, first.ID, "complete", obj{"processor": "p", "task_output": 1}))
	if got := b.getTask(t, first.ID); got.State != "dead" || got.ProcessedAt == nil || *got.ProcessedAt != *dead.ProcessedAt || got.MustHeartbeatBefore != nil {
		t.Errorf("GET after dead: got %v, want dead as failed, its lease ended", got)
	}
	hist = b.earlierAttempts(t, first.ID)
	if len(hist) != 2 || hist[1].Fence != second.fence(t) || hist[1].Outcome != task.OutcomeFailed {
		t.Errorf("after the last fail: earlier attempts %+v, want attempt 1 and then attempt 2 with fence %d, failed", hist, second.fence(t))
	}
	b.wantNoTaskLeaseRows(t, "after dead", first.ID)
}

// TestTaskHistoryOnTheWire follows a task's earlier_attempts through the
// API: none at first ([], not null), the failed attempt with its error once
// it is dead, kept by the retry and by the next claim (whose attempt is the
// task's own processor and fence, not yet history), and the cancelled one
// with its reason; in GET /api/tasks/{id} and in the lists alike.
func TestTaskHistoryOnTheWire(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	created := b.createTask(t, `{"task_data": {"n": 1}, "kind": "report.render", "max_attempts": 1}`)
	if len(created.EarlierAttempts) != 0 {
		t.Errorf("created task: earlier_attempts %+v, want []", created.EarlierAttempts)
	}
	path := fmt.Sprintf("/api/tasks/%d", created.ID)
	if raw := b.do(t, "GET", path, "").want(t, path, http.StatusOK); !bytes.Contains(raw.body, []byte(`"earlier_attempts":[]`)) {
		t.Errorf("GET %s of a task never claimed: %s, want \"earlier_attempts\":[]", path, raw.body)
	}

	first := b.claimTask(t, "p1")
	const reason = "disk full\nat /var/spool"
	dead := b.taskOp(t, first.ID, "fail", obj{"processor": "p1", "fence": first.fence(t), "error": reason}).
		want(t, "fail", http.StatusAccepted).task(t, "fail")
	if dead.State != "dead" {
		t.Fatalf("after the only attempt failed: %v, want dead", dead)
	}
	wantFailed := func(what string, tk taskJSON) {
		t.Helper()
		if len(tk.EarlierAttempts) < 1 {
			t.Fatalf("%s: earlier_attempts %+v, want the failed attempt first", what, tk.EarlierAttempts)
		}
		a := tk.EarlierAttempts[0]
		if a.Outcome != task.OutcomeFailed || a.Error == nil || *a.Error != reason || a.Processor != "p1" || a.Fence != first.fence(t) ||
			a.StartedAt != *first.StartedAt || a.ExpiresAt != *first.MustHeartbeatBefore {
			t.Errorf("%s: earlier_attempts[0] %+v, want p1's attempt under fence %d (started %s, lease until %s), failed with %q",
				what, a, first.fence(t), *first.StartedAt, *first.MustHeartbeatBefore, reason)
		}
	}
	wantFailed("the fail's answer", dead)
	wantFailed("GET of the dead task", b.getTask(t, first.ID))

	retried := b.do(t, "POST", path+"/retry", `{}`).want(t, "retry", http.StatusAccepted).task(t, "retry")
	if retried.State != "pending" || len(retried.EarlierAttempts) != 1 {
		t.Errorf("retried: %v, want pending with its one earlier attempt", retried)
	}
	wantFailed("the retry's answer", retried)
	got := b.getTask(t, first.ID)
	wantFailed("GET of the retried task", got)
	for _, list := range []string{"/api/tasks?kind=report.render", "/api/tasks?state=pending&kind=report.render&queue=default", "/api/tasks/started"} {
		ts := b.do(t, "GET", list, "").want(t, list, http.StatusOK).tasks(t, list)
		if len(ts) != 1 || ts[0].ID != first.ID {
			t.Fatalf("GET %s: %v, want task %d", list, ts, first.ID)
		}
		wantFailed("GET "+list, ts[0])
	}

	// The next attempt runs: it is the task's own, not yet history; then
	// cancelled, it joins the history with the reason.
	second := b.claimTask(t, "p2")
	if second.ID != first.ID || len(second.EarlierAttempts) != 1 || *second.Processor != "p2" {
		t.Fatalf("claim after the retry: %v, want task %d run by p2 with the one earlier attempt", second, first.ID)
	}
	cancelled := b.do(t, "POST", path+"/cancel", `{"reason": "no longer wanted"}`).want(t, "cancel", http.StatusAccepted).task(t, "cancel")
	wantFailed("the cancel's answer", cancelled)
	if len(cancelled.EarlierAttempts) != 2 {
		t.Fatalf("cancelled while running: earlier_attempts %+v, want the failed attempt and the cancelled one", cancelled.EarlierAttempts)
	}
	if a := cancelled.EarlierAttempts[1]; a.Outcome != task.OutcomeCancelled || a.Processor != "p2" || a.Fence != second.fence(t) ||
		a.Error == nil || *a.Error != "no longer wanted" {
		t.Errorf("cancelled while running: earlier_attempts[1] %+v, want p2's attempt under fence %d, cancelled with the reason", a, second.fence(t))
	}
	if got := b.getTask(t, first.ID); !reflect.DeepEqual(got.EarlierAttempts, cancelled.EarlierAttempts) {
		t.Errorf("GET after the cancel: earlier_attempts %+v, want %+v as the cancel answered", got.EarlierAttempts, cancelled.EarlierAttempts)
	}
}

func TestTaskLeaseLapse(t *testing.T) {
	t.Parallel()
	b := newBundle(t, withTaskTTL(45*time.Second))
	b.createTask(t, `{"task_data": {"n": 1}}`)
	a := b.claimTask(t, "a")
	// TaskTTL, not DefaultTTL, is the lease of a claim, and of its heartbeats.
	if got := parseTime(t, "must_heartbeat_before", *a.MustHeartbeatBefore).Sub(parseTime(t, "last_heartbeat_at", *a.LastHeartbeatAt)); got != 45*time.Second {
		t.Errorf("claim: must_heartbeat_before - last_heartbeat_at = %v, want TaskTTL 45s", got)
	}
	beat := b.taskOp(t, a.ID, "heartbeat", obj{"processor": "a"}).want(t, "heartbeat", http.StatusAccepted).task(t, "heartbeat")
	if got := parseTime(t, "must_heartbeat_before", *beat.MustHeartbeatBefore).Sub(parseTime(t, "last_heartbeat_at", *beat.LastHeartbeatAt)); got != 45*time.Second {
		t.Errorf("heartbeat: must_heartbeat_before - last_heartbeat_at = %v, want TaskTTL 45s", got)
	}

	// a stalls past its lease: everything it sends is refused, and b takes
	// the task over under a new fence.
	b.expireTaskLease(t, a.ID)
	wantConflict(t, "heartbeat after the lease lapsed", b.taskOp(t, a.ID, "heartbeat", obj{"processor": "a", "fence": a.fence(t)}))
	wantConflict(t, "complete after the lease lapsed", b.taskOp(t, a.ID, "complete", obj{"processor": "a", "fence": a.fence(t), "task_output": "late"}))
	taken := b.claimTask(t, "b")
	if taken.ID != a.ID || *taken.Processor != "b" || taken.Attempts != 2 || taken.fence(t) <= a.fence(t) {
		t.Fatalf("claim after the lapse: got %v, want task %d for b, attempt 2, fence > %d", taken, a.ID, a.fence(t))
	}
	wantConflict(t, "complete by the stalled processor", b.taskOp(t, a.ID, "complete", obj{"processor": "a", "task_output": "late"}))
	// The takeover recorded a's attempt as expired.
	if hist := b.earlierAttempts(t, a.ID); len(hist) != 1 || hist[0].Processor != "a" || hist[0].Fence != a.fence(t) || hist[0].Outcome != task.OutcomeExpired {
		t.Errorf("after the takeover: earlier attempts %+v, want a's attempt with fence %d, expired", hist, a.fence(t))
	}
	done := b.taskOp(t, a.ID, "complete", obj{"processor": "b", "fence": taken.fence(t), "task_output": "on time"}).
		want(t, "complete by the new processor", http.StatusAccepted).task(t, "complete by the new processor")
	if done.State != "done" || string(done.TaskOutput) != `"on time"` {
		t.Errorf("complete: got %v, want done with output \"on time\"", done)
	}
}

func TestTaskCreateBatch(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// Defaults, a schedule in the future (any offset, answered in UTC with
	// milliseconds), max_attempts at both bounds.
	r := b.do(t, "POST", "/api/tasks", `[
		{"task_data": {"i": 0}},
		{"task_data": {"i": 1}, "scheduled_at": "2999-01-02T03:04:05.678+01:00", "max_attempts": 1},
		{"task_data": {"i": 2}, "max_attempts": 100}
	]`).want(t, "POST /api/tasks with an array", http.StatusCreated)
	ts := r.tasks(t, "POST /api/tasks with an array")
	if len(ts) != 3 {
		t.Fatalf("POST /api/tasks with 3 tasks: got %d back", len(ts))
	}
	for i, tk := range ts {
		if !jsonEqual(t, tk.TaskData, fmt.Appendf(nil, `{"i": %d}`, i)) || tk.State != "pending" || (i > 0 && tk.ID <= ts[i-1].ID) {
			t.Errorf("task %d of the batch: got %v, want task_data {\"i\": %d}, pending, ids ascending", i, tk, i)
		}
	}
	if ts[0].MaxAttempts != 5 || ts[1].MaxAttempts != 1 || ts[2].MaxAttempts != 100 {
		t.Errorf("batch max_attempts: got %d, %d, %d, want 5, 1, 100", ts[0].MaxAttempts, ts[1].MaxAttempts, ts[2].MaxAttempts)
	}
	if ts[1].ScheduledAt != "2999-01-02T02:04:05.678Z" {
		t.Errorf("scheduled_at 2999-01-02T03:04:05.678+01:00: got %s, want 2999-01-02T02:04:05.678Z", ts[1].ScheduledAt)
	}

	// The one scheduled in the future is not claimed.
	got := []int64{b.claimTask(t, "p").ID, b.claimTask(t, "p").ID}
	if want := []int64{ts[0].ID, ts[2].ID}; !slices.Equal(got, want) {
		t.Errorf("claims: got tasks %v, want %v", got, want)
	}
	b.do(t, "POST", "/api/tasks/next", `{"processor":"p"}`).want(t, "claim with only a future task", http.StatusNoContent)

	// A single object gets an object back; a one-item array an array.
	one := b.do(t, "POST", "/api/tasks", `[{"task_data": {"one": true}}]`).want(t, "one-item array", http.StatusCreated).tasks(t, "one-item array")
	if len(one) != 1 {
		t.Errorf("one-item array: got %d tasks", len(one))
	}

	// The largest batch, in one request, in order.
	var sb strings.Builder
	sb.WriteString("[")
	for i := range 10000 {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"task_data":{"i":%d}}`, i)
	}
	sb.WriteString("]")
	big := b.do(t, "POST", "/api/tasks", sb.String()).want(t, "10000 tasks", http.StatusCreated).tasks(t, "10000 tasks")
	if len(big) != 10000 {
		t.Fatalf("10000 tasks: got %d", len(big))
	}
	for i, tk := range big {
		if !bytes.Equal(tk.TaskData, fmt.Appendf(nil, `{"i":%d}`, i)) || (i > 0 && tk.ID != big[i-1].ID+1) {
			t.Fatalf("10000 tasks: item %d is %v, want task_data {\"i\": %d} and consecutive ids", i, tk, i)
		}
	}
}

func TestTaskListsAndStats(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	stats := func() obj {
		t.Helper()
		r := b.do(t, "GET", "/api/tasks/stats", "").want(t, "stats", http.StatusOK)
		return decodeStrict[obj](t, "stats", r)
	}
	if got, want := stats(), (obj{"pending": 0.0, "running": 0.0, "done": 0.0, "dead": 0.0, "cancelled": 0.0, "done_last_minute": 0.0}); !reflect.DeepEqual(got, want) {
		t.Errorf("stats of an empty queue: got %v, want %v", got, want)
	}

	// 1 done, 2 dead, 3 running, 4 and 5 pending.
	var ids []int64
	for i := range 5 {
		attempts := 5
		if i == 1 {
			attempts = 1
		}
		ids = append(ids, b.createTask(t, jsonBody(t, obj{"task_data": obj{"i": i}, "max_attempts": attempts})).ID)
	}
	one, two, three := b.claimTask(t, "p1"), b.claimTask(t, "p2"), b.claimTask(t, "p3")
	b.taskOp(t, one.ID, "complete", obj{"processor": "p1", "task_output": "ok"}).want(t, "complete 1", http.StatusAccepted)
	b.taskOp(t, two.ID, "fail", obj{"processor": "p2", "error": "no"}).want(t, "fail 2", http.StatusAccepted)
	if got, want := stats(), (obj{"pending": 2.0, "running": 1.0, "done": 1.0, "dead": 1.0, "cancelled": 0.0, "done_last_minute": 1.0}); !reflect.DeepEqual(got, want) {
		t.Errorf("stats: got %v, want %v", got, want)
	}

	listIDs := func(path string) []int64 {
		t.Helper()
		var got []int64
		for _, tk := range b.do(t, "GET", path, "").want(t, path, http.StatusOK).tasks(t, path) {
			got = append(got, tk.ID)
		}
		return got
	}
	for _, tc := range []struct {
		path string
		want []int64
	}{
		{"/api/tasks", ids},
		{"/api/tasks/processed", []int64{one.ID, two.ID}},
		{"/api/tasks/started", []int64{one.ID, two.ID, three.ID}},
		{"/api/tasks?limit=2", ids[:2]},
		{fmt.Sprintf("/api/tasks?limit=2&after_id=%d", ids[1]), ids[2:4]},
		{fmt.Sprintf("/api/tasks?after_id=%d", ids[4]), nil},
		{fmt.Sprintf("/api/tasks/processed?after_id=%d", one.ID), []int64{two.ID}},
		{"/api/tasks/started?limit=1", []int64{one.ID}},
		{fmt.Sprintf("/api/tasks/started?limit=1000&after_id=%d", two.ID), []int64{three.ID}},
	} {
		if got := listIDs(tc.path); !slices.Equal(got, tc.want) {
			t.Errorf("GET %s: got ids %v, want %v", tc.path, got, tc.want)
		}
	}
	// A listed task is the one GET /api/tasks/{id} shows.
	for _, tk := range b.do(t, "GET", "/api/tasks", "").want(t, "list", http.StatusOK).tasks(t, "list") {
		if got := b.getTask(t, tk.ID); got.String() != tk.String() {
			t.Errorf("GET /api/tasks/%d: got %v, want %v as listed", tk.ID, got, tk)
		}
	}

	// Paging to the end; the default limit is 100, the largest 1000.
	b.do(t, "POST", "/api/tasks", "["+strings.Repeat(`{"task_data":{}},`, 199)+`{"task_data":{}}]`).want(t, "200 more", http.StatusCreated)
	if got := len(listIDs("/api/tasks")); got != 100 {
		t.Errorf("GET /api/tasks: got %d tasks, want the default limit 100", got)
	}
	if got := len(listIDs("/api/tasks?limit=1000")); got != 205 {
		t.Errorf("GET /api/tasks?limit=1000: got %d tasks, want all 205", got)
	}
	var paged []int64
	for after := int64(0); ; {
		page := listIDs(fmt.Sprintf("/api/tasks?limit=64&after_id=%d", after))
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1]
	}
	if len(paged) != 205 || !slices.IsSorted(paged) || len(slices.Compact(slices.Clone(paged))) != 205 {
		t.Errorf("paging by 64: got %d ids (%v…), want 205 ascending without repeats", len(paged), paged[:min(len(paged), 5)])
	}
}

// TestTaskJSONRange stores the values at the edge of what PostgreSQL's
// jsonb holds, written out in full (a number PostgreSQL would print much
// longer than it was written is refused: see TestNumbersThatGrowAreRefused),
// and the shorthand that grows within the bound; one step further is a 400
// (see the rejected-requests test).
func TestTaskJSONRange(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	for _, v := range []string{
		"1" + strings.Repeat("0", 131071), "-1" + strings.Repeat("0", 131071), "0." + strings.Repeat("0", 16382) + "1",
		"1e30", "-1e-30", "1.5e-20", "6.02e23", "0e1073741822", "0E+5",
		"123456789012345678901234567890.5", `"\ud83d\ude00 paired surrogates"`, `"\u00e9t\u00e9"`, `"\\u0000 is text here"`,
		`{"nested": [1, {"deep": [null, true, false, "x"]}]}`,
	} {
		created := b.createTask(t, `{"task_data": {"v": `+v+`}}`)
		var got struct{ V json.RawMessage }
		if err := json.Unmarshal(created.TaskData, &got); err != nil || len(got.V) == 0 {
			t.Errorf("task_data {\"v\": %.40s}: got %.80s (%v)", v, created.TaskData, err)
		}
	}
	if got := b.createTask(t, `{"task_data": {"s": "\ud83d\ude00"}}`); string(got.TaskData) != `{"s":"😀"}` {
		t.Errorf("a surrogate pair: task_data %s, want {\"s\":\"😀\"}", got.TaskData)
	}
	for _, out := range []string{"0." + strings.Repeat("0", 16382) + "1", `"\ud83d\ude00"`, "[]", "0"} {
		b.createTask(t, `{"task_data": {}}`)
		c := b.claimTask(t, "p")
		b.taskOp(t, c.ID, "complete", obj{"processor": "p", "task_output": json.RawMessage(out)}).want(t, "complete with task_output "+out, http.StatusAccepted)
	}
}
