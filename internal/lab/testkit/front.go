// Package testkit holds what the tests of many packages share: a front
// door that loses answers, waits on conditions with one generous limit, a
// buffer that goroutines write to while a test reads it.
package testkit

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
)

// Front is a reverse proxy in front of a leasehold service whose answers
// can get lost on the way back: a request it is told to lose still reaches
// the service and is carried out, and its client never hears of it (the
// proxy keeps it waiting until the client gives up, then closes the
// connection), as a network that fails in one direction would.
type Front struct {
	// URL is the proxy's address, for the client under test.
	URL string

	mu    sync.Mutex
	match func(*http.Request) bool
	left  int
	lost  []*http.Request
	onto  chan struct{} // closed and replaced as each answer is lost
}

// NewFront starts a front door to target, stopped when the test ends.
func NewFront(t testing.TB, target string) *Front {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("testkit: front: %v", err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	f := &Front{onto: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.take(r) {
			proxy.ServeHTTP(w, r)
			return
		}
		// Carried out, answer and all, then not delivered.
		proxy.ServeHTTP(httptest.NewRecorder(), r.Clone(r.Context()))
		f.mu.Lock()
		f.lost = append(f.lost, r)
		close(f.onto)
		f.onto = make(chan struct{})
		f.mu.Unlock()
		<-r.Context().Done()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

// LoseNext loses the answers to the next n requests that match.
func (f *Front) LoseNext(n int, match func(*http.Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match, f.left = match, n
}

// take reports whether r's answer is to be lost, counting it.
func (f *Front) take(r *http.Request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left == 0 || !f.match(r) {
		return false
	}
	f.left--
	return true
}

// Lost returns how many answers were lost so far, and a channel closed
// when the next one is.
func (f *Front) Lost() (int, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lost), f.onto
}

// Route matches requests by method and path.
func Route(method, path string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Method == method && r.URL.Path == path }
}
