package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

func withRateLimit(rate float64, burst int, trusted ...string) option {
	return func(d *server.Deps) {
		d.RateLimit, d.RateBurst = rate, burst
		for _, p := range trusted {
			d.TrustedProxies = append(d.TrustedProxies, netip.MustParsePrefix(p))
		}
	}
}

// from sends one request to h as if from the peer remote.
func from(t *testing.T, h http.Handler, remote, method, path string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), method, path, nil)
	req.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// wantTooMany checks a 429 in the API's error shape with a Retry-After of
// whole seconds.
func wantTooMany(t *testing.T, what string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("%s: status %d %s, want 429", what, rec.Code, rec.Body)
	}
	if secs, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || secs < 1 {
		t.Errorf("%s: Retry-After %q, want a whole number of seconds, at least 1", what, rec.Header().Get("Retry-After"))
	}
	checkError(t, what, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// A burst of 3, then one request every 1000 s: nothing refills while
	// the test runs (the refill itself is TestRateLimiterBucket's).
	h := server.NewServer(testDeps(db, withRateLimit(0.001, 3)))
	const alice, bob = "192.0.2.1:50000", "192.0.2.2:50000"

	for i := range 3 {
		if rec := from(t, h, alice, "GET", "/api/leases"); rec.Code != http.StatusOK {
			t.Fatalf("request %d of the burst: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	rec := from(t, h, alice, "GET", "/api/leases")
	wantTooMany(t, "the 4th request", rec)
	var body struct{ Error string }
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if !strings.Contains(body.Error, "192.0.2.1") {
		t.Errorf("429 error %q does not name the client it counted", body.Error)
	}
	if secs, _ := strconv.Atoi(rec.Header().Get("Retry-After")); secs < 999 || secs > 1000 {
		t.Errorf("Retry-After %d s, want about 1000 s (one token at 0.001/s)", secs)
	}
	// Another port is the same client; any route under /api/ and /ws counts.
	wantTooMany(t, "another port", from(t, h, "192.0.2.1:50001", "POST", "/api/leases"))
	wantTooMany(t, "the websocket", from(t, h, alice, "GET", "/ws"))
	wantTooMany(t, "the sign-in", from(t, h, alice, "POST", "/api/session"))

	// Another client is not affected.
	if rec := from(t, h, bob, "GET", "/api/leases"); rec.Code != http.StatusOK {
		t.Errorf("another client: %d %s, want 200", rec.Code, rec.Body)
	}
	// Probes, scrapers and the page are never limited.
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/"} {
		if rec := from(t, h, alice, "GET", path); rec.Code != http.StatusOK {
			t.Errorf("GET %s over the limit: %d, want 200", path, rec.Code)
		}
	}
	// A 429 is counted like any answer, and every refusal once more in a
	// counter of its own: the 4th request, another port, the websocket and
	// the sign-in.
	metrics := from(t, h, alice, "GET", "/metrics").Body.String()
	if !strings.Contains(metrics, `leasehold_http_requests_total{method="GET",route="GET /api/leases",status="429"} 1`) {
		t.Errorf("no 429 in the metrics:\n%s", grep(metrics, "status=\"429\""))
	}
	if !strings.Contains(metrics, "\nleasehold_http_rate_limited_total 4\n") {
		t.Errorf("leasehold_http_rate_limited_total: want 4, the requests refused; got:\n%s", grep(metrics, "rate_limited"))
	}
}

// TestRateLimitOff: without a RateLimit, as by default, a burst of 300
// requests from one client is answered in full, and nothing is counted as
// refused.
func TestRateLimitOff(t *testing.T) {
	t.Parallel()
	h := server.NewServer(testDeps(pgtest.New(t)))
	for i := range 300 {
		if rec := from(t, h, "192.0.2.1:1", "GET", "/api/nothing"); rec.Code != http.StatusNotFound {
			t.Fatalf("request %d without a limit: %d, want 404", i+1, rec.Code)
		}
	}
	metrics := from(t, h, "192.0.2.1:1", "GET", "/metrics").Body.String()
	if !strings.Contains(metrics, "\nleasehold_http_rate_limited_total 0\n") {
		t.Errorf("leasehold_http_rate_limited_total: want 0 without a limit; got:\n%s", grep(metrics, "rate_limited"))
	}
}

// TestRateLimitBehindProxy: X-Forwarded-For names the client only when the
// peer is a trusted proxy.
func TestRateLimitBehindProxy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := server.NewServer(testDeps(db, withRateLimit(0.001, 1, "127.0.0.0/8")))
	const proxy = "127.0.0.1:40000"

	if rec := from(t, h, proxy, "GET", "/api/nothing", "X-Forwarded-For", "198.51.100.1"); rec.Code != http.StatusNotFound {
		t.Fatalf("first client through the proxy: %d", rec.Code)
	}
	wantTooMany(t, "the same client again", from(t, h, proxy, "GET", "/api/nothing", "X-Forwarded-For", "198.51.100.1"))
	// A client cannot pose as another by adding its own X-Forwarded-For
	// entries: the proxy appends the address it saw, which decides.
	wantTooMany(t, "the same client with a made-up entry", from(t, h, proxy, "GET", "/api/nothing", "X-Forwarded-For", "203.0.113.9, 198.51.100.1"))
	if rec := from(t, h, proxy, "GET", "/api/nothing", "X-Forwarded-For", "198.51.100.2"); rec.Code != http.StatusNotFound {
		t.Errorf("another client through the proxy: %d, want 404", rec.Code)
	}
	// From an untrusted peer the header is ignored: the peer is the client.
	if rec := from(t, h, "192.0.2.9:1", "GET", "/api/nothing", "X-Forwarded-For", "198.51.100.3"); rec.Code != http.StatusNotFound {
		t.Fatalf("direct client: %d", rec.Code)
	}
	wantTooMany(t, "direct client posing as another", from(t, h, "192.0.2.9:1", "GET", "/api/nothing", "X-Forwarded-For", "198.51.100.4"))
}
