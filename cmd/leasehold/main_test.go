package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/schema"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

// env is a getenv over the given name, value pairs and nothing else: the
// tests never see the environment they run in.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(name string) string { return m[name] }
}

// syncBuffer is a bytes.Buffer that a replica's logger and the test can
// share.
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

func TestServeNeedsDatabaseURL(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve"},
		{"serve", "--addr", "127.0.0.1:0"},
		{"serve", "--database-url", ""},
		{"migrate"},
	} {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := run(ctx, args, env("LEASEHOLD_ADDR", "127.0.0.1:0"), &stdout, &stderr)
		cancel()
		if err == nil {
			t.Fatalf("run %q without DATABASE_URL: got nil, want an error", args)
		}
		if msg := err.Error(); !strings.Contains(msg, "DATABASE_URL") || strings.Contains(msg, "\n") {
			t.Errorf("run %q without DATABASE_URL: got %q, want one line naming DATABASE_URL", args, msg)
		}
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q without DATABASE_URL: got %v, want a usage error (exit status 2)", args, err)
		}
	}
}

func TestServeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	// Against a URL that answers nothing (runRefused): the flags must be
	// refused before any connection is tried.
	for _, tc := range []struct {
		args []string
		env  []string
		want []string // in the error
	}{
		{[]string{"--workers", "x"}, nil, []string{`--workers "x"`, "integer"}},
		{[]string{"--workers", "-1"}, nil, []string{`--workers "-1"`}},
		{[]string{"--workers", "1025"}, nil, []string{`--workers "1025"`}},
		{nil, []string{"LEASEHOLD_WORKERS", "many"}, []string{`--workers "many"`}},
		{[]string{"--lease-ttl", "0s"}, nil, []string{`--lease-ttl "0s"`, "between 1s and 1h"}},
		{[]string{"--lease-ttl", "1500ms"}, nil, []string{`--lease-ttl "1500ms"`, "whole seconds"}},
		{[]string{"--lease-ttl", "2h"}, nil, []string{`--lease-ttl "2h"`}},
		{[]string{"--lease-ttl", "thirty"}, nil, []string{`--lease-ttl "thirty"`}},
		{nil, []string{"LEASEHOLD_LEASE_TTL", "-5s"}, []string{`--lease-ttl "-5s"`}},
		{[]string{"--generator-rate", "0"}, nil, []string{`--generator-rate "0"`, "above 0"}},
		{[]string{"--generator-sleep", "5s-1s"}, nil, []string{`--generator-sleep "5s-1s"`, "MIN-MAX"}},
		{[]string{"--generator-sleep", "3s"}, nil, []string{`--generator-sleep "3s"`}},
		{nil, []string{"LEASEHOLD_SHUTDOWN_GRACE", "-1s"}, []string{`--shutdown-grace "-1s"`}},
		{[]string{"--roles", "api,bogus"}, nil, []string{`"bogus"`, "api,worker,generator,reaper"}},
		{nil, []string{"LEASEHOLD_ROLES", "reaper,apis"}, []string{`"apis"`}},
		// The simulated faults are the demo's: a production replica has no such flag.
		{[]string{"--sim-crash-rate", "0.1"}, nil, []string{"-sim-crash-rate"}},
		{[]string{"--sim-spike-rate", "0"}, nil, []string{"-sim-spike-rate"}},
		{[]string{"--log-format", "xml"}, nil, []string{`--log-format "xml"`}},
		{[]string{"--rate-limit", "-1"}, nil, []string{`--rate-limit "-1"`, "0 (off)"}},
		{[]string{"--rate-limit", "NaN"}, nil, []string{`--rate-limit "NaN"`}},
		{nil, []string{"LEASEHOLD_RATE_BURST", "lots"}, []string{`--rate-burst "lots"`}},
		{[]string{"--trusted-proxies", "10.0.0.0/8,proxy.local"}, nil, []string{`"proxy.local"`, "CIDR"}},
		{[]string{"--log-level", "loud"}, nil, []string{`--log-level "loud"`}},
		{[]string{"--bogus"}, nil, []string{"bogus"}},
		{[]string{"stray"}, nil, []string{"stray"}},
		// Every mistake at once, each named.
		{[]string{"--workers", "x", "--lease-ttl", "0s", "--roles", "api,bogus"}, nil,
			[]string{`--workers "x"`, `--lease-ttl "0s"`, `"bogus"`}},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)
		runRefused(t, args, tc.env, tc.want)
	}
	// A demo replica checks its simulated faults' rates.
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--sim-crash-rate", "2"}, []string{"--sim-crash-rate", "between 0 and 1"}},
		{[]string{"--sim-spike-rate", "x"}, []string{"--sim-spike-rate"}},
	} {
		runRefused(t, append([]string{"demo", "replica", "--addr", "127.0.0.1:0"}, tc.args...), nil, tc.want)
	}
}

// runRefused runs the command line args, which must be refused as bad
// usage with an error that says each of want.
func runRefused(t *testing.T, args, envv, want []string) {
	t.Helper()
	const noDB = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	err := run(ctx, args, env(append([]string{"DATABASE_URL", noDB}, envv...)...), &stdout, &stderr)
	cancel()
	if err == nil {
		t.Errorf("run %q (env %q): got nil, want an error", args, envv)
		return
	}
	t.Logf("run %q (env %q): %v", args, envv, err)
	if !errors.Is(err, errUsage) {
		t.Errorf("run %q (env %q): got %v, want a usage error (exit status 2)", args, envv, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("run %q (env %q): got %q, want it to say %q", args, envv, err, w)
		}
	}
}

// serveConfig parses replica flags the way "leasehold demo replica" does,
// with no simulated faults unless args set them: a replica that runs the
// demo's sleep workers and generator besides a production replica's roles,
// unless args name its roles.
func serveConfig(t *testing.T, args []string, getenv func(string) string) config {
	t.Helper()
	return replicaConfig(t, demoReplica, append([]string{"--sim-crash-rate", "0", "--sim-spike-rate", "0"}, args...), getenv)
}

// replicaConfig parses the flags of a replica of kind.
func replicaConfig(t *testing.T, kind replicaKind, args []string, getenv func(string) string) config {
	t.Helper()
	fs := flag.NewFlagSet("leasehold serve", flag.ContinueOnError)
	finish := configFlags(fs, getenv, kind)
	if err := parse(fs, args, io.Discard); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	c, err := finish()
	if err != nil {
		t.Fatalf("config %q: %v", args, err)
	}
	return c
}

// replica is one running serve (or run).
type replica struct {
	url     string
	logs    *syncBuffer
	cancel  context.CancelFunc
	done    <-chan error // what serve returned
	stopped bool
}

// startReplica runs serve with c until stop is called (or the test ends),
// and returns once it accepts connections and /readyz answers 200.
func startReplica(t *testing.T, c config) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	r := &replica{logs: &syncBuffer{}, cancel: cancel, done: done}
	ready := make(chan string, 1)
	go func() { done <- serve(ctx, c, r.logs, ready) }()
	t.Cleanup(func() {
		if !r.stopped {
			if err := r.stop(t); err != nil {
				t.Errorf("serve at the end of the test: got %v, want nil", err)
			}
		}
	})

	select {
	case addr := <-ready:
		r.url = "http://" + addr
	case err := <-done:
		r.stopped = true
		t.Fatalf("serve returned before it was ready: %v\nlogs:\n%s", err, r.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start listening within 30s\nlogs:\n%s", r.logs)
	}

	// The listener connects on its own; readiness says when it has.
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, body := r.get(t, "/readyz", "")
		if status == http.StatusOK {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz: still %d %s after 15s\nlogs:\n%s", status, body, r.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop cancels the replica's context and returns what serve returned.
func (r *replica) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	r.stopped = true
	select {
	case err := <-r.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not return within 20s of cancellation\nlogs:\n%s", r.logs)
		return nil
	}
}

func (r *replica) request(t *testing.T, method, path, body, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, got
}

func (r *replica) get(t *testing.T, path, token string) (int, []byte) {
	t.Helper()
	return r.request(t, "GET", path, "", token)
}

type leaseBody struct {
	ID         int64   `json:"id"`
	Resource   string  `json:"resource"`
	Holder     string  `json:"holder"`
	Fence      int64   `json:"fence"`
	State      string  `json:"state"`
	TTLSeconds int     `json:"ttl_seconds"`
	ReleasedAt *string `json:"released_at"`
	ExpiresAt  string  `json:"expires_at"`
}

// call sends a request and decodes the answer into a T, wanting status.
func call[T any](t *testing.T, r *replica, method, path, body string, status int) T {
	t.Helper()
	got, raw := r.request(t, method, path, body, "")
	if got != status {
		t.Fatalf("%s %s %s: got %d %s, want %d", method, path, body, got, raw, status)
	}
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: decode %s: %v", method, path, raw, err)
	}
	return v
}

// TestServeEndToEnd runs a replica on a fresh database: leases through the
// API, an expiry announced by its reaper, and a clean shutdown that
// releases the reaper lease at once.
func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "e2e-replica", "--roles", "api,reaper"},
		env("DATABASE_URL", db.URL, "LEASEHOLD_LEASE_TTL", "45s"))
	r := startReplica(t, c)

	if status, body := r.get(t, "/healthz", ""); status != http.StatusOK {
		t.Errorf("GET /healthz: got %d %s, want 200", status, body)
	}

	acquired := call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"e2e:job","holder":"client-1"}`, http.StatusCreated)
	if acquired.Holder != "client-1" || acquired.State != "active" || acquired.TTLSeconds != 45 {
		t.Errorf("acquire: got %+v, want held by client-1, active, ttl_seconds 45 (LEASEHOLD_LEASE_TTL)", acquired)
	}
	call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"e2e:job","holder":"client-2"}`, http.StatusConflict)
	body := fmt.Sprintf(`{"resource":"e2e:job","holder":"client-1","fence":%d}`, acquired.Fence)
	renewed := call[leaseBody](t, r, "PUT", "/api/leases/renew", body, http.StatusOK)
	if renewed.Fence != acquired.Fence || renewed.ExpiresAt < acquired.ExpiresAt {
		t.Errorf("renew: got %+v, want fence %d and expires_at not before %s", renewed, acquired.Fence, acquired.ExpiresAt)
	}
	released := call[leaseBody](t, r, "DELETE", "/api/leases/release", body, http.StatusOK)
	if released.State != "released" || released.ReleasedAt == nil {
		t.Errorf("release: got %+v, want released", released)
	}
	call[leaseBody](t, r, "DELETE", "/api/leases/release", body, http.StatusNotFound)
	type instanceOnly struct {
		Instance struct {
			ID    string   `json:"id"`
			Roles []string `json:"roles"`
		} `json:"instance"`
	}
	listed := call[instanceOnly](t, r, "GET", "/api/leases", "", http.StatusOK)
	if listed.Instance.ID != "e2e-replica" || strings.Join(listed.Instance.Roles, ",") != "api,reaper" {
		t.Errorf("GET /api/leases instance: got %+v, want e2e-replica with roles api,reaper", listed.Instance)
	}

	// The reaper takes its lease on its own; wait until it holds it.
	waitFor(t, r, "the reaper lease held by e2e-replica", func() bool {
		ls := call[[]leaseBody](t, r, "GET", "/api/leases/active?prefix="+reaper.Resource, "", http.StatusOK)
		return len(ls) == 1 && ls[0].Holder == "e2e-replica"
	})

	// A lease of 1 s: the reaper announces its expiry as an event.
	short := call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"e2e:short","holder":"client-1","ttl_seconds":1}`, http.StatusCreated)
	type event struct {
		Kind      string `json:"kind"`
		At        string `json:"at"`
		Fence     int64  `json:"fence"`
		ExpiresAt string `json:"expires_at"`
	}
	var expired event
	waitFor(t, r, "an expired event for e2e:short", func() bool {
		for _, e := range call[[]event](t, r, "GET", "/api/leases/events?resource=e2e:short", "", http.StatusOK) {
			if e.Kind == "expired" {
				expired = e
				return true
			}
		}
		return false
	})
	if expired.Fence != short.Fence {
		t.Errorf("expired event: fence %d, want %d", expired.Fence, short.Fence)
	}
	at, err1 := time.Parse(time.RFC3339, expired.At)
	due, err2 := time.Parse(time.RFC3339, short.ExpiresAt)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	// Announced within a second of its expiry, with the test's slack (the
	// race detector, a busy machine): a test, not a benchmark.
	lag := at.Sub(due)
	t.Logf("expiry of e2e:short announced %v after its expires_at", lag)
	if lag < 0 || lag > testkit.Bound(time.Second) {
		t.Errorf("expiry announced %v after expires_at, want within %s (a second, with the test's slack)", lag, testkit.Bound(time.Second))
	}

	// A clean shutdown: serve returns nil and the reaper lease is released now,
	// not left to expire.
	if err := r.stop(t); err != nil {
		t.Errorf("serve after cancel: got %v, want nil\nlogs:\n%s", err, r.logs)
	}
	var (
		holder         string
		releasedAtOnce bool
		kinds          []string
	)
	err := db.Pool.QueryRow(t.Context(),
		`SELECT holder, released_at IS NOT NULL AND released_at = expires_at FROM leases WHERE resource = $1`,
		reaper.Resource).Scan(&holder, &releasedAtOnce)
	if err != nil {
		t.Fatalf("reaper lease: %v", err)
	}
	if holder != "e2e-replica" || !releasedAtOnce {
		t.Errorf("reaper lease after shutdown: holder %q, released %v; want e2e-replica, released", holder, releasedAtOnce)
	}
	rows, err := db.Pool.Query(t.Context(), `SELECT kind FROM lease_events WHERE resource = $1 ORDER BY id`, reaper.Resource)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	if len(kinds) == 0 || kinds[len(kinds)-1] != "released" {
		t.Errorf("reaper lease events: got %q, want the last to be released", kinds)
	}
	if !strings.Contains(r.logs.String(), `"message":"stopped"`) {
		t.Errorf("logs: no \"stopped\" line in\n%s", r.logs)
	}
	if resp, err := http.Get(r.url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("GET /healthz after shutdown: answered, want the listener closed")
	}
}

// waitFor retries cond every 20 ms until it holds, for at most 15 s.
func waitFor(t *testing.T, r *replica, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s\nlogs:\n%s", what, r.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// addrFromLog passes log lines through to a buffer and sends the address of
// the first "serving" line: how a test learns where run listens.
type addrFromLog struct {
	logs *syncBuffer
	addr chan string
	mu   sync.Mutex
	rest []byte
	sent bool
}

func (a *addrFromLog) Write(p []byte) (int, error) {
	_, _ = a.logs.Write(p) // a syncBuffer never fails
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rest = append(a.rest, p...)
	sc := bufio.NewScanner(bytes.NewReader(a.rest))
	for sc.Scan() {
		var line struct {
			Message string `json:"message"`
			Addr    string `json:"addr"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "serving" && !a.sent {
			a.sent = true
			a.addr <- line.Addr
		}
	}
	if i := bytes.LastIndexByte(a.rest, '\n'); i >= 0 {
		a.rest = a.rest[i+1:]
	}
	return len(p), nil
}

// TestRunServe starts the whole program as main does, configured through the
// environment, and stops it by cancelling its context.
func TestRunServe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "run-test-token-of-16"
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	defer cancel()
	logs := &addrFromLog{logs: &syncBuffer{}, addr: make(chan string, 1)}
	getenv := env("DATABASE_URL", db.URL, "LEASEHOLD_ADDR", "127.0.0.1:0", "LEASEHOLD_INSTANCE", "run-replica",
		"LEASEHOLD_ROLES", "api", "LEASEHOLD_API_TOKEN", token)
	done := make(chan error, 1)
	var stdout bytes.Buffer
	go func() { done <- run(ctx, []string{"serve"}, getenv, &stdout, logs) }()

	r := &replica{logs: logs.logs, cancel: cancel, done: done}
	t.Cleanup(func() {
		if !r.stopped {
			if err := r.stop(t); err != nil {
				t.Errorf("serve at the end of the test: got %v, want nil", err)
			}
		}
	})
	select {
	case addr := <-logs.addr:
		r.url = "http://" + addr
	case err := <-done:
		r.stopped = true
		t.Fatalf("run returned before serving: %v\nlogs:\n%s", err, logs.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not log a serving line within 30s\nlogs:\n%s", logs.logs)
	}
	waitFor(t, r, "GET /readyz 200", func() bool {
		status, _ := r.get(t, "/readyz", "")
		return status == http.StatusOK
	})

	if status, body := r.get(t, "/api/leases", ""); status != http.StatusUnauthorized {
		t.Errorf("GET /api/leases without the token: got %d %s, want 401", status, body)
	}
	if status, body := r.get(t, "/api/leases", token); status != http.StatusOK {
		t.Errorf("GET /api/leases with the token: got %d %s, want 200", status, body)
	}
	// The default TTL comes from the configuration (30s here).
	status, body := r.request(t, "POST", "/api/leases", `{"resource":"run:job","holder":"h"}`, token)
	var l struct {
		TTLSeconds int `json:"ttl_seconds"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &l) != nil || l.TTLSeconds != 30 {
		t.Errorf("acquire with the token: got %d %s, want 201 and ttl_seconds 30", status, body)
	}

	if err := r.stop(t); err != nil {
		t.Errorf("run after cancel: got %v, want nil\nlogs:\n%s", err, logs.logs)
	}
	// Without the reaper role, no reaper lease was ever taken.
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM leases WHERE resource = $1`, reaper.Resource).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("replica with roles api: %d reaper leases, want none", n)
	}
	if stdout.Len() != 0 {
		t.Errorf("run serve wrote %q to stdout, want nothing (logs go to stderr)", stdout.String())
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	migrate := func(args []string, getenv func(string) string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), args, getenv, &stdout, &stderr); err != nil {
			t.Fatalf("run %q: %v\nstderr: %s", args, err, &stderr)
		}
		return stdout.String()
	}

	all := allMigrations(t)
	if got := migrate([]string{"migrate", "--database-url", db.URL}, env()); !strings.HasPrefix(got, all) {
		t.Errorf("first migrate: got %q, want %q", got, all)
	}
	var missing []string
	for _, table := range []string{"leases", "lease_events", "leasehold_migrations"} {
		var ok bool
		if err := db.Pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if !ok {
			missing = append(missing, table)
		}
	}
	if len(missing) > 0 {
		t.Errorf("after migrate: tables %q missing", missing)
	}
	// Again, with the URL from the environment: nothing left to do.
	if got := migrate([]string{"migrate"}, env("DATABASE_URL", db.URL)); !strings.HasPrefix(got, "applied 0 migration(s)") {
		t.Errorf("second migrate: got %q, want \"applied 0 migration(s) ...\"", got)
	}
}

// allMigrations is what migrate prints when it applies every migration.
func allMigrations(t *testing.T) string {
	t.Helper()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("applied %d migration(s)", len(ms))
}

// TestMigrateConcurrently starts several migrations at once, as N replicas
// starting together do: exactly one applies the migrations.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	const n = 4
	var (
		wg   sync.WaitGroup
		outs [n]bytes.Buffer
		errs [n]error
	)
	for i := range n {
		wg.Go(func() {
			errs[i] = run(t.Context(), []string{"migrate", "--database-url", db.URL}, env(), &outs[i], io.Discard)
		})
	}
	wg.Wait()
	applied := 0
	all := allMigrations(t)
	for i := range n {
		if errs[i] != nil {
			t.Errorf("migrate #%d: %v", i, errs[i])
		}
		switch out := outs[i].String(); {
		case strings.HasPrefix(out, all):
			applied++
		case strings.HasPrefix(out, "applied 0 migration(s)"):
		default:
			t.Errorf("migrate #%d: got %q, want %q or none applied", i, out, all)
		}
	}
	if applied != 1 {
		t.Errorf("%d of %d concurrent migrations applied the schema, want exactly 1", applied, n)
	}
}

// TestShutdownReleasesEveryLease: a replica with every role, generating
// and running two long tasks, one of them gated by a lock, is stopped with
// no grace: its tasks go back to the queue at once (no attempt counted)
// and no lease of its own — task, lock, generator, reaper, scheduler,
// instance — is left for others to wait out.
func TestShutdownReleasesEveryLease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "drain-replica", "--workers", "2",
		"--shutdown-grace", "0s", "--generator-rate", "1", "--generator-sleep", "10m-10m"},
		env("DATABASE_URL", db.URL))
	r := startReplica(t, c)
	if status, body := r.request(t, "POST", "/api/tasks", `{"task_data":{"sleep_duration_seconds":600},"lock":"drain-lock"}`, ""); status != http.StatusCreated {
		t.Fatalf("add a gated task: %d %s", status, body)
	}
	if status, body := r.request(t, "POST", "/api/generator/start", "", ""); status != http.StatusAccepted {
		t.Fatalf("start the generator: %d %s", status, body)
	}
	// Wait until the replica holds every kind of lease: its two workers run
	// ten-minute tasks (one holding its lock), and it is the generator, the
	// reaper, the scheduler and itself.
	deadline := time.Now().Add(time.Minute) // keeps a broken test from hanging
	for {
		var held int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(DISTINCT CASE WHEN resource LIKE 'leasehold:%' THEN resource ELSE split_part(resource, ':', 1) END)
			FROM leases WHERE released_at IS NULL AND expires_at > now()
			  AND (holder = 'drain-replica' OR holder LIKE 'drain-replica/%')`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		// A task's lease lives in its row.
		var running int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM tasks WHERE state = 'running'
			  AND processor LIKE 'drain-replica/%' AND must_heartbeat_before > now()`).Scan(&running); err != nil {
			t.Fatal(err)
		}
		if held == 5 && running == 2 { // instance:, leasehold:generator, leasehold:reaper, leasehold:scheduler, drain-lock, and the tasks'
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never held its task, lock, generator, reaper, scheduler and instance leases (held kinds %d, running %d)\n%s", held, running, r.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("serve after cancel: %v\n%s", err, r.logs)
	}
	var live []string
	rows, err := db.Pool.Query(t.Context(), `
		SELECT resource FROM leases WHERE released_at IS NULL AND expires_at > now()
		UNION ALL
		SELECT 'task:' || id FROM tasks WHERE state = 'running' AND must_heartbeat_before > now()`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var res string
		if err := rows.Scan(&res); err != nil {
			t.Fatal(err)
		}
		live = append(live, res)
	}
	if len(live) > 0 {
		t.Errorf("leases still live after a clean shutdown: %q", live)
	}
	rows, err = db.Pool.Query(t.Context(), `SELECT id, state, attempts FROM tasks WHERE started_at IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	interrupted := 0
	for rows.Next() {
		var (
			id       int64
			state    string
			attempts int
		)
		if err := rows.Scan(&id, &state, &attempts); err != nil {
			t.Fatal(err)
		}
		interrupted++
		if state != "pending" || attempts != 0 {
			t.Errorf("the interrupted task %d: state %s, attempts %d; want pending with the attempt not counted", id, state, attempts)
		}
	}
	if interrupted != 2 {
		t.Errorf("%d interrupted tasks, want 2", interrupted)
	}
}

// TestLocalDBHelp: localdb -h prints its usage, which says how to stop the
// local PostgreSQL, and starts nothing (no URL on stdout); a flag it does
// not know is bad usage.
func TestLocalDBHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"localdb", "-h"}, env(), &stdout, &stderr)
	if !errors.Is(err, errUsage) || stdout.Len() != 0 || !strings.Contains(stderr.String(), "usage: leasehold localdb") ||
		!strings.Contains(stderr.String(), "-stop") {
		t.Errorf("localdb -h: %v, stdout %q, stderr %q; want its usage, naming --stop, and nothing started", err, &stdout, &stderr)
	}
	if err := run(t.Context(), []string{"localdb", "--bogus"}, env(), io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("localdb --bogus: %v, want a usage error", err)
	}
}
