package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/task"
)

// taskHeader is the header of the task commands' table.
const taskHeader = "ID STATE KIND QUEUE PRIORITY ATTEMPTS PROCESSOR FENCE LOCK SCHEDULE SCHEDULED_AT AGE LAST_ERROR"

// taskRows parses a table of the task commands: one map per row from
// column name to value; LAST_ERROR, the last column, may hold spaces.
func taskRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := strings.Fields(lines[0])
	if strings.Join(header, " ") != taskHeader {
		t.Fatalf("table header: got %q, want %s", lines[0], taskHeader)
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := strings.Fields(line)
		if len(cells) < len(header) {
			t.Fatalf("table row %q: got %d cells, want %d", line, len(cells), len(header))
		}
		cells = append(cells[:len(header)-1], strings.Join(cells[len(header)-1:], " "))
		row := map[string]string{}
		for i, h := range header {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	return rows
}

// taskJSON runs a task command with --json and decodes its one line of
// output, which must be the API's JSON, into a T.
func taskJSON[T any](c cli, args ...string) T {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		c.t.Fatalf("leasehold %q --json: got %q, want one line of JSON", args, out)
	}
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		c.t.Fatalf("leasehold %q --json: decode %q: %v", args, out, err)
	}
	return v
}

// TestTaskCommands drives add, get, list, cancel and retry against a
// replica that requires an API token, given in the environment, as tables
// and as the API's JSON, with the exit statuses of refusals.
func TestTaskCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "task-token-of-the-test"
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--api-token", token, "--rate-limit", "0"},
		env("DATABASE_URL", db.URL)))
	c := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token)}

	// add: a table of the new task, with the server's defaults.
	rows := taskRows(t, c.ok("task", "add", "--data", `{"sleep_duration_seconds": 1}`))
	if len(rows) != 1 || rows[0]["STATE"] != "pending" || rows[0]["KIND"] != "sleep" || rows[0]["QUEUE"] != "default" ||
		rows[0]["PRIORITY"] != "0" || rows[0]["ATTEMPTS"] != "0/5" || rows[0]["PROCESSOR"] != "-" || rows[0]["FENCE"] != "-" ||
		rows[0]["LAST_ERROR"] != "-" {
		t.Fatalf("add table: got %v, want one pending sleep task of the default queue, priority 0, attempts 0/5, no processor", rows)
	}
	sleepID, _ := strconv.ParseInt(rows[0]["ID"], 10, 64)
	// Every flag, as JSON: the API's task object.
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	added := taskJSON[task.Task](c, "task", "add", "--data", `{"to": "ann"}`, "--kind", "email", "--queue", "mail",
		"--priority", "-3", "--unique-key", "welcome:ann", "--ttl", "45s", "--scheduled-at", at.Format(time.RFC3339Nano), "--max-attempts", "2")
	if added.Kind != "email" || added.Queue != "mail" || added.Priority != -3 || added.UniqueKey != "welcome:ann" ||
		added.TTLSeconds != 45 || !added.ScheduledAt.Equal(at) || added.MaxAttempts != 2 || string(added.TaskData) != `{"to":"ann"}` {
		t.Errorf("add with every flag: got %+v, want kind email, queue mail, priority -3, unique key welcome:ann, TTL 45 s, due at %s, 2 attempts", added, at)
	}
	// The same unique key again: nothing inserted, the holder of the key
	// shown, and a note saying so.
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"task", "add", "--data", `{"to": "ann", "again": true}`, "--kind", "email", "--unique-key", "welcome:ann", "--json"},
		c.getenv, &stdout, &stderr); err != nil {
		t.Fatalf("add of a held unique key: %v", err)
	}
	var dup task.Task
	if err := json.Unmarshal(stdout.Bytes(), &dup); err != nil || dup.ID != added.ID {
		t.Errorf("add of a held unique key: printed %s, want task %d", &stdout, added.ID)
	}
	if want := fmt.Sprintf("nothing inserted: task %d (pending) of kind email holds the unique key", added.ID); !strings.Contains(stderr.String(), want) {
		t.Errorf("add of a held unique key: stderr %q, want it to say %q", &stderr, want)
	}

	// get, with the flag before or after the ID: the API's JSON as it is,
	// one line.
	out := c.ok("task", "get", "--json", strconv.FormatInt(added.ID, 10))
	var wire map[string]any
	if err := json.Unmarshal([]byte(out), &wire); err != nil || wire["unique_key"] != "welcome:ann" || wire["state"] != "pending" {
		t.Errorf("get --json: got %s, want the API's task object", out)
	}
	if rows := taskRows(t, c.ok("task", "get", strconv.FormatInt(added.ID, 10))); len(rows) != 1 || rows[0]["KIND"] != "email" ||
		rows[0]["SCHEDULED_AT"] != at.Format("2006-01-02T15:04:05.000Z") || rows[0]["PRIORITY"] != "-3" {
		t.Errorf("get table: got %v, want the email task, due at %s", rows, at)
	}

	// list with filters; paging.
	third := taskJSON[task.Task](c, "task", "add", "--data", `{}`, "--kind", "email", "--queue", "mail")
	if got := taskRows(t, c.ok("task", "list", "--kind", "email")); len(got) != 2 || got[0]["ID"] != strconv.FormatInt(added.ID, 10) ||
		got[1]["ID"] != strconv.FormatInt(third.ID, 10) {
		t.Errorf("list --kind email: got %v, want tasks %d and %d", got, added.ID, third.ID)
	}
	if got := taskJSON[[]task.Task](c, "task", "list", "--queue", "default"); len(got) != 1 || got[0].ID != sleepID {
		t.Errorf("list --queue default: got %+v, want task %d", got, sleepID)
	}
	page := taskJSON[[]task.Task](c, "task", "list", "--kind", "email", "--limit", "1")
	next := taskJSON[[]task.Task](c, "task", "list", "--kind", "email", "--after-id", strconv.FormatInt(page[0].ID, 10))
	if len(page) != 1 || page[0].ID != added.ID || len(next) != 1 || next[0].ID != third.ID {
		t.Errorf("list pages: got %+v then %+v, want %d then %d", page, next, added.ID, third.ID)
	}
	stdout.Reset()
	stderr.Reset()
	if err := run(t.Context(), []string{"task", "list", "--limit", "1"}, c.getenv, &stdout, &stderr); err != nil ||
		!strings.Contains(stderr.String(), fmt.Sprintf("--after-id %d", sleepID)) {
		t.Errorf("list --limit 1: %v, stderr %q; want a note naming the next page", err, &stderr)
	}
	if got := taskJSON[[]task.Task](c, "task", "list", "--state", "cancelled"); len(got) != 0 {
		t.Errorf("list --state cancelled before any cancellation: got %+v, want an empty array", got)
	}

	// cancel; cancel again is refused (3); retry; retry again is refused.
	cancelled := taskJSON[task.Task](c, "task", "cancel", strconv.FormatInt(third.ID, 10), "--reason", "not needed")
	if cancelled.State != task.StateCancelled || cancelled.LastError != "not needed" {
		t.Errorf("cancel: got %s, last error %q; want cancelled, \"not needed\"", cancelled.State, cancelled.LastError)
	}
	if got := taskRows(t, c.ok("task", "list", "--state", "cancelled")); len(got) != 1 || got[0]["LAST_ERROR"] != "not needed" {
		t.Errorf("list --state cancelled: got %v, want task %d with its reason", got, third.ID)
	}
	id := strconv.FormatInt(third.ID, 10)
	c.fails(exitRefused, []string{"task", "cancel", id}, "task "+id+" cannot be cancelled: it is cancelled, and only a pending or running task can be")
	retried := taskJSON[task.Task](c, "task", "retry", id)
	if retried.State != task.StatePending {
		t.Errorf("retry: got %s, want pending", retried.State)
	}
	c.fails(exitRefused, []string{"task", "retry", id}, "task "+id+" cannot be retried: it is pending, and only a dead or cancelled task can be")
	if rows := taskRows(t, c.ok("task", "cancel", id)); len(rows) != 1 || rows[0]["STATE"] != "cancelled" || rows[0]["LAST_ERROR"] != "cancelled" {
		t.Errorf("cancel without a reason, as a table: got %v, want cancelled, with the server's default reason", rows)
	}

	// No such task: 1, saying so.
	c.fails(1, []string{"task", "get", "999999"}, "no task has ID 999999")
	c.fails(1, []string{"task", "cancel", "999999"}, "no task has ID 999999")
	c.fails(1, []string{"task", "retry", "999999"}, "no task has ID 999999")
	// Without the token: the server's 401, and how to pass the token.
	cli{t, env("LEASEHOLD_URL", r.url)}.fails(1, []string{"task", "list"}, "401", "--api-token")
	// Nobody there: what to check.
	cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}.fails(1, []string{"task", "get", "1"}, "cannot reach leasehold at http://127.0.0.1:1", "--url")
}

// TestTaskTableCutsLastError: a long, many-line last error is one line of
// the table, cut short.
func TestTaskTableCutsLastError(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	err := taskTable(&b, []task.Task{{
		ID: 7, State: task.StateDead, Kind: "k", Queue: "q", Attempts: 5, MaxAttempts: 5, Processor: "host-1/w2", Fence: 42,
		ScheduledAt: now, CreatedAt: now.Add(-90 * time.Minute), LastError: "Traceback:\n  File x\n" + strings.Repeat("y", 200) + "\nexit status 1",
	}}, now)
	if err != nil {
		t.Fatal(err)
	}
	rows := taskRows(t, b.String())
	want := map[string]string{"ID": "7", "STATE": "dead", "ATTEMPTS": "5/5", "PROCESSOR": "host-1/w2", "FENCE": "42",
		"SCHEDULED_AT": "2030-01-02T03:04:05.000Z", "AGE": "1h30m"}
	for k, v := range want {
		if rows[0][k] != v {
			t.Errorf("%s: got %q, want %q", k, rows[0][k], v)
		}
	}
	if e := rows[0]["LAST_ERROR"]; !strings.HasPrefix(e, "Traceback: File x yyy") || !strings.HasSuffix(e, "…") || len([]rune(e)) != lastErrorWidth {
		t.Errorf("LAST_ERROR: got %q, want the error on one line, cut to %d runes with an ellipsis", e, lastErrorWidth)
	}
}

// TestTaskCommandsRejectBadUsage: mistakes on the command line are exit
// status 2 with a message naming them, before anything is sent.
func TestTaskCommandsRejectBadUsage(t *testing.T) {
	t.Parallel()
	c := cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"task"}, []string{"usage"}},
		{[]string{"task", "delete", "1"}, []string{`"delete"`, "add, get, list, cancel or retry"}},
		{[]string{"task", "add"}, []string{"--data is required"}},
		{[]string{"task", "add", "--data", "[1]"}, []string{"--data", "must be a JSON object"}},
		{[]string{"task", "add", "--data", "{oops"}, []string{"must be a JSON object"}},
		{[]string{"task", "add", "--data", "{}", "--priority", "40000"}, []string{`--priority "40000"`}},
		{[]string{"task", "add", "--data", "{}", "--ttl", "1.5s"}, []string{`--ttl "1.5s"`, "whole seconds"}},
		{[]string{"task", "add", "--data", "{}", "--scheduled-at", "tomorrow"}, []string{`--scheduled-at "tomorrow"`, "RFC 3339"}},
		{[]string{"task", "add", "--data", "{}", "--max-attempts", "0"}, []string{`--max-attempts "0"`}},
		{[]string{"task", "add", "--data", "{}", "--kind", ""}, []string{"--kind is empty"}},
		{[]string{"task", "add", "--data", "{}", "--queue", strings.Repeat("q", 256)}, []string{"--queue is 256 bytes long"}},
		{[]string{"task", "add", "--data", "{}", "stray"}, []string{"stray"}},
		{[]string{"task", "get"}, []string{"needs a task ID"}},
		{[]string{"task", "get", "seven"}, []string{`"seven"`, "positive integer"}},
		{[]string{"task", "get", "0"}, []string{`"0"`, "positive integer"}},
		{[]string{"task", "get", "1", "2"}, []string{"one task ID"}},
		{[]string{"task", "cancel", "1", "--reason", strings.Repeat("r", 5000)}, []string{"--reason is 5000 bytes long"}},
		{[]string{"task", "retry", "1", "--reason", "x"}, []string{"reason"}},
		{[]string{"task", "list", "--state", "stale"}, []string{`--state "stale"`}},
		{[]string{"task", "list", "--limit", "1001"}, []string{`--limit "1001"`}},
		{[]string{"task", "list", "--after-id", "-1"}, []string{`--after-id "-1"`}},
		{[]string{"task", "list", "--url", "localhost:8080"}, []string{"--url", "http://"}},
		// Every mistake at once, each named.
		{[]string{"task", "add", "--priority", "x", "--max-attempts", "101"}, []string{"--data is required", `--priority "x"`, `--max-attempts "101"`}},
	} {
		_, code, err := c.run(tc.args...)
		if code != 2 {
			t.Errorf("leasehold %q: got exit status %d (%v), want 2", tc.args, code, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("leasehold %q: error %q, want it to say %q", tc.args, err, w)
			}
		}
	}
}
