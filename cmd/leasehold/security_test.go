package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// The tests of this file reproduce, each against a real replica (serve, on
// a real database), the findings of an outside security review, and show
// each closed: a small body that made huge answers, the service's own
// leases open to any client, cross-site writes and DNS rebinding with no
// token, one token that could do everything, and the smaller ones.

// send makes a request with headers (name, value pairs; "Host" sets the
// request's host) and returns the status and body.
func (r *replica) send(t *testing.T, method, path, body string, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	got, _ := io.ReadAll(res.Body)
	return res.StatusCode, got
}

// openReplica is a replica without a token, as serve starts by default (on
// loopback).
func openReplica(t *testing.T, extra ...string) *replica {
	t.Helper()
	db := pgtest.New(t)
	return startReplica(t, serveConfig(t, append([]string{"--addr", "127.0.0.1:0", "--roles", "api"}, extra...), env("DATABASE_URL", db.URL)))
}

// TestNumbersCannotBlowUpAnswers: the review's 9 KB body of 1,000 copies
// of 1e131071 was stored, answered with 131 MB, and answered so again on
// every read. Refused now, with a 400 that says why; and a dead task's
// error and data, whatever their size, cost the dashboard's feed a line.
func TestNumbersCannotBlowUpAnswers(t *testing.T) {
	t.Parallel()
	r := openReplica(t)
	nums := make([]string, 1000)
	for i := range nums {
		nums[i] = "1e131071"
	}
	body := `{"task_data": {"n": [` + strings.Join(nums, ",") + `]}}`
	status, answer := r.send(t, "POST", "/api/tasks", body, "Content-Type", "application/json")
	if status != http.StatusBadRequest || !strings.Contains(string(answer), "which PostgreSQL would store and print as 131072 characters") {
		t.Fatalf("POST /api/tasks with 1,000 × 1e131071 (%d bytes): %d, %d bytes %.200s; want a 400 saying how long it would print", len(body), status, len(answer), answer)
	}

	// A dead task with 500 KB of data and a 4 KB error.
	data := `{"blob": "` + strings.Repeat("x", 500<<10) + `"}`
	created := call[struct{ ID int64 }](t, r, "POST", "/api/tasks", `{"task_data": `+data+`, "max_attempts": 1, "kind": "big"}`, http.StatusCreated)
	claimed := call[struct{ Fence int64 }](t, r, "POST", "/api/tasks/next", `{"processor": "p", "kinds": ["big"]}`, http.StatusOK)
	call[json.RawMessage](t, r, "PUT", fmt.Sprintf("/api/tasks/%d/fail", created.ID),
		fmt.Sprintf(`{"processor": "p", "fence": %d, "error": %q}`, claimed.Fence, strings.Repeat("e", 4000)), http.StatusAccepted)
	conn, res, err := websocket.DefaultDialer.Dial(strings.Replace(r.url, "http", "ws", 1)+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	defer conn.Close()
	_, snapshot, err := conn.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if len(snapshot) > 32<<10 || !bytes.Contains(snapshot, []byte(fmt.Sprintf(`"id":%d`, created.ID))) {
		t.Errorf("the /ws snapshot with a dead task of 500 KB data and a 4 KB error: %d bytes; want its line, well under 32 KiB", len(snapshot))
	}
	t.Logf("the snapshot: %d bytes, the dead task among its lines", len(snapshot))
}

// TestReservedLeases: the review took leasehold:reaper with a client's
// acquisition (201) and released it; the reaper stopped. Every lease route
// now refuses the reserved namespace with a 403 naming it, and so do a
// task's and a schedule's lock.
func TestReservedLeases(t *testing.T) {
	t.Parallel()
	r := openReplica(t)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/api/leases", `{"resource": "leasehold:reaper", "holder": "mallory", "ttl_seconds": 3600}`},
		{"PUT", "/api/leases/renew", `{"resource": "leasehold:reaper", "holder": "mallory"}`},
		{"DELETE", "/api/leases/release", `{"resource": "leasehold:scheduler", "holder": "mallory"}`},
		{"POST", "/api/leases", `{"resource": "leasehold:instance:replica-a", "holder": "mallory"}`},
		{"POST", "/api/tasks", `{"task_data": {}, "lock": "leasehold:generator"}`},
		{"POST", "/api/schedules", `{"name": "s", "cron": "@hourly", "kind": "k", "lock": "leasehold:reaper"}`},
	} {
		status, body := r.send(t, tc.method, tc.path, tc.body, "Content-Type", "application/json")
		if status != http.StatusForbidden || !strings.Contains(string(body), `reserved namespace \"leasehold:\"`) {
			t.Errorf("%s %s %s: %d %s; want 403 naming the reserved namespace", tc.method, tc.path, tc.body, status, body)
		}
	}
}

// TestNoTokenNoStrangers: without a token the review drove the API from
// another site's page (text/plain bodies are "simple" cross-site requests)
// and read it through DNS rebinding (Host: evil.example). Refused now: 415
// for a body that is not JSON, 403 for another site's Origin, 421 for a
// Host that is not this server's, the websocket too; and serve will not
// listen beyond loopback without a token unless told --insecure.
func TestNoTokenNoStrangers(t *testing.T) {
	t.Parallel()
	r := openReplica(t)
	for _, tc := range []struct {
		method, path, body string
		header             []string
		want               int
	}{
		{"POST", "/api/tasks", `{"task_data": {}}`, []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType},
		{"POST", "/api/generator/start", "", []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType},
		{"POST", "/api/tasks", "task_data=1", []string{"Content-Type", "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"POST", "/api/tasks", `{"task_data": {}}`, []string{"Origin", "https://evil.example"}, http.StatusForbidden},
		{"POST", "/api/generator/start", "", []string{"Origin", "https://evil.example"}, http.StatusForbidden},
		{"GET", "/api/tasks", "", []string{"Host", "evil.example:8080", "Origin", "http://evil.example:8080"}, http.StatusMisdirectedRequest},
		{"GET", "/", "", []string{"Host", "evil.example:8080"}, http.StatusMisdirectedRequest},
		{"GET", "/ws", "", []string{"Host", "evil.example:8080", "Origin", "http://evil.example:8080", "Connection", "Upgrade",
			"Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}, http.StatusMisdirectedRequest},
		// What a user's own tools send still works.
		{"POST", "/api/tasks", `{"task_data": {}}`, []string{"Content-Type", "application/json; charset=utf-8"}, http.StatusCreated},
		{"GET", "/api/tasks", "", []string{"Host", "localhost:8080"}, http.StatusOK},
		{"GET", "/healthz", "", []string{"Host", "10.1.2.3:8080"}, http.StatusOK},
	} {
		if status, body := r.send(t, tc.method, tc.path, tc.body, tc.header...); status != tc.want {
			t.Errorf("%s %s %v: %d %.200s; want %d", tc.method, tc.path, tc.header, status, body, tc.want)
		}
	}
	if c := serveConfig(t, nil, env("DATABASE_URL", "postgres://x@localhost/x")); c.Addr != "127.0.0.1:8080" {
		t.Errorf("serve's default address: %s, want loopback (127.0.0.1:8080)", c.Addr)
	}
	err := run(t.Context(), []string{"serve", "--addr", ":8080"}, env("DATABASE_URL", "postgres://x@localhost/x"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no API token is set") || !strings.Contains(err.Error(), "--insecure") {
		t.Errorf("serve --addr :8080 without a token: %v; want a usage error naming --api-token and --insecure", err)
	}
}

// TestScopedTokens: with one token, any holder of it renewed or released
// another's lease, completed or cancelled any worker's task and read every
// task's data, and the read-only dashboard needed it whole. Tokens of their
// own scopes and prefixes now: a read token reads and changes nothing; a
// lease token bound to its holders cannot touch another's lease; a worker's
// token works only its queue; a producer's reads only its queue's tasks.
func TestScopedTokens(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tokens := `[
		{"name": "dashboard", "token": "read-only-token-0123", "scopes": ["read"]},
		{"name": "team-a", "token": "team-a-lease-token-01", "scopes": ["lease"], "resources": ["a:"], "holders": ["a/"]},
		{"name": "team-b", "token": "team-b-lease-token-01", "scopes": ["lease"], "holders": ["b/"]},
		{"name": "billing", "token": "billing-worker-token1", "scopes": ["work", "produce", "read"], "queues": ["billing"], "holders": ["billing/"]},
		{"name": "ops", "token": "ops-admin-token-01234", "scopes": ["admin"]}
	]`
	file := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(file, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--tokens-file", file}, env("DATABASE_URL", db.URL)))
	as := func(token string) []string {
		return []string{"Authorization", "Bearer " + token, "Content-Type", "application/json"}
	}
	expect := func(what string, want int, method, path, body, token string) []byte {
		t.Helper()
		status, got := r.send(t, method, path, body, as(token)...)
		if status != want {
			t.Errorf("%s: %s %s: %d %.200s; want %d", what, method, path, status, got, want)
		}
		return got
	}
	ops, dashboard, billing := "ops-admin-token-01234", "read-only-token-0123", "billing-worker-token1"
	expect("the read token reads", 200, "GET", "/api/leases", "", dashboard)
	expect("the read token creates no task", 403, "POST", "/api/tasks", `{"task_data": {}}`, dashboard)
	expect("the read token takes no lease", 403, "POST", "/api/leases", `{"resource": "r", "holder": "h"}`, dashboard)
	expect("the read token leaves the generator alone", 403, "POST", "/api/generator/start", "", dashboard)

	expect("team b takes its lease", 201, "POST", "/api/leases", `{"resource": "shared", "holder": "b/1"}`, "team-b-lease-token-01")
	expect("team a cannot renew team b's lease as b's holder", 403, "PUT", "/api/leases/renew", `{"resource": "shared", "holder": "b/1"}`, "team-a-lease-token-01")
	expect("team a cannot release it", 403, "DELETE", "/api/leases/release", `{"resource": "shared", "holder": "b/1"}`, "team-a-lease-token-01")
	expect("team a holds only its resources", 403, "POST", "/api/leases", `{"resource": "shared", "holder": "a/1"}`, "team-a-lease-token-01")
	expect("team a holds its own", 201, "POST", "/api/leases", `{"resource": "a:report", "holder": "a/1"}`, "team-a-lease-token-01")

	secret := expect("ops inserts a task of another queue", 201, "POST", "/api/tasks", `{"task_data": {"password": "hunter2"}, "queue": "payroll"}`, ops)
	var payroll struct{ ID int64 }
	_ = json.Unmarshal(secret, &payroll)
	expect("billing inserts its own", 201, "POST", "/api/tasks", `{"task_data": {"invoice": 1}, "queue": "billing", "kind": "invoice"}`, billing)
	expect("billing claims only its queue", 403, "POST", "/api/tasks/next", `{"processor": "billing/w1"}`, billing)
	expect("billing claims as its own processors", 403, "POST", "/api/tasks/next", `{"processor": "replica-a/w1", "queues": ["billing"]}`, billing)
	expect("billing claims its queue", 200, "POST", "/api/tasks/next", `{"processor": "billing/w1", "queues": ["billing"]}`, billing)
	expect("billing reads no payroll task", 403, "GET", fmt.Sprintf("/api/tasks/%d", payroll.ID), "", billing)
	expect("billing cancels no payroll task", 403, "POST", fmt.Sprintf("/api/tasks/%d/cancel", payroll.ID), `{}`, billing)
	if list := expect("billing lists", 200, "GET", "/api/tasks", "", billing); bytes.Contains(list, []byte("hunter2")) {
		t.Errorf("billing's list holds the payroll task's data: %s", list)
	}

	// The dashboard signs in with the read token: a session of it, not it.
	status, who := r.send(t, "POST", "/api/session", `{"token": "`+dashboard+`"}`, "Content-Type", "application/json")
	var session struct {
		Name   string   `json:"name"`
		Scopes []string `json:"scopes"`
	}
	if status != 200 || json.Unmarshal(who, &session) != nil || session.Name != "dashboard" || len(session.Scopes) != 1 || session.Scopes[0] != "read" {
		t.Errorf("sign in with the read token: %d %s; want the session of dashboard, read only", status, who)
	}
}

// TestSessionCookieIsNotTheToken: the review found the token itself (in
// base64) as the cookie's value, with no expiry and no sign-out. The
// cookie now holds a signed session that names its token and expires; the
// page can sign out; --secure-cookie marks it Secure.
func TestSessionCookieIsNotTheToken(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "the-token-of-the-cookie-test"
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--api-token", token, "--secure-cookie"},
		env("DATABASE_URL", db.URL)))
	req, _ := http.NewRequestWithContext(t.Context(), "POST", r.url+"/api/session", strings.NewReader(`{"token": "`+token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	cookies := res.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("sign-in: cookies %v, want one", cookies)
	}
	c := cookies[0]
	if strings.Contains(c.Value, token) || bytes.Contains([]byte(c.Value), []byte("dGhlLXRva2Vu")) || !c.Secure || !c.HttpOnly ||
		c.SameSite != http.SameSiteStrictMode || c.Expires.IsZero() || c.Expires.After(time.Now().Add(13*time.Hour)) {
		t.Errorf("session cookie %+v: want neither the token nor its base64, Secure, HttpOnly, SameSite=Strict, expiring within 12 h", c)
	}
	if status, _ := r.send(t, "GET", "/api/leases", "", "Cookie", c.Name+"="+c.Value); status != 200 {
		t.Errorf("a request with the session: %d, want 200", status)
	}
	status, _ := r.send(t, "DELETE", "/api/session", "", "Cookie", c.Name+"="+c.Value)
	if status != http.StatusNoContent {
		t.Errorf("sign-out: %d, want 204", status)
	}
}

// TestCLIPrintsControlCharactersEscaped: a task's error is another
// program's text; printed raw, an escape sequence in it moved the cursor,
// recoloured or cleared the operator's terminal.
func TestCLIPrintsControlCharactersEscaped(t *testing.T) {
	t.Parallel()
	r := openReplica(t)
	created := call[struct{ ID int64 }](t, r, "POST", "/api/tasks", `{"task_data": {}, "max_attempts": 1, "kind": "ansi"}`, http.StatusCreated)
	claimed := call[struct{ Fence int64 }](t, r, "POST", "/api/tasks/next", `{"processor": "p", "kinds": ["ansi"]}`, http.StatusOK)
	call[json.RawMessage](t, r, "PUT", fmt.Sprintf("/api/tasks/%d/fail", created.ID),
		fmt.Sprintf(`{"processor": "p", "fence": %d, "error": "boom \u001b[2J\u001b[31mred \u202Egnp.exe"}`, claimed.Fence), http.StatusAccepted)
	for _, args := range [][]string{{"task", "list"}, {"task", "get", fmt.Sprint(created.ID)}} {
		var out bytes.Buffer
		if err := run(context.Background(), append(args, "--url", r.url), env(), &out, io.Discard); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.ContainsAny(out.String(), "\x1b\u202e") || !strings.Contains(out.String(), `\u001b[2J`) {
			t.Errorf("leasehold %v printed %q; want the escape and the override written out, not sent to the terminal", args, out.String())
		}
	}
}

// TestCommandsKeepTheTokenFromCMD: exec and work passed
// LEASEHOLD_API_TOKEN on to the command they ran; now only with
// --pass-token.
func TestCommandsKeepTheTokenFromCMD(t *testing.T) {
	t.Setenv("LEASEHOLD_API_TOKEN", "the-secret-of-the-env-test")
	if env := strings.Join(childEnv(false, "the-secret-of-the-env-test"), "\n"); strings.Contains(env, "the-secret-of-the-env-test") {
		t.Errorf("a command's environment holds the API token without --pass-token")
	}
	if env := childEnv(true, "the-secret-of-the-env-test"); !strings.Contains(strings.Join(env, "\n"), "LEASEHOLD_API_TOKEN=the-secret-of-the-env-test") {
		t.Errorf("with --pass-token the command's environment lacks the token")
	}
}

// TestShortTokensRefused: a token of any length was taken.
func TestShortTokensRefused(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), []string{"serve", "--api-token", "s3cret"}, env("DATABASE_URL", "postgres://x@localhost/x"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("serve --api-token s3cret: %v; want a usage error asking for 16 bytes", err)
	}
}
