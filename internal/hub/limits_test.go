package hub_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/gorilla/websocket"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// readUntilClosed reads until the connection fails and returns the error.
func readUntilClosed(conn *websocket.Conn) error {
	for {
		if _, err := read(conn); err != nil {
			return err
		}
	}
}

// wantClose fails the test unless err is a close frame with code.
func wantClose(t *testing.T, what string, err error, code int) {
	t.Helper()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("%s: read error %v, want close %d", what, err, code)
	}
}

// waitClients waits until the hub has n clients.
func waitClients(t *testing.T, r *replica, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); r.hub.Clients() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("clients %d, want %d", r.hub.Clients(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOversizedClientFrameClosesConnection: the page sends nothing the
// hub reads, so text frames are ignored up to the read limit (4 KiB), and
// a larger one closes the connection with 1009 (message too big).
func TestOversizedClientFrameClosesConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := startReplica(t, db, "replica-a", options{})
	conn, _ := connect(t, r)

	// A frame within the limit is read and ignored: the stream goes on.
	if err := conn.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("x"), 4<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := leasestore.NewStore(db.Pool).Acquire(t.Context(), lease.AcquireParams{Resource: "after-small-frame", Holder: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "the acquisition after a frame of 4 KiB", leaseMsg("after-small-frame", "acquired"))

	// A message of 4 KiB + 1 closes the connection, whether it comes in
	// one frame or (gorilla's client writes 4 KiB at a time) in several.
	if err := conn.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("x"), 4<<10+1)); err != nil {
		t.Fatal(err)
	}
	wantClose(t, "after a message of 4 KiB + 1 in two frames", readUntilClosed(conn), websocket.CloseMessageTooBig)
	waitClients(t, r, 0)

	dialer := *websocket.DefaultDialer
	dialer.WriteBufferSize = 64 << 10
	one, resp, err := dialer.Dial(r.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	defer one.Close()
	if err := one.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("x"), 32<<10)); err != nil {
		t.Fatal(err)
	}
	wantClose(t, "after one frame of 32 KiB", readUntilClosed(one), websocket.CloseMessageTooBig)
	waitClients(t, r, 0)
}

// TestWebsocketOutlivesServerTimeouts: the HTTP server's ReadTimeout and
// WriteTimeout (serve.go sets 30 s each) do not end a websocket. net/http
// clears a connection's deadlines when a handler hijacks it, and the hub
// sets its own (a write deadline per write, a read deadline moved by each
// pong). Here both timeouts are 1 s and the connection is used after 2 s.
func TestWebsocketOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	db := pgtest.New(t)
	r := startReplica(t, db, "replica-a", options{server: func(s *http.Server) {
		s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout = timeout, timeout, timeout
	}})
	start := time.Now()
	conn, _ := connect(t, r)
	// Nothing to wait on but the clock: the timeouts must have passed.
	time.Sleep(time.Until(start.Add(2 * timeout)))

	// The server still writes...
	if _, err := leasestore.NewStore(db.Pool).Acquire(t.Context(), lease.AcquireParams{Resource: "late", Holder: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "an acquisition after the server's timeouts", leaseMsg("late", "acquired"))
	// ...and reads: an oversized frame is noticed and answered.
	if err := conn.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("x"), 8<<10)); err != nil {
		t.Fatal(err)
	}
	wantClose(t, "an oversized frame after the server's timeouts", readUntilClosed(conn), websocket.CloseMessageTooBig)
}

// TestCrossOriginUpgradeRefused: an upgrade from an origin other than the
// server's own or one allowed is 403, whatever else it carries.
func TestCrossOriginUpgradeRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "s3cret"
	r := startReplica(t, db, "replica-a", options{token: token, origins: []string{"https://dash.example.com"}})
	host := strings.TrimPrefix(r.srv.URL, "http://")
	hostname, _, _ := strings.Cut(host, ":")
	cookie := signIn(t, r.srv.URL, token)
	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"http://evil.example", http.StatusForbidden},
		{"null", http.StatusForbidden}, // sandboxed frames, file:// pages
		{"https://dash.example.com.evil.example", http.StatusForbidden},
		{"https://evil.example/https://dash.example.com", http.StatusForbidden},
		{"http://dash.example.com", http.StatusForbidden}, // another scheme
		{"https://dash.example.com:8443", http.StatusForbidden},
		{"http://" + hostname + ":1", http.StatusForbidden}, // the server's host, another port
		{"http://" + host + "@evil.example", http.StatusForbidden},
		{"https://DASH.example.com", http.StatusSwitchingProtocols},
		{"http://" + host, http.StatusSwitchingProtocols},
	} {
		// With a valid cookie and header both: neither opens a refused origin.
		for _, h := range []http.Header{
			{"Origin": {tc.origin}, "Cookie": {cookie}},
			{"Origin": {tc.origin}, "Authorization": {"Bearer " + token}},
		} {
			if _, got, _ := dial(t, r, h); got != tc.want {
				t.Errorf("origin %q with %v: status %d, want %d", tc.origin, h, got, tc.want)
			}
		}
	}

	// The refusal is the API's JSON error, naming the origin.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, r.srv.URL+"/ws", nil)
	for k, v := range map[string]string{
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": "http://evil.example", "Authorization": "Bearer " + token,
	} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Error string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusForbidden ||
		resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body.Error, "http://evil.example") {
		t.Errorf("cross-origin upgrade: %d %q (%v), want a JSON 403 naming the origin", resp.StatusCode, body.Error, err)
	}
}
