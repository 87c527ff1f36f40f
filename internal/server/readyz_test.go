package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/server"
)

// TestReadyzSaysOnlyTheReason: GET /readyz needs no token, so of a
// server.NotReady it says the reason alone, never the details (a connect
// error names the server, the user and the database).
func TestReadyzSaysOnlyTheReason(t *testing.T) {
	t.Parallel()
	detail := errors.New("failed to connect to `user=secret_user database=secret_db`: 10.1.2.3:5432: connection refused")
	b := newBundle(t, withReady(func(context.Context) error {
		return &server.NotReady{Reason: "the database cannot be reached", Err: detail}
	}))
	r := b.do(t, "GET", "/readyz", "").want(t, "GET /readyz with the database down", http.StatusServiceUnavailable)
	var msg string
	if err := json.Unmarshal(checkError(t, "GET /readyz", r)["error"], &msg); err != nil {
		t.Fatal(err)
	}
	if msg != "not ready: the database cannot be reached" {
		t.Errorf("GET /readyz: error %q, want %q", msg, "not ready: the database cannot be reached")
	}
	for _, secret := range []string{"secret_user", "secret_db", "10.1.2.3", "refused"} {
		if strings.Contains(string(r.body), secret) {
			t.Errorf("GET /readyz: body %s gives away %q", r.body, secret)
		}
	}
}

func TestNotReadyError(t *testing.T) {
	t.Parallel()
	detail := errors.New("connection refused")
	err := error(&server.NotReady{Reason: "the database cannot be reached", Err: detail})
	if got, want := err.Error(), "the database cannot be reached: connection refused"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, detail) {
		t.Errorf("errors.Is(NotReady, its details) = false, want true")
	}
	if got := (&server.NotReady{Reason: "migrations pending"}).Error(); got != "migrations pending" {
		t.Errorf("Error() without details = %q, want the reason alone", got)
	}
}
