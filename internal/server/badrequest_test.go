package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

// snapshot is the state a rejected request must leave alone: every lease
// row and the length of the audit history.
func snapshot(t *testing.T, db pgtest.DB) string {
	t.Helper()
	var sb strings.Builder
	rows, err := db.Pool.Query(t.Context(), `SELECT * FROM leases ORDER BY id`)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		fmt.Fprintln(&sb, vals...)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	var events int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM lease_events`).Scan(&events); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	fmt.Fprintf(&sb, "lease_events: %d\n", events)
	return sb.String()
}

// field is one member of a JSON object, its value as raw JSON text (which
// may be anything, invalid JSON and invalid UTF-8 included).
type field struct{ key, raw string }

// object writes the fields as a JSON object, in order.
func object(fs ...field) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = strconv.Quote(f.key) + ":" + f.raw
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// with returns fs with key set to raw (replaced, or appended).
func with(fs []field, key, raw string) []field {
	out := make([]field, 0, len(fs)+1)
	found := false
	for _, f := range fs {
		if f.key == key {
			f.raw, found = raw, true
		}
		out = append(out, f)
	}
	if !found {
		out = append(out, field{key, raw})
	}
	return out
}

func without(fs []field, key string) []field {
	var out []field
	for _, f := range fs {
		if f.key != key {
			out = append(out, f)
		}
	}
	return out
}

// badCase is one request and the status the API promises for it.
type badCase struct {
	name   string
	method string
	path   string
	body   string
	status int
}

// TestRejectedRequestsChangeNothing sends every kind of bad request the
// API promises for every lease route, and requests that are valid but match
// nothing, and checks each answer and that the database is as it was.
func TestRejectedRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// Something to change: seed:a held by h1 (its first holder released it,
	// leaving a stale fence), seed:b held by h2, seed:c released by h3.
	stale := b.acquire(t, "seed:a", "h0", 3600)
	b.release(t, "seed:a", "h0")
	a := b.acquire(t, "seed:a", "h1", 3600)
	bLease := b.acquire(t, "seed:b", "h2", 3600)
	c := b.acquire(t, "seed:c", "h3", 3600)
	b.release(t, "seed:c", "h3")

	q := strconv.Quote
	long := strings.Repeat("r", 256)
	longUTF8 := strings.Repeat("é", 128) // 256 bytes
	idPath := fmt.Sprintf("/api/leases/%d", a.ID)

	// The body routes, each with a body it would accept: acquiring a new
	// resource, or renewing/releasing seed:a by its holder. A bad variant
	// that slipped through would change the database.
	bodyRoutes := []struct {
		method, path string
		base         []field
		ttl, fence   bool
	}{
		{"POST", "/api/leases", []field{{"resource", q("fresh")}, {"holder", q("h-new")}}, true, false},
		{"PUT", "/api/leases/renew", []field{{"resource", q("seed:a")}, {"holder", q("h1")}, {"ttl_seconds", "60"}}, true, true},
		{"DELETE", "/api/leases/release", []field{{"resource", q("seed:a")}, {"holder", q("h1")}}, false, true},
		{"DELETE", idPath, []field{{"resource", q("seed:a")}, {"holder", q("h1")}}, false, true},
	}

	var cases []badCase
	for _, r := range bodyRoutes {
		route := r.method + " " + r.path
		add := func(name, body string, status int) {
			cases = append(cases, badCase{route + ": " + name, r.method, r.path, body, status})
		}
		base := object(r.base...)
		add("malformed JSON", `{"resource": "seed:a", "holder": }`, 400)
		add("truncated JSON", base[:len(base)-1], 400)
		add("single-quoted JSON", `{'resource': 'seed:a', 'holder': 'h1'}`, 400)
		add("form encoding", "resource=seed:a&holder=h1", 400)
		add("empty body", "", 400)
		add("whitespace body", " \r\n\t ", 400)
		add("empty array", "[]", 400)
		add("array of the object", "["+base+"]", 400)
		add("string", q("seed:a"), 400)
		add("number", "42", 400)
		add("true", "true", 400)
		add("null", "null", 400)
		add("trailing object", base+" {}", 400)
		add("the object twice", base+base, 400)
		add("trailing garbage", base+" x", 400)
		add("trailing bracket", base+"]", 400)
		add("trailing brace", base+"}", 400)
		add("unknown field", object(with(r.base, "color", q("red"))...), 400)
		add("unknown field null", object(with(r.base, "lease_id", "null")...), 400)
		if !r.fence {
			add("fence (not a field here)", object(with(r.base, "fence", "1")...), 400)
		}
		if !r.ttl {
			add("ttl_seconds (not a field here)", object(with(r.base, "ttl_seconds", "30")...), 400)
		}

		for _, name := range []string{"resource", "holder"} {
			add("missing "+name, object(without(r.base, name)...), 400)
			for _, v := range []struct{ what, raw string }{
				{"empty", `""`},
				{"null", "null"},
				{"a number", "7"},
				{"an object", `{"name":"x"}`},
				{"over 255 bytes", q(long)},
				{"over 255 bytes of 2-byte runes", q(longUTF8)},
				{"a newline escape", `"seed:a\n"`},
				{"a raw newline", "\"seed:a\n\""},
				{"a NUL escape", `"seed\u0000a"`},
				{"a tab", `"seed\ta"`},
				{"an escape character", `"seed\u001ba"`},
				{"a DEL escape", `"seed:a\u007f"`},
				{"a raw DEL", "\"seed:a\x7f\""},
				{"a C1 control", `"seed:a\u0085"`},
				{"invalid UTF-8", "\"seed:a\xff\""},
				{"a truncated UTF-8 sequence", "\"seed:a\xc3\""},
				{"UTF-8 of a surrogate", "\"seed:a\xed\xa0\x80\""},
				{"overlong UTF-8", "\"seed:a\xc0\xaf\""},
				{"an escaped lone surrogate", `"seed:a\ud800"`},
			} {
				add(name+" "+v.what, object(with(r.base, name, v.raw)...), 400)
			}
		}

		if r.ttl {
			for _, raw := range []string{"0", "3601", "-1", "1.5", `"30"`, "99999999999999999999",
				"9223372036854775808", "4294967297", "-4294967295", "1e400", "true", "[30]", `{"s":30}`} {
				add("ttl_seconds "+raw, object(with(r.base, "ttl_seconds", raw)...), 400)
			}
		}
		if r.fence {
			for _, raw := range []string{"0", "-1", `"x"`, `"1"`, "1.5", "99999999999999999999", "true"} {
				add("fence "+raw, object(with(r.base, "fence", raw)...), 400)
			}
		}

		// Just over the limit, so that the server reads it all before it answers.
		add("body over 1 MiB", object(with(r.base, "holder", q(strings.Repeat("h", 1<<20)))...), 413)
		add("body over 1 MiB of trailing space", base+strings.Repeat(" ", 1<<20), 413)
	}

	validRelease := object(field{"resource", q("seed:a")}, field{"holder", q("h1")})
	for _, id := range []string{"0", "-1", "abc", "1.5", "99999999999999999999", "1e3", "0x1", "%20", "1%20", "%2B1", "01", "0001"} {
		cases = append(cases,
			badCase{"GET /api/leases/" + id, "GET", "/api/leases/" + id, "", 400},
			badCase{"DELETE /api/leases/" + id, "DELETE", "/api/leases/" + id, validRelease, 400})
	}

	lists := []string{"/api/leases", "/api/leases/active", "/api/leases/expired", "/api/leases/renewed", "/api/leases/released"}
	for _, list := range lists {
		for _, query := range []string{"limit=0", "limit=10001", "limit=abc", "limit=-1", "limit=1.5",
			"limit=99999999999999999999", "after_id=-1", "after_id=abc", "after_id=1.5",
			"prefix=" + long, "prefix=" + longUTF8} {
			cases = append(cases, badCase{"GET " + list + "?" + query[:min(len(query), 20)], "GET", list + "?" + query, "", 400})
		}
	}
	for _, query := range []string{"limit=0", "limit=10001", "limit=abc", "after=-1", "after=x", "resource=" + long} {
		cases = append(cases, badCase{"GET /api/leases/events?" + query[:min(len(query), 20)], "GET", "/api/leases/events?" + query, "", 400})
	}

	// Valid requests that match nothing.
	cases = append(cases,
		badCase{"GET an unknown id", "GET", "/api/leases/999999", "", 404},
		badCase{"GET the largest id", "GET", "/api/leases/9223372036854775807", "", 404},
		badCase{"acquire a held resource", "POST", "/api/leases", `{"resource":"seed:a","holder":"h2"}`, 409},
		badCase{"acquire a held resource with a TTL", "POST", "/api/leases", `{"resource":"seed:a","holder":"h2","ttl_seconds":1}`, 409},
		badCase{"renew by another holder", "PUT", "/api/leases/renew", `{"resource":"seed:a","holder":"h2"}`, 404},
		badCase{"renew by the previous holder", "PUT", "/api/leases/renew", `{"resource":"seed:a","holder":"h0"}`, 404},
		badCase{"renew with a stale fence", "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"seed:a","holder":"h1","fence":%d}`, stale.Fence), 404},
		badCase{"renew with another lease's fence", "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"seed:a","holder":"h1","fence":%d}`, bLease.Fence), 404},
		badCase{"renew a released lease", "PUT", "/api/leases/renew", `{"resource":"seed:c","holder":"h3"}`, 404},
		badCase{"renew an unknown resource", "PUT", "/api/leases/renew", `{"resource":"nothing","holder":"h1"}`, 404},
		badCase{"release by another holder", "DELETE", "/api/leases/release", `{"resource":"seed:a","holder":"h2"}`, 404},
		badCase{"release with a stale fence", "DELETE", "/api/leases/release", fmt.Sprintf(`{"resource":"seed:a","holder":"h1","fence":%d}`, stale.Fence), 404},
		badCase{"release twice", "DELETE", "/api/leases/release", `{"resource":"seed:c","holder":"h3"}`, 404},
		badCase{"release an unknown resource", "DELETE", "/api/leases/release", `{"resource":"nothing","holder":"h1"}`, 404},
		badCase{"release by another lease's id", "DELETE", fmt.Sprintf("/api/leases/%d", bLease.ID), validRelease, 404},
		badCase{"release by an unknown id", "DELETE", "/api/leases/999999", validRelease, 404},
		badCase{"release twice by id", "DELETE", fmt.Sprintf("/api/leases/%d", c.ID), `{"resource":"seed:c","holder":"h3"}`, 404},
	)

	// Wrong methods and unknown paths.
	for _, mp := range []string{
		"PATCH /api/leases", "DELETE /api/leases", "PUT /api/leases",
		"GET /api/leases/renew", "POST /api/leases/renew", "DELETE /api/leases/renew",
		"GET /api/leases/release", "PUT /api/leases/release", "POST /api/leases/release",
		"POST /api/leases/active", "DELETE /api/leases/active", "PUT /api/leases/expired",
		"DELETE /api/leases/renewed", "POST /api/leases/released", "DELETE /api/leases/events",
		"PUT " + idPath, "POST " + idPath, "PATCH " + idPath, "PUT /api/leases/abc",
		"POST /healthz", "DELETE /readyz", "POST /metrics",
	} {
		method, path, _ := strings.Cut(mp, " ")
		cases = append(cases, badCase{mp, method, path, validRelease, 405})
	}
	for _, mp := range []string{
		"GET /api/nothing", "GET /api", "GET /api/", "POST /api/lease", "GET /api/leases/1/extra",
		"PUT /api/leases/renew/now", "GET /API/leases", "GET /nothing", "DELETE /api/tasks/1/x",
	} {
		method, path, _ := strings.Cut(mp, " ")
		cases = append(cases, badCase{mp, method, path, "", 404})
	}

	before := snapshot(t, b.db)
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
					checkAllow(t, b, tc.method, tc.path, r)
				}
			})
		}
	})
	if after := snapshot(t, b.db); after != before {
		t.Errorf("rejected requests changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// checkAllow checks a 405's Allow header: present, without the method
// refused, and naming only methods that are not refused in turn.
func checkAllow(t *testing.T, b bundle, method, path string, r response) {
	t.Helper()
	allow := r.header.Get("Allow")
	if allow == "" {
		t.Errorf("%s %s: 405 without an Allow header", method, path)
		return
	}
	for m := range strings.SplitSeq(allow, ",") {
		m = strings.TrimSpace(m)
		if m == method {
			t.Errorf("%s %s: refused, but Allow %q names %s", method, path, allow, m)
			continue
		}
		// With an empty body: a method that is allowed fails validation
		// (400) or matches nothing, and changes nothing either way.
		if got := b.do(t, m, path, ""); got.status == http.StatusMethodNotAllowed {
			t.Errorf("%s %s: Allow %q names %s, but %s %s is refused too (Allow %q)",
				method, path, allow, m, m, path, got.header.Get("Allow"))
		}
	}
}

// TestNullAndRepeatedMembers: a member of a request body given as null, or
// given twice, is refused (400) with a message naming it and saying what to
// send instead, on every route that reads a body, and the database is left
// alone. encoding/json would read the null as the member left out (the
// default) and the repeated member as its last value. A member that takes
// null as a value of its own (task_output) keeps it, and the client's own
// JSON inside task_data and task_output is not looked into.
func TestNullAndRepeatedMembers(t *testing.T) {
	t.Parallel()
	// The task claimed here is completed after a hundred requests: an
	// hour's lease outlasts them however loaded the machine.
	b := newBundle(t, func(d *server.Deps) { d.TaskTTL = time.Hour })
	b.acquire(t, "seed:a", "h1", 3600)
	b.createTask(t, `{"task_data": {"n": 1}}`)
	running := b.claimTask(t, "p1")
	b.createTask(t, `{"task_data": {"n": 2}}`)

	op := func(o string) string { return fmt.Sprintf("/api/tasks/%d/%s", running.ID, o) }
	// Each route with a body it would accept, and its optional members.
	routes := []struct {
		method, path string
		base         []field
		optional     map[string]string // member → what the message asks for instead
	}{
		{"POST", "/api/leases", []field{{"resource", `"fresh"`}, {"holder", `"h9"`}},
			map[string]string{"ttl_seconds": "an integer", "wait_seconds": "an integer"}},
		{"PUT", "/api/leases/renew", []field{{"resource", `"seed:a"`}, {"holder", `"h1"`}},
			map[string]string{"ttl_seconds": "an integer", "fence": "an integer"}},
		{"DELETE", "/api/leases/release", []field{{"resource", `"seed:a"`}, {"holder", `"h1"`}},
			map[string]string{"fence": "an integer"}},
		{"POST", "/api/tasks", []field{{"task_data", `{"n":9}`}}, map[string]string{
			"kind": "a string", "queue": "a string", "priority": "an integer", "unique_key": "a string",
			"ttl_seconds": "an integer", "scheduled_at": "a string", "max_attempts": "an integer"}},
		{"POST", "/api/tasks/next", []field{{"processor", `"p9"`}},
			map[string]string{"kinds": "an array", "queues": "an array", "wait_seconds": "an integer"}},
		{"PUT", op("heartbeat"), []field{{"processor", `"p1"`}}, map[string]string{"fence": "an integer"}},
		{"PUT", op("complete"), []field{{"processor", `"p1"`}, {"task_output", `{"ok":true}`}}, map[string]string{"fence": "an integer"}},
		{"PUT", op("fail"), []field{{"processor", `"p1"`}, {"error", `"boom"`}},
			map[string]string{"fence": "an integer", "retry_in_seconds": "a number"}},
		{"PUT", op("snooze"), []field{{"processor", `"p1"`}, {"delay_seconds", "60"}}, map[string]string{"fence": "an integer"}},
		{"PUT", op("requeue"), []field{{"processor", `"p1"`}}, map[string]string{"fence": "an integer", "reason": "a string"}},
		{"POST", op("cancel"), []field{{"processor", `"p1"`}},
			map[string]string{"reason": "a string", "processor": "a string", "fence": "an integer"}},
	}
	type refused struct {
		name, method, path, body string
		want                     []string // in the error message
	}
	var cases []refused
	for _, r := range routes {
		route := r.method + " " + r.path
		add := func(name, body string, want ...string) {
			cases = append(cases, refused{route + ": " + name, r.method, r.path, body, want})
		}
		for _, f := range r.base {
			// A member the route needs: null is no default.
			if f.key != "task_data" && f.key != "task_output" && r.optional[f.key] == "" {
				add(f.key+" null", object(with(r.base, f.key, "null")...), `"`+f.key+`" is null; give`)
			}
			add(f.key+" twice", object(append(r.base, f)...), `"`+f.key+`" appears twice in the body; give each key once`)
			if strings.HasPrefix(f.raw, `"`) {
				add(f.key+" twice, the second different", object(append(r.base, field{f.key, `"other"`})...), `"`+f.key+`" appears twice`)
			}
		}
		for key, kind := range r.optional {
			add(key+" null", object(with(r.base, key, "null")...),
				`"`+key+`" is null; leave it out for the default, or give `+kind)
		}
		// What encoding/json takes for the same field is the same member.
		first := r.base[0]
		add(first.key+" twice, in another case", object(append(r.base, field{strings.ToUpper(first.key), first.raw})...),
			`"`+first.key+`" appears twice in the body (as "`+first.key+`" and "`+strings.ToUpper(first.key)+`"`)
		add(first.key+" twice, once escaped", object(r.base...)[:len(object(r.base...))-1]+`,"\u0`+fmt.Sprintf("%03x", first.key[0])+first.key[1:]+`":`+first.raw+"}",
			`"`+first.key+`" appears twice in the body; give each key once`)
	}
	cases = append(cases,
		refused{"POST /api/leases: the example of the issue", "POST", "/api/leases", `{"resource": "fresh", "holder": "h9", "ttl_seconds": null}`,
			[]string{`"ttl_seconds" is null; leave it out for the default, or give an integer`}},
		refused{"POST /api/leases: ttl_seconds twice", "POST", "/api/leases", `{"resource": "fresh", "holder": "h9", "ttl_seconds": 5, "ttl_seconds": 60}`,
			[]string{`"ttl_seconds" appears twice in the body; give each key once`}},
		refused{"POST /api/tasks: an array with a null in its second task", "POST", "/api/tasks", `[{"task_data": {}}, {"task_data": {}, "max_attempts": null}]`,
			[]string{`item 1 of the array (counting from 0): "max_attempts" is null; leave it out for the default`}},
		refused{"POST /api/tasks: an array with a key twice in its first task", "POST", "/api/tasks", `[{"task_data": {}, "kind": "a", "kind": "b"}, {"task_data": {}}]`,
			[]string{`item 0 of the array (counting from 0): "kind" appears twice in the body`}},
		refused{"POST /api/tasks: task_data null", "POST", "/api/tasks", `{"task_data": null}`,
			[]string{`"task_data" must be a JSON object, not null`}},
		refused{"POST /api/session: token null", "POST", "/api/session", `{"token": null}`,
			[]string{`"token" is null; give a string`}},
		refused{"POST /api/session: token twice", "POST", "/api/session", `{"token": "", "token": "guess"}`,
			[]string{`"token" appears twice in the body`}},
		refused{"POST /api/tasks/{id}/retry: an unknown member, null", "POST", op("retry"), `{"reason": null}`,
			[]string{`unknown field "reason"`}},
	)

	before := snapshotAll(t, b.db)
	t.Run("refused", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				r := b.do(t, tc.method, tc.path, tc.body)
				if r.status != http.StatusBadRequest {
					t.Fatalf("%s %s %s: got %s, want 400", tc.method, tc.path, tc.body, r)
				}
				var body struct{ Error string }
				checkError(t, "400", r)
				_ = json.Unmarshal(r.body, &body)
				for _, w := range tc.want {
					if !strings.Contains(body.Error, w) {
						t.Errorf("%s %s %s: error %q, want it to say %q", tc.method, tc.path, tc.body, body.Error, w)
					}
				}
			})
		}
	})
	if after := snapshotAll(t, b.db); after != before {
		t.Errorf("refused requests changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// What is still accepted: task_output null (no result), and repeated
	// keys or nulls inside the client's own task_data and task_output.
	created := b.createTask(t, `{"task_data": {"a": 1, "a": 2, "b": null, "c": {"d": null, "d": 3}}}`)
	if created.ID == 0 {
		t.Fatal("POST /api/tasks with repeated keys inside task_data: no task")
	}
	done := b.do(t, "PUT", op("complete"), `{"processor": "p1", "task_output": null}`).
		want(t, "complete with task_output null", http.StatusAccepted).task(t, "complete")
	if done.State != "done" || string(done.TaskOutput) != "null" {
		t.Errorf("complete with task_output null: got %v, want done with the output null", done)
	}
	other := b.claimTask(t, "p2")
	b.do(t, "PUT", fmt.Sprintf("/api/tasks/%d/complete", other.ID), `{"processor": "p2", "task_output": {"x": 1, "x": 2}}`).
		want(t, "complete with a key twice inside task_output", http.StatusAccepted)
}
