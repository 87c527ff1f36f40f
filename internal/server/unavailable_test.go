package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
)

// TestDatabaseErrorsAnswer503: every way the database can be out of reach
// or too slow is answered 503 with Retry-After and a sentence saying so;
// the database's other errors stay 500s.
func TestDatabaseErrorsAnswer503(t *testing.T) {
	t.Parallel()
	refused := connectError(t, "postgres://nobody@127.0.0.1:1/none?connect_timeout=5", time.Minute)
	silent := silentServer(t)
	hung := connectError(t, "postgres://nobody@"+silent+"/none", 200*time.Millisecond)

	const unreachable, slow = "the database cannot be reached; retry shortly", "the database did not answer in time; retry shortly"
	for _, tc := range []struct {
		name   string
		err    error
		status int
		msg    string
	}{
		{"connection refused", refused, http.StatusServiceUnavailable, unreachable},
		{"connecting to a server that never answers", hung, http.StatusServiceUnavailable, slow},
		{"request deadline", fmt.Errorf("acquire job: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, slow},
		{"statement_timeout", &pgconn.PgError{Code: "57014"}, http.StatusServiceUnavailable, slow},
		{"server shutting down", &pgconn.PgError{Code: "57P01"}, http.StatusServiceUnavailable, unreachable},
		{"server starting up", &pgconn.PgError{Code: "57P03"}, http.StatusServiceUnavailable, unreachable},
		{"connection failure", &pgconn.PgError{Code: "08006"}, http.StatusServiceUnavailable, unreachable},
		{"too many connections", &pgconn.PgError{Code: "53300"}, http.StatusServiceUnavailable, unreachable},
		{"connection cut mid-statement", fmt.Errorf("list tasks: %w", io.ErrUnexpectedEOF), http.StatusServiceUnavailable, unreachable},
		{"network error", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, http.StatusServiceUnavailable, unreachable},
		{"unique violation", &pgconn.PgError{Code: "23505"}, http.StatusInternalServerError, "internal error; the server log has the details"},
		{"wrong password", &pgconn.PgError{Code: "28P01"}, http.StatusInternalServerError, "internal error; the server log has the details"},
		{"a bug", errors.New("boom"), http.StatusInternalServerError, "internal error; the server log has the details"},
	} {
		w := httptest.NewRecorder()
		writeError(w, httptest.NewRequest("GET", "/api/tasks", nil), zerolog.Nop(), tc.err)
		var body errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Errorf("%s: body %q: %v", tc.name, w.Body, err)
		}
		if w.Code != tc.status || body.Error != tc.msg {
			t.Errorf("%s (%v): got %d %q, want %d %q", tc.name, tc.err, w.Code, body.Error, tc.status, tc.msg)
		}
		if retry := w.Header().Get("Retry-After"); (tc.status == http.StatusServiceUnavailable) != (retry != "") {
			t.Errorf("%s: Retry-After %q with status %d", tc.name, retry, w.Code)
		}
	}
}

// TestClientGoneIsNot503: a request whose client went away is not counted
// as the database being down, even when the driver calls the error safe to
// retry.
func TestClientGoneIsNot503(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest("GET", "/api/tasks", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	_, err := pgx.Connect(ctx, "postgres://nobody@127.0.0.1:1/none")
	if err == nil {
		t.Fatal("connected with a cancelled context")
	}
	writeError(w, r, zerolog.Nop(), err)
	if w.Code != 499 {
		t.Errorf("%v with the client gone: got %d, want 499", err, w.Code)
	}
}

// connectError returns the error of connecting to url within limit.
func connectError(t *testing.T, url string, limit time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		conn.Close(ctx)
		t.Fatalf("connected to %s", url)
	}
	return err
}

// silentServer accepts connections and never answers, as a server behind a
// network that drops packets, and returns its address.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return ln.Addr().String()
}
