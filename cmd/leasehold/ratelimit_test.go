package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// burstAcquire sends n requests to r at once, all from this host, each racing
// for the lease on resource under a holder of its own, as 48 processes of
// one host racing for one lease do, or a leasehold work --concurrency 32.
// It returns how many answers had each status.
func burstAcquire(t *testing.T, r *replica, n int, resource string) map[int]int {
	t.Helper()
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		errs     []error
		wg       sync.WaitGroup
		start    = make(chan struct{})
	)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	for i := range n {
		wg.Go(func() {
			<-start
			body := fmt.Sprintf(`{"resource": %q, "holder": "racer-%d", "ttl_seconds": 60}`, resource, i)
			resp, err := client.Post(r.url+"/api/leases", "application/json", strings.NewReader(body))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			statuses[resp.StatusCode]++
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("POST /api/leases: %v", err)
	}
	return statuses
}

// rateLimitedTotal reads leasehold_http_rate_limited_total from r's /metrics.
func rateLimitedTotal(t *testing.T, r *replica) int {
	t.Helper()
	status, body := r.get(t, "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	m := regexp.MustCompile(`(?m)^leasehold_http_rate_limited_total (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics has no leasehold_http_rate_limited_total:\n%s", body)
	}
	n, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("leasehold_http_rate_limited_total %q: %v", m[1], err)
	}
	return int(n)
}

// TestServeRateLimitOffByDefault: a replica with the default configuration
// refuses none of a burst of 300 requests from one client (a limit
// of 100 a second in bursts of 200 would answer 429 to a host of lease
// holders racing for one lease); exactly one of them wins the lease.
func TestServeRateLimitOffByDefault(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api"}, env("DATABASE_URL", db.URL))
	if c.RateLimit != 0 {
		t.Fatalf("default --rate-limit: got %v, want 0 (off)", c.RateLimit)
	}
	r := startReplica(t, c)
	const n = 300
	got := burstAcquire(t, r, n, "nightly")
	if got[http.StatusCreated] != 1 || got[http.StatusConflict] != n-1 {
		t.Errorf("%d holders racing for one lease: got the statuses %v, want one 201 and %d 409s", n, got, n-1)
	}
	if refused := rateLimitedTotal(t, r); refused != 0 {
		t.Errorf("leasehold_http_rate_limited_total: got %d, want 0 with the limit off", refused)
	}
}

// TestServeRateLimitOn: the limit is still there for who sets it (here
// through its environment variable), and what it refuses is counted in
// /metrics.
func TestServeRateLimitOn(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// A burst of 5, then one request every 1000 s: nothing refills while
	// the test runs.
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api"},
		env("DATABASE_URL", db.URL, "LEASEHOLD_RATE_LIMIT", "0.001", "LEASEHOLD_RATE_BURST", "5"))
	r := startReplica(t, c) // its /readyz probes are not limited
	const n = 20
	got := burstAcquire(t, r, n, "nightly")
	if got[http.StatusTooManyRequests] != n-5 || got[http.StatusCreated]+got[http.StatusConflict] != 5 {
		t.Errorf("%d requests against a burst of 5: got the statuses %v, want 5 answered and %d 429s", n, got, n-5)
	}
	if refused := rateLimitedTotal(t, r); refused != got[http.StatusTooManyRequests] {
		t.Errorf("leasehold_http_rate_limited_total: got %d, want %d, the 429s answered", refused, got[http.StatusTooManyRequests])
	}
}
