package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/internal/worker"
)

// metricsGiveUp bounds every wait of these tests, only so that a broken
// test fails instead of hanging; none asserts how fast anything happens.
const metricsGiveUp = time.Minute

// replicaMetrics is a server wired as serve wires it for metrics: a
// listener, a hub feeding its notify lag, the database gauges, all on one
// fresh database.
type replicaMetrics struct {
	bundle
	metrics  *server.Metrics
	listener *notify.Listener
	hub      *hub.Hub
}

func newReplicaMetrics(t *testing.T) *replicaMetrics {
	t.Helper()
	db := pgtest.New(t)
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator)
	m := server.NewMetrics(listener.Connected, listener.Reconnects)
	m.WatchDatabase(db.Pool, metricsGiveUp, 0)
	d := testDeps(db)
	h := hub.New(hub.Deps{
		Leases: d.Leases, Tasks: d.Tasks, Generator: d.Generator, Instances: instance.NewStore(db.Pool),
		Listener: listener, Instance: "test", Log: zerolog.Nop(), NotifyLag: m.NotifyLag,
	})
	m.WatchClients(h.Clients)
	d.Metrics, d.Hub = m, h
	srv := httptest.NewServer(server.NewServer(d))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) })
	wg.Go(func() { _ = h.Run(ctx) })
	// Registered after pgtest's cleanup, so it runs first.
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		srv.Close()
	})
	r := &replicaMetrics{bundle: bundle{db: db, srv: srv}, metrics: m, listener: listener, hub: h}
	for deadline := time.Now().Add(metricsGiveUp); !listener.Connected(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not connect")
		}
	}
	return r
}

// scrape is one /metrics answer: each sample's value by its series as
// printed (name{label="value",...}, labels sorted), and each family's type.
type scrape struct {
	text    string
	samples map[string]float64
	types   map[string]string
}

func (b bundle) scrape(t *testing.T) scrape {
	t.Helper()
	r := b.do(t, "GET", "/metrics", "").want(t, "GET /metrics", http.StatusOK)
	return parseScrape(t, string(r.body))
}

func parseScrape(t *testing.T, text string) scrape {
	t.Helper()
	s := scrape{text: text, samples: map[string]float64{}, types: map[string]string{}}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			s.types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		s.samples[line[:i]] = v
	}
	return s
}

// value returns a sample's value, failing the test when it is missing.
func (s scrape) value(t *testing.T, series string) float64 {
	t.Helper()
	v, ok := s.samples[series]
	if !ok {
		name, _, _ := strings.Cut(series, "{")
		t.Fatalf("no sample %s in the metrics:\n%s", series, grep(s.text, name))
	}
	return v
}

// moved checks that each series moved by want since before (where a
// series missing counts as 0).
func moved(t *testing.T, before, after scrape, want map[string]float64) {
	t.Helper()
	for series, delta := range want {
		if got := after.value(t, series) - before.samples[series]; got != delta {
			t.Errorf("%s moved by %v, want %v", series, got, delta)
		}
	}
}

// TestMetricsAfterActivity drives real activity through a replica's parts
// on a real database (API leases with a conflict and a release, a worker
// claiming and completing a task, an elector whose lease is taken from it,
// a websocket client) and checks that each metric moved as it should.
func TestMetricsAfterActivity(t *testing.T) {
	t.Parallel()
	r := newReplicaMetrics(t)
	before := r.scrape(t)

	// A dashboard connects: its snapshot comes first.
	ws, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(r.srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatalf("dial /ws: %v", err)
	}
	resp.Body.Close()
	defer ws.Close()
	readUntil(t, ws, "the snapshot", func(m wsMessage) bool { return m.Type == "snapshot" })

	// API leases: an acquisition, a conflict, a release; one lease stays held.
	r.acquire(t, "metered", "alice", 30)
	r.do(t, "POST", "/api/leases", `{"resource":"metered","holder":"bob"}`).want(t, "conflict", http.StatusConflict)
	released := r.release(t, "metered", "alice")
	r.acquire(t, "kept", "carol", 30)
	// The feed has read the release's event (and measured its notify lag)
	// once it sends the message.
	readUntil(t, ws, "the release's message", func(m wsMessage) bool {
		return m.Type == "lease" && m.Kind == "released" && m.Lease.Resource == "metered"
	})

	// A worker claims and completes a task; another task waits for later.
	completed := make(chan int64, 1)
	runPool(t, r, func(ev worker.Event) {
		if ev.Kind == worker.EventCompleted {
			completed <- ev.TaskID
		}
	})
	tasks := taskstore.NewStore(r.db.Pool)
	if _, err := taskstore.TasksOf(tasks.Insert(t.Context(), []taskstore.NewTask{{TaskData: json.RawMessage(`{"sleep_duration_seconds": 0}`)}})); err != nil {
		t.Fatal(err)
	}
	if _, err := taskstore.TasksOf(tasks.Insert(t.Context(), []taskstore.NewTask{{
		TaskData: json.RawMessage(`{"sleep_duration_seconds": 0}`), ScheduledAt: time.Now().Add(time.Hour),
	}})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-completed:
	case <-time.After(metricsGiveUp):
		t.Fatal("the worker never completed the task")
	}

	// The generator's elector loses its lease: the lease is released behind
	// its back, so its next renewal is refused.
	loseElectedLease(t, r)

	after := r.scrape(t)
	moved(t, before, after, map[string]float64{
		`leasehold_lease_operations_total{op="acquire",outcome="ok"}`:                        2,
		`leasehold_lease_operations_total{op="acquire",outcome="conflict"}`:                  1,
		`leasehold_lease_operations_total{op="release",outcome="ok"}`:                        1,
		`leasehold_lease_age_at_release_seconds_count{holder="api"}`:                         1,
		`leasehold_worker_tasks_claimed_total`:                                               1,
		`leasehold_worker_tasks_finished_total{outcome="completed"}`:                         1,
		`leasehold_worker_tasks_finished_total{outcome="dead"}`:                              0,
		`leasehold_task_insert_to_claim_seconds_count`:                                       1,
		`leasehold_leases_won_total{holder="generator"}`:                                     1,
		`leasehold_lease_renew_failures_total{holder="generator"}`:                           1,
		`leasehold_leases_lost_total{holder="generator",reason="refused"}`:                   1,
		`leasehold_leases_lost_total{holder="generator",reason="deadline"}`:                  0,
		`leasehold_leases_lost_total{holder="task",reason="refused"}`:                        0,
		`leasehold_http_requests_total{method="POST",route="POST /api/leases",status="409"}`: 1,
	})
	// The age is released_at − created_at, as the API showed them.
	created, _ := time.Parse(time.RFC3339Nano, released.CreatedAt)
	releasedAt, _ := time.Parse(time.RFC3339Nano, *released.ReleasedAt)
	if got, want := after.value(t, `leasehold_lease_age_at_release_seconds_sum{holder="api"}`), releasedAt.Sub(created).Seconds(); got < want-0.002 || got > want+0.002 {
		t.Errorf("lease age at release: sum %v s, want %v s (released_at − created_at, to the millisecond the API shows)", got, want)
	}
	// The acquisitions and the release were each notified and read.
	if got := after.value(t, "leasehold_notify_lag_seconds_count"); got < 3 {
		t.Errorf("notify lag observed %v times, want at least 3 (two acquisitions and a release)", got)
	}
	// State, read from the database at scrape time.
	for series, want := range map[string]float64{
		"leasehold_ws_clients":                          1,
		"leasehold_listener_connected":                  1,
		"leasehold_db_up":                               1,
		`leasehold_leases{state="active"}`:              1, // "kept"; the task's lease went with its completion
		`leasehold_leases{state="expired_unannounced"}`: 0,
		`leasehold_tasks{state="pending"}`:              1, // the one scheduled in an hour
		`leasehold_tasks{state="running"}`:              0,
		`leasehold_tasks{state="dead"}`:                 0,
		"leasehold_task_oldest_due_seconds":             0, // nothing pending is due
	} {
		if got := after.value(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// databaseMetrics serves only the database gauges of a fresh database.
func databaseMetrics(t *testing.T) bundle {
	t.Helper()
	db := pgtest.New(t)
	m := server.NewMetrics(func() bool { return true }, func() int64 { return 0 })
	m.WatchDatabase(db.Pool, metricsGiveUp, 0)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return bundle{db: db, srv: srv}
}

// insertTasks inserts tasks, failing the test when it cannot.
func insertTasks(t *testing.T, db pgtest.DB, tasks ...taskstore.NewTask) {
	t.Helper()
	if _, err := taskstore.TasksOf(taskstore.NewStore(db.Pool).Insert(t.Context(), tasks)); err != nil {
		t.Fatal(err)
	}
}

// byKind names the series of a pending-by-kind gauge as a scrape prints it.
func byKind(name, queue, kind string) string {
	return fmt.Sprintf(`%s{kind=%q,queue=%q}`, name, kind, queue)
}

// TestMetricsPendingByKind scrapes pending tasks of two kinds in two
// queues: each (queue, kind) has its count and the wait of its
// longest-waiting due task, 0 when none is due; tasks that are not pending
// count nowhere.
func TestMetricsPendingByKind(t *testing.T) {
	t.Parallel()
	b := databaseMetrics(t)
	data := json.RawMessage(`{}`)
	// Fixed instants in the past, so that each wait is known to lie between
	// two readings of the clock the database shares with this test.
	sleepDue := time.Now().Add(-10 * time.Minute).Truncate(time.Millisecond)
	renderDue := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	later := time.Now().Add(time.Hour)
	insertTasks(t, b.db,
		taskstore.NewTask{TaskData: data, ScheduledAt: sleepDue},
		taskstore.NewTask{TaskData: data, ScheduledAt: sleepDue.Add(time.Minute)},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "render", ScheduledAt: renderDue},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "render", ScheduledAt: later},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "sleep", ScheduledAt: later},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "sleep", ScheduledAt: later},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "sleep", ScheduledAt: later},
	)
	// One more in its own (queue, kind), claimed: it is running, not pending.
	claimed := taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "mail"}
	insertTasks(t, b.db, claimed)
	if got, err := taskstore.NewStore(b.db.Pool).Claim(t.Context(), taskstore.ClaimParams{
		Processors: []string{"p"}, TTL: time.Minute, Kinds: []string{"mail"},
	}); err != nil || len(got) != 1 {
		t.Fatalf("claiming the mail task: %d claimed, %v", len(got), err)
	}

	sleepLo, renderLo := time.Since(sleepDue).Seconds(), time.Since(renderDue).Seconds()
	s := b.scrape(t)
	sleepHi, renderHi := time.Since(sleepDue).Seconds(), time.Since(renderDue).Seconds()

	const pending, wait = "leasehold_tasks_pending_by_kind", "leasehold_task_oldest_wait_seconds"
	for series, want := range map[string]float64{
		byKind(pending, "default", "sleep"):  2,
		byKind(pending, "reports", "render"): 2,
		byKind(pending, "reports", "sleep"):  3,
		byKind(wait, "reports", "sleep"):     0, // none is due
	} {
		if got := s.value(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// A millisecond of slack each way: the database keeps microseconds.
	for series, bounds := range map[string][2]float64{
		byKind(wait, "default", "sleep"):  {sleepLo, sleepHi},
		byKind(wait, "reports", "render"): {renderLo, renderHi},
	} {
		if got := s.value(t, series); got < bounds[0]-0.001 || got > bounds[1]+0.001 {
			t.Errorf("%s = %v, want the wait of its oldest due task, between %v and %v", series, got, bounds[0], bounds[1])
		}
	}
	for _, name := range []string{pending, wait} {
		if got := seriesOf(s, name); len(got) != 3 {
			t.Errorf("%s has the series %v, want the 3 (queue, kind)s with pending tasks", name, got)
		}
	}
	if got := s.types[pending] + " " + s.types[wait]; got != "gauge gauge" {
		t.Errorf("types of %s and %s: %s, want gauge gauge", pending, wait, got)
	}
	// The kind-blind gauge is the longest of the waits (read by another
	// statement, at another instant).
	if got := s.value(t, "leasehold_task_oldest_due_seconds"); got < renderLo-0.001 || got > renderHi+0.001 {
		t.Errorf("leasehold_task_oldest_due_seconds = %v, want the longest wait, between %v and %v", got, renderLo, renderHi)
	}
}

// TestMetricsPendingByKindBounded scrapes more (queue, kind)s than the
// gauges have series for: the 99 that waited longest keep their own, and
// the rest, a real ("other", "other") among them, are summed into
// queue="other",kind="other" with the longest of their waits.
func TestMetricsPendingByKindBounded(t *testing.T) {
	t.Parallel()
	b := databaseMetrics(t)
	const kinds = 105
	start := time.Now().Add(-24 * time.Hour)
	tasks := make([]taskstore.NewTask, 0, kinds+1)
	for i := range kinds {
		// Kind i has waited i minutes less than kind 0.
		tasks = append(tasks, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Queue: "many",
			Kind: fmt.Sprintf("kind-%03d", i), ScheduledAt: start.Add(time.Duration(i) * time.Minute)})
	}
	tasks = append(tasks, taskstore.NewTask{TaskData: json.RawMessage(`{}`), Queue: "other", Kind: "other", ScheduledAt: time.Now().Add(time.Hour)})
	insertTasks(t, b.db, tasks...)

	s := b.scrape(t)
	const pending, wait = "leasehold_tasks_pending_by_kind", "leasehold_task_oldest_wait_seconds"
	for _, name := range []string{pending, wait} {
		if got := seriesOf(s, name); len(got) != 100 {
			t.Errorf("%s has %d series, want 100 (99 (queue, kind)s and other)", name, len(got))
		}
	}
	for i := range 99 {
		if got := s.value(t, byKind(pending, "many", fmt.Sprintf("kind-%03d", i))); got != 1 {
			t.Errorf("kind-%03d: %v pending, want 1", i, got)
		}
	}
	if _, ok := s.samples[byKind(pending, "many", "kind-099")]; ok {
		t.Errorf("kind-099 has its own series; want it summed into other, with the 100th longest wait:\n%s", grep(s.text, pending))
	}
	if got := s.value(t, byKind(pending, otherLabel, otherLabel)); got != kinds-99+1 {
		t.Errorf("other: %v pending, want %d (kind-099 to kind-104, and other's own)", got, kinds-99+1)
	}
	// All the waits are read at the same database instant.
	if got, want := s.value(t, byKind(wait, otherLabel, otherLabel)), s.value(t, byKind(wait, "many", "kind-000"))-99*60; got < want-0.001 || got > want+0.001 {
		t.Errorf("other: oldest wait %v s, want kind-099's, %v s", got, want)
	}
}

// otherLabel is the queue and kind of the series past the bound.
const otherLabel = "other"

// seriesOf returns the series of one metric in a scrape.
func seriesOf(s scrape, name string) []string {
	var out []string
	for series := range s.samples {
		if strings.HasPrefix(series, name+"{") || series == name {
			out = append(out, series)
		}
	}
	return out
}

// wsMessage is the part of a /ws message these tests read.
type wsMessage struct {
	Type  string `json:"type"`
	Kind  string `json:"kind"`
	Lease struct {
		Resource string `json:"resource"`
	} `json:"lease"`
}

// readUntil reads the websocket's messages until one matches.
func readUntil(t *testing.T, ws *websocket.Conn, what string, match func(wsMessage) bool) {
	t.Helper()
	if err := ws.SetReadDeadline(time.Now().Add(metricsGiveUp)); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		var m wsMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("waiting for %s: %s: %v", what, data, err)
		}
		if match(m) {
			return
		}
	}
}

// sleepHandler is the demo's sleep handler, with no simulated crashes.
func sleepHandler(t *testing.T) worker.Handler {
	t.Helper()
	h, err := demo.Sleep(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// runPool runs one worker on the replica's listener, its events counted by
// the metrics and then passed to onEvent, until the test ends.
func runPool(t *testing.T, r *replicaMetrics, onEvent func(worker.Event)) {
	t.Helper()
	p := &worker.Pool{
		Tasks: taskstore.NewStore(r.db.Pool), Listener: r.listener, Instance: "metered", Workers: 1,
		TTL: 30 * time.Second, SafetyPoll: -1, Log: zerolog.Nop(),
		Kinds: []string{demo.Kind}, Handler: sleepHandler(t),
		OnEvent: func(ev worker.Event) {
			r.metrics.WorkerEvent(ev)
			onEvent(ev)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Run(ctx); err != nil {
			t.Errorf("worker pool: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// loseElectedLease runs an elector with the generator's observer until it
// has won its lease and lost it: the lease is released behind its back,
// so its next renewal is refused.
func loseElectedLease(t *testing.T, r *replicaMetrics) {
	t.Helper()
	const resource = "metered-elector"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &leasing.Elector{
		Leases: leasestore.NewStore(r.db.Pool), Listener: r.listener, Resource: resource, Holder: "elector",
		Keep: lease.KeepConfig{TTL: 3 * time.Second, Observer: r.metrics.KeepObserver(server.HolderGenerator)},
		Log:  zerolog.Nop(),
	}
	won := make(chan lease.Lease, 1)
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(lctx context.Context, l lease.Lease) {
			won <- l
			<-lctx.Done() // the lease is lost
			cancel()      // and the elector stops: no second term
		})
	}()
	select {
	case l := <-won:
		if _, err := r.db.Pool.Exec(t.Context(),
			`UPDATE leases SET released_at = now(), expires_at = now() WHERE resource = $1 AND fence = $2`, resource, l.Fence); err != nil {
			t.Fatal(err)
		}
	case <-time.After(metricsGiveUp):
		t.Fatal("the elector never won its lease")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("elector: %v", err)
		}
	case <-time.After(metricsGiveUp):
		t.Fatal("the elector never noticed it lost its lease")
	}
}

// TestMetricsCatalogue keeps docs/reference/metrics.md and the metrics in
// step: every metric of the catalogue's table is exported, with the type
// the table gives, and every leasehold_* metric exported is in the table.
func TestMetricsCatalogue(t *testing.T) {
	t.Parallel()
	documented := catalogue(t, "../../docs/reference/metrics.md")
	r := newReplicaMetrics(t)
	// The HTTP metrics have a series once a request was served, the
	// pending-by-kind gauges once a task is pending, the tables' estimated
	// sizes once they were analyzed.
	r.do(t, "GET", "/healthz", "").want(t, "GET /healthz", http.StatusOK)
	insertTasks(t, r.db, taskstore.NewTask{TaskData: json.RawMessage(`{}`), ScheduledAt: time.Now().Add(time.Hour)})
	if _, err := r.db.Pool.Exec(t.Context(), "ANALYZE leases, lease_events, tasks"); err != nil {
		t.Fatal(err)
	}
	// The flow-control gauges once a key has a limit and a rate and a
	// queue is paused.
	if _, err := leasestore.NewStore(r.db.Pool).SetRate(t.Context(), "partner-api", 10, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := taskstore.NewStore(r.db.Pool).PauseQueue(t.Context(), "bulk", time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	exported := map[string]string{}
	for name, typ := range r.scrape(t).types {
		if strings.HasPrefix(name, "leasehold_") {
			exported[name] = typ
		}
	}
	for name, typ := range documented {
		switch got, ok := exported[name]; {
		case !ok:
			t.Errorf("docs/reference/metrics.md lists %s, which /metrics does not export: remove it from the table or export it", name)
		case got != typ:
			t.Errorf("docs/reference/metrics.md gives %s the type %s; /metrics says %s", name, typ, got)
		}
	}
	for name := range exported {
		if _, ok := documented[name]; !ok {
			t.Errorf("/metrics exports %s, which docs/reference/metrics.md does not list: add a row to its table", name)
		}
	}
	if len(documented) < 20 {
		t.Errorf("docs/reference/metrics.md's table lists %d metrics; is the table still parsed right?", len(documented))
	}
}

// catalogue reads the metrics table of docs/reference/metrics.md: each
// row's name (its first cell, in backquotes) and type (its second cell).
func catalogue(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`leasehold_") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if _, dup := names[name]; dup {
			t.Errorf("docs/reference/metrics.md lists %s twice", name)
		}
		names[name] = strings.TrimSpace(cells[2])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestMetricsDatabaseUnreachable scrapes a replica whose database refuses
// connections, and one whose database accepts them but never answers: the
// scrape answers, says leasehold_db_up 0, leaves out the database gauges
// and still has the rest.
func TestMetricsDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	for name, addr := range map[string]string{"refused": refusingAddr(t), "silent": silentAddr(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// connect_timeout bounds the pool's own attempt, which goes on
			// after the scrape gave up, so that the test ends cleanly.
			pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://leasehold@%s/leasehold?sslmode=disable&connect_timeout=5", addr))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			m := server.NewMetrics(func() bool { return false }, func() int64 { return 0 })
			m.WatchDatabase(pool, 100*time.Millisecond, 0)
			srv := httptest.NewServer(m.Handler())
			t.Cleanup(srv.Close)

			ctx, cancel := context.WithTimeout(t.Context(), metricsGiveUp)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("scrape with the database %s: %v", name, err)
			}
			defer resp.Body.Close()
			var body strings.Builder
			if _, err := bufio.NewReader(resp.Body).WriteTo(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("scrape with the database %s: status %d, want 200", name, resp.StatusCode)
			}
			s := parseScrape(t, body.String())
			if got := s.value(t, "leasehold_db_up"); got != 0 {
				t.Errorf("leasehold_db_up = %v with the database %s, want 0", got, name)
			}
			for _, gauge := range []string{"leasehold_leases", "leasehold_tasks", "leasehold_task_oldest_due_seconds",
				"leasehold_tasks_pending_by_kind", "leasehold_task_oldest_wait_seconds"} {
				if _, ok := s.types[gauge]; ok {
					t.Errorf("%s exported although the database did not answer:\n%s", gauge, grep(s.text, gauge))
				}
			}
			if got := s.value(t, "leasehold_listener_connected"); got != 0 {
				t.Errorf("leasehold_listener_connected = %v, want 0", got)
			}
		})
	}
}

// refusingAddr returns an address where nothing listens.
func refusingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentAddr returns the address of a server that accepts connections and
// never says a word, as a database host that hangs; it closes them when
// the test ends.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// countingDB counts the statements it is given.
type countingDB struct {
	*pgxpool.Pool
	statements atomic.Int64
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.statements.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.statements.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}

// TestMetricsDatabaseGaugesCached: eight scrapers at once, and again, cost
// the database one reading while it is fresh; the reading's gauges are
// what every scrape shows (the endpoint needs no token, so a crowd of
// scrapers must not become a crowd of queries).
func TestMetricsDatabaseGaugesCached(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	conn := &countingDB{Pool: db.Pool}
	m := server.NewMetrics(func() bool { return true }, func() int64 { return 0 })
	m.WatchDatabase(conn, metricsGiveUp, time.Hour)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	scrape := func() string {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Error(err)
			return ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { scrape() })
	}
	wg.Wait()
	once := conn.statements.Load()
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO tasks (task_data) VALUES ('{}')`); err != nil {
		t.Fatal(err)
	}
	got := scrape()
	// One reading is four statements: the gauges, the pending summary, the
	// limits and the paused queues.
	if n := conn.statements.Load(); n != once || once != 4 {
		t.Errorf("nine scrapes ran %d statements, the first eight %d; want one reading's four", n, once)
	}
	if !strings.Contains(got, `leasehold_tasks{state="pending"} 0`) {
		t.Errorf("a scrape within the reading's hour shows the task inserted after it:\n%s", got)
	}
}

// TestMetricsFlowControl scrapes a key with a limit, a key with a rate
// and a paused queue: each limited key's slots, holders and waiting tasks,
// each rate's starts and spend, each paused queue.
func TestMetricsFlowControl(t *testing.T) {
	t.Parallel()
	b := databaseMetrics(t)
	data := json.RawMessage(`{}`)
	insertTasks(t, b.db,
		taskstore.NewTask{TaskData: data, Lock: "imports", LockLimit: 3},
		taskstore.NewTask{TaskData: data, Lock: "imports", LockLimit: 3},
		taskstore.NewTask{TaskData: data, Lock: "partner-api"})
	ls, ts := leasestore.NewStore(b.db.Pool), taskstore.NewStore(b.db.Pool)
	if _, err := ls.Acquire(t.Context(), lease.AcquireParams{Resource: "imports", Holder: "script", TTL: time.Minute, Slots: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := ls.SetRate(t.Context(), "partner-api", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, err := ts.Claim(t.Context(), taskstore.ClaimParams{Processors: []string{"p"}, TTL: time.Minute, Queues: []string{"default"}}); err != nil || len(got) != 1 {
		t.Fatalf("claim: %d claimed, %v; want 1", len(got), err)
	}
	if _, err := ts.PauseQueue(t.Context(), "bulk", time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	s := b.scrape(t)
	// The claim took one task: of imports (2 slots held then, the
	// script's and the task's) or of partner-api (its one start spent).
	imports, api := s.value(t, `leasehold_limit_waiting{key="imports"}`), s.value(t, `leasehold_limit_waiting{key="partner-api"}`)
	for series, want := range map[string]float64{
		`leasehold_limit_slots{key="imports"}`:                                 3,
		`leasehold_limit_held{key="imports"}`:                                  3 - imports,
		`leasehold_limit_slots{key="partner-api"}`:                             1000,
		`leasehold_limit_rate_starts{key="partner-api",period_seconds="3600"}`: 1,
		`leasehold_limit_rate_spent{key="partner-api"}`:                        1 - api,
		`leasehold_queue_paused{queue="bulk"}`:                                 1,
	} {
		if got := s.value(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if imports+api != 2 {
		t.Errorf("waiting: %v of imports and %v of partner-api, want 2 in all after one of the three was claimed", imports, api)
	}
}
