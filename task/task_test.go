package task_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/task"
)

// TestTaskJSONEarlierAttempts: the history goes on the wire as
// earlier_attempts, its times as the task's are (UTC, milliseconds), null
// for an attempt without an error, and comes back the same.
func TestTaskJSONEarlierAttempts(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	in := task.Task{
		ID: 7, Kind: "report.render", Queue: "reports", TaskData: json.RawMessage(`{}`), State: task.StatePending,
		ScheduledAt: at("2026-12-01T09:30:00Z"), Attempts: 0, MaxAttempts: 5, CreatedAt: at("2026-12-01T09:00:00Z"),
		Processor: "replica-b/w1", Fence: 44,
		EarlierAttempts: []task.Attempt{
			{Processor: "replica-a/w2", Fence: 43, StartedAt: at("2026-12-01T09:10:00.123456+01:00"),
				ExpiresAt: at("2026-12-01T08:10:30.123Z"), EndedAt: at("2026-12-01T08:10:02.5Z"),
				Outcome: task.OutcomeFailed, Error: "disk full"},
			{Processor: "replica-b/w1", Fence: 44, StartedAt: at("2026-12-01T08:20:00Z"),
				ExpiresAt: at("2026-12-01T08:20:30Z"), EndedAt: at("2026-12-01T08:20:31Z"), Outcome: task.OutcomeExpired},
		},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `"earlier_attempts":[` +
		`{"processor":"replica-a/w2","fence":43,"started_at":"2026-12-01T08:10:00.123Z","expires_at":"2026-12-01T08:10:30.123Z","ended_at":"2026-12-01T08:10:02.500Z","outcome":"failed","error":"disk full"},` +
		`{"processor":"replica-b/w1","fence":44,"started_at":"2026-12-01T08:20:00.000Z","expires_at":"2026-12-01T08:20:30.000Z","ended_at":"2026-12-01T08:20:31.000Z","outcome":"expired","error":null}]`
	if !strings.Contains(string(b), want) {
		t.Errorf("json.Marshal: got\n%s\nwant it to contain\n%s", b, want)
	}
	var back task.Task
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	// What the wire keeps: times to the millisecond.
	wantBack := in.EarlierAttempts
	wantBack[0].StartedAt = at("2026-12-01T08:10:00.123Z")
	for i := range wantBack {
		for _, p := range []*time.Time{&wantBack[i].StartedAt, &wantBack[i].ExpiresAt, &wantBack[i].EndedAt} {
			*p = p.UTC()
		}
	}
	for i := range back.EarlierAttempts {
		a := &back.EarlierAttempts[i]
		for _, p := range []*time.Time{&a.StartedAt, &a.ExpiresAt, &a.EndedAt} {
			*p = p.UTC()
		}
	}
	if !reflect.DeepEqual(back.EarlierAttempts, wantBack) {
		t.Errorf("json.Unmarshal: earlier attempts\n%+v\nwant\n%+v", back.EarlierAttempts, wantBack)
	}
}

// TestTaskJSONNoEarlierAttempts: a task without history shows [], never
// null, and reads back as none.
func TestTaskJSONNoEarlierAttempts(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(task.Task{ID: 1, State: task.StatePending, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"earlier_attempts":[]`) {
		t.Errorf("json.Marshal: got %s, want \"earlier_attempts\":[]", b)
	}
	for _, in := range []string{string(b), `{"id": 1, "state": "pending", "scheduled_at": "2026-12-01T09:30:00.000Z", "created_at": "2026-12-01T09:30:00.000Z"}`} {
		var back task.Task
		if err := json.Unmarshal([]byte(in), &back); err != nil {
			t.Fatalf("json.Unmarshal(%s): %v", in, err)
		}
		if back.EarlierAttempts != nil {
			t.Errorf("json.Unmarshal(%s): earlier attempts %+v, want none", in, back.EarlierAttempts)
		}
	}
}
