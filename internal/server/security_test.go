package server_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/task"
)

// TestTokenNeverLogged drives requests that carry the API token, right and
// wrong, in every place a client may put it (and in the query, where it
// must not), with the logger at debug level, and searches the log.
func TestTokenNeverLogged(t *testing.T) {
	t.Parallel()
	const (
		token = "tok-7f3a9c21e5b84d06"
		guess = "tok-guess-0b1e2d4c9a"
	)
	var logs syncBuffer
	db := pgtest.New(t)
	h := server.NewServer(testDeps(db, withToken(token), withLog(zerolog.New(&logs).Level(zerolog.DebugLevel))))
	cookie := func(tok string) string {
		return server.SessionCookie + "=" + server.SessionValue(tok, time.Now().Add(time.Hour))
	}

	for _, tc := range []struct {
		method, path, body string
		header             []string
		status             int
	}{
		{"GET", "/api/leases", "", []string{"Authorization", "Bearer " + token}, 200},
		{"GET", "/api/leases", "", []string{"Authorization", "Bearer " + guess}, 401},
		{"GET", "/api/leases", "", []string{"Authorization", "Basic " + token}, 401},
		{"GET", "/api/leases", "", []string{"Authorization", token}, 401},
		{"GET", "/api/leases", "", []string{"Cookie", cookie(token)}, 200},
		{"GET", "/api/leases", "", []string{"Cookie", cookie(guess)}, 401},
		{"GET", "/api/leases", "", []string{"Cookie", server.SessionCookie + "=" + token}, 401},                                                    // the token is not a session
		{"GET", "/api/leases", "", []string{"Cookie", server.SessionCookie + "=" + server.SessionValue(token, time.Now().Add(-time.Second))}, 401}, // expired
		{"POST", "/api/leases", `{"resource":"r","holder":"h"}`, []string{"Authorization", "Bearer " + token}, 201},
		{"POST", "/api/leases", `{"resource":"r","holder":"h"}`, []string{"Cookie", cookie(token), "Origin", "http://evil.example"}, 403},
		{"POST", "/api/session", `{"token":"` + token + `"}`, nil, 200},
		{"POST", "/api/session", `{"token":"` + guess + `"}`, nil, 401},
		{"POST", "/api/session", `{"token":"` + token + `","extra":1}`, nil, 400},
		{"GET", "/ws", "", []string{"Authorization", "Bearer " + guess}, 401},
		{"GET", "/api/leases?api_token=" + token + "&token=" + guess, "", nil, 401},
		{"GET", "/api/nothing", "", []string{"Authorization", "Bearer " + token}, 404},
	} {
		req := httptest.NewRequestWithContext(t.Context(), tc.method, tc.path, strings.NewReader(tc.body))
		for i := 0; i+1 < len(tc.header); i += 2 {
			req.Header.Set(tc.header[i], tc.header[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("%s %s %v: status %d, want %d", tc.method, tc.path, tc.header, rec.Code, tc.status)
		}
	}

	text := logs.String()
	if n := strings.Count(text, `"message":"request"`); n < 15 {
		t.Fatalf("%d request log lines, want one per request:\n%s", n, text)
	}
	for _, secret := range []string{token, guess} {
		for _, form := range []string{secret, base64.RawURLEncoding.EncodeToString([]byte(secret)), base64.StdEncoding.EncodeToString([]byte(secret))} {
			if strings.Contains(text, form) {
				t.Errorf("the log holds %q:\n%s", form, grep(text, form))
			}
		}
	}
}

// TestBodyLimitOnEveryRoute: every route that takes a body, as routes.go
// lists them, answers 413 to one over 1 MiB and reads one of exactly 1 MiB.
func TestBodyLimitOnEveryRoute(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("routes.go")
	if err != nil {
		t.Fatal(err)
	}
	var routes [][]string
	for _, m := range regexp.MustCompile(`mux\.Handle\("(POST|PUT|PATCH|DELETE) (/[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		routes = append(routes, []string{m[1], strings.ReplaceAll(m[2], "{id}", "1")})
	}
	if len(routes) < 12 {
		t.Fatalf("found %d routes that take a body in routes.go, want at least 12: %v", len(routes), routes)
	}
	b := newBundle(t)
	const limit = 1 << 20
	for _, r := range routes {
		over := b.do(t, r[0], r[1], "{"+strings.Repeat(" ", limit)+"}")
		if over.status != http.StatusRequestEntityTooLarge {
			t.Errorf("%s %s with a body of 1 MiB + 2 bytes: %s, want 413", r[0], r[1], over)
		} else {
			checkError(t, r[0]+" "+r[1], over)
		}
		if at := b.do(t, r[0], r[1], "{"+strings.Repeat(" ", limit-2)+"}"); at.status == http.StatusRequestEntityTooLarge {
			t.Errorf("%s %s with a body of exactly 1 MiB: 413, want it read", r[0], r[1])
		}
	}
}

// TestPayloadBound: a task_data or task_output over task.MaxPayloadBytes,
// in a body under 1 MiB, is 413 naming the field and the bound (the bound
// the library keeps too), and changes nothing; one at the bound is taken.
func TestPayloadBound(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	over := `"` + strings.Repeat("x", task.MaxPayloadBytes) + `"`
	at := `"` + strings.Repeat("x", task.MaxPayloadBytes-2) + `"`
	for _, r := range []struct{ what, method, path, body string }{
		{"task_data", "POST", "/api/tasks", `{"kind": "k", "task_data": {"b": ` + over + `}}`},
		{"task_data", "POST", "/api/schedules", `{"name": "s", "cron": "@daily", "kind": "k", "task_data": {"b": ` + over + `}}`},
	} {
		got := b.do(t, r.method, r.path, r.body)
		if got.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(got.body), r.what) || !strings.Contains(string(got.body), strconv.Itoa(task.MaxPayloadBytes)) {
			t.Errorf("%s %s with a %s over the bound: %s; want 413 naming it and the bound", r.method, r.path, r.what, got)
		}
	}
	created := b.do(t, "POST", "/api/tasks", `{"kind": "k", "task_data": {"b": "small"}}`).want(t, "a small task", http.StatusCreated)
	var tk struct{ ID int64 }
	if err := json.Unmarshal(created.body, &tk); err != nil {
		t.Fatal(err)
	}
	claimed := b.do(t, "POST", "/api/tasks/next", `{"processor": "p", "kinds": ["k"]}`).want(t, "the claim", http.StatusOK)
	var c struct{ Fence int64 }
	if err := json.Unmarshal(claimed.body, &c); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/api/tasks/%d/complete", tk.ID)
	if got := b.do(t, "PUT", path, fmt.Sprintf(`{"processor": "p", "fence": %d, "task_output": %s}`, c.Fence, over)); got.status != http.StatusRequestEntityTooLarge ||
		!strings.Contains(string(got.body), "task_output") {
		t.Errorf("a task_output over the bound: %s; want 413 naming it", got)
	}
	b.do(t, "PUT", path, fmt.Sprintf(`{"processor": "p", "fence": %d, "task_output": %s}`, c.Fence, at)).want(t, "a task_output at the bound", http.StatusAccepted)
}
