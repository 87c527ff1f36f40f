package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/schedule"
	"github.com/leasehold/leasehold/task"
)

// scheduleHeader is the header of schedule list's table.
const scheduleHeader = "NAME CRON ZONE KIND NEXT_TICK LAST_TASK MISSED SKIPPED"

// columnGap separates the cells of the schedule table: two spaces or more,
// since a cron expression holds single ones.
var columnGap = regexp.MustCompile(`\s{2,}`)

// scheduleRows parses schedule list's table: one map per row from column
// name to value.
func scheduleRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := columnGap.Split(strings.TrimSpace(lines[0]), -1)
	if strings.Join(header, " ") != scheduleHeader {
		t.Fatalf("table header: got %q, want %s", lines[0], scheduleHeader)
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := columnGap.Split(strings.TrimSpace(line), -1)
		if len(cells) != len(header) {
			t.Fatalf("table row %q: got %d cells %q, want %d", line, len(cells), cells, len(header))
		}
		row := map[string]string{}
		for i, h := range header {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	return rows
}

// scheduleFields parses the table of one schedule (add, replace, get): a
// map from field name to value.
func scheduleFields(t *testing.T, out string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("schedule table line %q: want a field name and its value", line)
		}
		fields[name] = strings.TrimSpace(value)
	}
	return fields
}

// scheduleCLI starts a replica with roles and returns it and a cli of it,
// its API token in the environment.
func scheduleCLI(t *testing.T, roles string) (cli, *replica) {
	t.Helper()
	db := pgtest.New(t)
	const token = "schedule-token-of-the-test"
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", roles, "--api-token", token, "--rate-limit", "0"},
		env("DATABASE_URL", db.URL)))
	return cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token)}, r
}

// TestScheduleCommands drives add, replace, get, list and rm against a
// replica without a scheduler (so nothing ticks meanwhile): every flag,
// the retry of an add, the refusal of a conflicting one, mistakes the
// server would refuse, tables and the API's JSON.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	c, r := scheduleCLI(t, "api")

	// add with every flag, flags before and after the name.
	every := []string{"--cron", "0 3 * * *", "--zone", "Europe/Berlin", "--kind", "report", "--data", `{"report": "daily"}`,
		"--queue", "reports", "--priority", "-2", "--lock", "report:db", "--unique", "--max-attempts", "3", "--ttl", "45s"}
	added := taskJSON[schedule.Schedule](c, append([]string{"schedule", "add", "--cron", "0 3 * * *", "nightly"}, every[2:]...)...)
	if added.Name != "nightly" || added.Cron != "0 3 * * *" || added.Zone != "Europe/Berlin" || added.Kind != "report" ||
		string(added.TaskData) != `{"report":"daily"}` || added.Queue != "reports" || added.Priority != -2 || added.Lock != "report:db" ||
		!added.Unique || added.MaxAttempts != 3 || added.TTLSeconds != 45 || added.LastTask != nil || added.LastTick != nil {
		t.Fatalf("add with every flag: got %+v", added)
	}
	// 03:00 in Berlin is 01:00 or 02:00 UTC.
	if h := added.NextTick.UTC().Hour(); (h != 1 && h != 2) || added.NextTick.Minute() != 0 || !added.NextTick.After(time.Now()) {
		t.Errorf("add: next tick %s, want the next 03:00 in Berlin", added.NextTick)
	}

	// The same definition again, its task_data spelled otherwise: nothing
	// changed, exit 0, the schedule shown and a note saying so.
	again := append([]string{"schedule", "add", "nightly"}, every...)
	again[slices.Index(again, "--data")+1] = `{ "report":"daily" }`
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append(again, "--json"), c.getenv, &stdout, &stderr); err != nil {
		t.Fatalf("add of the same definition: %v, want exit 0", err)
	}
	var retried schedule.Schedule
	if err := json.Unmarshal(stdout.Bytes(), &retried); err != nil || !retried.UpdatedAt.Equal(added.UpdatedAt) || !retried.NextTick.Equal(added.NextTick) {
		t.Errorf("add of the same definition: printed %s (%v), want the schedule as it was", &stdout, err)
	}
	if want := `nothing changed: schedule "nightly" exists already with this definition`; !strings.Contains(stderr.String(), want) {
		t.Errorf("add of the same definition: stderr %q, want %q", &stderr, want)
	}

	// Another definition under the name: 3, the server's sentence with the
	// existing cron and kind, what to do instead, and nothing changed.
	c.fails(exitRefused, []string{"schedule", "add", "nightly", "--cron", "0 4 * * *", "--kind", "report"},
		`schedule "nightly" was not added`, `cron "0 3 * * *"`, `kind "report"`, "leasehold schedule replace nightly", "leasehold schedule rm nightly")
	if got := taskJSON[schedule.Schedule](c, "schedule", "get", "nightly"); got.Cron != "0 3 * * *" || got.Queue != "reports" || !got.UpdatedAt.Equal(added.UpdatedAt) {
		t.Errorf("get after a refused add: got %+v, want the schedule unchanged", got)
	}

	// A minimal add, as a table: the defaults.
	f := scheduleFields(t, c.ok("schedule", "add", "hourly-ping", "--cron", "@hourly", "--kind", "ping"))
	for k, v := range map[string]string{"name": "hourly-ping", "cron": "@hourly", "zone": "UTC", "kind": "ping", "task_data": "{}",
		"queue": "default", "priority": "0", "unique": "false", "lock": "-", "max_attempts": "5", "ttl_seconds": "-",
		"last_tick": "-", "last_task": "-", "last_error": "-", "missed_ticks": "0", "skipped_ticks": "0"} {
		if f[k] != v {
			t.Errorf("add table: %s is %q, want %q (all: %v)", k, f[k], v, f)
		}
	}
	if next, far, _ := strings.Cut(f["next_tick"], " "); !strings.HasSuffix(next, ":00:00.000Z") || !strings.HasPrefix(far, "(in ") {
		t.Errorf("add table: next_tick %q, want the next full hour and how far off it is", f["next_tick"])
	}

	// get: a table, or the API's JSON.
	if f := scheduleFields(t, c.ok("schedule", "get", "nightly")); f["cron"] != "0 3 * * *" || f["lock"] != "report:db" ||
		f["ttl_seconds"] != "45" || f["unique"] != "true" || f["task_data"] != `{"report":"daily"}` {
		t.Errorf("get table: got %v", f)
	}
	var wire map[string]any
	if err := json.Unmarshal([]byte(c.ok("schedule", "get", "--json", "nightly")), &wire); err != nil || wire["lock"] != "report:db" || wire["last_task"] != nil {
		t.Errorf("get --json: got %v (%v), want the API's schedule object", wire, err)
	}

	// list: name order, a table or JSON; pages.
	rows := scheduleRows(t, c.ok("schedule", "list"))
	if len(rows) != 2 || rows[0]["NAME"] != "hourly-ping" || rows[1]["NAME"] != "nightly" {
		t.Fatalf("list: got %v, want hourly-ping and nightly", rows)
	}
	if r := rows[1]; r["CRON"] != "0 3 * * *" || r["ZONE"] != "Europe/Berlin" || r["KIND"] != "report" || r["LAST_TASK"] != "-" ||
		r["MISSED"] != "0" || r["SKIPPED"] != "0" || r["NEXT_TICK"] != added.NextTick.UTC().Format("2006-01-02T15:04:05.000Z") {
		t.Errorf("list row of nightly: got %v", r)
	}
	if got := taskJSON[[]schedule.Schedule](c, "schedule", "list"); len(got) != 2 || got[1].Lock != "report:db" {
		t.Errorf("list --json: got %+v", got)
	}
	stdout.Reset()
	stderr.Reset()
	if err := run(t.Context(), []string{"schedule", "list", "--limit", "1"}, c.getenv, &stdout, &stderr); err != nil ||
		!strings.Contains(stderr.String(), `--after-name "hourly-ping"`) {
		t.Errorf("list --limit 1: %v, stderr %q; want a note naming the next page", err, &stderr)
	}
	if got := taskJSON[[]schedule.Schedule](c, "schedule", "list", "--after-name", "hourly-ping"); len(got) != 1 || got[0].Name != "nightly" {
		t.Errorf("list --after-name hourly-ping: got %+v, want nightly", got)
	}

	// A bad cron or zone: bad usage, saying what to fix; nothing added.
	c.fails(2, []string{"schedule", "add", "bad", "--cron", "61 * * * *", "--kind", "k"}, `--cron "61 * * * *" is not a cron expression`, "five fields")
	c.fails(2, []string{"schedule", "add", "bad", "--cron", "@every 500ms", "--kind", "k"}, `--cron "@every 500ms"`, "whole number of seconds")
	c.fails(2, []string{"schedule", "add", "bad", "--cron", "@daily", "--zone", "Mars/Olympus_Mons", "--kind", "k"},
		`--zone "Mars/Olympus_Mons" is not a known IANA time zone`)
	c.fails(2, []string{"schedule", "replace", "nightly", "--cron", "@daily", "--zone", "Local", "--kind", "k"}, `--zone "Local"`, "IANA")
	c.fails(1, []string{"schedule", "get", "bad"}, `no schedule is named "bad"`, "leasehold schedule list")
	if got := taskJSON[schedule.Schedule](c, "schedule", "get", "nightly"); got.Zone != "Europe/Berlin" || !got.UpdatedAt.Equal(added.UpdatedAt) {
		t.Errorf("get after a refused replace: got %+v, want it unchanged", got)
	}

	// replace: the whole definition, what is left out back to its default.
	replaced := taskJSON[schedule.Schedule](c, "schedule", "replace", "nightly", "--cron", "30 4 * * *", "--kind", "report")
	if replaced.Cron != "30 4 * * *" || replaced.Zone != "UTC" || replaced.Queue != "default" || replaced.Lock != "" || replaced.Unique ||
		replaced.MaxAttempts != 5 || replaced.TTLSeconds != 0 || !replaced.CreatedAt.Equal(added.CreatedAt) ||
		replaced.NextTick.Hour() != 4 || replaced.NextTick.Minute() != 30 {
		t.Errorf("replace: got %+v, want cron 30 4 * * * in UTC with the defaults, created when it was", replaced)
	}
	// replace of a name nobody has: added. A name with a space and a slash
	// reaches its path as one segment.
	if got := taskJSON[schedule.Schedule](c, "schedule", "replace", "team a/weekly", "--cron", "@weekly", "--kind", "digest"); got.Name != "team a/weekly" {
		t.Errorf("replace of a new name: got %+v", got)
	}
	if got := taskJSON[schedule.Schedule](c, "schedule", "get", "team a/weekly"); got.Kind != "digest" {
		t.Errorf("get of a name with a slash: got %+v", got)
	}

	// rm: one line, or the removed schedule as JSON; then it is gone.
	if out := c.ok("schedule", "rm", "nightly"); out != `removed schedule "nightly" (cron "30 4 * * *", kind report); the tasks it made stay`+"\n" {
		t.Errorf("rm: got %q", out)
	}
	if got := taskJSON[schedule.Schedule](c, "schedule", "rm", "team a/weekly"); got.Name != "team a/weekly" {
		t.Errorf("rm --json: got %+v", got)
	}
	c.fails(1, []string{"schedule", "rm", "nightly"}, `no schedule is named "nightly"`)
	c.fails(1, []string{"schedule", "get", "nightly"}, `no schedule is named "nightly"`)
	if rows := scheduleRows(t, c.ok("schedule", "list")); len(rows) != 1 || rows[0]["NAME"] != "hourly-ping" {
		t.Errorf("list after rm: got %v, want hourly-ping alone", rows)
	}

	// Without the token: the server's 401, and how to pass the token.
	cli{t, env("LEASEHOLD_URL", r.url)}.fails(1, []string{"schedule", "list"}, "401", "--api-token")
	// Nobody there: what to check.
	cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}.fails(1, []string{"schedule", "get", "x"}, "cannot reach leasehold at http://127.0.0.1:1", "--url")
}

// TestScheduleConflictWords: a 409 is told with the schedule that holds the
// name (from the answer's schedule, whatever the server's sentence), and
// what to do instead.
func TestScheduleConflictWords(t *testing.T) {
	t.Parallel()
	err := scheduleConflict("nightly", &schedule.ExistsError{Schedule: schedule.Schedule{Name: "nightly", Cron: "0 3 * * *", Zone: "UTC", Kind: "report"}})
	for _, want := range []string{`schedule "nightly" was not added`, `cron "0 3 * * *"`, `kind "report"`, "nothing changed", "leasehold schedule replace nightly"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to say %q", err, want)
		}
	}
}

// TestScheduleMakesTasks: a schedule added with @every 1s on a replica
// that runs the scheduler makes tasks, each naming the schedule and its
// tick, with the schedule's definition; get shows the last one.
func TestScheduleMakesTasks(t *testing.T) {
	t.Parallel()
	c, r := scheduleCLI(t, "api,scheduler")
	c.ok("schedule", "add", "every-second", "--cron", "@every 1s", "--kind", "tick", "--data", `{"n": 1}`, "--queue", "ticks", "--lock", "tick:lock")

	var made []task.Task
	waitFor(t, r, "a task of schedule every-second", func() bool {
		made = made[:0]
		for _, tk := range taskJSON[[]task.Task](c, "task", "list", "--kind", "tick") {
			if tk.Schedule == "every-second" {
				made = append(made, tk)
			}
		}
		return len(made) > 0
	})
	tk := made[0]
	if tk.ScheduleTick == nil || !tk.ScheduledAt.Equal(*tk.ScheduleTick) || tk.Queue != "ticks" || tk.Lock != "tick:lock" ||
		string(tk.TaskData) != `{"n":1}` || tk.State != task.StatePending {
		t.Errorf("the schedule's task: got %+v, want a pending task of queue ticks, lock tick:lock, due at its tick", tk)
	}
	waitFor(t, r, "get to show the last task", func() bool {
		s := taskJSON[schedule.Schedule](c, "schedule", "get", "every-second")
		return s.LastTask != nil && s.LastTick != nil
	})
	if rows := scheduleRows(t, c.ok("schedule", "list")); len(rows) != 1 || !strings.HasSuffix(rows[0]["LAST_TASK"], " pending") {
		t.Errorf("list: got %v, want the last task, pending", rows)
	}
}

// TestTaskAddLock: task add --lock sets the task's lock, which get shows.
func TestTaskAddLock(t *testing.T) {
	t.Parallel()
	c, _ := scheduleCLI(t, "api")
	added := taskJSON[task.Task](c, "task", "add", "--data", `{}`, "--kind", "backup", "--lock", "db:primary")
	if added.Lock != "db:primary" {
		t.Errorf("add --lock: got lock %q, want db:primary", added.Lock)
	}
	var wire map[string]any
	if err := json.Unmarshal([]byte(c.ok("task", "get", "--json", strconv.FormatInt(added.ID, 10))), &wire); err != nil || wire["lock"] != "db:primary" {
		t.Errorf("get --json: got %v (%v), want \"lock\": \"db:primary\"", wire, err)
	}
	// Without --lock: null.
	plain := taskJSON[map[string]any](c, "task", "add", "--data", `{}`)
	if v, ok := plain["lock"]; !ok || v != nil {
		t.Errorf("add without --lock: \"lock\" is %v (present %t), want null", v, ok)
	}
}

// TestScheduleCommandsRejectBadUsage: mistakes on the command line are
// exit status 2 with a message naming them, before anything is sent.
func TestScheduleCommandsRejectBadUsage(t *testing.T) {
	t.Parallel()
	c := cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}
	def := []string{"--cron", "@daily", "--kind", "k"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"schedule"}, []string{"usage"}},
		{[]string{"schedule", "delete", "x"}, []string{`"delete"`, "add, replace, get, list or rm"}},
		{[]string{"schedule", "add"}, []string{"needs the schedule's name"}},
		{[]string{"schedule", "add", "x"}, []string{"--cron is required", "--kind is required"}},
		{[]string{"schedule", "add", "x", "--kind", "k"}, []string{"--cron is required"}},
		{[]string{"schedule", "add", "x", "--cron", "@daily"}, []string{"--kind is required"}},
		{[]string{"schedule", "add", "x", "0", "3", "*", "*", "*", "--kind", "k"}, []string{"one schedule name", "quote a cron expression"}},
		{append([]string{"schedule", "add", "x", "--kind", ""}, def[:2]...), []string{"--kind is empty"}},
		{append([]string{"schedule", "add", "x", "--data", "[1]"}, def...), []string{"--data", "must be a JSON object"}},
		{append([]string{"schedule", "add", "x", "--priority", "40000"}, def...), []string{`--priority "40000"`}},
		{append([]string{"schedule", "add", "x", "--ttl", "1.5s"}, def...), []string{`--ttl "1.5s"`, "whole seconds"}},
		{append([]string{"schedule", "add", "x", "--max-attempts", "0"}, def...), []string{`--max-attempts "0"`}},
		{append([]string{"schedule", "add", "x", "--queue", strings.Repeat("q", 256)}, def...), []string{"--queue is 256 bytes long"}},
		{append([]string{"schedule", "add", "x", "--lock", "a\tb"}, def...), []string{"--lock", "control character"}},
		{append([]string{"schedule", "add", "x\x01"}, def...), []string{"the schedule name", "control character"}},
		{append([]string{"schedule", "add", strings.Repeat("n", 256)}, def...), []string{"the schedule name is 256 bytes long"}},
		{append([]string{"schedule", "add", "x", "--cron", "TZ=Europe/Berlin 0 9 * * *"}, def[2:]...), []string{"--cron", "names a zone", "zone"}},
		{append([]string{"schedule", "replace", "x", "--zone", "Nowhere/Land"}, def...), []string{`--zone "Nowhere/Land"`}},
		{append([]string{"schedule", "replace"}, def...), []string{"needs the schedule's name"}},
		{append([]string{"schedule", "add", "x", "--url", "localhost:8080"}, def...), []string{"--url", "http://"}},
		{[]string{"schedule", "get"}, []string{"needs the schedule's name"}},
		{[]string{"schedule", "get", "a", "b"}, []string{"one schedule name"}},
		{[]string{"schedule", "rm", "a", "--cron", "@daily"}, []string{"cron"}},
		{[]string{"schedule", "list", "--limit", "0"}, []string{`--limit "0"`}},
		{[]string{"schedule", "list", "--limit", "10001"}, []string{`--limit "10001"`}},
		{[]string{"schedule", "list", "--after-name", ""}, []string{"--after-name is empty"}},
		{[]string{"schedule", "list", "stray"}, []string{"stray"}},
		{[]string{"task", "add", "--data", "{}", "--lock", ""}, []string{"--lock is empty"}},
		// Every mistake at once, each named.
		{[]string{"schedule", "add", "x", "--cron", "* *", "--zone", "Mars/Base", "--priority", "x"},
			[]string{`--cron "* *"`, `--zone "Mars/Base"`, "--kind is required", `--priority "x"`}},
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
