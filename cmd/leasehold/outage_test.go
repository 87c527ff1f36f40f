package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/reaper"
)

// outageLimit bounds every wait of these tests, only so that a broken test
// fails instead of hanging; none asserts how fast anything happens.
const outageLimit = 90 * time.Second

// TestDatabaseOutage stops the replica's PostgreSQL under it and starts it
// again. While it is down: /readyz and the API answer 503 saying the
// database is the trouble, every lease holder (generator, reaper, the
// instance, the worker with a task) counts its lease lost at its local
// deadline, and nothing is logged at every retry. When it is back,
// everything resumes by itself: readiness, the catch-up claim of a task
// inserted before the listener was back, a task woken by its NOTIFY, the
// leases won again, and the generator generating under its new lease.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	cluster := openCluster(t, "outage")
	dbURL := freshDatabase(t, cluster, "outage")
	const name = "outage-replica"
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", name, "--workers", "2",
		"--lease-ttl", "3s", "--shutdown-grace", "0s", "--generator-rate", "2", "--generator-sleep", "0s-1ms",
		"--log-level", "debug"}, env("DATABASE_URL", dbURL))
	r := startReplica(t, c)

	// Before: a worker runs a long task, and the replica holds the
	// generator, reaper and instance leases.
	long := call[taskBody](t, r, "POST", "/api/tasks", `{"task_data": {"sleep_duration_seconds": 600}}`, http.StatusCreated)
	var claimed taskBody
	eventually(t, r, "the long task running", func() bool {
		claimed = call[taskBody](t, r, "GET", fmt.Sprintf("/api/tasks/%d", long.ID), "", http.StatusOK)
		return claimed.State == "running"
	})
	singletons := []string{demo.Resource, reaper.Resource, instance.LeaseResource(name)}
	before := holdsLeases(t, r, name, singletons, nil)
	page := watchPage(t, r) // a dashboard open throughout

	// PostgreSQL goes away.
	mark := len(r.logs.String())
	if err := cluster.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, r, "/readyz answering 503", func() bool {
		status, e := send(t, r, "GET", "/readyz", "")
		return status == http.StatusServiceUnavailable && strings.Contains(e.Error, "database")
	})
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/api/leases", `{"resource": "during-outage", "holder": "client"}`},
		{"GET", "/api/tasks", ""},
		{"GET", "/api/leases", ""},
		{"POST", "/api/tasks", `{"task_data": {"sleep_duration_seconds": 0}}`},
		{"PUT", "/api/leases/renew", `{"resource": "during-outage", "holder": "client"}`},
		{"GET", "/api/generator", ""},
	} {
		status, e := send(t, r, req.method, req.path, req.body)
		if status != http.StatusServiceUnavailable || !strings.Contains(e.Error, "database") {
			t.Errorf("%s %s with the database down: got %d %q, want 503 with an error naming the database", req.method, req.path, status, e.Error)
		}
	}
	// Each holder counts its lease lost when its local deadline passes
	// without a renewal. An elector logs the loss after its term ended: the
	// generator generates no more, the reaper reaps no more.
	eventually(t, r, "every lease counted lost at its deadline", func() bool {
		lost := map[string]bool{}
		for _, l := range logLines(r, mark) {
			switch {
			case !strings.Contains(l.Error, lease.ErrDeadline.Error()):
			case l.Message == "lost the lease":
				lost[l.Resource] = true
			case strings.HasPrefix(l.Message, "the task's lease was given up at its deadline") && l.Task == long.ID:
				lost["task"] = true
			}
		}
		return lost["task"] && !slices.ContainsFunc(singletons, func(res string) bool { return !lost[res] })
	})

	// PostgreSQL comes back. A task inserted at once, most likely before
	// the listener reconnected, so that its NOTIFY is lost: the catch-up
	// claim after the reconnect must find it.
	restarted := page.len()
	if err := cluster.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	caughtUp := insertTask(t, dbURL)
	eventually(t, r, "/readyz answering 200", func() bool {
		status, _ := send(t, r, "GET", "/readyz", "")
		return status == http.StatusOK
	})
	eventually(t, r, "the task inserted at the restart done", func() bool {
		return call[taskBody](t, r, "GET", fmt.Sprintf("/api/tasks/%d", caughtUp), "", http.StatusOK).State == "done"
	})
	eventually(t, r, "the long task claimed again", func() bool {
		tk := call[taskBody](t, r, "GET", fmt.Sprintf("/api/tasks/%d", long.ID), "", http.StatusOK)
		return tk.State == "running" && tk.Fence > claimed.Fence
	})
	// Won again: with a new fence when the lease expired meanwhile, or the
	// same one, renewed, when it was still live on the database.
	after := holdsLeases(t, r, name, singletons, before)
	wonAgain(t, r, mark, singletons...)

	// The dashboard's stream, which carried nothing while the listener was
	// down, resyncs (a generator message) and carries lease changes again.
	eventually(t, r, "the dashboard resynced and streaming lease changes", func() bool {
		msgs := page.since(restarted)
		return slices.ContainsFunc(msgs, func(m pageMessage) bool { return m.Type == "generator" }) &&
			slices.ContainsFunc(msgs, func(m pageMessage) bool { return m.Type == "lease" && m.Lease.Resource == demo.Resource })
	})

	// A task inserted now is claimed woken by its NOTIFY: the listener is
	// back. Unless the dispatcher is still settling after the restart (its
	// last claim came back short, and it is registering as a waiter): then
	// the catch-up claim after the registration may take the task first,
	// woken "registered", and the next task tells.
	var (
		wakes []string
		fresh taskBody
	)
	for try := 0; try < 5 && !slices.ContainsFunc(wakes, func(w string) bool { return strings.Contains(w, "insert") }); try++ {
		fresh = call[taskBody](t, r, "POST", "/api/tasks", `{"task_data": {"sleep_duration_seconds": 0}}`, http.StatusCreated)
		eventually(t, r, "the task inserted after the restart done", func() bool {
			return call[taskBody](t, r, "GET", fmt.Sprintf("/api/tasks/%d", fresh.ID), "", http.StatusOK).State == "done"
		})
		for _, l := range logLines(r, mark) {
			if l.Message == "claimed task" && l.Task == fresh.ID {
				wakes = append(wakes, l.Wake)
			}
		}
	}
	if !slices.ContainsFunc(wakes, func(w string) bool { return strings.Contains(w, "insert") }) {
		t.Errorf("no task inserted after the restart was claimed woken by its insert's NOTIFY: woken by %q", wakes)
	}

	// The generator, switched on, generates under the lease it won again.
	if status, e := send(t, r, "POST", "/api/generator/start", ""); status != http.StatusAccepted {
		t.Fatalf("start the generator: %d %q", status, e.Error)
	}
	eventually(t, r, "a task generated under the new generator lease, done", func() bool {
		return generatedDone(t, dbURL, fresh.ID, after[demo.Resource]) > 0
	})

	// Quiet logs: whatever failed during the outage said so once, not at
	// every retry. (A request answered 503 logs its own line.)
	said := map[string]int{}
	for _, l := range logLines(r, mark) {
		if l.Message == "internal error" {
			t.Errorf("a request was answered 500: %+v", l)
		}
		if (l.Level == "warn" || l.Level == "error") && l.Message != "database unavailable" {
			said[fmt.Sprintf("%s %q (resource %q, task %d)", l.Level, l.Message, l.Resource, l.Task)]++
		}
	}
	for line, n := range said {
		if n > 1 {
			t.Errorf("logged %s %d times during one outage, want once", line, n)
		}
	}
	t.Logf("warnings during the outage: %v", said)
}

// TestUnresponsiveDatabase: a database that stops answering without
// closing anything (packets dropped, a host frozen) is the worst kind of
// outage: nothing fails, everything waits. The replica must not: /readyz
// and the API answer 503 within their budgets, the reaper counts its lease
// lost at its local deadline, and all resumes once the network is back.
func TestUnresponsiveDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	link := newLink(t, db.URL)
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "silent-replica", "--roles", "api,reaper",
		"--statement-timeout", "1s"}, env("DATABASE_URL", link.databaseURL(t, db.URL, "connect_timeout=1")))
	r := startReplica(t, c)
	before := holdsLeases(t, r, "silent-replica", []string{reaper.Resource}, nil)

	mark := len(r.logs.String())
	link.freeze()
	// Each answer comes back, so nothing hung; how soon is not asserted.
	if status, e := send(t, r, "GET", "/readyz", ""); status != http.StatusServiceUnavailable || !strings.Contains(e.Error, "database") {
		t.Errorf("GET /readyz with the database silent: got %d %q, want 503 naming the database", status, e.Error)
	}
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/api/leases", `{"resource": "during-silence", "holder": "client"}`},
		{"GET", "/api/tasks", ""},
	} {
		status, e := send(t, r, req.method, req.path, req.body)
		if status != http.StatusServiceUnavailable || !strings.Contains(e.Error, "database") {
			t.Errorf("%s %s with the database silent: got %d %q, want 503 naming the database", req.method, req.path, status, e.Error)
		}
	}
	eventually(t, r, "the reaper lease counted lost at its deadline", func() bool {
		return slices.ContainsFunc(logLines(r, mark), func(l logLine) bool {
			return l.Message == "lost the lease" && l.Resource == reaper.Resource && strings.Contains(l.Error, lease.ErrDeadline.Error())
		})
	})

	link.heal()
	eventually(t, r, "/readyz answering 200", func() bool {
		status, _ := send(t, r, "GET", "/readyz", "")
		return status == http.StatusOK
	})
	// Serving again is the promise, not serving the first request at once:
	// a request that meets a database still slow (a busy machine, a pool
	// reconnecting) is told 503 and to retry, and a client retries.
	acquireRetrying(t, r, "after-silence", "client")
	holdsLeases(t, r, "silent-replica", []string{reaper.Resource}, before)
	wonAgain(t, r, mark, reaper.Resource)
}

// acquireRetrying acquires resource for holder as a client does: again
// while the replica answers 503 naming the database (it asks for a retry),
// for at most outageLimit. Anything else but 201 fails the test; so does a
// 200 (already held) unless an attempt before it was answered 503, which
// may have taken the lease although its answer said otherwise.
func acquireRetrying(t *testing.T, r *replica, resource, holder string) {
	t.Helper()
	body := fmt.Sprintf(`{"resource": %q, "holder": %q}`, resource, holder)
	var refused []string
	eventually(t, r, "POST /api/leases answered 201", func() bool {
		status, e := send(t, r, "POST", "/api/leases", body)
		switch {
		case status == http.StatusCreated, status == http.StatusOK && len(refused) > 0:
			return true
		case status == http.StatusServiceUnavailable && strings.Contains(e.Error, "database"):
			refused = append(refused, e.Error)
			return false
		}
		t.Fatalf("POST /api/leases %s: got %d %q after %d answers 503 %q, want 201", body, status, e.Error, len(refused), refused)
		return false
	})
	if len(refused) > 0 {
		t.Logf("POST /api/leases %s: answered 503 %d times before it succeeded: %q", body, len(refused), refused)
	}
	holdsLeases(t, r, holder, []string{resource}, nil)
}

// wonAgain waits until the replica has won each of resources in a
// campaign logged after byte offset mark. (The lease may be seen held
// before that: its old term, still live on the database, which the
// campaign then renews.)
func wonAgain(t *testing.T, r *replica, mark int, resources ...string) {
	t.Helper()
	for _, res := range resources {
		eventually(t, r, res+" won again after the outage", func() bool {
			return slices.ContainsFunc(logLines(r, mark), func(l logLine) bool { return l.Message == "won the lease" && l.Resource == res })
		})
	}
}

// page is a dashboard's websocket, its messages collected as they come.
type page struct {
	mu   sync.Mutex
	msgs []pageMessage
}

type pageMessage struct {
	Type  string `json:"type"`
	Kind  string `json:"kind"`
	Lease struct {
		Resource string `json:"resource"`
		Fence    int64  `json:"fence"`
	} `json:"lease"`
}

// watchPage opens /ws as the dashboard does and collects its messages
// until the test ends.
func watchPage(t *testing.T, r *replica) *page {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.DialContext(t.Context(), "ws"+strings.TrimPrefix(r.url, "http")+"/ws", nil)
	if err != nil {
		t.Fatalf("open /ws: %v", err)
	}
	resp.Body.Close()
	// The snapshot first: a page whose snapshot failed is closed, and this
	// one must be open throughout.
	var first pageMessage
	if err := conn.ReadJSON(&first); err != nil || first.Type != "snapshot" {
		t.Fatalf("first message on /ws: %q, %v; want the snapshot", first.Type, err)
	}
	p := &page{msgs: []pageMessage{first}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var m pageMessage
			if err := conn.ReadJSON(&m); err != nil {
				return
			}
			p.mu.Lock()
			p.msgs = append(p.msgs, m)
			p.mu.Unlock()
		}
	})
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return p
}

func (p *page) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs)
}

// since returns the messages from index from on.
func (p *page) since(from int) []pageMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.msgs[from:])
}

// migrationLock is schema's advisory lock key ("leasemig").
const migrationLock int64 = 0x6c656173656d6967

// TestStatementTimeout: the replica's queries run under --statement-timeout
// (a statement stuck behind a lock is cut short and answered 503), while
// its migrations do not: serve waits for the migration lock however long
// another session holds it.
func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t) // migrations pending: serve must take the lock
	ctx := t.Context()
	locker, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Release()
	if _, err := locker.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
		t.Fatal(err)
	}

	const name = "timeout-replica"
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", name, "--roles", "api",
		"--statement-timeout", "1s"}, env("DATABASE_URL", db.URL))
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	r := &replica{logs: &syncBuffer{}, cancel: cancel, done: done}
	ready := make(chan string, 1)
	go func() { done <- serve(sctx, c, r.logs, ready) }()
	t.Cleanup(func() {
		if !r.stopped {
			if err := r.stop(t); err != nil {
				t.Errorf("serve at the end of the test: %v", err)
			}
		}
	})

	// The migration waits for the lock for twice the statement timeout,
	// by the database's own account, and is not cut short.
	deadline := time.Now().Add(outageLimit)
	for {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1
			  AND wait_event_type = 'Lock' AND now() - query_start > interval '2 seconds')`, "leasehold "+name).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			r.stopped = true
			t.Fatalf("serve returned while waiting for the migration lock: %v\nlogs:\n%s", err, r.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve's migration never waited for the lock\nlogs:\n%s", r.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := locker.Exec(ctx, `SELECT pg_advisory_unlock($1)`, migrationLock); err != nil {
		t.Fatal(err)
	}
	select {
	case addr := <-ready:
		r.url = "http://" + addr
	case err := <-done:
		r.stopped = true
		t.Fatalf("serve returned instead of migrating: %v\nlogs:\n%s", err, r.logs)
	case <-time.After(outageLimit):
		t.Fatalf("serve never started after the migration lock was free\nlogs:\n%s", r.logs)
	}

	// A statement waiting on a row lock longer than the timeout is cut
	// short by the database: 503, not a hang.
	call[leaseBody](t, r, "POST", "/api/leases", `{"resource": "locked", "holder": "a", "ttl_seconds": 60}`, http.StatusCreated)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM leases WHERE resource = 'locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	mark := len(r.logs.String())
	status, e := send(t, r, "POST", "/api/leases", `{"resource": "locked", "holder": "b"}`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusServiceUnavailable || e.Error != "the database did not answer in time; retry shortly" {
		t.Errorf("acquire stuck behind a row lock: got %d %q, want 503 saying the database did not answer in time", status, e.Error)
	}
	if !slices.ContainsFunc(logLines(r, mark), func(l logLine) bool {
		return l.Message == "database unavailable" && strings.Contains(l.Error, "57014")
	}) {
		t.Errorf("no log of the statement cut short by statement_timeout (SQLSTATE 57014)\nlogs:\n%s", r.logs.String()[mark:])
	}
	call[leaseBody](t, r, "POST", "/api/leases", `{"resource": "locked", "holder": "b"}`, http.StatusConflict)
}

func TestStatementTimeoutFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  []string
		want time.Duration
	}{
		{nil, nil, 5 * time.Second},
		{[]string{"--statement-timeout", "250ms"}, nil, 250 * time.Millisecond},
		{nil, []string{"LEASEHOLD_STATEMENT_TIMEOUT", "1m"}, time.Minute},
		{[]string{"--statement-timeout", "0"}, []string{"LEASEHOLD_STATEMENT_TIMEOUT", "1m"}, 0},
	} {
		c := serveConfig(t, tc.args, env(tc.env...))
		if c.StatementTimeout != tc.want {
			t.Errorf("%q (env %q): statement timeout %s, want %s", tc.args, tc.env, c.StatementTimeout, tc.want)
		}
	}
	for _, bad := range []string{"-1s", "1500us", "2h", "soon"} {
		err := run(t.Context(), []string{"serve", "--statement-timeout", bad}, env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(fmt.Sprint(err), "--statement-timeout") {
			t.Errorf("--statement-timeout %s: got %v, want a usage error naming the flag", bad, err)
		}
	}
	// An API request waits for a connection and one statement at most, and
	// never longer than the server may take to answer.
	for _, tc := range []struct{ statement, connect, want time.Duration }{
		{5 * time.Second, 5 * time.Second, 10 * time.Second},
		{time.Second, time.Second, 2 * time.Second},
		{0, 5 * time.Second, writeTimeout},
		{time.Minute, 5 * time.Second, writeTimeout},
	} {
		if got := apiBudget(config{StatementTimeout: tc.statement}, tc.connect); got != tc.want {
			t.Errorf("API budget with statement timeout %s, connect timeout %s: %s, want %s", tc.statement, tc.connect, got, tc.want)
		}
	}
}

// openCluster brings up a PostgreSQL cluster of the test's own, which it
// may stop and start (never the shared one), and stops it at the end.
func openCluster(t *testing.T, name string) *localpg.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // the first run pays for initdb
	defer cancel()
	cluster, err := localpg.Open(ctx, name, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Close(context.Background(), true); err != nil {
			t.Errorf("stop the %s cluster: %v", name, err)
		}
	})
	return cluster
}

// freshDatabase (re)creates database name on the cluster, which keeps its
// data between runs, and returns its URL.
func freshDatabase(t *testing.T, cluster *localpg.Cluster, name string) string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), localpg.URL(cluster.Port(), "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{
		`DROP DATABASE IF EXISTS ` + pgx.Identifier{name}.Sanitize() + ` WITH (FORCE)`,
		`CREATE DATABASE ` + pgx.Identifier{name}.Sanitize(),
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	return localpg.URL(cluster.Port(), name)
}

// insertTask inserts a task straight into the database, not through a
// replica, and returns its id.
func insertTask(t *testing.T, dbURL string) int64 {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ts, err := taskstore.TasksOf(taskstore.NewStore(pool).Insert(t.Context(), []taskstore.NewTask{{TaskData: json.RawMessage(`{"sleep_duration_seconds": 0}`)}}))
	if err != nil {
		t.Fatal(err)
	}
	return ts[0].ID
}

// generatedDone counts the tasks after id that the generator inserted
// under fence and that are done.
func generatedDone(t *testing.T, dbURL string, after, fence int64) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM tasks WHERE id > $1 AND generator_fence = $2 AND state = 'done'`,
		after, fence).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type taskBody struct {
	ID    int64  `json:"id"`
	State string `json:"state"`
	Fence int64  `json:"fence"`
}

// holdsLeases waits until holder holds every one of resources with a fence
// not below the one in atLeast, and returns their fences.
func holdsLeases(t *testing.T, r *replica, holder string, resources []string, atLeast map[string]int64) map[string]int64 {
	t.Helper()
	fences := map[string]int64{}
	for _, res := range resources {
		eventually(t, r, res+" held by "+holder, func() bool {
			for _, l := range call[[]leaseBody](t, r, "GET", "/api/leases/active?prefix="+url.QueryEscape(res), "", http.StatusOK) {
				if l.Resource == res && l.Holder == holder && l.Fence >= atLeast[res] {
					fences[res] = l.Fence
					return true
				}
			}
			return false
		})
	}
	return fences
}

// eventually checks cond every 50 ms until it holds, giving up after
// outageLimit.
func eventually(t *testing.T, r *replica, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(outageLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s\nlogs:\n%s", what, r.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// patientClient gives up on a request only after outageLimit: an answer
// that does not come by then is a hang, and fails the test.
var patientClient = &http.Client{Timeout: outageLimit}

// send sends a request and returns the status and the error it carries,
// if any.
func send(t *testing.T, r *replica, method, path, body string) (int, errorAnswer) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := patientClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var e errorAnswer
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" {
			t.Errorf("%s %s: %d with body %q, want a JSON error", method, path, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, e
}

type errorAnswer struct {
	Error string `json:"error"`
}

// logLine is what these tests read of a replica's log lines.
type logLine struct {
	Level    string `json:"level"`
	Message  string `json:"message"`
	Error    string `json:"error"`
	Resource string `json:"resource"`
	Task     int64  `json:"task"`
	Wake     string `json:"wake"`
}

// logLines returns the replica's log lines from byte offset from on.
func logLines(r *replica, from int) []logLine {
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(r.logs.String()[from:]))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			lines = append(lines, l)
		}
	}
	return lines
}

// link is a TCP path to PostgreSQL that can go silent: frozen, it accepts
// connections and takes in bytes but passes nothing on, like a network
// that drops packets. Healed, it cuts the connections that lived through
// the silence (their streams lost bytes) and passes traffic again.
type link struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// newLink starts a link to the host of dbURL.
func newLink(t *testing.T, dbURL string) *link {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || u.Port() == "" {
		t.Skipf("the test database URL %q names no TCP host and port to put a link in front of", dbURL)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	t.Cleanup(func() {
		ln.Close()
		l.closeAll()
		l.wg.Wait()
	})
	return l
}

// databaseURL is dbURL through the link, with the given query parameters added.
func (l *link) databaseURL(t *testing.T, dbURL, params string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = l.ln.Addr().String()
	if u.RawQuery != "" {
		params = u.RawQuery + "&" + params
	}
	u.RawQuery = params
	return u.String()
}

func (l *link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		if !l.track(c) {
			continue // frozen: held open, answered never
		}
		up, err := net.Dial("tcp", l.target)
		if err != nil {
			c.Close()
			continue
		}
		l.track(up)
		l.wg.Go(func() { l.pipe(up, c) })
		l.wg.Go(func() { l.pipe(c, up) })
	}
}

// track remembers c and reports whether the link passes traffic.
func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns[c] = struct{}{}
	return !l.frozen
}

// pipe copies src to dst, dropping what arrives while the link is frozen.
func (l *link) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.isFrozen() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (l *link) isFrozen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frozen
}

func (l *link) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frozen = true
}

func (l *link) heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeAllLocked()
	l.frozen = false
}

func (l *link) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeAllLocked()
}

func (l *link) closeAllLocked() {
	for c := range l.conns {
		c.Close()
	}
	clear(l.conns)
}
