package server_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// snapshotAll is snapshot plus every task, the generator switch and the
// instances: all a rejected request to the task, generator or instance
// routes must leave alone.
func snapshotAll(t *testing.T, db pgtest.DB) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(snapshot(t, db))
	for _, table := range []string{"tasks", "generator_state", "instances"} {
		fmt.Fprintf(&sb, "%s:\n", table)
		rows, err := db.Pool.Query(t.Context(), `SELECT * FROM `+table+` ORDER BY 1`)
		if err != nil {
			t.Fatalf("snapshot %s: %v", table, err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatalf("snapshot %s: %v", table, err)
			}
			fmt.Fprintln(&sb, vals...)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("snapshot %s: %v", table, err)
		}
	}
	return sb.String()
}

// TestTaskRejectedRequestsChangeNothing sends every kind of bad request the
// API promises for every task, generator and instance route, and requests
// that are valid but refused, and checks each answer and that the database
// is as it was.
func TestTaskRejectedRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// Something to change: running (p1), done (p2), dead (p3), and a
	// pending task ready to be claimed.
	b.createTask(t, `{"task_data": {"n": 1}}`)
	running := b.claimTask(t, "p1")
	b.createTask(t, `{"task_data": {"n": 2}}`)
	done := b.claimTask(t, "p2")
	b.taskOp(t, done.ID, "complete", obj{"processor": "p2", "task_output": "ok"}).want(t, "complete", http.StatusAccepted)
	b.createTask(t, `{"task_data": {"n": 3}, "max_attempts": 1}`)
	dead := b.claimTask(t, "p3")
	b.taskOp(t, dead.ID, "fail", obj{"processor": "p3", "error": "no"}).want(t, "fail", http.StatusAccepted)
	pending := b.createTask(t, `{"task_data": {"n": 4}}`)

	q := strconv.Quote
	long := strings.Repeat("p", 256)
	longUTF8 := strings.Repeat("é", 128) // 256 bytes
	fenceRaw := strconv.FormatInt(running.fence(t), 10)
	op := func(o string) string { return fmt.Sprintf("/api/tasks/%d/%s", running.ID, o) }

	// The body routes, each with a body it would accept. A bad variant
	// that slipped through would change the database.
	bodyRoutes := []struct {
		method, path string
		base         []field
		processor    bool
		fence        bool
	}{
		{"POST", "/api/tasks", []field{{"task_data", `{"n":9}`}}, false, false},
		{"POST", "/api/tasks/next", []field{{"processor", q("p9")}}, true, false},
		{"PUT", op("heartbeat"), []field{{"processor", q("p1")}, {"fence", fenceRaw}}, true, true},
		{"PUT", op("complete"), []field{{"processor", q("p1")}, {"fence", fenceRaw}, {"task_output", `{"ok":true}`}}, true, true},
		{"PUT", op("fail"), []field{{"processor", q("p1")}, {"fence", fenceRaw}, {"error", q("boom")}}, true, true},
	}

	var cases []badCase
	for _, r := range bodyRoutes {
		route := r.method + " " + r.path
		add := func(name, body string, status int) {
			cases = append(cases, badCase{route + ": " + name, r.method, r.path, body, status})
		}
		base := object(r.base...)
		add("malformed JSON", `{"processor": "p1", "task_data": }`, 400)
		add("truncated JSON", base[:len(base)-1], 400)
		add("single-quoted JSON", `{'processor': 'p1'}`, 400)
		add("form encoding", "processor=p1", 400)
		add("empty body", "", 400)
		add("whitespace body", " \r\n\t ", 400)
		add("empty array", "[]", 400)
		add("string", q("p1"), 400)
		add("number", "42", 400)
		add("true", "true", 400)
		add("null", "null", 400)
		add("trailing object", base+" {}", 400)
		add("the object twice", base+base, 400)
		add("trailing garbage", base+" x", 400)
		add("trailing bracket", base+"]", 400)
		add("unknown field", object(with(r.base, "color", q("red"))...), 400)
		add("unknown field null", object(with(r.base, "id", "null")...), 400)
		add("invalid UTF-8 in an unknown field", object(with(r.base, "x", "\"\xff\"")...), 400)
		add("a \\u0000 escape in an unknown field", object(with(r.base, "x", `"a\u0000"`)...), 400)
		add("an unpaired surrogate in an unknown field", object(with(r.base, "x", `"a\ud800"`)...), 400)
		if r.path != "/api/tasks" {
			add("array of the object", "["+base+"]", 400)
		}
		if !r.fence {
			add("fence (not a field here)", object(with(r.base, "fence", "1")...), 400)
		}
		if r.path == "/api/tasks" {
			// The new task's own fields: bad values, and null for any.
			for _, v := range []struct{ field, what, raw string }{
				{"ttl_seconds", "null", "null"}, {"ttl_seconds", "0", "0"}, {"ttl_seconds", "3601", "3601"},
				{"ttl_seconds", "a fraction", "1.5"}, {"kind", "empty", `""`}, {"kind", "null", "null"},
				{"kind", "over 255 bytes", q(long)}, {"kind", "a control character", `"a\tb"`},
				{"queue", "empty", `""`}, {"queue", "null", "null"}, {"queue", "a number", "7"},
				{"unique_key", "empty", `""`}, {"unique_key", "null", "null"}, {"unique_key", "over 255 bytes", q(long)},
				{"priority", "below -32768", "-32769"}, {"priority", "above 32767", "32768"},
				{"priority", "a string", `"high"`}, {"priority", "null", "null"},
			} {
				add(v.field+" "+v.what, object(with(r.base, v.field, v.raw)...), 400)
			}
		} else {
			add("ttl_seconds (not a field here)", object(with(r.base, "ttl_seconds", "30")...), 400)
		}
		if r.path == "/api/tasks/next" {
			for _, v := range []struct{ field, what, raw string }{
				{"kinds", "empty", "[]"}, {"kinds", "null", "null"}, {"kinds", "a string", q("sleep")},
				{"kinds", "an empty name", `[""]`}, {"queues", "empty", "[]"}, {"queues", "a name over 255 bytes", "[" + q(long) + "]"},
				{"wait_seconds", "negative", "-1"}, {"wait_seconds", "over 300", "301"}, {"wait_seconds", "null", "null"},
			} {
				add(v.field+" "+v.what, object(with(r.base, v.field, v.raw)...), 400)
			}
		}

		if r.processor {
			add("missing processor", object(without(r.base, "processor")...), 400)
			for _, v := range []struct{ what, raw string }{
				{"empty", `""`},
				{"null", "null"},
				{"a number", "7"},
				{"an object", `{"name":"p1"}`},
				{"an array", `["p1"]`},
				{"over 255 bytes", q(long)},
				{"over 255 bytes of 2-byte runes", q(longUTF8)},
				{"a newline escape", `"p1\n"`},
				{"a raw newline", "\"p1\n\""},
				{"a NUL escape", `"p\u00001"`},
				{"a tab", `"p\t1"`},
				{"a DEL escape", `"p1\u007f"`},
				{"a C1 control", `"p1\u0085"`},
				{"invalid UTF-8", "\"p1\xff\""},
				{"UTF-8 of a surrogate", "\"p1\xed\xa0\x80\""},
				{"an unpaired high surrogate escape", `"p1\ud800"`},
				{"an unpaired low surrogate escape", `"p1\udc00"`},
				{"a high surrogate escape before a letter", `"p1\ud800x"`},
				{"two high surrogate escapes", `"p1\ud800\ud800"`},
			} {
				add("processor "+v.what, object(with(r.base, "processor", v.raw)...), 400)
			}
		}
		if r.fence {
			for _, raw := range []string{"0", "-1", `"x"`, q(fenceRaw), "1.5", "99999999999999999999", "true", "[1]"} {
				add("fence "+raw, object(with(r.base, "fence", raw)...), 400)
			}
		}

		// Just over the limit, so that the server reads it all before it answers.
		add("body over 1 MiB", object(with(r.base, "padding", q(strings.Repeat("x", 1<<20)))...), 413)
		add("body over 1 MiB of trailing space", base+strings.Repeat(" ", 1<<20), 413)
	}

	// POST /api/tasks: task_data, scheduled_at, max_attempts, arrays.
	create := func(name, body string) {
		cases = append(cases, badCase{"POST /api/tasks: " + name, "POST", "/api/tasks", body, 400})
	}
	task := []field{{"task_data", `{"n":9}`}}
	create("missing task_data", `{}`)
	create("missing task_data with max_attempts", `{"max_attempts": 3}`)
	for _, raw := range []string{"null", "1", `"{}"`, "[]", `[{"n":1}]`, "true", `""`} {
		create("task_data "+raw, object(with(task, "task_data", raw)...))
	}
	for _, raw := range []string{
		`{"s":"a\u0000b"}`, `{"a\u0000":1}`, `{"s":"\ud800"}`, `{"s":"\udfff"}`, `{"s":"\ud800\u0041"}`, `{"s":["\ud83d"]}`,
		`{"n":1e131072}`, `{"n":-1e131072}`, `{"n":1e-16384}`, `{"n":1.5e-16383}`, `{"n":0.0e-16383}`, `{"n":0e-16384}`,
		`{"n":1e1073741823}`, `{"n":0e1073741823}`, `{"n":1e99999999999}`, `{"n":[1, 2, 1e200000]}`,
		`{"n":1e131071}`, `{"n":-1e-16383}`, `{"n":1e40}`, `{"n":[1, 2, 1e-40]}`, `{"n":0.0e-100}`,
		`{"n":1.` + strings.Repeat("0", 16384) + `}`,
	} {
		create(fmt.Sprintf("task_data %.40s", raw), object(with(task, "task_data", raw)...))
	}
	for _, raw := range []string{
		`""`, `"2030-01-01"`, `"2030-01-01T00:00:00"`, `"2030-01-01 00:00:00Z"`, `"2030-02-30T00:00:00Z"`,
		`"2030-01-01T24:00:00Z"`, `"2030-01-01T00:00:00+25:00"`, `"tomorrow"`, "1700000000", "true", `{"at":"x"}`,
		`"0000-12-31T23:59:59Z"`, `"0001-01-01T00:00:00+01:00"`, `"9999-12-31T23:59:59-01:00"`, `"9999-12-31T23:59:59.5Z"`,
		`"10000-01-01T00:00:00Z"`, `"2030-01-01T00:00:00\u0000Z"`,
	} {
		create("scheduled_at "+raw, object(with(task, "scheduled_at", raw)...))
	}
	for _, raw := range []string{"0", "101", "-1", "1.5", `"5"`, "1e400", "99999999999999999999", "4294967297", "true"} {
		create("max_attempts "+raw, object(with(task, "max_attempts", raw)...))
	}
	item := object(task...)
	create("an array of 10001", "["+strings.Repeat(item+",", 10000)+item+"]")
	create("an array with a task without task_data", "["+item+`,{"max_attempts":1}]`)
	create("an array with null", "["+item+",null]")
	create("an array with a number", "["+item+",1]")
	create("an array of arrays", "[["+item+"]]")
	create("an array with an unknown field", "["+item+`,{"task_data":{},"color":"red"}]`)
	create("an array with a bad max_attempts", "["+item+`,{"task_data":{},"max_attempts":0}]`)
	create("an array with a \\u0000", "["+item+`,{"task_data":{"s":"\u0000"}}]`)
	create("an array with trailing data", "["+item+"] []")

	// PUT complete: task_output is required, any JSON PostgreSQL can hold.
	complete := []field{{"processor", q("p1")}, {"task_output", `{"ok":true}`}}
	for name, body := range map[string]string{
		"missing task_output":      object(without(complete, "task_output")...),
		"task_output with \\u0000": object(with(complete, "task_output", `"\u0000"`)...),
		"task_output 1e131072":     object(with(complete, "task_output", `1e131072`)...),
		"task_output 1e-16384":     object(with(complete, "task_output", `[1e-16384]`)...),
		"task_output \\udc00":      object(with(complete, "task_output", `{"\udc00":1}`)...),
	} {
		cases = append(cases, badCase{"PUT complete: " + name, "PUT", op("complete"), body, 400})
	}
	// PUT fail: error is required, not blank, at most 4096 bytes, no NUL.
	fail := []field{{"processor", q("p1")}, {"error", q("boom")}}
	for name, raw := range map[string]string{
		"empty": `""`, "blank": `" \n\t "`, "null": "null", "a number": "1", "an object": `{"msg":"x"}`,
		"4097 bytes": q(strings.Repeat("e", 4097)), "4098 bytes of 2-byte runes": q(strings.Repeat("é", 2049)),
		"with a NUL": `"bo\u0000om"`, "an unpaired surrogate": `"boom \ud800"`, "invalid UTF-8": "\"boom\xff\"",
	} {
		cases = append(cases, badCase{"PUT fail: error " + name, "PUT", op("fail"), object(with(fail, "error", raw)...), 400})
	}
	cases = append(cases, badCase{"PUT fail: missing error", "PUT", op("fail"), object(without(fail, "error")...), 400})

	// {id} that is not a positive integer.
	heartbeat := jsonBody(t, obj{"processor": "p1"})
	for _, id := range []string{"0", "-1", "abc", "1.5", "99999999999999999999", "1e3", "0x1", "%20", "%2B1", "01", "next", "stats"} {
		if _, fixed := map[string]bool{"next": true, "stats": true}[id]; !fixed {
			cases = append(cases, badCase{"GET /api/tasks/" + id, "GET", "/api/tasks/" + id, "", 400})
		}
		for _, o := range []string{"heartbeat", "complete", "fail"} {
			cases = append(cases, badCase{"PUT /api/tasks/" + id + "/" + o, "PUT", "/api/tasks/" + id + "/" + o, heartbeat, 400})
		}
	}
	// The id is checked first: a bad id with a bad body is about the id.
	cases = append(cases, badCase{"PUT /api/tasks/abc/heartbeat with a bad body", "PUT", "/api/tasks/abc/heartbeat", "{", 400})

	for _, list := range []string{"/api/tasks", "/api/tasks/processed", "/api/tasks/started"} {
		for _, query := range []string{"limit=0", "limit=1001", "limit=abc", "limit=-1", "limit=1.5",
			"limit=99999999999999999999", "after_id=-1", "after_id=abc", "after_id=1.5", "after_id=99999999999999999999"} {
			cases = append(cases, badCase{"GET " + list + "?" + query, "GET", list + "?" + query, "", 400})
		}
	}

	// Valid requests that are refused.
	byP := func(p string, extra ...any) string {
		o := obj{"processor": p}
		for i := 0; i+1 < len(extra); i += 2 {
			o[extra[i].(string)] = extra[i+1]
		}
		return jsonBody(t, o)
	}
	path := func(id int64, o string) string { return fmt.Sprintf("/api/tasks/%d/%s", id, o) }
	cases = append(cases,
		badCase{"GET an unknown task", "GET", "/api/tasks/999999", "", 404},
		badCase{"GET the largest id", "GET", "/api/tasks/9223372036854775807", "", 404},
		badCase{"heartbeat an unknown task", "PUT", path(999999, "heartbeat"), byP("p1"), 404},
		badCase{"complete an unknown task", "PUT", path(999999, "complete"), byP("p1", "task_output", 1), 404},
		badCase{"fail an unknown task", "PUT", path(999999, "fail"), byP("p1", "error", "x"), 404},
		badCase{"heartbeat by another processor", "PUT", path(running.ID, "heartbeat"), byP("p2"), 409},
		badCase{"heartbeat with another task's fence", "PUT", path(running.ID, "heartbeat"), byP("p1", "fence", done.fence(t)), 409},
		badCase{"heartbeat with a later fence", "PUT", path(running.ID, "heartbeat"), byP("p1", "fence", running.fence(t)+100), 409},
		badCase{"complete by another processor", "PUT", path(running.ID, "complete"), byP("p2", "task_output", 1), 409},
		badCase{"fail by another processor", "PUT", path(running.ID, "fail"), byP("p2", "error", "x"), 409},
		badCase{"heartbeat a done task", "PUT", path(done.ID, "heartbeat"), byP("p2"), 409},
		badCase{"complete a done task again", "PUT", path(done.ID, "complete"), byP("p2", "task_output", 2), 409},
		badCase{"fail a done task", "PUT", path(done.ID, "fail"), byP("p2", "error", "x"), 409},
		badCase{"heartbeat a dead task", "PUT", path(dead.ID, "heartbeat"), byP("p3"), 409},
		badCase{"complete a dead task", "PUT", path(dead.ID, "complete"), byP("p3", "task_output", 1), 409},
		badCase{"fail a dead task again", "PUT", path(dead.ID, "fail"), byP("p3", "error", "x"), 409},
		badCase{"heartbeat a pending task", "PUT", path(pending.ID, "heartbeat"), byP("p1"), 409},
		badCase{"complete a pending task", "PUT", path(pending.ID, "complete"), byP("p1", "task_output", 1), 409},
		badCase{"generator start with a body over 1 MiB", "POST", "/api/generator/start", strings.Repeat(" ", 1<<20+1), 413},
		badCase{"generator stop with a body over 1 MiB", "POST", "/api/generator/stop", "{" + strings.Repeat(" ", 1<<20) + "}", 413},
	)

	// Wrong methods, with the Allow each path answers.
	allow := map[string]string{}
	for _, mp := range []string{
		"PUT /api/tasks", "DELETE /api/tasks", "PATCH /api/tasks",
	} {
		allow[mp] = "GET, HEAD, POST"
	}
	for _, mp := range []string{
		"GET /api/tasks/next", "PUT /api/tasks/next", "DELETE /api/tasks/next", "PATCH /api/tasks/next",
		"GET /api/generator/start", "PUT /api/generator/start", "DELETE /api/generator/stop", "GET /api/generator/stop",
	} {
		allow[mp] = "POST"
	}
	for _, mp := range []string{
		"POST /api/tasks/stats", "PUT /api/tasks/stats", "DELETE /api/tasks/processed", "POST /api/tasks/processed",
		"PUT /api/tasks/started", "POST /api/tasks/started",
		fmt.Sprintf("POST /api/tasks/%d", running.ID), fmt.Sprintf("PUT /api/tasks/%d", running.ID),
		fmt.Sprintf("DELETE /api/tasks/%d", running.ID), "PATCH /api/tasks/abc",
		"POST /api/generator", "PUT /api/generator", "DELETE /api/generator",
		"POST /api/instances", "DELETE /api/instances",
	} {
		allow[mp] = "GET, HEAD"
	}
	for _, o := range []string{"heartbeat", "complete", "fail"} {
		allow["GET "+op(o)] = "PUT"
		allow["POST "+op(o)] = "PUT"
		allow["DELETE "+op(o)] = "PUT"
	}
	for mp := range allow {
		method, p, _ := strings.Cut(mp, " ")
		cases = append(cases, badCase{mp, method, p, heartbeat, 405})
	}
	for _, mp := range []string{
		"GET /api/task", "GET /api/tasks/", "PUT /api/tasks/1/done", "PUT /api/tasks/1/heartbeat/now",
		"POST /api/tasks/next/now", "GET /api/tasks/stats/", "GET /api/tasks/1/", "POST /api/generator/restart",
		"GET /api/generators", "GET /api/instance", "GET /api/instances/x",
	} {
		method, p, _ := strings.Cut(mp, " ")
		cases = append(cases, badCase{mp, method, p, heartbeat, 404})
	}

	before := snapshotAll(t, b.db)
	t.Run("cases", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				r := b.do(t, tc.method, tc.path, tc.body)
				if r.status != tc.status {
					t.Errorf("%s %s %.200q: got %.300s, want status %d", tc.method, tc.path, tc.body, r, tc.status)
				}
				if r.status >= 400 {
					checkError(t, "error response", r)
				}
				if tc.status == http.StatusMethodNotAllowed {
					if got, want := methods(r.header.Get("Allow")), methods(allow[tc.method+" "+tc.path]); !slices.Equal(got, want) {
						t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, r.header.Get("Allow"), allow[tc.method+" "+tc.path])
					}
				}
			})
		}
	})
	if after := snapshotAll(t, b.db); after != before {
		t.Errorf("rejected requests changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// methods returns the methods of an Allow header, sorted.
func methods(allow string) []string {
	var ms []string
	for m := range strings.SplitSeq(allow, ",") {
		if m = strings.TrimSpace(m); m != "" {
			ms = append(ms, m)
		}
	}
	slices.Sort(ms)
	return ms
}
