package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

// fuzzRoutes are the routes FuzzAPI sends its input to: every route that
// reads a body, and the lists that read a query.
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/api/leases"},
	{"PUT", "/api/leases/renew"},
	{"DELETE", "/api/leases/release"},
	{"DELETE", "/api/leases/1"},
	{"POST", "/api/tasks"},
	{"POST", "/api/tasks/next"},
	{"PUT", "/api/tasks/1/heartbeat"},
	{"PUT", "/api/tasks/1/complete"},
	{"PUT", "/api/tasks/1/fail"},
	{"POST", "/api/session"},
	{"POST", "/api/generator/start"},
	{"POST", "/api/generator/stop"},
	{"GET", "/api/leases"},
	{"GET", "/api/leases/active"},
	{"GET", "/api/leases/events"},
	{"GET", "/api/tasks"},
	{"GET", "/api/tasks/processed"},
}

// FuzzAPI sends a body and a query to a route of a real server on a real
// database: the answer is never a 5xx; a 4xx is the API's JSON error and
// leaves the database as it was; an acquisition stores the names exactly
// as sent, and a task its task_data as PostgreSQL reads the JSON sent.
func FuzzAPI(f *testing.F) {
	for i, body := range []string{
		`{"resource":"r","holder":"h","ttl_seconds":30}`,
		`{"resource":"seed","holder":"h1"}`,
		`{"resource":"seed","holder":"h1"}`,
		`{"resource":"seed","holder":"h1","fence":1}`,
		`[{"task_data":{"n":1e-16383}},{"task_data":{"s":"\ud83d\ude00"},"scheduled_at":"9999-12-31T23:59:59Z"}]`,
		`{"processor":"p"}`,
		`{"processor":"p","fence":2}`,
		`{"processor":"p","task_output":{"n":123456789012345678901234567890}}`,
		`{"processor":"p","error":"boom"}`,
		`{"token":"fuzz-token"}`,
		`{}`, ``,
	} {
		f.Add(uint8(i), "", []byte(body))
	}
	f.Add(uint8(0), "", []byte(`{"resource":"caf\u00e9","holder":"h\u00a0"}`))
	f.Add(uint8(4), "", []byte(`{"task_data":{"n":1e131071}}`))
	f.Add(uint8(4), "", []byte(`{"task_data":{"n":1e-16384}}`))
	f.Add(uint8(12), "prefix=%FF&limit=2", []byte(nil))
	f.Add(uint8(12), "prefix=a%00", []byte(nil))
	f.Add(uint8(14), "resource=r&after=1&limit=10000", []byte(nil))
	f.Add(uint8(15), "limit=1000&after_id=4611686018427387904", []byte(nil))

	const token = "fuzz-token"
	db := pgtest.New(f)
	h := server.NewServer(testDeps(db, withToken(token)))
	f.Fuzz(func(t *testing.T, route uint8, query string, body []byte) {
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		target := rt.path
		if query != "" {
			target += "?" + query
			if _, err := url.ParseRequestURI(target); err != nil || strings.ContainsAny(query, "# ") {
				return // not a request line a client could send
			}
		}
		before := dbState(t, db)
		req := httptest.NewRequestWithContext(t.Context(), rt.method, target, strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		r := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
		what := rt.method + " " + target + " " + string(body)

		switch {
		case r.status >= 500:
			t.Fatalf("%s: %s", what, r)
		case r.status >= 400:
			checkError(t, what, r)
			if after := dbState(t, db); after != before {
				t.Fatalf("%s: refused with %s, but the database changed", what, r)
			}
		case rt.method == "POST" && rt.path == "/api/leases" && r.status == http.StatusCreated:
			var sent struct{ Resource, Holder string }
			_ = json.Unmarshal(body, &sent)
			if got := r.lease(t, what); got.Resource != sent.Resource || got.Holder != sent.Holder {
				t.Fatalf("%s: stored as %q, %q", what, got.Resource, got.Holder)
			}
		case rt.method == "POST" && rt.path == "/api/tasks" && r.status == http.StatusCreated:
			checkStoredTasks(t, db, what, body, r.body)
		}
	})
}

// dbState is every row a request could change, as text (snapshotAll's
// numbers overflow a float64 with the task_data the fuzzer sends).
func dbState(t *testing.T, db pgtest.DB) string {
	t.Helper()
	var state string
	err := db.Pool.QueryRow(t.Context(), `
		SELECT concat_ws(E'\n',
			(SELECT string_agg(l::text, E'\n' ORDER BY id) FROM leases AS l),
			(SELECT count(*) FROM lease_events),
			(SELECT string_agg(t::text, E'\n' ORDER BY id) FROM tasks AS t),
			(SELECT g::text FROM generator_state AS g),
			(SELECT string_agg(i::text, E'\n' ORDER BY id) FROM instances AS i))`).Scan(&state)
	if err != nil {
		t.Fatalf("database state: %v", err)
	}
	return state
}

// checkStoredTasks checks that each task created stores the task_data sent,
// as PostgreSQL's jsonb reads it.
func checkStoredTasks(t *testing.T, db pgtest.DB, what string, sent, got []byte) {
	t.Helper()
	type item struct {
		TaskData json.RawMessage `json:"task_data"`
	}
	type created struct {
		ID int64 `json:"id"`
	}
	var items []item
	var tasks []created
	if strings.HasPrefix(strings.TrimSpace(string(sent)), "[") {
		_ = json.Unmarshal(sent, &items)
		_ = json.Unmarshal(got, &tasks)
	} else {
		var one item
		var c created
		_ = json.Unmarshal(sent, &one)
		_ = json.Unmarshal(got, &c)
		items, tasks = []item{one}, []created{c}
	}
	if len(items) != len(tasks) {
		t.Fatalf("%s: %d tasks sent, %d created", what, len(items), len(tasks))
	}
	for i := range items {
		var same bool
		err := db.Pool.QueryRow(t.Context(), `SELECT task_data = $1::text::jsonb FROM tasks WHERE id = $2`,
			string(items[i].TaskData), tasks[i].ID).Scan(&same)
		if err != nil || !same {
			t.Fatalf("%s: task %d stores other task_data than sent (%v)", what, tasks[i].ID, err)
		}
	}
}

// authorized is the API's rule, written out apart from the server's:
// a request presents the token in an Authorization header of the Bearer
// scheme (any case) or, when it has no such header, in the sign-in cookie.
func authorized(r *http.Request, token string) (ok, byCookie bool) {
	if scheme, got, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
		return got == token, false
	}
	c, err := r.Cookie(server.SessionCookie)
	if err != nil {
		return false, false
	}
	return server.SessionValid(token, c.Value), true
}

// FuzzRequireToken sends requests built from any method, target,
// Authorization header and Cookie header, parsed as the server parses a
// request, to a server with an API token. A request the API's rule
// authorizes is never answered 401; one it does not is never served by an
// /api/* route (POST /api/session aside) or /ws: the route the request log
// names for it must be a public one, or the answer a 401 (or the mux's
// redirect to the cleaned path, which serves nothing). The stores point
// at a database that refuses connections, so that an authorized request
// fails fast (503) instead of needing one.
func FuzzRequireToken(f *testing.F) {
	const token = "s3cret-token-of-the-fuzz"
	cookie := server.SessionCookie + "=" + server.SessionValue(token, time.Now().Add(time.Hour))
	for _, s := range [][4]string{
		{"GET", "/api/leases", "Bearer " + token, ""},
		{"GET", "/api/leases", "bearer " + token, ""},
		{"GET", "/api/leases", "Bearer  " + token, ""},
		{"GET", "/api/leases", "Bearer " + token + " ", ""},
		{"GET", "/api/leases", "Basic " + token, cookie},
		{"GET", "/api/leases", "", cookie},
		{"POST", "/api/leases", "", cookie},
		{"GET", "/ws", "", cookie + "; other=1"},
		{"GET", "/ws", "Bearer wrong", cookie},
		{"GET", "//api/leases", "", ""},
		{"GET", "/api/../api/leases", "", ""},
		{"GET", "/api%2Fleases", "", ""},
		{"GET", "/API/leases", "", ""},
		{"GET", "/api/leases/1", "", ""},
		{"POST", "/api/session", "", ""},
		{"GET", "http://other.example/api/leases", "", ""},
		{"OPTIONS", "*", "", ""},
		{"GET", "/healthz", "", ""},
		{"DELETE", "/api/leases/release", "Bearer", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	var logs syncBuffer
	h := server.NewServer(server.Deps{
		Leases: leasestore.NewStore(pool), Tasks: taskstore.NewStore(pool), Generator: demo.NewState(pool),
		Instances: instance.NewStore(pool), DefaultTTL: 30 * time.Second, APIToken: token,
		Log:     zerolog.New(&logs),
		Metrics: server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready:   func(context.Context) error { return nil },
	})
	f.Fuzz(func(t *testing.T, method, target, authorization, cookies string) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: leasehold.test\r\n"
		if authorization != "" {
			raw += "Authorization: " + authorization + "\r\n"
		}
		if cookies != "" {
			raw += "Cookie: " + cookies + "\r\n"
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw + "\r\n")))
		if err != nil || req.Header.Get("Authorization") != authorization || len(req.Header.Values("Cookie")) > 1 {
			return // not a request the server would read, or one with smuggled headers
		}
		req = req.WithContext(t.Context())
		logged := len(logs.String())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		ok, _ := authorized(req, token)
		if ok && rec.Code == http.StatusUnauthorized {
			t.Fatalf("%q: authorized by the API's rule, answered 401", raw)
		}
		route := loggedRoute(t, logs.String()[logged:])
		protected := strings.Contains(route, " /api/") && route != "POST /api/session" || route == "GET /ws"
		// A path the mux would clean is redirected, which serves nothing.
		redirected := rec.Code >= 300 && rec.Code < 400
		if !ok && protected && rec.Code != http.StatusUnauthorized && !redirected {
			t.Fatalf("%q: not authorized, routed to %s and answered %d %s", raw, route, rec.Code, rec.Body)
		}
		if rec.Code == http.StatusUnauthorized {
			checkError(t, raw, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()})
			if !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%q: 401 without a Bearer challenge", raw)
			}
		}
	})
}

// loggedRoute returns the route of the request log line among lines.
func loggedRoute(t *testing.T, lines string) string {
	t.Helper()
	for l := range strings.Lines(lines) {
		var line struct{ Message, Route string }
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if line.Message == "request" {
			return line.Route
		}
	}
	t.Fatalf("no request log line in %q", lines)
	return ""
}
