package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo/frontdoor"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

func TestDemoRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"demo", "--replicas", "0"},
		{"demo", "--replicas", "27"},
		{"demo", "--chaos=maybe"},
		{"demo", "--workers", "x"},
	} {
		err := run(t.Context(), args, env(), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q: got %v, want a usage error", args, err)
		}
	}
}

// demoProc is a "leasehold demo" process.
type demoProc struct {
	cmd    *exec.Cmd
	logs   *syncBuffer // its stderr, its replicas' included
	url    string      // the front door
	client *http.Client
	done   chan error // what Wait returned
	exited bool
}

// startDemo runs "leasehold demo" with three replicas on the database at dbURL, no
// simulated faults, and args.
func startDemo(t *testing.T, bin, dbURL string, args ...string) *demoProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	args = append([]string{"demo", "--replicas", "3", "--addr", addr, "--database-url", dbURL,
		"--sim-crash-rate", "0", "--sim-spike-rate", "0"}, args...)
	d := &demoProc{
		cmd:  exec.Command(bin, args...),
		logs: &syncBuffer{},
		url:  "http://" + addr,
		// Its own transport, so that its connections end with the test (goleak).
		client: &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second},
		done:   make(chan error, 1),
	}
	// The demo's configuration is its flags, not whatever LEASEHOLD_* the test runs under.
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			environ = append(environ, kv)
		}
	}
	d.cmd.Env = environ
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.WaitDelay = 10 * time.Second
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.client.CloseIdleConnections()
		if d.exited {
			return
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.done:
			t.Logf("demo stopped at the end of the test: %v", err)
		case <-time.After(60 * time.Second):
			t.Errorf("demo still running 60s after SIGTERM: killing it\nlogs:\n%s", d.logs)
			_ = d.cmd.Process.Kill() // its replicas get SIGTERM as their parent dies
			t.Logf("demo killed: %v", <-d.done)
		}
	})
	return d
}

// stop sends SIGTERM to the demo and returns what Wait returned.
func (d *demoProc) stop(t *testing.T) error {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		d.exited = true
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("demo still running 60s after SIGTERM\nlogs:\n%s", d.logs)
		return nil
	}
}

var startedLine = regexp.MustCompile(`started (replica-[a-z]+) pid=(\d+)`)

// pids returns the pids the demo logged for each replica it started, in order.
func (d *demoProc) pids() map[string][]int {
	pids := map[string][]int{}
	for _, m := range startedLine.FindAllStringSubmatch(d.logs.String(), -1) {
		pid, _ := strconv.Atoi(m[2])
		pids[m[1]] = append(pids[m[1]], pid)
	}
	return pids
}

// send sends a request through the front door and returns the status, the replica that
// answered and the body.
func (d *demoProc) send(t *testing.T, method, path, body string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, d.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := d.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\nlogs:\n%s", method, path, err, d.logs)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return res.StatusCode, res.Header.Get(frontdoor.ReplicaHeader), got
}

// waitUntil checks cond every 50 ms until it holds; it fails the test after limit, or at
// once should the demo exit.
func (d *demoProc) waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		select {
		case err := <-d.done:
			d.exited = true
			t.Fatalf("waiting for %s: the demo exited (%v)\nlogs:\n%s", what, err, d.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s\nlogs:\n%s", limit, what, d.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAllReady waits until /readyz through the front door has answered 200 from every one of
// the replicas named.
func (d *demoProc) waitAllReady(t *testing.T, names ...string) {
	t.Helper()
	ready := map[string]bool{}
	d.waitUntil(t, 90*time.Second, fmt.Sprintf("GET /readyz 200 from each of %q", names), func() bool {
		ln, err := net.DialTimeout("tcp", strings.TrimPrefix(d.url, "http://"), time.Second)
		if err != nil {
			return false // the front door is not listening yet
		}
		_ = ln.Close()
		if status, name, _ := d.send(t, "GET", "/readyz", ""); status == http.StatusOK {
			ready[name] = true
		}
		for _, n := range names {
			if !ready[n] {
				return false
			}
		}
		return true
	})
}

// pidGone reports whether no process has pid (a zombie still counts as there).
func pidGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// checkStoppedCleanly stops the demo and checks that it exits 0 and leaves none of its
// replicas behind.
func (d *demoProc) checkStoppedCleanly(t *testing.T) {
	t.Helper()
	if err := d.stop(t); err != nil {
		t.Errorf("demo after SIGTERM: %v, want exit status 0\nlogs:\n%s", err, d.logs)
	}
	for name, pids := range d.pids() {
		for _, pid := range pids {
			if !pidGone(pid) {
				t.Errorf("%s (pid %d) still exists after the demo exited", name, pid)
			}
		}
	}
	if !strings.Contains(d.logs.String(), "all replicas stopped") {
		t.Errorf("logs: no \"all replicas stopped\" line\nlogs:\n%s", d.logs)
	}
}

// TestDemo runs the demo as a user does, as real processes: three replicas behind the front
// door, one of them killed with SIGKILL and restarted while the front door keeps answering,
// then SIGTERM, after which nothing of it is left running.
func TestDemo(t *testing.T) {
	t.Parallel()
	bin := testkit.Leasehold(t)
	db := pgtest.New(t)
	d := startDemo(t, bin, db.URL)
	replicas := []string{"replica-a", "replica-b", "replica-c"}
	d.waitAllReady(t, replicas...)
	if got := d.pids(); len(got) != 3 {
		t.Fatalf("started lines: got %v, want one pid for each of %q", got, replicas)
	}

	status, _, body := d.send(t, "POST", "/api/leases", `{"resource":"demo:job","holder":"demo-test","ttl_seconds":600}`)
	if status != http.StatusCreated {
		t.Fatalf("acquire through the front door: got %d %s, want 201", status, body)
	}

	// kill -9 replica-b: the supervisor starts it again as a new process.
	killed := d.pids()["replica-b"][0]
	if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Meanwhile the front door answers from the others.
	for i := range 6 {
		if status, name, body := d.send(t, "GET", "/readyz", ""); status != http.StatusOK {
			t.Errorf("GET /readyz #%d after the kill: got %d from %q %s, want 200", i, status, name, body)
		}
	}
	d.waitUntil(t, 60*time.Second, "replica-b started again", func() bool { return len(d.pids()["replica-b"]) >= 2 })
	if pids := d.pids()["replica-b"]; pids[1] == killed {
		t.Errorf("replica-b restarted with the killed pid %d", killed)
	}
	if !strings.Contains(d.logs.String(), "replica-b exited (signal: killed)") {
		t.Errorf("logs: no line saying replica-b exited (signal: killed)")
	}
	d.waitAllReady(t, "replica-b")

	// The lease outlived the replica that granted it: it lives in the database.
	status, _, body = d.send(t, "GET", "/api/leases/active?prefix=demo:", "")
	var active []leaseBody
	if status != http.StatusOK || json.Unmarshal(body, &active) != nil || len(active) != 1 || active[0].Holder != "demo-test" {
		t.Errorf("GET /api/leases/active after the kill: got %d %s, want the lease of demo-test", status, body)
	}

	d.checkStoppedCleanly(t)
}

// TestDemoExactlyOnce is item 8's proof across real processes: 300 tasks through the front
// door, worked by three replicas of four workers, one replica killed with SIGKILL while it
// runs tasks. Every task ends done, none lost, and the lease history of each shows holders
// that never overlap.
func TestDemoExactlyOnce(t *testing.T) {
	t.Parallel()
	bin := testkit.Leasehold(t)
	db := pgtest.New(t)
	// No generator: the 300 tasks are all there is.
	d := startDemo(t, bin, db.URL, "--roles", "api,worker,reaper", "--workers", "4")
	replicas := []string{"replica-a", "replica-b", "replica-c"}
	d.waitAllReady(t, replicas...)

	const n = 300
	batch := make([]string, n)
	for i := range batch {
		batch[i] = `{"task_data":{"sleep_duration_seconds":0.2}}`
	}
	status, _, body := d.send(t, "POST", "/api/tasks", "["+strings.Join(batch, ",")+"]")
	var created []struct {
		ID int64 `json:"id"`
	}
	if status != http.StatusCreated || json.Unmarshal(body, &created) != nil || len(created) != n {
		t.Fatalf("POST /api/tasks with %d tasks: got %d %.300s, want 201 and %d tasks", n, status, body, n)
	}

	// Kill a replica that is running a task, as soon as one is.
	var processor string
	d.waitUntil(t, 60*time.Second, "a running task", func() bool {
		err := db.Pool.QueryRow(t.Context(),
			`SELECT processor FROM tasks WHERE state = 'running' ORDER BY id LIMIT 1`).Scan(&processor)
		return err == nil
	})
	victim, _, _ := strings.Cut(processor, "/")
	pids := d.pids()[victim]
	if len(pids) == 0 {
		t.Fatalf("task processor %q: no replica of that name in the logs", processor)
	}
	if err := syscall.Kill(pids[len(pids)-1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s (pid %d) while it ran a task", victim, pids[len(pids)-1])

	type stats struct {
		Pending, Running, Done, Dead int64
	}
	var last stats
	d.waitUntil(t, 3*time.Minute, fmt.Sprintf("all %d tasks finished", n), func() bool {
		status, _, body := d.send(t, "GET", "/api/tasks/stats", "")
		if status != http.StatusOK {
			return false // the replica that answered may be starting
		}
		if err := json.Unmarshal(body, &last); err != nil {
			t.Fatalf("GET /api/tasks/stats: %v in %s", err, body)
		}
		return last.Pending == 0 && last.Running == 0 && last.Done+last.Dead == n
	})
	t.Logf("stats: %+v", last)

	// In the database: every task done, none lost.
	ctx := t.Context()
	var total, done, retried int
	err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'done' AND processed_at IS NOT NULL),
		count(*) FILTER (WHERE attempts >= 2) FROM tasks`).Scan(&total, &done, &retried)
	if err != nil {
		t.Fatal(err)
	}
	if total != n || done != n {
		t.Errorf("tasks: %d in all, %d done; want %d and %d", total, done, n, n)
	}
	t.Logf("%d task(s) needed a second attempt (the kill can land between tasks: not required)", retried)

	// Holding intervals [acquired, end) of each task lease, by fence, where end is the
	// expires_at of the fence's last event (a release sets it to the release time).
	rows, err := db.Pool.Query(ctx, `
		WITH holds AS (
			-- A task's lease lives in its row: the attempts that ended
			-- otherwise than by the completion, then the current or
			-- completed one.
			SELECT 'task:' || t.id AS resource, (a->>'fence')::bigint AS fence,
			       (a->>'started_at')::timestamptz AS start,
			       CASE WHEN a->>'outcome' = 'expired' THEN (a->>'expires_at')::timestamptz
			            ELSE (a->>'ended_at')::timestamptz END AS finish
			FROM tasks AS t, jsonb_array_elements(t.earlier_attempts) AS a
			UNION ALL
			SELECT 'task:' || t.id, t.fence, t.started_at, coalesce(t.processed_at, t.must_heartbeat_before)
			FROM tasks AS t WHERE t.state IN ('running', 'done')
		), ordered AS (
			SELECT resource, fence, start, finish,
			       lag(fence) OVER w AS prev_fence, lag(finish) OVER w AS prev_finish
			FROM holds WINDOW w AS (PARTITION BY resource ORDER BY start, fence)
		)
		SELECT resource, fence, prev_fence FROM ordered
		WHERE start IS NULL OR start < prev_finish OR fence <= prev_fence`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var resource string
		var fence int64
		var prev *int64
		if err := rows.Scan(&resource, &fence, &prev); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%s: the hold under fence %d overlaps the one before it (fence %v), or has no acquisition", resource, fence, deref(prev))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// Completed once, by the holder of the live lease: the task's fence is greater than
	// that of every earlier attempt, and the completion came while that lease was live.
	rows, err = db.Pool.Query(ctx, `
		SELECT t.id, t.fence,
		       (SELECT max((a->>'fence')::bigint) FROM jsonb_array_elements(t.earlier_attempts) AS a),
		       coalesce(t.started_at <= t.processed_at AND t.processed_at < t.must_heartbeat_before, false)
		FROM tasks AS t WHERE t.state = 'done'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var fence, earlier *int64
		var live bool
		if err := rows.Scan(&id, &fence, &earlier, &live); err != nil {
			t.Fatal(err)
		}
		if fence == nil || (earlier != nil && *earlier >= *fence) || !live {
			t.Errorf("task %d: fence %v, latest earlier attempt's fence %v, completed under a live lease: %v; want a greater fence than every earlier attempt's, and live",
				id, deref(fence), deref(earlier), live)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got := d.pids()[victim]; len(got) < 2 {
		t.Errorf("%s was not restarted after the kill: pids %v", victim, got)
	}

	d.checkStoppedCleanly(t)
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestDemoReplicasTakeTheDemosConfiguration: each replica the demo starts
// is a demo replica with the configuration the demo was given, flags and
// secrets (by environment, never on its command line) alike.
func TestDemoReplicasTakeTheDemosConfiguration(t *testing.T) {
	t.Parallel()
	c := replicaConfig(t, demoReplica, []string{
		"--task-retention", "48h", "--lease-history-retention", "0", "--listen-database-url", "postgres://session@db:5432/x",
		"--api-token", "demo-token-of-16-bytes", "--rate-limit", "7",
	}, env("DATABASE_URL", "postgres://app@db:6432/x"))
	child := replicaChild("/bin/leasehold", "replica-a", c, "5s", frontdoor.NewBackend("replica-a", ""), zerolog.Nop())
	cmd, err := child.Command()
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(cmd.Args, " ")
	for _, want := range []string{"/bin/leasehold demo replica ", "--task-retention 48h0m0s", "--lease-history-retention 0s", "--rate-limit 7", "--lease-ttl 5s"} {
		if !strings.Contains(args, want) {
			t.Errorf("the replica's command line %q does not say %q", args, want)
		}
	}
	for _, secret := range []string{"postgres://", "demo-token"} {
		if strings.Contains(args, secret) {
			t.Errorf("the replica's command line %q shows a secret (%s)", args, secret)
		}
	}
	for _, want := range []string{"DATABASE_URL=postgres://app@db:6432/x", "LEASEHOLD_LISTEN_DATABASE_URL=postgres://session@db:5432/x", "LEASEHOLD_API_TOKEN=demo-token-of-16-bytes"} {
		if !slices.Contains(cmd.Env, want) {
			t.Errorf("the replica's environment lacks %s", want)
		}
	}
}
