package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// upstreamPorts returns the local ports of the link's connections to
// PostgreSQL: the client_port pg_stat_activity shows for a session that
// came through the link.
func (l *link) upstreamPorts() []int32 {
	_, port, _ := net.SplitHostPort(l.target)
	l.mu.Lock()
	defer l.mu.Unlock()
	var ports []int32
	for c := range l.conns {
		remote, ok1 := c.RemoteAddr().(*net.TCPAddr)
		local, ok2 := c.LocalAddr().(*net.TCPAddr)
		if ok1 && ok2 && strconv.Itoa(remote.Port) == port {
			ports = append(ports, int32(local.Port))
		}
	}
	return ports
}

// pgSession is a row of pg_stat_activity.
type pgSession struct {
	app   string
	port  int32
	query string
}

// pgSessions returns the sessions of the test's database whose
// application_name starts with prefix.
func pgSessions(t *testing.T, db pgtest.DB, prefix string) []pgSession {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `
		SELECT application_name, coalesce(client_port, -1), query FROM pg_stat_activity
		WHERE datname = current_database() AND starts_with(application_name, $1)`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []pgSession
	for rows.Next() {
		var s pgSession
		if err := rows.Scan(&s.app, &s.port, &s.query); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestListenDatabaseURL: with LEASEHOLD_LISTEN_DATABASE_URL set, the
// session-level work goes there (the migrations of an empty database, and
// the LISTEN session, which stays), and the pool's sessions, everything
// else, use DATABASE_URL. The listen URL here is a path to the same server
// through a link the test can cut: then the replica is not ready, saying
// only that the listener is not connected, while the API, on DATABASE_URL,
// answers; once the link is back, the replica is ready again.
func TestListenDatabaseURL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	link := newLink(t, db.URL)
	const name = "listen-url-replica"
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", name, "--roles", "api"},
		env("DATABASE_URL", db.URL, "LEASEHOLD_LISTEN_DATABASE_URL", link.databaseURL(t, db.URL, "connect_timeout=1")))
	r := startReplica(t, c)
	call[leaseBody](t, r, "POST", "/api/leases", `{"resource": "listen-url", "holder": "client"}`, http.StatusCreated)

	all := pgSessions(t, db, "leasehold "+name)
	through := link.upstreamPorts()
	var listens, others int
	for _, s := range all {
		isListener := s.app == "leasehold "+name+" listener"
		if isListener {
			listens++
			if !strings.HasPrefix(strings.ToLower(s.query), "listen ") {
				t.Errorf("the listener's session: last query %q, want a LISTEN", s.query)
			}
		} else {
			others++
		}
		if viaLink := slices.Contains(through, s.port); viaLink != isListener {
			t.Errorf("session %q (client port %d, last query %q): through the listen URL %v, want %v (ports through it: %v)",
				s.app, s.port, s.query, viaLink, isListener, through)
		}
	}
	if listens != 1 || others == 0 {
		t.Fatalf("sessions of the replica: %d listener(s) and %d other(s), want 1 and some: %+v", listens, others, all)
	}

	// The listen URL goes dark: the LISTEN session breaks and cannot come back.
	link.freeze()
	link.closeAll()
	eventually(t, r, "/readyz answering 503", func() bool {
		status, _ := send(t, r, "GET", "/readyz", "")
		return status == http.StatusServiceUnavailable
	})
	if status, e := send(t, r, "GET", "/readyz", ""); status != http.StatusServiceUnavailable || e.Error != "not ready: the listener is not connected" {
		t.Errorf("GET /readyz with the listen URL cut: got %d %q, want 503 %q", status, e.Error, "not ready: the listener is not connected")
	}
	if status, e := send(t, r, "GET", "/api/leases/active", ""); status != http.StatusOK {
		t.Errorf("GET /api/leases/active with only the listen URL cut: got %d %q, want 200", status, e.Error)
	}

	link.heal()
	eventually(t, r, "/readyz answering 200", func() bool {
		status, _ := send(t, r, "GET", "/readyz", "")
		return status == http.StatusOK
	})
}

// TestListenDatabaseURLRejected: a listen URL that cannot be parsed is a
// usage error naming the flag (and not its password); one that parses but
// does not connect stops serve at start, also naming the flag.
func TestListenDatabaseURLRejected(t *testing.T) {
	t.Parallel()
	const noDB = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	const bad = "postgres://bob:s3cret@db.example:port/app"
	for _, tc := range []struct {
		args []string
		env  []string
	}{
		{[]string{"--listen-database-url", bad}, nil},
		{nil, []string{"LEASEHOLD_LISTEN_DATABASE_URL", bad}},
		{[]string{"--listen-database-url", "host=db.example sslmode=sometimes"}, nil},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := run(ctx, args, env(append([]string{"DATABASE_URL", noDB}, tc.env...)...), io.Discard, io.Discard)
		cancel()
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q (env %q): got %v, want a usage error", args, tc.env, err)
			continue
		}
		t.Logf("run %q (env %q): %v", args[3:], tc.env, err)
		if msg := err.Error(); !strings.Contains(msg, "--listen-database-url") || strings.Contains(msg, "s3cret") {
			t.Errorf("run %q (env %q): got %q, want it to name --listen-database-url and not the password", args, tc.env, msg)
		}
	}

	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--instance", "listen-url-refused", "--listen-database-url", noDB},
		env("DATABASE_URL", db.URL), io.Discard, io.Discard)
	t.Logf("run serve with a listen URL that does not connect: %v", err)
	if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--listen-database-url") {
		t.Errorf("run serve with a listen URL that does not connect: got %v, want an error naming --listen-database-url", err)
	}
}

// TestReadyzKeepsDetailsToTheLog: /readyz needs no token, so while the
// database cannot be reached it says so without the details of the
// connect error, which name the user and the database; the log has them.
func TestReadyzKeepsDetailsToTheLog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	link := newLink(t, db.URL)
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "readyz-replica", "--roles", "api"},
		env("DATABASE_URL", link.databaseURL(t, db.URL, "connect_timeout=1")))
	r := startReplica(t, c)

	mark := len(r.logs.String())
	link.freeze()
	link.closeAll()
	var answer string
	eventually(t, r, "/readyz answering 503", func() bool {
		status, e := send(t, r, "GET", "/readyz", "")
		answer = e.Error
		return status == http.StatusServiceUnavailable
	})
	if answer != "not ready: the database cannot be reached" && answer != "not ready: the database did not answer in time" {
		t.Errorf("GET /readyz with the database cut off: error %q, want it to say only that the database cannot be reached or did not answer", answer)
	}
	u := strings.TrimPrefix(db.URL, "postgres://")
	user, _, _ := strings.Cut(u, "@")
	user, _, _ = strings.Cut(user, ":")
	for _, secret := range []string{db.Name, user, link.ln.Addr().String()} {
		if secret != "" && strings.Contains(answer, secret) {
			t.Errorf("GET /readyz: %q gives away %q", answer, secret)
		}
	}
	eventually(t, r, "the details of the failed readiness check in the log", func() bool {
		return slices.ContainsFunc(logLines(r, mark), func(l logLine) bool {
			return l.Level == "warn" && l.Message == "not ready" && strings.Contains(l.Error, "the database")
		})
	})

	link.heal()
	eventually(t, r, "/readyz answering 200", func() bool {
		status, _ := send(t, r, "GET", "/readyz", "")
		return status == http.StatusOK
	})
	eventually(t, r, "\"ready again\" in the log", func() bool {
		return slices.ContainsFunc(logLines(r, mark), func(l logLine) bool { return l.Message == "ready again" })
	})
}
