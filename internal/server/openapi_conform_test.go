package server_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/server"
)

// notDriven are the documented statuses no request of the test can
// produce, with why; every other documented status must be seen. A 500 is
// documented on every /api/* operation and never driven.
var notDriven = map[string]string{
	"POST /api/generator/start 400": "the body could not be read: a broken connection",
	"POST /api/generator/stop 400":  "the body could not be read: a broken connection",
}

// withSchedules serves /api/schedules from db.
func withSchedules(db pgtest.DB) option {
	return func(d *server.Deps) { d.Schedules = schedulestore.NewStore(db.Pool) }
}

// serve starts a server on deps until the test ends.
func serve(t *testing.T, db pgtest.DB, deps server.Deps) bundle {
	t.Helper()
	srv := httptest.NewServer(server.NewServer(deps))
	t.Cleanup(srv.Close)
	return bundle{db: db, srv: srv}
}

// liveHub runs a LISTEN connection and a websocket hub on db; stop ends
// them (the hub first), and is called at the test's end if not before.
type liveHub struct {
	hub  *hub.Hub
	stop func()
}

func startHub(t *testing.T, db pgtest.DB) liveHub {
	t.Helper()
	listener := notify.New(func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		zerolog.Nop(), notify.ChannelLease, notify.ChannelTask, notify.ChannelGenerator, notify.ChannelSchedule)
	connected := listener.Subscribe(notify.ChannelGenerator, 1) // resynced once every channel is listened to
	defer connected.Close()
	h := hub.New(hub.Deps{
		Leases: leasestore.NewStore(db.Pool), Tasks: taskstore.NewStore(db.Pool), Generator: demo.NewState(db.Pool),
		Instances: instance.NewStore(db.Pool), Listener: listener, Instance: "test", Log: zerolog.Nop(),
	})
	listenCtx, stopListener := context.WithCancel(context.Background())
	listenDone := make(chan struct{})
	go func() { defer close(listenDone); _ = listener.Run(listenCtx) }()
	hubCtx, stopHub := context.WithCancel(context.Background())
	hubDone := make(chan error, 1)
	go func() { hubDone <- h.Run(hubCtx) }()
	stop := sync.OnceFunc(func() {
		stopHub()
		if err := <-hubDone; err != nil {
			t.Errorf("hub: %v", err)
		}
		stopListener()
		<-listenDone
	})
	t.Cleanup(stop)
	select {
	case <-connected.Resync():
	case <-time.After(30 * time.Second): // a guard against a hang, not a timed assertion
		t.Fatal("the LISTEN connection did not come up")
	}
	return liveHub{hub: h, stop: stop}
}

// TestOpenAPIConformance drives real servers on a real database through
// every operation of openapi.json and its statuses (successes, 400, 401,
// 403, 404, 405, 409, 413, 429, 503 and the websocket's), holding every
// exchange to the document; then it fails for any documented status no
// request got, so that the document says no more than the server does.
func TestOpenAPIConformance(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	live := startHub(t, db)
	primary := serve(t, db, testDeps(db, withSchedules(db), func(d *server.Deps) { d.Hub = live.hub }))

	// The document served is the one in the repository.
	resp := primary.do(t, "GET", "/api/openapi.json", "").want(t, "GET /api/openapi.json", http.StatusOK)
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.body) != string(file) {
		t.Error("GET /api/openapi.json does not answer openapi.json")
	}
	c := &conformance{t: t, doc: loadOpenAPI(t, resp.body), seen: map[string]map[string]bool{}}
	c.send(primary, exchange{op: "GET /api/openapi.json", path: "/api/openapi.json", want: http.StatusOK})

	t.Run("websocket", func(t *testing.T) { c.t = t; conformWebsocket(c, primary, live) })
	t.Run("leases", func(t *testing.T) { c.t = t; conformLeases(c, primary) })
	t.Run("tasks", func(t *testing.T) { c.t = t; conformTasks(c, primary) })
	t.Run("schedules", func(t *testing.T) { c.t = t; conformSchedules(c, primary) })
	t.Run("others", func(t *testing.T) { c.t = t; conformOthers(c, primary) })
	t.Run("bad requests", func(t *testing.T) { c.t = t; conformBadRequests(c, primary) })
	t.Run("token", func(t *testing.T) { c.t = t; conformToken(c, db) })
	t.Run("browsers", func(t *testing.T) { c.t = t; conformBrowsers(c, db) })
	t.Run("rate limit", func(t *testing.T) { c.t = t; conformRateLimit(c, db) })
	t.Run("database down", func(t *testing.T) { c.t = t; conformDatabaseDown(c) })
	c.t = t

	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		for code := range c.doc.ops[key]["responses"].(map[string]any) {
			if code == "500" || c.seen[key][code] || notDriven[key+" "+code] != "" {
				continue
			}
			t.Errorf("openapi.json lists %s for %s, and no request of this test got it; drive it here or take it out", code, key)
		}
	}
}

// conformWebsocket: /ws refuses what is not an upgrade, a cross-origin
// upgrade and (once the hub stops) any upgrade, and streams each message
// type of the document's WsMessage, each valid.
func conformWebsocket(c *conformance, b bundle, live liveHub) {
	t := c.t
	const ws = "GET /ws"
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13",
		"Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(key)}
	c.send(b, exchange{op: ws, path: "/ws", want: http.StatusBadRequest})
	c.send(b, exchange{op: ws, path: "/ws", header: append(slices.Clone(upgrade), "Origin", "http://elsewhere.example"), want: http.StatusForbidden})

	// A limited key with a rate and a paused queue, so that the items of
	// the tasks state's limits and paused_queues are held to the document.
	if _, err := leasestore.NewStore(b.db.Pool).SetRate(t.Context(), "ws:key", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := taskstore.NewStore(b.db.Pool).PauseQueue(t.Context(), "ws-paused", time.Now().Add(time.Hour), "held to the schema"); err != nil {
		t.Fatal(err)
	}
	conn, hs, err := websocket.DefaultDialer.DialContext(t.Context(), "ws"+strings.TrimPrefix(b.srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatalf("dial /ws: %v", err)
	}
	defer conn.Close()
	if hs.Body != nil {
		hs.Body.Close()
	}
	c.checkResponse(ws, c.doc.operation(t, ws), response{status: hs.StatusCode, header: hs.Header})

	msgs := c.doc.operation(t, ws)["x-websocket-messages"].(map[string]any)["schema"]
	v := schemaValidator{root: c.doc.root, closed: true}
	types := map[string]bool{}
	// next reads messages, each held to the document, until one of type
	// want, and returns it.
	next := func(want string) map[string]any {
		t.Helper()
		for {
			// A guard against a hang, not a timed assertion.
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, data, err := conn.ReadMessage()
			if err != nil {
				t.Fatalf("reading /ws for a %s message: %v", want, err)
			}
			msg, err := decodeJSON(data)
			if err != nil {
				t.Fatalf("/ws message %s: %v", data, err)
			}
			if err := v.validate(msgs, msg); err != nil {
				t.Errorf("/ws message breaks the documented schema: %v\n%s", err, data)
			}
			obj, _ := msg.(map[string]any)
			typ, _ := obj["type"].(string)
			types[typ] = true
			if typ == want {
				return obj
			}
		}
	}
	snapTasks, _ := next("snapshot")["tasks"].(map[string]any)
	if l, p := snapTasks["limits"].([]any), snapTasks["paused_queues"].([]any); len(l) != 1 || len(p) != 1 {
		t.Errorf("snapshot tasks limits %v and paused_queues %v, want one of each (held to the document)", l, p)
	}

	// A lease, then the instance that holds its instance lease, a task, the
	// generator and a schedule: each change its message.
	c.send(b, exchange{op: "POST /api/leases", path: "/api/leases", body: `{"resource": "ws:demo", "holder": "a"}`, want: http.StatusCreated})
	next("lease")
	if err := instance.NewStore(b.db.Pool).Register(t.Context(), instance.Instance{ID: "replica-x", Addr: "127.0.0.1:8081", Roles: []string{"api", "worker"}, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	c.send(b, exchange{op: "POST /api/leases", path: "/api/leases", body: `{"resource": "instance:replica-x", "holder": "replica-x"}`, want: http.StatusCreated})
	next("instances")
	c.send(b, exchange{op: "POST /api/tasks", path: "/api/tasks", body: `{"task_data": {"sleep_duration_seconds": 1}, "scheduled_at": "2100-01-01T00:00:00Z"}`, want: http.StatusCreated})
	next("tasks")
	c.send(b, exchange{op: "POST /api/generator/start", path: "/api/generator/start", want: http.StatusAccepted})
	next("generator")
	c.send(b, exchange{op: "POST /api/generator/stop", path: "/api/generator/stop", want: http.StatusAccepted})
	c.send(b, exchange{op: "POST /api/schedules", path: "/api/schedules", body: `{"name": "ws-demo", "cron": "@daily", "kind": "report"}`, want: http.StatusCreated})
	next("schedule")
	for _, branch := range c.doc.deref(t, msgs)["oneOf"].([]any) {
		name := strings.TrimPrefix(branch.(map[string]any)["$ref"].(string), "#/components/schemas/")
		typ := c.doc.deref(t, branch)["properties"].(map[string]any)["type"].(map[string]any)["const"].(string)
		if !types[typ] {
			t.Errorf("/ws sent no %q message (%s)", typ, name)
		}
	}

	_ = conn.Close()
	live.stop()
	c.send(b, exchange{op: ws, path: "/ws", header: upgrade, want: http.StatusServiceUnavailable})
}

// fields decodes r's JSON object body.
func fields(t *testing.T, r response) map[string]any {
	t.Helper()
	v, err := decodeJSON(r.body)
	if err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: not a JSON object", r)
	}
	return m
}

// conformLeases: the lease routes' successes, conflicts, 404s and bad input.
func conformLeases(c *conformance, b bundle) {
	t := c.t
	send := func(op, path, body string, want int) response {
		t.Helper()
		return c.send(b, exchange{op: op, path: path, body: body, want: want})
	}
	bad := func(op, path, body string) {
		t.Helper()
		c.send(b, exchange{op: op, path: path, body: body, invalid: true, want: http.StatusBadRequest})
	}
	const acquire, renew, release = "POST /api/leases", "PUT /api/leases/renew", "DELETE /api/leases/release"

	l := fields(t, send(acquire, "/api/leases", `{"resource": "report:nightly", "holder": "a", "ttl_seconds": 30}`, http.StatusCreated))
	id, fence := l["id"], l["fence"]
	send(acquire, "/api/leases", `{"resource": "report:nightly", "holder": "a"}`, http.StatusOK)
	held := fields(t, send(acquire, "/api/leases", `{"resource": "report:nightly", "holder": "b", "wait_seconds": 0}`, http.StatusConflict))
	if held["lease"].(map[string]any)["holder"] != "a" {
		t.Errorf("409 of acquire: %v, want a's lease", held)
	}
	// Waits out its second and finds the lease still held.
	send(acquire, "/api/leases", `{"resource": "report:nightly", "holder": "b", "wait_seconds": 1}`, http.StatusConflict)
	bad(acquire, "/api/leases", `{"resource": "report:nightly"}`)
	bad(acquire, "/api/leases", `{"resource": "", "holder": "a"}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a", "ttl_seconds": 0}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a", "ttl_seconds": 3601}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a", "wait_seconds": 301}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a", "colour": "red"}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": 7}`)
	bad(acquire, "/api/leases", `{"resource": "report\nnightly", "holder": "a"}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a\u0085"}`)
	bad(acquire, "/api/leases", `{"resource": "r", "holder": "a", "ttl_seconds": null}`)
	bad(acquire, "/api/leases", `{"resource": "r",`)
	bad(acquire, "/api/leases", `[]`)

	send(renew, "/api/leases/renew", fmt.Sprintf(`{"resource": "report:nightly", "holder": "a", "fence": %v, "ttl_seconds": 60}`, fence), http.StatusOK)
	send(renew, "/api/leases/renew", `{"resource": "report:nightly", "holder": "b"}`, http.StatusNotFound)
	bad(renew, "/api/leases/renew", `{"resource": "report:nightly", "holder": "a", "fence": 0}`)

	send("GET /api/leases/{id}", fmt.Sprintf("/api/leases/%v", id), "", http.StatusOK)
	send("GET /api/leases/{id}", "/api/leases/999999999", "", http.StatusNotFound)
	bad("GET /api/leases/{id}", "/api/leases/abc", "")
	bad("GET /api/leases/{id}", "/api/leases/0", "")

	// One lease of each state, then every list.
	b.acquire(t, "report:weekly", "a", 30)
	b.expire(t, "report:weekly")
	send(release, "/api/leases/release", fmt.Sprintf(`{"resource": "report:nightly", "holder": "a", "fence": %v}`, fence), http.StatusOK)
	send(release, "/api/leases/release", `{"resource": "report:nightly", "holder": "a"}`, http.StatusNotFound)
	bad(release, "/api/leases/release", `{"holder": "a"}`)
	other := fields(t, send(acquire, "/api/leases", `{"resource": "report:monthly", "holder": "a"}`, http.StatusCreated))
	const byID = "DELETE /api/leases/{id}"
	send(byID, fmt.Sprintf("/api/leases/%v", id), `{"resource": "report:monthly", "holder": "a"}`, http.StatusNotFound) // not this lease's id
	send(byID, fmt.Sprintf("/api/leases/%v", other["id"]), `{"resource": "report:monthly", "holder": "a"}`, http.StatusOK)
	bad(byID, "/api/leases/-1", `{"resource": "report:monthly", "holder": "a"}`)
	bad(byID, fmt.Sprintf("/api/leases/%v", other["id"]), `{"resource": "report:monthly"}`)
	b.acquire(t, "report:daily", "a", 30)

	send("GET /api/leases", "/api/leases", "", http.StatusOK)
	send("GET /api/leases", "/api/leases?prefix=report:&limit=2&after_id=1", "", http.StatusOK)
	bad("GET /api/leases", "/api/leases?limit=0", "")
	bad("GET /api/leases", "/api/leases?after_id=x", "")
	bad("GET /api/leases", "/api/leases?prefix=report%0A", "")
	for _, state := range []string{"active", "expired", "renewed", "released"} {
		op, path := "GET /api/leases/"+state, "/api/leases/"+state
		if list := send(op, path+"?prefix=report:", "", http.StatusOK); string(list.body) == "[]\n" {
			t.Errorf("%s: an empty list; the test made a lease of every kind", op)
		}
		bad(op, path+"?limit=10001", "")
	}
	const events = "GET /api/leases/events"
	send(events, "/api/leases/events", "", http.StatusOK)
	send(events, "/api/leases/events?resource=report:nightly&after=0&limit=100", "", http.StatusOK)

	// Queue pauses, beside the leases for want of a section of their own.
	const pause, resume, paused = "PUT /api/queues/{queue}/pause", "DELETE /api/queues/{queue}/pause", "GET /api/queues/paused"
	send(pause, "/api/queues/imports/pause", `{"reason": "a bug", "until": "2030-01-02T15:04:05Z"}`, http.StatusOK)
	bad(pause, "/api/queues/imports/pause", `{"until": "tomorrow"}`)
	send(paused, "/api/queues/paused", "", http.StatusOK)
	send(resume, "/api/queues/imports/pause", "", http.StatusNoContent)
	send(resume, "/api/queues/imports/pause", "", http.StatusNotFound)
	bad(resume, "/api/queues/a%0Ab/pause", "")
	bad(events, "/api/leases/events?after=-1", "")
	bad(events, "/api/leases/events?limit=abc", "")

	// A key of slots: a slot, a full key's refusal, its limit.
	send(acquire, "/api/leases", `{"resource": "imports", "holder": "a", "slots": 1}`, http.StatusCreated)
	send(acquire, "/api/leases", `{"resource": "imports", "holder": "b", "slots": 1}`, http.StatusConflict)
	bad(acquire, "/api/leases", `{"resource": "imports", "holder": "b", "slots": 0}`)
	const getLimit, setLimit = "GET /api/limits/{key}", "PUT /api/limits/{key}"
	send(getLimit, "/api/limits/imports", "", http.StatusOK)
	send(getLimit, "/api/limits/exports", "", http.StatusNotFound)
	bad(getLimit, "/api/limits/a%0Ab", "")
	send(setLimit, "/api/limits/imports", `{"slots": 2}`, http.StatusOK)
	bad(setLimit, "/api/limits/imports", `{"slots": 1001}`)
	send(setLimit, "/api/limits/imports", `{"rate_starts": 10, "rate_period_seconds": 60}`, http.StatusOK)
	bad(setLimit, "/api/limits/imports", `{"rate_starts": 10}`)
	send(setLimit, "/api/limits/imports", `{}`, http.StatusOK)
	send(setLimit, "/api/limits/exports", `{}`, http.StatusNotFound)
	send("GET /api/limits", "/api/limits?limit=10", "", http.StatusOK)
	bad("GET /api/limits", "/api/limits?limit=0", "")
}

// conformTasks: the task routes' successes, 204, conflicts, 404s and bad input.
func conformTasks(c *conformance, b bundle) {
	t := c.t
	send := func(op, path, body string, want int) response {
		t.Helper()
		return c.send(b, exchange{op: op, path: path, body: body, want: want})
	}
	bad := func(op, path, body string) {
		t.Helper()
		c.send(b, exchange{op: op, path: path, body: body, invalid: true, want: http.StatusBadRequest})
	}
	const create, claim = "POST /api/tasks", "POST /api/tasks/next"
	const heartbeat, complete, fail = "PUT /api/tasks/{id}/heartbeat", "PUT /api/tasks/{id}/complete", "PUT /api/tasks/{id}/fail"

	send(create, "/api/tasks", `{"task_data": {"sleep_duration_seconds": 1}}`, http.StatusCreated)
	send(create, "/api/tasks", `[{"task_data": {"n": 1}, "max_attempts": 1}, {"task_data": {}, "scheduled_at": "2100-01-02T15:04:05+01:00"}]`, http.StatusCreated)
	bad(create, "/api/tasks", `{"task_data": 5}`)
	bad(create, "/api/tasks", `{"sleep_duration_seconds": 1}`)
	bad(create, "/api/tasks", `[]`)
	bad(create, "/api/tasks", `{"task_data": {}, "max_attempts": 101}`)
	bad(create, "/api/tasks", `{"task_data": {}, "scheduled_at": "tomorrow"}`)
	bad(create, "/api/tasks", `[{"task_data": {}}, {"task_data": {}, "priority": 40000}]`)
	bad(create, "/api/tasks", `{"task_data": {}, "kind": ""}`)
	bad(create, "/api/tasks", `{"task_data": {}, "ttl_seconds": null}`)
	// A unique key: the second insert finds the first's task (200). The
	// task is of a kind nobody claims here, in a queue of its own.
	keyed := `{"task_data": {}, "kind": "report", "queue": "reports", "priority": -5, "unique_key": "2030-01", "ttl_seconds": 60}`
	send(create, "/api/tasks", keyed, http.StatusCreated)
	again := fields(t, send(create, "/api/tasks", keyed, http.StatusOK))

	// Claim what is due (two tasks, the third is scheduled in 2100): one
	// to complete, one to fail for good (max_attempts 1), then nothing.
	first := fields(t, send(claim, "/api/tasks/next", `{"processor": "p1", "kinds": ["sleep"]}`, http.StatusOK))
	second := fields(t, send(claim, "/api/tasks/next", `{"processor": "p2", "queues": ["default"]}`, http.StatusOK))
	send(claim, "/api/tasks/next", `{"processor": "p3", "kinds": ["sleep"], "wait_seconds": 0}`, http.StatusNoContent)
	bad(claim, "/api/tasks/next", `{"processor": ""}`)
	bad(claim, "/api/tasks/next", `{}`)
	bad(claim, "/api/tasks/next", `{"processor": "p", "kinds": []}`)
	bad(claim, "/api/tasks/next", `{"processor": "p", "wait_seconds": 301}`)
	// The one of max_attempts 1 fails; the other completes.
	if second["max_attempts"] != json.Number("1") {
		first, second = second, first
	}
	path := func(task map[string]any, op string) string { return fmt.Sprintf("/api/tasks/%v/%s", task["id"], op) }
	hb := func(task map[string]any, extra string) string {
		return fmt.Sprintf(`{"processor": %q, "fence": %v%s}`, task["processor"], task["fence"], extra)
	}

	send(heartbeat, path(first, "heartbeat"), hb(first, ""), http.StatusAccepted)
	send(heartbeat, path(first, "heartbeat"), `{"processor": "someone-else"}`, http.StatusConflict)
	send(heartbeat, "/api/tasks/999999999/heartbeat", hb(first, ""), http.StatusNotFound)
	bad(heartbeat, "/api/tasks/abc/heartbeat", hb(first, ""))
	bad(heartbeat, path(first, "heartbeat"), `{"processor": "p1", "fence": -3}`)
	bad(complete, path(first, "complete"), hb(first, "")) // no task_output
	send(complete, path(first, "complete"), hb(first, `, "task_output": {"ok": true}`), http.StatusAccepted)
	send(complete, path(first, "complete"), hb(first, `, "task_output": null`), http.StatusConflict)
	send(complete, "/api/tasks/999999999/complete", hb(first, `, "task_output": 1`), http.StatusNotFound)
	bad(complete, "/api/tasks/01/complete", hb(first, `, "task_output": 1`))
	bad(fail, path(second, "fail"), hb(second, `, "error": ""`))
	send(fail, path(second, "fail"), hb(second, `, "error": "disk full"`), http.StatusAccepted)
	send(fail, path(second, "fail"), hb(second, `, "error": "disk full"`), http.StatusConflict)
	send(fail, "/api/tasks/999999999/fail", hb(second, `, "error": "disk full"`), http.StatusNotFound)
	bad(fail, "/api/tasks/1.5/fail", hb(second, `, "error": "disk full"`))

	// The keyed task: claimed, snoozed, claimed again, cancelled while it
	// runs, retried; then cancelled while pending.
	const snooze, cancel, retry = "PUT /api/tasks/{id}/snooze", "POST /api/tasks/{id}/cancel", "POST /api/tasks/{id}/retry"
	report := fields(t, send(claim, "/api/tasks/next", `{"processor": "p4", "kinds": ["report"], "queues": ["reports"]}`, http.StatusOK))
	if report["id"] != again["id"] {
		t.Fatalf("claimed %v; want the keyed task %v", report["id"], again["id"])
	}
	bad(snooze, path(report, "snooze"), hb(report, ""))
	bad(snooze, path(report, "snooze"), hb(report, `, "delay_seconds": -1`))
	send(snooze, path(report, "snooze"), hb(report, `, "delay_seconds": 0`), http.StatusAccepted)
	send(snooze, path(report, "snooze"), hb(report, `, "delay_seconds": 0`), http.StatusConflict)
	send(snooze, "/api/tasks/999999999/snooze", hb(report, `, "delay_seconds": 0`), http.StatusNotFound)
	const requeue = "PUT /api/tasks/{id}/requeue"
	report = fields(t, send(claim, "/api/tasks/next", `{"processor": "p4", "kinds": ["report"]}`, http.StatusOK))
	bad(requeue, path(report, "requeue"), `{"processor": "p4", "reason": null}`)
	send(requeue, path(report, "requeue"), hb(report, `, "reason": "shutting down"`), http.StatusAccepted)
	send(requeue, path(report, "requeue"), hb(report, ""), http.StatusConflict)
	send(requeue, "/api/tasks/999999999/requeue", hb(report, ""), http.StatusNotFound)
	report = fields(t, send(claim, "/api/tasks/next", `{"processor": "p4", "kinds": ["report"]}`, http.StatusOK))
	send(cancel, path(report, "cancel"), `{"processor": "someone-else", "reason": "mine"}`, http.StatusConflict)
	bad(cancel, path(report, "cancel"), `{"fence": 3}`)
	send(retry, path(report, "retry"), `{}`, http.StatusConflict) // running
	bad(cancel, path(report, "cancel"), `{"reason": null}`)
	send(cancel, path(report, "cancel"), `{"reason": "no longer wanted"}`, http.StatusAccepted)
	send(cancel, path(report, "cancel"), `{}`, http.StatusConflict)
	send(cancel, "/api/tasks/999999999/cancel", `{}`, http.StatusNotFound)
	bad(retry, path(report, "retry"), `{"now": true}`)
	send(retry, path(report, "retry"), `{}`, http.StatusAccepted)
	send(retry, "/api/tasks/999999999/retry", `{}`, http.StatusNotFound)
	send(cancel, path(report, "cancel"), `{}`, http.StatusAccepted)

	send("GET /api/tasks/{id}", fmt.Sprintf("/api/tasks/%v", first["id"]), "", http.StatusOK)
	send("GET /api/tasks/{id}", fmt.Sprintf("/api/tasks/%v", second["id"]), "", http.StatusOK)
	send("GET /api/tasks/{id}", "/api/tasks/999999999", "", http.StatusNotFound)
	bad("GET /api/tasks/{id}", "/api/tasks/x", "")
	for _, list := range []string{"/api/tasks", "/api/tasks/processed", "/api/tasks/started"} {
		send("GET "+list, list, "", http.StatusOK)
		send("GET "+list, list+"?limit=1&after_id=0", "", http.StatusOK)
		send("GET "+list, list+"?state=done&kind=sleep&queue=default", "", http.StatusOK)
		send("GET "+list, list+"?kind=report", "", http.StatusOK)
		bad("GET "+list, list+"?limit=1001", "")
		bad("GET "+list, list+"?state=finished", "")
	}
	send("GET /api/tasks/stats", "/api/tasks/stats", "", http.StatusOK)
}

// conformSchedules: the schedule routes' successes, the 409 of a name
// taken, 404s and bad input; and what a lock and a schedule show of a task
// (its lock held under the task's fence, the schedule's last task).
func conformSchedules(c *conformance, b bundle) {
	t := c.t
	send := func(op, path, body string, want int) response {
		t.Helper()
		return c.send(b, exchange{op: op, path: path, body: body, want: want})
	}
	bad := func(op, path, body string) {
		t.Helper()
		c.send(b, exchange{op: op, path: path, body: body, invalid: true, want: http.StatusBadRequest})
	}
	// refused is bad input no schema can tell from good (a cron expression,
	// a zone, a name against the path's): the server's 400 says what to fix.
	refused := func(op, path, body string) {
		t.Helper()
		c.send(b, exchange{op: op, path: path, body: body, want: http.StatusBadRequest})
	}
	const create, list, get, replace, remove = "POST /api/schedules", "GET /api/schedules",
		"GET /api/schedules/{name}", "PUT /api/schedules/{name}", "DELETE /api/schedules/{name}"

	nightly := `{"name": "nightly-report", "cron": "0 3 * * *", "zone": "Europe/Berlin", "kind": "report",
		"task_data": {"report": "daily"}, "queue": "reports", "priority": -5, "unique": true, "lock": "db:reports",
		"max_attempts": 3, "ttl_seconds": 120}`
	send(create, "/api/schedules", nightly, http.StatusCreated)
	send(create, "/api/schedules", nightly, http.StatusOK) // a retry
	taken := fields(t, send(create, "/api/schedules", `{"name": "nightly-report", "cron": "0 4 * * *", "kind": "report"}`, http.StatusConflict))
	if s, _ := taken["schedule"].(map[string]any); s["cron"] != "0 3 * * *" {
		t.Errorf("409 of a taken name: %v, want the schedule that holds it", taken)
	}
	bad(create, "/api/schedules", `{"cron": "@daily", "kind": "report"}`)
	bad(create, "/api/schedules", `{"name": "n", "kind": "report"}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily"}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "", "kind": "report"}`)
	bad(create, "/api/schedules", `{"name": "a\nb", "cron": "@daily", "kind": "report"}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "lock": "c1\u0085"}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "task_data": []}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "priority": 40000}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "max_attempts": 0}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "ttl_seconds": 3601}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "unique": "yes"}`)
	bad(create, "/api/schedules", `{"name": "n", "cron": "@daily", "kind": "report", "zone": null}`)
	for _, cron := range []string{"61 * * * *", "* * * * * *", "@every 500ms", "0 0 31 2 *", "CRON_TZ=Europe/Berlin 0 3 * * *"} {
		refused(create, "/api/schedules", fmt.Sprintf(`{"name": "n", "cron": %q, "kind": "report"}`, cron))
	}
	refused(create, "/api/schedules", `{"name": "n", "cron": "@daily", "zone": "Mars/Olympus", "kind": "report"}`)
	refused(create, "/api/schedules", `{"name": "n", "cron": "@daily", "zone": "Local", "kind": "report"}`)
	send(get, "/api/schedules/n", "", http.StatusNotFound) // none of them made it

	const hourly = "/api/schedules/hourly-cleanup"
	send(replace, hourly, `{"cron": "@hourly", "kind": "cleanup"}`, http.StatusCreated)
	send(replace, hourly, `{"name": "hourly-cleanup", "cron": "@every 90s", "kind": "cleanup", "zone": "UTC"}`, http.StatusOK)
	bad(replace, hourly, `{"cron": "@hourly"}`)
	bad(replace, "/api/schedules/a%0Ab", `{"cron": "@hourly", "kind": "cleanup"}`)
	refused(replace, hourly, `{"name": "other", "cron": "@hourly", "kind": "cleanup"}`)
	refused(replace, hourly, `{"cron": "@every 0s", "kind": "cleanup"}`)

	send(get, "/api/schedules/nightly-report", "", http.StatusOK)
	send(get, "/api/schedules/nobody", "", http.StatusNotFound)
	bad(get, "/api/schedules/a%0Ab", "")
	bad(get, "/api/schedules/"+strings.Repeat("n", 256), "")
	send(list, "/api/schedules", "", http.StatusOK)
	if page := send(list, "/api/schedules?limit=1&after_name=hourly-cleanup", "", http.StatusOK); !strings.Contains(string(page.body), `"nightly-report"`) {
		t.Errorf("GET /api/schedules after hourly-cleanup: %s, want nightly-report", page)
	}
	bad(list, "/api/schedules?limit=10001", "")
	bad(list, "/api/schedules?after_name=a%0A", "")

	// A task of a lock: its claim takes the lock's lease under the task's
	// fence (another holder is refused it), its cancellation releases it.
	const createTask, claim = "POST /api/tasks", "POST /api/tasks/next"
	bad(createTask, "/api/tasks", `{"task_data": {}, "lock": ""}`)
	bad(createTask, "/api/tasks", `{"task_data": {}, "lock": "a\tb"}`)
	gated := fields(t, send(createTask, "/api/tasks", `{"kind": "reindex", "queue": "gated", "lock": "db:reports", "task_data": {}}`, http.StatusCreated))
	running := fields(t, send(claim, "/api/tasks/next", `{"processor": "p5", "kinds": ["reindex"], "queues": ["gated"]}`, http.StatusOK))
	if running["id"] != gated["id"] || running["lock"] != "db:reports" {
		t.Fatalf("claimed %v with lock %v; want the task %v of the lock db:reports", running["id"], running["lock"], gated["id"])
	}
	held := fields(t, send("POST /api/leases", "/api/leases", `{"resource": "db:reports", "holder": "a-script"}`, http.StatusConflict))
	if l, _ := held["lease"].(map[string]any); l["holder"] != "p5" || l["fence"] != running["fence"] {
		t.Errorf("the lock's lease: %v; want the task's processor p5 and fence %v", held["lease"], running["fence"])
	}
	taskPath := fmt.Sprintf("/api/tasks/%v", gated["id"])
	send("POST /api/tasks/{id}/cancel", taskPath+"/cancel", `{"reason": "not tonight"}`, http.StatusAccepted)
	send("POST /api/leases", "/api/leases", `{"resource": "db:reports", "holder": "a-script"}`, http.StatusCreated)

	// What the scheduler writes when it makes a tick a task (no scheduler
	// runs here): the task names its schedule and tick, the schedule its
	// last task, whose outcome the schedule then shows.
	if _, err := b.db.Pool.Exec(t.Context(), `UPDATE tasks SET schedule = 'nightly-report', schedule_tick = scheduled_at WHERE id = $1`, gated["id"].(json.Number).String()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(t.Context(), `UPDATE schedules SET last_task_id = $1, last_tick_at = now() WHERE name = 'nightly-report'`, gated["id"].(json.Number).String()); err != nil {
		t.Fatal(err)
	}
	if made := fields(t, send("GET /api/tasks/{id}", taskPath, "", http.StatusOK)); made["schedule"] != "nightly-report" || made["schedule_tick"] == nil {
		t.Errorf("the tick's task: schedule %v, schedule_tick %v; want nightly-report and its tick", made["schedule"], made["schedule_tick"])
	}
	s := fields(t, send(get, "/api/schedules/nightly-report", "", http.StatusOK))
	if last, _ := s["last_task"].(map[string]any); last["id"] != gated["id"] || last["state"] != "cancelled" || last["last_error"] != "not tonight" {
		t.Errorf("last_task %v; want the cancelled task %v", s["last_task"], gated["id"])
	}
	send(list, "/api/schedules", "", http.StatusOK)

	send(remove, hourly, "", http.StatusOK)
	send(remove, hourly, "", http.StatusNotFound)
	bad(remove, "/api/schedules/a%0Ab", "")
}

// conformOthers: generator, instances, session, health, metrics and the page.
func conformOthers(c *conformance, b bundle) {
	send := func(op, path, body string, want int) response {
		c.t.Helper()
		return c.send(b, exchange{op: op, path: path, body: body, want: want})
	}
	send("GET /api/generator", "/api/generator", "", http.StatusOK)
	send("POST /api/generator/start", "/api/generator/start", "", http.StatusAccepted)
	send("GET /api/generator", "/api/generator", "", http.StatusOK)
	send("POST /api/generator/stop", "/api/generator/stop", "", http.StatusAccepted)
	if list := send("GET /api/instances", "/api/instances", "", http.StatusOK); !strings.Contains(string(list.body), "replica-x") {
		c.t.Errorf("GET /api/instances: %s, want replica-x, which holds its instance lease", list)
	}
	send("POST /api/session", "/api/session", `{}`, http.StatusOK) // no token to sign in to: open
	send("GET /api/session", "/api/session", "", http.StatusOK)
	send("DELETE /api/session", "/api/session", "", http.StatusNoContent)
	c.send(b, exchange{op: "POST /api/session", path: "/api/session", body: `{"password": "x"}`, invalid: true, want: http.StatusBadRequest})
	send("GET /healthz", "/healthz", "", http.StatusOK)
	send("GET /readyz", "/readyz", "", http.StatusOK)
	send("GET /metrics", "/metrics", "", http.StatusOK)
	send("GET /", "/", "", http.StatusOK)
	send("GET /static/{file}", "/static/app.js", "", http.StatusOK)
	send("GET /static/{file}", "/static/style.css", "", http.StatusOK)
	send("GET /static/{file}", "/static/nothing.js", "", http.StatusNotFound)
	// A range past the end, as a download resumed against a newer binary asks.
	beyond := []string{"Range", "bytes=100000000-"}
	c.send(b, exchange{op: "GET /", path: "/", header: beyond, want: http.StatusRequestedRangeNotSatisfiable})
	c.send(b, exchange{op: "GET /static/{file}", path: "/static/app.js", header: beyond, want: http.StatusRequestedRangeNotSatisfiable})
}

// conformBadRequests: for every operation, what the server refuses before
// it looks at the request (a method the path does not have, a body over
// 1 MiB) and the bad input every operation of a kind refuses (an unknown
// field, an id of 0, a limit of 0); and a path the document does not have.
func conformBadRequests(c *conformance, b bundle) {
	t := c.t
	for _, path := range slices.Sorted(maps.Keys(c.doc.methods)) {
		documented := c.doc.methods[path]
		concrete := c.doc.example(t, documented[0]+" "+path).path
		allow := slices.Clone(documented)
		if slices.Contains(allow, "GET") {
			allow = append(allow, "HEAD")
		}
		slices.Sort(allow)
		for _, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH"} {
			if slices.Contains(documented, m) {
				continue
			}
			r := b.do(t, m, concrete, "")
			what := m + " " + concrete
			if r.status != http.StatusMethodNotAllowed {
				t.Errorf("%s: got %s, want 405 (the document has only %v)", what, r, documented)
				continue
			}
			c.checkComponent(what, "MethodNotAllowed", r)
			got := strings.Split(r.header.Get("Allow"), ", ")
			slices.Sort(got)
			if !slices.Equal(got, allow) {
				t.Errorf("%s: Allow %q, want the document's methods %v", what, r.header.Get("Allow"), allow)
			}
		}
	}
	r := b.do(t, "GET", "/api/nothing", "")
	if r.status != http.StatusNotFound {
		t.Errorf("GET /api/nothing: got %s, want 404", r)
	}
	c.checkComponent("GET /api/nothing", "NotFound", r)

	big := `{"resource": "` + strings.Repeat("x", 1<<20) + `"}`
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		op := c.doc.ops[key]
		responses := op["responses"].(map[string]any)
		x := c.doc.example(t, key)
		if _, ok := responses["413"]; ok {
			c.send(b, exchange{op: key, path: x.path, body: big, unchecked: true, want: http.StatusRequestEntityTooLarge})
		}
		if _, ok := responses["400"]; !ok {
			continue
		}
		if schema, _ := c.doc.bodySchema(t, op); schema != nil {
			// The example with one field more: the schema must be closed.
			c.send(b, exchange{op: key, path: x.path, body: withField(t, x.body, "unknown_field", true), invalid: true, want: http.StatusBadRequest})
		}
		for _, p := range c.doc.parameters(t, op) {
			name := p["name"].(string)
			switch {
			case p["in"] == "path" && p["schema"].(map[string]any)["type"] == "integer":
				path := strings.Replace(x.path, "/"+fmt.Sprint(p["example"]), "/0", 1)
				c.send(b, exchange{op: key, path: path, body: x.body, invalid: true, want: http.StatusBadRequest})
			case p["in"] == "query" && name == "limit":
				c.send(b, exchange{op: key, path: x.path + "?limit=0", invalid: true, want: http.StatusBadRequest})
			}
		}
	}
}

// withField returns the JSON object body with one more field.
func withField(t *testing.T, body, name string, value any) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	m[name] = value
	return jsonBody(t, m)
}

// conformToken: with --api-token, every operation the document secures
// answers 401 without the token or with a wrong one; each change the
// document says another site's page may not make is refused (403), and
// each read a token without the read scope may not make.
func conformToken(c *conformance, db pgtest.DB) {
	t := c.t
	const token = "s3cret-of-16-bytes" // the example of POST /api/session
	const writer = "a-writer-token-of-16-bytes"
	b := serve(t, db, testDeps(db, withToken(token), withSchedules(db),
		withTokens(t, `[{"name": "writer", "token": "`+writer+`", "scopes": ["lease"]}]`)))
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		x := c.doc.example(t, key)
		if !c.doc.secured(c.doc.ops[key]) {
			c.send(b, x)
			continue
		}
		x.want = http.StatusUnauthorized
		c.send(b, x)
		x.header = []string{"Authorization", "Bearer not-" + token}
		c.send(b, x)
	}
	c.send(b, exchange{op: "GET /api/leases", path: "/api/leases", header: []string{"Authorization", "Bearer " + token}, want: http.StatusOK})
	c.send(b, exchange{op: "POST /api/session", path: "/api/session", body: `{"token": "wrong"}`, want: http.StatusUnauthorized})

	signIn := c.send(b, exchange{op: "POST /api/session", path: "/api/session", body: `{"token": "` + token + `"}`, want: http.StatusOK})
	cookies := (&http.Response{Header: signIn.header}).Cookies()
	if len(cookies) != 1 {
		t.Fatalf("POST /api/session: cookies %v, want one", cookies)
	}
	cookie := cookies[0].Name + "=" + cookies[0].Value
	c.send(b, exchange{op: "GET /api/leases", path: "/api/leases", header: []string{"Cookie", cookie}, want: http.StatusOK})
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		if _, ok := c.doc.ops[key]["responses"].(map[string]any)["403"]; !ok || key == "GET /ws" {
			continue // /ws's 403 is its own (the upgrade's origin), driven with the websocket
		}
		x := c.doc.example(t, key)
		if strings.HasPrefix(key, "GET ") {
			x.header, x.want = []string{"Authorization", "Bearer " + writer}, http.StatusForbidden
		} else {
			x.header, x.want = []string{"Cookie", cookie, "Origin", "http://elsewhere.example"}, http.StatusForbidden
		}
		c.send(b, x)
	}
}

// conformBrowsers: every operation the document says refuses a body that
// is not JSON answers 415 to one sent as text/plain, and every one it says
// answers only to allowed names answers 421 to another Host.
func conformBrowsers(c *conformance, db pgtest.DB) {
	t := c.t
	b := serve(t, db, testDeps(db, withSchedules(db), withAllowedHosts("localhost", "127.0.0.1")))
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		responses := c.doc.ops[key]["responses"].(map[string]any)
		x := c.doc.example(t, key)
		if _, ok := responses["415"]; ok {
			y := x
			y.header, y.want, y.unchecked = []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType, true
			c.send(b, y)
		}
		if _, ok := responses["421"]; ok {
			y := x
			y.header, y.want = []string{"Host", "evil.example:8080"}, http.StatusMisdirectedRequest
			c.send(b, y)
		}
	}
}

// conformRateLimit: once a client's burst is spent, every operation the
// document says is limited answers 429 with Retry-After, and the others
// answer as ever.
func conformRateLimit(c *conformance, db pgtest.DB) {
	b := serve(c.t, db, testDeps(db, withRateLimit(0.001, 1), withSchedules(db)))
	c.send(b, exchange{op: "GET /api/tasks/stats", path: "/api/tasks/stats", want: http.StatusOK})
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		x := c.doc.example(c.t, key)
		if _, limited := c.doc.ops[key]["responses"].(map[string]any)["429"]; limited {
			x.want = http.StatusTooManyRequests
		}
		c.send(b, x)
	}
}

// conformDatabaseDown: with the database out of reach, every operation
// that documents 503 answers it (those that need the database with
// Retry-After) and the others answer as ever.
func conformDatabaseDown(c *conformance) {
	t := c.t
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	down := pgtest.DB{Pool: pool}
	b := serve(t, down, testDeps(down, withSchedules(down)))
	for _, key := range slices.Sorted(maps.Keys(c.doc.ops)) {
		if key == "GET /ws" {
			continue // its 503 is the hub's shutting down, driven with the websocket
		}
		x := c.doc.example(t, key)
		if _, documented := c.doc.ops[key]["responses"].(map[string]any)["503"]; documented {
			x.want = http.StatusServiceUnavailable
		}
		c.send(b, x)
	}
}
