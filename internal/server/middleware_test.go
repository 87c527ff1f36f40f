package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

func TestAPIToken(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	b := newBundle(t, withToken(token))
	acquire := `{"resource":"guarded","holder":"h"}`

	for _, tc := range []struct {
		name, method, path, body string
		auth                     []string // header key, value
	}{
		{"no header", "GET", "/api/leases", "", nil},
		{"wrong token", "GET", "/api/leases", "", []string{"Authorization", "Bearer wrong"}},
		{"token as a prefix", "GET", "/api/leases", "", []string{"Authorization", "Bearer " + token[:5]}},
		{"token with more", "GET", "/api/leases", "", []string{"Authorization", "Bearer " + token + "x"}},
		{"no scheme", "GET", "/api/leases", "", []string{"Authorization", token}},
		{"basic scheme", "GET", "/api/leases", "", []string{"Authorization", "Basic " + token}},
		{"empty bearer", "GET", "/api/leases", "", []string{"Authorization", "Bearer "}},
		{"token in another header", "GET", "/api/leases", "", []string{"X-API-Token", token}},
		{"acquire without a token", "POST", "/api/leases", acquire, nil},
		{"acquire with a wrong token", "POST", "/api/leases", acquire, []string{"Authorization", "Bearer nope"}},
		{"unknown API path", "GET", "/api/nothing", "", nil},
		{"wrong method under /api", "PATCH", "/api/leases", "", nil},
		{"websocket", "GET", "/ws", "", nil},
	} {
		r := b.do(t, tc.method, tc.path, tc.body, tc.auth...)
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s: %s %s: got %s, want 401", tc.name, tc.method, tc.path, r)
		}
		checkError(t, tc.name, r)
		if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge", tc.name, got)
		}
	}
	var leases int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM leases`).Scan(&leases); err != nil {
		t.Fatal(err)
	}
	if leases != 0 {
		t.Errorf("after unauthorized requests: %d leases, want 0", leases)
	}

	auth := []string{"Authorization", "Bearer " + token}
	b.do(t, "GET", "/api/leases", "", auth...).want(t, "GET /api/leases with the token", http.StatusOK)
	b.do(t, "GET", "/api/leases", "", "Authorization", "bearer "+token).want(t, "the scheme name in lower case", http.StatusOK)
	b.do(t, "POST", "/api/leases", acquire, auth...).want(t, "acquire with the token", http.StatusCreated)
	r := b.do(t, "GET", "/api/nothing", "", auth...).want(t, "unknown API path with the token", http.StatusNotFound)
	checkError(t, "unknown API path with the token", r)

	// Health, readiness and metrics need no token.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		b.do(t, "GET", path, "").want(t, path+" without a token", http.StatusOK)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := newBundle(t, withReady(func(context.Context) error { return errors.New("database: down") }))
	r := b.do(t, "GET", "/healthz", "").want(t, "GET /healthz while not ready", http.StatusOK)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /healthz: Content-Type %q, want application/json", ct)
	}
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var (
		mu     sync.Mutex
		reason error
	)
	ready := func(ctx context.Context) error {
		if err := db.Pool.Ping(ctx); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return reason
	}
	srv := httptest.NewServer(server.NewServer(testDeps(db, withReady(ready))))
	t.Cleanup(srv.Close)
	b := bundle{db: db, srv: srv}

	r := b.do(t, "GET", "/readyz", "").want(t, "GET /readyz when ready", http.StatusOK)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /readyz: Content-Type %q, want application/json", ct)
	}

	mu.Lock()
	reason = errors.New("listener: the LISTEN connection is down")
	mu.Unlock()
	r = b.do(t, "GET", "/readyz", "").want(t, "GET /readyz when not ready", http.StatusServiceUnavailable)
	body := checkError(t, "GET /readyz when not ready", r)
	var msg string
	_ = json.Unmarshal(body["error"], &msg)
	if !strings.Contains(msg, "the LISTEN connection is down") {
		t.Errorf("GET /readyz when not ready: error %q, want the reason", msg)
	}

	mu.Lock()
	reason = nil
	mu.Unlock()
	b.do(t, "GET", "/readyz", "").want(t, "GET /readyz when ready again", http.StatusOK)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	b.do(t, "GET", "/healthz", "").want(t, "GET /healthz", http.StatusOK)
	b.do(t, "GET", "/api/nothing", "").want(t, "GET /api/nothing", http.StatusNotFound)
	b.acquire(t, "metered", "h", 0)
	b.do(t, "POST", "/api/leases", `{"resource":"metered","holder":"other"}`).want(t, "conflict", http.StatusConflict)

	r := b.do(t, "GET", "/metrics", "").want(t, "GET /metrics", http.StatusOK)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: Content-Type %q, want Prometheus text (text/plain)", ct)
	}
	text := string(r.body)
	for _, want := range []string{
		"# TYPE leasehold_http_requests_total counter",
		`leasehold_http_requests_total{method="GET",route="GET /healthz",status="200"} 1`,
		`leasehold_http_requests_total{method="POST",route="POST /api/leases",status="201"} 1`,
		`leasehold_http_requests_total{method="POST",route="POST /api/leases",status="409"} 1`,
		`status="404"`,
		`leasehold_lease_operations_total{op="acquire",outcome="ok"} 1`,
		`leasehold_lease_operations_total{op="acquire",outcome="conflict"} 1`,
		"leasehold_http_request_duration_seconds_bucket",
		"leasehold_listener_connected 1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("GET /metrics: no line with %q in\n%s", want, grep(text, "leasehold_"))
		}
	}
}

// grep returns the lines of text that contain s.
func grep(text, s string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func TestRequestLog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var logs syncBuffer
	h := server.NewServer(testDeps(db, withLog(zerolog.New(&logs))))

	// serve calls the handler directly, so the log line is written when it returns.
	serve := func(method, path, body string, header ...string) (*httptest.ResponseRecorder, map[string]any) {
		t.Helper()
		before := len(logs.String())
		req := httptest.NewRequestWithContext(t.Context(), method, path, strings.NewReader(body))
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var line map[string]any
		for l := range strings.Lines(logs.String()[before:]) {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("log line %q is not JSON: %v", l, err)
			}
			if m["message"] == "request" {
				if line != nil {
					t.Errorf("%s %s: more than one request log line", method, path)
				}
				line = m
			}
		}
		if line == nil {
			t.Fatalf("%s %s: no request log line in %q", method, path, logs.String()[before:])
		}
		return rec, line
	}

	hexID := regexp.MustCompile(`^[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for _, tc := range []struct {
		method, path, body string
		status             int
		level              string
	}{
		// The probes and the scrapes come every few seconds: at debug level.
		{"GET", "/healthz", "", 200, "debug"},
		{"GET", "/readyz", "", 200, "debug"},
		{"GET", "/metrics", "", 200, "debug"},
		{"POST", "/api/leases", `{"resource":"logged","holder":"h"}`, 201, "info"},
		{"POST", "/api/leases", `{"resource":""}`, 400, "info"},
		{"GET", "/api/nothing", "", 404, "info"},
		{"PATCH", "/api/leases", "", 405, "info"},
	} {
		rec, line := serve(tc.method, tc.path, tc.body)
		if rec.Code != tc.status {
			t.Errorf("%s %s: got status %d, want %d", tc.method, tc.path, rec.Code, tc.status)
		}
		id := rec.Header().Get("X-Request-Id")
		if !hexID.MatchString(id) {
			t.Errorf("%s %s: X-Request-Id %q, want 16 hex digits", tc.method, tc.path, id)
		}
		if seen[id] {
			t.Errorf("%s %s: X-Request-Id %q was used before", tc.method, tc.path, id)
		}
		seen[id] = true
		for key, want := range map[string]any{
			"request_id": id, "method": tc.method, "path": tc.path, "status": float64(tc.status), "level": tc.level,
		} {
			if line[key] != want {
				t.Errorf("%s %s: log %q = %v, want %v (line %v)", tc.method, tc.path, key, line[key], want, line)
			}
		}
		if d, ok := line["duration_ms"].(float64); !ok || d < 0 {
			t.Errorf("%s %s: log duration_ms = %v, want a non-negative number", tc.method, tc.path, line["duration_ms"])
		}
		if r, ok := line["route"].(string); !ok || r == "" {
			t.Errorf("%s %s: log route = %v, want the route", tc.method, tc.path, line["route"])
		}
	}

	// A caller's request id is kept when it is sane, replaced otherwise.
	rec, line := serve("GET", "/healthz", "", "X-Request-Id", "caller-42")
	if got := rec.Header().Get("X-Request-Id"); got != "caller-42" || line["request_id"] != "caller-42" {
		t.Errorf("X-Request-Id caller-42: got header %q, logged %v, want caller-42 in both", got, line["request_id"])
	}
	for _, bad := range []string{"has space", strings.Repeat("x", 65), "tab\there"} {
		rec, line := serve("GET", "/healthz", "", "X-Request-Id", bad)
		if got := rec.Header().Get("X-Request-Id"); !hexID.MatchString(got) || line["request_id"] != got {
			t.Errorf("X-Request-Id %q: got header %q, logged %v, want a new id in both", bad, got, line["request_id"])
		}
	}
}
