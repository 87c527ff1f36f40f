package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/reaper"
	"github.com/leasehold/leasehold/internal/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// replica is one leasehold process as far as /ws goes: its own listener,
// hub and HTTP server, on a shared database.
type replica struct {
	listener *notify.Listener
	hub      *hub.Hub
	srv      *httptest.Server
	stop     context.CancelFunc // ends the hub (and then the listener)
	hubDone  chan error
}

type options struct {
	token      string
	origins    []string
	sendBuffer int
	// connect, if set, opens the LISTEN connection instead of pgx.Connect.
	connect func(ctx context.Context) (*pgx.Conn, error)
	// server, if set, adjusts the HTTP server before it starts.
	server func(*http.Server)
}

// startReplica runs a listener, a hub and a server on db until the test ends.
func startReplica(t testing.TB, db pgtest.DB, name string, o options) *replica {
	t.Helper()
	connectListener := o.connect
	if connectListener == nil {
		connectListener = func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) }
	}
	listener := notify.New(connectListener, zerolog.Nop(), notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator, notify.ChannelSchedule)
	h := hub.New(hub.Deps{
		Leases: leasestore.NewStore(db.Pool), Tasks: taskstore.NewStore(db.Pool), Generator: demo.NewState(db.Pool),
		Instances: instance.NewStore(db.Pool), Listener: listener, Instance: name,
		AllowedOrigins: o.origins, SendBuffer: o.sendBuffer, Log: zerolog.Nop(),
	})
	listenCtx, stopListener := context.WithCancel(context.Background())
	listenDone := make(chan struct{})
	go func() { defer close(listenDone); _ = listener.Run(listenCtx) }()
	hubCtx, stopHub := context.WithCancel(context.Background())
	r := &replica{listener: listener, hub: h, stop: stopHub, hubDone: make(chan error, 1)}
	go func() { r.hubDone <- h.Run(hubCtx) }()
	r.srv = httptest.NewUnstartedServer(server.NewServer(server.Deps{
		Leases: leasestore.NewStore(db.Pool), Tasks: taskstore.NewStore(db.Pool), Generator: demo.NewState(db.Pool),
		Instances: instance.NewStore(db.Pool), DefaultTTL: 30 * time.Second, APIToken: o.token, Hub: h,
		Log: zerolog.Nop(), Metrics: server.NewMetrics(listener.Connected, listener.Reconnects),
		Ready:    func(ctx context.Context) error { return nil },
		Instance: server.Instance{ID: name, StartedAt: time.Now().UTC(), Roles: []string{"api"}, Version: "test"},
	}))
	if o.server != nil {
		o.server(r.srv.Config)
	}
	r.srv.Start()
	t.Cleanup(func() {
		stopHub()
		if err := <-r.hubDone; err != nil {
			t.Errorf("hub: %v", err)
		}
		r.srv.Close()
		stopListener()
		<-listenDone
	})
	return r
}

func (r *replica) wsURL() string { return "ws" + strings.TrimPrefix(r.srv.URL, "http") + "/ws" }

// waitListening waits until the replica's LISTEN connection is up, so that
// no change made after it is missed.
func (r *replica) waitListening(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !r.listener.Connected(); {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not connect")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dial opens a websocket to the replica; the handshake's status is
// returned too (0 when there was no response).
func dial(t testing.TB, r *replica, header http.Header) (*websocket.Conn, int, error) {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.Dial(r.wsURL(), header)
	status := 0
	if resp != nil {
		status = resp.StatusCode
		if resp.Body != nil {
			resp.Body.Close()
		}
	}
	if conn != nil {
		t.Cleanup(func() { conn.Close() })
	}
	return conn, status, err
}

// connect opens a websocket and returns it with its snapshot.
func connect(t testing.TB, r *replica) (*websocket.Conn, message) {
	t.Helper()
	conn, _, err := dial(t, r, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	snap := next(t, conn)
	if snap.Type != "snapshot" {
		t.Fatalf("first message type %q, want snapshot", snap.Type)
	}
	r.waitListening(t)
	return conn, snap
}

// message is any message of the protocol, loosely decoded.
type message struct {
	Type         string              `json:"type"`
	Kind         string              `json:"kind"`
	Lease        *lease.Lease        `json:"lease"`
	Event        *lease.Event        `json:"event"`
	ThisInstance string              `json:"this_instance"`
	Leases       []lease.Lease       `json:"leases"`
	Events       []lease.Event       `json:"events"`
	Tasks        *tasksBody          `json:"tasks"`
	Generator    json.RawMessage     `json:"generator"`
	Instances    []instance.Instance `json:"instances"`
	DBNow        *time.Time          `json:"db_now"`
	Status       string              `json:"status"`
	// Name is a schedule message's; null (nil) stands for any schedule.
	Name *string `json:"name"`
	tasksBody
	raw []byte
}

type tasksBody struct {
	task.Stats
	RunningTasks  []json.RawMessage `json:"running_tasks"`
	DeadTasks     []json.RawMessage `json:"dead_tasks"`
	PendingByKind []pendingKind     `json:"pending_by_kind"`
	Limits        []lease.Limit     `json:"limits"`
	PausedQueues  []task.QueuePause `json:"paused_queues"`
}

type pendingKind struct {
	Queue             string  `json:"queue"`
	Kind              string  `json:"kind"`
	Count             int64   `json:"count"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// next reads one message; the deadline only turns a hang into a failure.
func next(t testing.TB, conn *websocket.Conn) message {
	t.Helper()
	m, err := read(conn)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return m
}

func read(conn *websocket.Conn) (message, error) {
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	typ, data, err := conn.ReadMessage()
	if err != nil {
		return message{}, err
	}
	if typ != websocket.TextMessage {
		return message{}, fmt.Errorf("message type %d, want text", typ)
	}
	var m message
	if err := json.Unmarshal(data, &m); err != nil {
		return message{}, fmt.Errorf("decode %s: %w", data, err)
	}
	m.raw = data
	return m, nil
}

// waitFor reads until a message satisfies ok.
func waitFor(t testing.TB, conn *websocket.Conn, what string, ok func(message) bool) message {
	t.Helper()
	for {
		m, err := read(conn)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok(m) {
			return m
		}
	}
}

func leaseMsg(resource, kind string) func(message) bool {
	return func(m message) bool {
		return m.Type == "lease" && m.Kind == kind && m.Lease != nil && m.Lease.Resource == resource
	}
}

func TestSnapshotThenLeaseEvents(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	leases := leasestore.NewStore(db.Pool)
	// History from before the client connects shows in the snapshot.
	before, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "before", Holder: "h0", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := taskstore.TasksOf(taskstore.NewStore(db.Pool).Insert(ctx, []taskstore.NewTask{{TaskData: json.RawMessage(`{}`)}})); err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, db, "replica-a", options{})
	conn, snap := connect(t, r)

	var shape map[string]json.RawMessage
	if err := json.Unmarshal(snap.raw, &shape); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"type", "this_instance", "leases", "events", "tasks", "generator", "instances", "db_now"} {
		if _, ok := shape[k]; !ok {
			t.Errorf("snapshot has no %q: %s", k, snap.raw)
		}
	}
	var tasksShape map[string]json.RawMessage
	_ = json.Unmarshal(shape["tasks"], &tasksShape)
	for _, k := range []string{"pending", "running", "done", "dead", "done_last_minute", "running_tasks", "dead_tasks", "pending_by_kind",
		"limits", "paused_queues"} {
		if _, ok := tasksShape[k]; !ok {
			t.Errorf("snapshot tasks has no %q: %s", k, shape["tasks"])
		}
	}
	if snap.ThisInstance != "replica-a" {
		t.Errorf("this_instance %q, want replica-a", snap.ThisInstance)
	}
	if len(snap.Leases) != 1 || snap.Leases[0].ID != before.Lease.ID {
		t.Errorf("snapshot leases %+v, want the lease of %q", snap.Leases, "before")
	}
	if len(snap.Events) != 1 || snap.Events[0].Resource != "before" || snap.Events[0].Kind != "acquired" {
		t.Errorf("snapshot events %+v, want one acquired of %q", snap.Events, "before")
	}
	if snap.Tasks.Pending != 1 {
		t.Errorf("snapshot tasks pending %d, want 1", snap.Tasks.Pending)
	}
	if !bytes.Contains(shape["generator"], []byte(`"status":"STOPPED"`)) {
		t.Errorf("snapshot generator %s, want STOPPED", shape["generator"])
	}
	if snap.DBNow == nil || snap.DBNow.IsZero() {
		t.Errorf("snapshot db_now %v", snap.DBNow)
	}

	acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "r1", Holder: "h1", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := waitFor(t, conn, "acquired", leaseMsg("r1", "acquired"))
	if m.Lease.ID != acq.Lease.ID || m.Lease.Holder != "h1" || m.Lease.Fence != acq.Lease.Fence {
		t.Errorf("acquired lease %+v, want %+v", m.Lease, acq.Lease)
	}
	if m.Event == nil || m.Event.LeaseID != acq.Lease.ID || m.Event.Kind != "acquired" {
		t.Errorf("acquired event %+v", m.Event)
	}
	if _, err := leases.Renew(ctx, lease.RenewParams{Resource: "r1", Holder: "h1", Fence: acq.Lease.Fence}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, conn, "renewed", leaseMsg("r1", "renewed"))
	if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: "r1", Holder: "h1", Fence: acq.Lease.Fence}); err != nil {
		t.Fatal(err)
	}
	m = waitFor(t, conn, "released", leaseMsg("r1", "released"))
	if m.Lease.State != lease.StateReleased {
		t.Errorf("released lease state %q", m.Lease.State)
	}

	// A lease that runs out is announced by the reaper.
	reapCtx, stopReaper := context.WithCancel(ctx)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		_ = (&reaper.Reaper{Store: leases, Listener: r.listener, Instance: "replica-a",
			Keep: lease.KeepConfig{TTL: 5 * time.Second}, Log: zerolog.Nop()}).Run(reapCtx)
	}()
	defer func() { stopReaper(); <-reaped }()
	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "short", Holder: "h2", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	m = waitFor(t, conn, "expired", leaseMsg("short", "expired"))
	if m.Lease.State != lease.StateExpired {
		t.Errorf("expired lease state %q", m.Lease.State)
	}
}

func TestReplicasStreamTheSameEvents(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	a := startReplica(t, db, "replica-a", options{})
	b := startReplica(t, db, "replica-b", options{})
	connA, _ := connect(t, a)
	connB, _ := connect(t, b)
	leases := leasestore.NewStore(db.Pool)
	acq, err := leases.Acquire(t.Context(), lease.AcquireParams{Resource: "shared", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Release(t.Context(), lease.ReleaseParams{Resource: "shared", Holder: "h", Fence: acq.Lease.Fence}); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"acquired", "released"} {
		ma := waitFor(t, connA, "a: "+kind, leaseMsg("shared", kind))
		mb := waitFor(t, connB, "b: "+kind, leaseMsg("shared", kind))
		if ma.Lease.ID != mb.Lease.ID || ma.Lease.Fence != mb.Lease.Fence || ma.Event == nil || mb.Event == nil || ma.Event.ID != mb.Event.ID {
			t.Errorf("%s: replica a sent %s, replica b %s", kind, ma.raw, mb.raw)
		}
	}
}

func TestTaskBurstIsCoalesced(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := startReplica(t, db, "replica-a", options{})
	conn, _ := connect(t, r)
	tasks := taskstore.NewStore(db.Pool)
	const n = 1000
	start := time.Now()
	go func() {
		for i := range n {
			if _, err := taskstore.TasksOf(tasks.Insert(context.Background(), []taskstore.NewTask{{TaskData: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}})); err != nil {
				t.Errorf("insert: %v", err)
				return
			}
		}
	}()
	frames := 0
	waitFor(t, conn, "tasks showing all inserts", func(m message) bool {
		if m.Type != "tasks" {
			return false
		}
		frames++
		return m.Pending+m.Running+m.Done+m.Dead == n
	})
	// At most one tasks message every 250 ms (and the snapshot's), however
	// long the inserts took on this machine, and far fewer than inserts.
	elapsed := time.Since(start)
	if limit := int(elapsed/(250*time.Millisecond)) + 2; frames > limit || frames >= n/2 {
		t.Errorf("%d tasks frames for %d inserts in %s, want at most one per 250 ms (%d) and far fewer than inserts",
			frames, n, elapsed.Round(time.Millisecond), limit)
	}
	t.Logf("%d inserts in %s, %d tasks frames", n, elapsed.Round(time.Millisecond), frames)
}

// TestPendingByKind: the snapshot and the tasks messages carry the pending
// tasks of each (queue, kind), longest wait first, a kind nobody works
// among them.
func TestPendingByKind(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tasks := taskstore.NewStore(db.Pool)
	insert := func(ts ...taskstore.NewTask) {
		t.Helper()
		if _, err := taskstore.TasksOf(tasks.Insert(t.Context(), ts)); err != nil {
			t.Fatal(err)
		}
	}
	data := json.RawMessage(`{}`)
	// Fixed instants in the past: each wait lies between two readings of
	// the clock the database shares with this test.
	renderDue := time.Now().Add(-10 * time.Minute)
	insert(taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "render", ScheduledAt: renderDue},
		taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "render", ScheduledAt: renderDue.Add(time.Minute)},
		taskstore.NewTask{TaskData: data, ScheduledAt: time.Now().Add(time.Hour)})
	r := startReplica(t, db, "replica-a", options{})
	lo := time.Since(renderDue).Seconds()
	conn, snap := connect(t, r)
	hi := time.Since(renderDue).Seconds()

	got := snap.Tasks.PendingByKind
	if len(got) != 2 {
		t.Fatalf("snapshot pending_by_kind %+v, want reports/render and default/sleep", got)
	}
	if g := got[0]; g.Queue != "reports" || g.Kind != "render" || g.Count != 2 ||
		g.OldestWaitSeconds < lo-0.002 || g.OldestWaitSeconds > hi+0.002 {
		t.Errorf("first row %+v, want reports/render, 2 pending, waiting between %.3f and %.3f s", g, lo, hi)
	}
	if g := got[1]; g.Queue != task.DefaultQueue || g.Kind != demo.Kind || g.Count != 1 || g.OldestWaitSeconds != 0 {
		t.Errorf("second row %+v, want default/sleep, 1 pending, none due (0 s)", g)
	}

	// A kind that waited longer comes first once a tasks message shows it.
	insert(taskstore.NewTask{TaskData: data, Queue: "reports", Kind: "mail", ScheduledAt: time.Now().Add(-time.Hour)})
	m := waitFor(t, conn, "a tasks message with the mail task", func(m message) bool {
		return m.Type == "tasks" && len(m.PendingByKind) == 3
	})
	var order []string
	for _, p := range m.PendingByKind {
		order = append(order, p.Queue+"/"+p.Kind)
	}
	if want := "reports/mail reports/render default/sleep"; strings.Join(order, " ") != want {
		t.Errorf("pending_by_kind in the order %v, want %s (longest wait first)", order, want)
	}
}

func TestSlowClientIsDropped(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := startReplica(t, db, "replica-a", options{sendBuffer: 4})
	reader, _ := connect(t, r)
	// The slow client never reads.
	slow, resp, err := websocket.DefaultDialer.Dial(r.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	defer slow.Close()
	testkit.WaitFor(t, "the hub to register the slow client", func() bool { return r.hub.Clients() == 2 })

	big := bytes.Repeat([]byte("x"), 64<<10)
	payload := []byte(`{"type":"test","pad":"` + string(big) + `"}`)
	got := make(chan error)
	go func() {
		for {
			m, err := read(reader)
			if err != nil || m.Type == "test" {
				got <- err
			}
			if err != nil {
				return
			}
		}
	}()
	sent := 0
	for r.hub.Clients() == 2 {
		if sent == 5000 {
			t.Fatalf("the slow client is still connected after %d frames of 64 KiB", sent)
		}
		r.hub.BroadcastForTest(payload) // returns at once: the hub never waits on a client
		sent++
		if err := <-got; err != nil {
			t.Fatalf("the reading client, frame %d: %v", sent, err)
		}
	}
	if r.hub.Clients() != 1 {
		t.Fatalf("clients %d after the drop, want 1", r.hub.Clients())
	}
	t.Logf("slow client dropped after %d frames of 64 KiB", sent)

	// The slow client finds its connection closed by the server.
	var closeErr error
	for closeErr == nil {
		_ = slow.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _, closeErr = slow.ReadMessage()
	}
	var ce *websocket.CloseError
	if !errors.As(closeErr, &ce) || ce.Code != websocket.ClosePolicyViolation {
		t.Errorf("slow client read error %v, want close 1008", closeErr)
	}
	_ = reader.Close() // ends the reading goroutine
	if err := <-got; err == nil {
		t.Error("reader goroutine ended without an error")
	}
}

func TestOriginAndToken(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	open := startReplica(t, db, "open", options{origins: []string{"https://dash.example.com"}})
	host := strings.TrimPrefix(open.srv.URL, "http://")
	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"http://evil.example", http.StatusForbidden},
		{"http://" + host, http.StatusSwitchingProtocols},
		{"https://dash.example.com", http.StatusSwitchingProtocols},
		{"", http.StatusSwitchingProtocols},
	} {
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		if _, got, _ := dial(t, open, h); got != tc.want {
			t.Errorf("origin %q: status %d, want %d", tc.origin, got, tc.want)
		}
	}
	// The 403 is the API's JSON error.
	req, _ := http.NewRequest(http.MethodGet, open.srv.URL+"/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Error string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || body.Error == "" {
		t.Errorf("cross-origin: %d %q, want 403 with an error", resp.StatusCode, body.Error)
	}

	const token = "s3cret token"
	locked := startReplica(t, db, "locked", options{token: token})
	status := func(h http.Header) int {
		_, got, _ := dial(t, locked, h)
		return got
	}
	if got := status(nil); got != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", got)
	}
	if got := status(http.Header{"Authorization": {"Bearer " + token}}); got != http.StatusSwitchingProtocols {
		t.Errorf("Authorization header: %d, want 101", got)
	}
	if got := status(http.Header{"Authorization": {"Bearer wrong"}}); got != http.StatusUnauthorized {
		t.Errorf("wrong token: %d, want 401", got)
	}
	session := func(tok string) (int, []*http.Cookie) {
		resp, err := http.Post(locked.srv.URL+"/api/session", "application/json", strings.NewReader(`{"token":"`+tok+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Cookies()
	}
	if got, cookies := session("wrong"); got != http.StatusUnauthorized || len(cookies) != 0 {
		t.Errorf("session with a wrong token: %d, cookies %v; want 401 and none", got, cookies)
	}
	got, cookies := session(token)
	if got != http.StatusOK || len(cookies) != 1 {
		t.Fatalf("session: %d, cookies %v; want 200 and one cookie", got, cookies)
	}
	c := cookies[0]
	if c.Name != "leasehold_session" || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Errorf("cookie %+v, want leasehold_session, HttpOnly, SameSite=Strict, Path=/", c)
	}
	if got := status(http.Header{"Cookie": {c.String()}}); got != http.StatusSwitchingProtocols {
		t.Errorf("session cookie: %d, want 101", got)
	}
	// The cookie opens the API too (the page's buttons), but a changing
	// request from another origin is refused.
	apiStatus := func(method, origin string) int {
		t.Helper()
		req, _ := http.NewRequest(method, locked.srv.URL+"/api/generator/stop", nil)
		if method == http.MethodGet {
			req, _ = http.NewRequest(method, locked.srv.URL+"/api/leases", nil)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.AddCookie(c)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := apiStatus(http.MethodGet, ""); got != http.StatusOK {
		t.Errorf("cookie on GET /api/leases: %d, want 200", got)
	}
	if got := apiStatus(http.MethodPost, "http://evil.example"); got != http.StatusForbidden {
		t.Errorf("cookie on a cross-origin POST: %d, want 403", got)
	}
	if got := apiStatus(http.MethodPost, locked.srv.URL); got != http.StatusAccepted {
		t.Errorf("cookie on a same-origin POST: %d, want 202", got)
	}
}

// TestMissedEventsAfterReconnect: a lease changes while the hub's LISTEN
// connection is down, so its notification is lost; after the reconnect the
// hub finds the event in the history and streams it all the same.
func TestMissedEventsAfterReconnect(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var cut atomic.Bool
	reconnect := make(chan struct{})
	r := startReplica(t, db, "replica-a", options{connect: func(ctx context.Context) (*pgx.Conn, error) {
		if cut.Load() {
			select { // held down until the test has made its change
			case <-reconnect:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return pgx.Connect(ctx, db.URL)
	}})
	r.waitListening(t)
	conn, _ := connect(t, r)
	// With a client, the hub waits for inserted tasks, registered under its
	// LISTEN session (before the snapshot, once the listener is up): cut
	// that session.
	cut.Store(true)
	var killed int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM task_waiters
		WHERE waiter = 'replica-a/hub'`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends, %v; want 1", killed, err)
	}
	for deadline := time.Now().Add(30 * time.Second); r.listener.Connected(); {
		if time.Now().After(deadline) {
			t.Fatal("the listener never noticed its connection was cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := leasestore.NewStore(db.Pool).Acquire(t.Context(), lease.AcquireParams{Resource: "missed", Holder: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	close(reconnect)
	m := waitFor(t, conn, "the missed acquisition", leaseMsg("missed", "acquired"))
	if m.Event == nil || m.Event.Resource != "missed" {
		t.Errorf("missed acquisition's event %+v, want the event of %q", m.Event, "missed")
	}
}

func TestShutdownClosesClients(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := startReplica(t, db, "replica-a", options{})
	conn, _ := connect(t, r)
	r.stop()
	var err error
	for err == nil {
		_, err = read(conn)
	}
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Errorf("read after shutdown: %v, want close 1001", err)
	}
	if err := <-r.hubDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.hubDone <- nil // for the cleanup
	// A late upgrade is refused.
	if _, got, _ := dial(t, r, nil); got != http.StatusServiceUnavailable {
		t.Errorf("upgrade after shutdown: %d, want 503", got)
	}
}

// signIn signs in to the replica at url with token and returns its session
// cookie as a Cookie header's value.
func signIn(t *testing.T, url, token string) string {
	t.Helper()
	resp, err := http.Post(url+"/api/session", "application/json", strings.NewReader(`{"token":"`+token+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 {
		t.Fatalf("sign in: %d, cookies %v; want 200 and one cookie", resp.StatusCode, resp.Cookies())
	}
	c := resp.Cookies()[0]
	return c.Name + "=" + c.Value
}
