package frontdoor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// replica is a backend that answers "<name> <method> <body>" and counts its requests.
type replica struct {
	*Backend
	hits atomic.Int64
}

func startReplica(t *testing.T, name string) *replica {
	t.Helper()
	r := &replica{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		body, err := io.ReadAll(req.Body)
		if err != nil {
			t.Errorf("%s: read body: %v", name, err)
		}
		fmt.Fprintf(w, "%s %s %s", name, req.Method, body)
	}))
	t.Cleanup(srv.Close)
	r.Backend = NewBackend(name, srv.Listener.Addr().String())
	return r
}

// deadAddr returns an address on 127.0.0.1 where nothing listens: connections are refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// startFrontDoor serves a front door over backends and returns its URL and a client for it.
func startFrontDoor(t *testing.T, backends ...*Backend) (string, *http.Client) {
	t.Helper()
	p := New(backends, zerolog.New(zerolog.NewTestWriter(t)))
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		p.CloseIdleConnections()
	})
	return srv.URL, srv.Client()
}

// send sends a request and returns the status, the replica header and the body.
func send(t *testing.T, client *http.Client, method, url, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, url, err)
	}
	return res.StatusCode, res.Header.Get(ReplicaHeader), string(got)
}

func TestRoundRobin(t *testing.T) {
	t.Parallel()
	a, b, c := startReplica(t, "replica-a"), startReplica(t, "replica-b"), startReplica(t, "replica-c")
	url, client := startFrontDoor(t, a.Backend, b.Backend, c.Backend)

	var got []string
	for range 6 {
		status, name, body := send(t, client, "GET", url+"/readyz", "")
		if status != http.StatusOK || !strings.HasPrefix(body, name+" GET") {
			t.Errorf("GET /readyz: got %d %q from %q, want 200 from the replica named in %s", status, body, name, ReplicaHeader)
		}
		got = append(got, name)
	}
	if want := "replica-a replica-b replica-c replica-a replica-b replica-c"; strings.Join(got, " ") != want {
		t.Errorf("%s over 6 requests: got %q, want %q", ReplicaHeader, got, want)
	}
}

func TestDeadReplicaSkipped(t *testing.T) {
	t.Parallel()
	a, c := startReplica(t, "replica-a"), startReplica(t, "replica-c")
	refusing := NewBackend("replica-b", deadAddr(t))
	down := NewBackend("replica-d", "")
	url, client := startFrontDoor(t, a.Backend, refusing, c.Backend, down)

	// With a body: what the refusing replica was offered reaches the next one whole.
	for i := range 8 {
		payload := fmt.Sprintf(`{"n":%d,"pad":%q}`, i, strings.Repeat("x", 100_000))
		status, name, body := send(t, client, "POST", url+"/api/leases", payload)
		if status != http.StatusOK {
			t.Fatalf("POST #%d: got %d %q, want 200", i, status, body)
		}
		if name != "replica-a" && name != "replica-c" {
			t.Errorf("POST #%d answered by %q, want replica-a or replica-c", i, name)
		}
		if want := name + " POST " + payload; body != want {
			t.Errorf("POST #%d: the replica got a body of %d bytes, want the %d sent", i, len(body)-len(name+" POST "), len(payload))
		}
	}
	if a.hits.Load() == 0 || c.hits.Load() == 0 || a.hits.Load()+c.hits.Load() != 8 {
		t.Errorf("hits: replica-a %d, replica-c %d; want both some, 8 in all", a.hits.Load(), c.hits.Load())
	}

	// Back up: it takes its turn again.
	refusing.SetAddr(a.Addr())
	seen := map[string]bool{}
	for range 4 {
		_, name, _ := send(t, client, "GET", url+"/", "")
		seen[name] = true
	}
	if !seen["replica-b"] {
		t.Errorf("after replica-b came back, 4 requests were answered by %v, want replica-b among them", seen)
	}
}

func TestNoReplicaUp(t *testing.T) {
	t.Parallel()
	url, client := startFrontDoor(t, NewBackend("replica-a", deadAddr(t)), NewBackend("replica-b", ""), NewBackend("replica-c", deadAddr(t)))

	req, err := http.NewRequestWithContext(t.Context(), "POST", url+"/api/leases", strings.NewReader(`{"resource":"r","holder":"h"}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body map[string]string
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatalf("decode the 502 body: %v", err)
	}
	if res.StatusCode != http.StatusBadGateway || res.Header.Get("Content-Type") != "application/json" || body["error"] == "" {
		t.Errorf("with no replica up: got %d %q %v, want 502 application/json with an error", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	if name := res.Header.Get(ReplicaHeader); name != "" {
		t.Errorf("%s: got %q, want none (no replica answered)", ReplicaHeader, name)
	}

	url, client = startFrontDoor(t)
	if status, _, _ := send(t, client, "GET", url+"/", ""); status != http.StatusBadGateway {
		t.Errorf("with no replicas at all: got %d, want 502", status)
	}
}

// TestFailedReplica: a replica that took the request and then failed may have acted on it,
// so a POST is answered 502 and not sent to another replica; a GET, which changes nothing,
// goes to the next one.
func TestFailedReplica(t *testing.T) {
	t.Parallel()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close() // crashed mid-request
	}))
	t.Cleanup(broken.Close)
	healthy := startReplica(t, "replica-b")
	url, client := startFrontDoor(t, NewBackend("replica-a", broken.Listener.Addr().String()), healthy.Backend)

	status, name, body := send(t, client, "POST", url+"/api/tasks", `{"task_data":{}}`)
	if status != http.StatusBadGateway || name != "" {
		t.Errorf("POST to a replica that failed mid-request: got %d from %q %q, want 502 from none", status, name, body)
	}
	if n := healthy.hits.Load(); n != 0 {
		t.Errorf("the failed POST was sent on to replica-b %d time(s), want 0", n)
	}

	// The next request starts at replica-b; the one after at the broken replica-a.
	for i := range 2 {
		if status, name, body := send(t, client, "GET", url+"/readyz", ""); status != http.StatusOK || name != "replica-b" {
			t.Errorf("GET #%d with replica-a failing: got %d from %q %q, want 200 from replica-b", i, status, name, body)
		}
	}
	if n := healthy.hits.Load(); n != 2 {
		t.Errorf("replica-b answered %d GETs, want 2", n)
	}
}

// TestUpgradePassesThrough opens a websocket-style connection through the front door: the
// replica sees the upgrade with the client's Host, answers 101, and bytes flow both ways.
func TestUpgradePassesThrough(t *testing.T) {
	t.Parallel()
	var frontHost atomic.Pointer[string]
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || !strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		if want := *frontHost.Load(); r.Host != want {
			t.Errorf("the replica saw Host %q, want the front door's %q", r.Host, want)
		}
		if r.Header.Get("X-Forwarded-For") == "" {
			t.Errorf("X-Forwarded-For missing")
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		for {
			line, err := rw.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = rw.WriteString("echo " + line)
			_ = rw.Flush()
		}
	}))
	t.Cleanup(echo.Close)
	url, _ := startFrontDoor(t, NewBackend("replica-a", deadAddr(t)), NewBackend("replica-b", echo.Listener.Addr().String()))
	host := strings.TrimPrefix(url, "http://")
	frontHost.Store(&host)

	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the upgrade response: %v", err)
	}
	defer res.Body.Close() // empty: what follows the 101 is read from br
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get(ReplicaHeader) != "replica-b" {
		t.Fatalf("upgrade: got %d from %q, want 101 from replica-b", res.StatusCode, res.Header.Get(ReplicaHeader))
	}
	for _, msg := range []string{"hello\n", "again\n"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		got, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read the echo: %v", err)
		}
		if got != "echo "+msg {
			t.Errorf("through the upgraded connection: got %q, want %q", got, "echo "+msg)
		}
	}
}

// TestAnswerBeforeBody: a replica that answers before reading the request's
// body (a refusal) leaves the kept-alive connection to the front door
// usable, and the front door's server recovers no panic.
func TestAnswerBeforeBody(t *testing.T) {
	t.Parallel()
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "refused unread", http.StatusUnauthorized)
	}))
	t.Cleanup(refuse.Close)
	p := New([]*Backend{NewBackend("replica-a", refuse.Listener.Addr().String())}, zerolog.New(zerolog.NewTestWriter(t)))
	var serverLog strings.Builder
	var mu sync.Mutex
	srv := httptest.NewUnstartedServer(p)
	srv.Config.ErrorLog = stdlog.New(lockedWriter{&mu, &serverLog}, "", 0)
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		p.CloseIdleConnections()
	})
	client := srv.Client()
	for i := range 400 {
		body := strings.Repeat("x", (i%40)<<12)
		status, _, _ := send(t, client, "POST", srv.URL+"/api/tasks", body)
		if status != http.StatusUnauthorized {
			t.Fatalf("request %d: status %d, want the replica's 401", i, status)
		}
	}
	srv.Close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(serverLog.String(), "panic") {
		t.Errorf("the front door's server recovered a panic:\n%s", serverLog.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestNoReplicaWarnsOnce: while no replica is up every request fails alike, and the log
// says so once, not once per request.
func TestNoReplicaWarnsOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var logged bytes.Buffer
	p := New([]*Backend{NewBackend("replica-a", deadAddr(t))},
		zerolog.New(lockedWriter{&mu, &logged}).Level(zerolog.InfoLevel))
	srv := httptest.NewServer(p)
	defer srv.Close()
	for range 20 {
		if status, _, _ := send(t, srv.Client(), "GET", srv.URL+"/", ""); status != http.StatusBadGateway {
			t.Fatalf("with no replica up: got %d, want 502", status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logged.String(), "front door: no replica is up"); n != 1 {
		t.Errorf("20 requests with no replica up logged %d warning(s), want 1:\n%s", n, logged.String())
	}
}
