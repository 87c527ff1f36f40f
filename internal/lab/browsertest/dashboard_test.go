package browsertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// stepTimeout bounds one wait for the page; the whole test has testTimeout.
const (
	stepTimeout = 30 * time.Second
	testTimeout = 4 * time.Minute
)

// TestDashboard opens the dashboard of a real replica in headless Chromium
// and watches it follow changes made through the API.
func TestDashboard(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	r := startReplica(t, testkit.Leasehold(t), db.URL)
	ctx := newBrowser(t, chromium)

	step(ctx, t, "the page connects to /ws",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		waitTrue(`document.getElementById("connection").textContent === "connected"`))

	// A task of a kind no worker of the replica runs waits: the panel shows
	// its queue and kind, highlighted once it has waited over a minute (it
	// was due five minutes ago).
	r.mustCall(t, "POST", "/api/tasks", map[string]any{"task_data": map[string]any{"report": "q3"},
		"kind": "report.render", "queue": "reports",
		"scheduled_at": time.Now().Add(-5 * time.Minute).UTC().Format(time.RFC3339Nano)}, http.StatusCreated)
	const unworked = `#pending-kinds tr[data-queue="reports"][data-kind="report.render"]`
	step(ctx, t, "the unworked kind in the pending-by-kind panel, highlighted",
		chromedp.WaitVisible(chromedp.CSS(unworked+`.long`)),
		waitTrue(`document.querySelector('`+unworked+` td:nth-child(3)').textContent === "1"`),
		waitTrue(`document.getElementById("pending-note").textContent !== ""`))

	// A lease acquired through the API appears; released, it changes state.
	r.mustCall(t, "POST", "/api/leases", map[string]any{"resource": "report:nightly", "holder": "alice", "ttl_seconds": 60}, http.StatusCreated)
	step(ctx, t, "the acquired lease's row",
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="report:nightly"].state-active`)))
	holder, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`tr[data-resource="report:nightly"] td:nth-child(2)`)))
	if err != nil || strings.TrimSpace(holder) != "alice" {
		t.Errorf("holder cell: got %q (%v), want %q", holder, err, "alice")
	}
	r.mustCall(t, "DELETE", "/api/leases/release", map[string]any{"resource": "report:nightly", "holder": "alice"}, http.StatusOK)
	step(ctx, t, "the released lease's row",
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="report:nightly"].state-released`)))

	// A short lease is marked expired when the reaper announces it.
	r.mustCall(t, "POST", "/api/leases", map[string]any{"resource": "cron:short", "holder": "bob", "ttl_seconds": 1}, http.StatusCreated)
	step(ctx, t, "the short lease's row",
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="cron:short"]`)))
	step(ctx, t, "the short lease marked expired",
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="cron:short"].state-expired`)))
	step(ctx, t, "the expiry in the event feed",
		waitTrue(`[...document.querySelectorAll("#events li.expired")].some(li => li.textContent.includes("cron:short"))`))

	// The generator, started through the API, is stopped with the button.
	r.mustCall(t, "POST", "/api/generator/start", nil, http.StatusAccepted)
	step(ctx, t, "the generator shown as started",
		waitTrue(`document.getElementById("generator-status").textContent === "STARTED"`))
	step(ctx, t, `a running task of kind "sleep" in queue "default"`,
		waitTrue(`[...document.querySelectorAll("#running tr")].some(tr =>
			tr.querySelector(".task-kind")?.textContent === "sleep" && tr.querySelector(".task-queue")?.textContent === "default")`))

	measureCommitToDOM(ctx, t, r, 5)

	// Some work done, so that the charts in the screenshot have a shape.
	step(ctx, t, "tasks done", waitTrue(`Number(document.getElementById("tasks-done").textContent.replace(/\D/g, "")) > 0`))
	step(ctx, t, "the Stop button",
		chromedp.WaitEnabled(chromedp.CSS(`#generator-stop`)),
		chromedp.Click(chromedp.CSS(`#generator-stop`)))
	step(ctx, t, "the generator shown as stopped",
		waitTrue(`document.getElementById("generator-status").textContent === "STOPPED"`))
	var g struct{ Status string }
	if err := json.Unmarshal(r.mustCall(t, "GET", "/api/generator", nil, http.StatusOK), &g); err != nil || g.Status != "STOPPED" {
		t.Errorf("GET /api/generator after Stop: got %q (%v), want STOPPED", g.Status, err)
	}

	saveScreenshot(ctx, t, "dashboard.png")
}

// TestDashboardSignIn opens the dashboard of a replica that wants an API
// token: the page offers its sign-in box, refuses a wrong token, and
// connects once the right one has set the session cookie.
func TestDashboardSignIn(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	const token = "correct horse battery staple"
	r := startReplica(t, testkit.Leasehold(t), db.URL, "--api-token", token, "--roles", "api")
	ctx := newBrowser(t, chromium)

	r.token = token
	step(ctx, t, "the sign-in box",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)),
		waitTrue(`document.getElementById("connection").textContent === "disconnected"`))
	// The tasks view, without the token, says what the API said.
	step(ctx, t, "the tasks view's 401 before signing in",
		chromedp.Click(chromedp.CSS(`#nav-tasks`)),
		chromedp.WaitVisible(chromedp.CSS(`#tasks-view`)),
		waitTrue(`document.getElementById("tasks-error").textContent.includes("missing or wrong API token")`),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)))
	step(ctx, t, "a wrong token refused",
		chromedp.SendKeys(chromedp.CSS(`#token`), "guess"),
		chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)),
		waitTrue(`document.getElementById("signin-error").textContent !== ""`))
	step(ctx, t, "the right token accepted",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("token").value = ""`),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)),
		chromedp.WaitNotVisible(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		waitTrue(`document.getElementById("tasks-error").textContent === ""`),
		chromedp.WaitVisible(chromedp.CSS(`#task-rows-empty`)),
		chromedp.Click(chromedp.CSS(`#nav-overview`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="leasehold:instance:browser-test"]`)))

	// A button whose request goes without the token (the session cookie
	// gone) shows the 401's message and changes nothing.
	pending := createTask(t, r, map[string]any{"task_data": map[string]any{}, "kind": "report.render"})
	row := fmt.Sprintf(`#task-rows tr[data-task-id="%d"]`, pending.ID)
	step(ctx, t, "the pending task in the tasks view",
		chromedp.Click(chromedp.CSS(`#nav-tasks`)),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="pending"] button.task-cancel`)))
	step(ctx, t, "the session cookie deleted", func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, network.DeleteCookies, network.DeleteCookiesParams{Name: "leasehold_session", URL: r.url + "/"})
		return chromedp.Void{}, err
	})
	// A change makes the view read its page again, refused: the sign-in box
	// shows (before the buttons are clicked, so that it moves none of them
	// while they are).
	createTask(t, r, map[string]any{"task_data": map[string]any{}, "kind": "report.render"})
	step(ctx, t, "the list's 401 once the cookie is gone",
		waitTrue(`document.getElementById("tasks-error").textContent.includes("Could not list the tasks: missing or wrong API token")`),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)))
	step(ctx, t, "Cancel refused with the 401's message",
		chromedp.Click(chromedp.CSS(row+` button.task-cancel`)),
		chromedp.Click(chromedp.CSS(row+` button.confirm-yes`)),
		waitTrue(`document.getElementById("tasks-error").textContent.includes("Could not cancel task `+fmt.Sprint(pending.ID)+`: missing or wrong API token")`),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="pending"] button.task-cancel`)))
	if got := getTask(t, r, pending.ID); got.State != "pending" {
		t.Errorf("task %d after the refused cancel: got %s, want pending", pending.ID, got.State)
	}
}

// TestDashboardReadOnly signs the dashboard in with a token of the read
// scope alone: the page shows everything and offers none of the controls
// that token may not use (the generator's switch, cancel and retry, a
// queue's pause and resume), and says who it is signed in as; signing out
// brings the sign-in box back.
func TestDashboardReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	const reader, admin = "a-read-only-token-of-the-page", "the-admin-token-of-the-page"
	file := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(file, []byte(`[{"name": "viewer", "token": "`+reader+`", "scopes": ["read"]},
		{"name": "ops", "token": "`+admin+`", "scopes": ["admin"]}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, testkit.Leasehold(t), db.URL, "--tokens-file", file, "--roles", "api")
	r.token = admin
	pending := createTask(t, r, map[string]any{"task_data": map[string]any{}, "kind": "report.render"})
	r.mustCall(t, "PUT", "/api/queues/reports/pause", map[string]any{"reason": "audit"}, http.StatusOK)
	ctx := newBrowser(t, chromium)
	step(ctx, t, "signed in with the read token",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), reader),
		chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)),
		chromedp.WaitNotVisible(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		waitTrue(`document.getElementById("who").textContent === "signed in as viewer"`),
		waitTrue(`getComputedStyle(document.getElementById("generator-start")).display === "none"`))
	step(ctx, t, "the paused queue shown without Resume, and no pause form",
		chromedp.WaitVisible(chromedp.CSS(`#queues tr[data-queue="reports"][data-state="paused"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#queues tr[data-queue="default"][data-state="active"]`)),
		waitTrue(`document.querySelectorAll("#queues button").length === 0`),
		waitTrue(`getComputedStyle(document.getElementById("pause-form")).display === "none"`))
	row := fmt.Sprintf(`#task-rows tr[data-task-id="%d"]`, pending.ID)
	step(ctx, t, "the task listed without its cancel button",
		chromedp.Click(chromedp.CSS(`#nav-tasks`)),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="pending"]`)),
		waitTrue(`((bs) => bs.length > 0 && bs.every(b => getComputedStyle(b).display === "none"))([...document.querySelectorAll('`+row+` button.task-cancel')])`))
	step(ctx, t, "signed out",
		chromedp.Click(chromedp.CSS(`#signout`)),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)))
}

// TestDashboardTasks opens the tasks view of a replica with one task
// running (claimed over REST by a worker of the test's own, under a lease
// that outlasts the test) and one dead (its only attempt failed), cancels
// the one and retries the other with the page's buttons and their inline
// confirmations, and watches both rows (and the open detail) change as
// the stream reports the changes, without a reload. The detail shows each
// task's attempts; the pending-by-kind panel leads to the view filtered by
// kind and queue.
func TestDashboardTasks(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	r := startReplica(t, testkit.Leasehold(t), db.URL)
	ctx := newBrowser(t, chromium)

	// A kind the replica's workers do not run: only the test claims it.
	const kind, queue, failure = "report.render", "reports", "disk full on /var/spool"
	running := createTask(t, r, map[string]any{"task_data": map[string]any{"report": "q3"}, "kind": kind, "queue": queue, "ttl_seconds": 3600})
	if got := claimTask(t, r, "test-worker/1", kind); got.ID != running.ID {
		t.Fatalf("claim: got task %d, want %d", got.ID, running.ID)
	}
	dead := createTask(t, r, map[string]any{"task_data": map[string]any{"report": "q4"}, "kind": kind, "queue": queue, "max_attempts": 1})
	failed := claimTask(t, r, "test-worker/2", kind)
	if failed.ID != dead.ID {
		t.Fatalf("claim: got task %d, want %d", failed.ID, dead.ID)
	}
	var afterFail restTask
	mustDecode(t, r.mustCall(t, "PUT", fmt.Sprintf("/api/tasks/%d/fail", dead.ID),
		map[string]any{"processor": "test-worker/2", "fence": failed.Fence, "error": failure}, http.StatusAccepted), &afterFail)
	if afterFail.State != "dead" {
		t.Fatalf("after its only attempt failed: task %d is %s, want dead", dead.ID, afterFail.State)
	}
	runRow := fmt.Sprintf(`#task-rows tr[data-task-id="%d"]`, running.ID)
	deadRow := fmt.Sprintf(`#task-rows tr[data-task-id="%d"]`, dead.ID)

	step(ctx, t, "the tasks view with the running and the dead task",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		chromedp.Evaluate[chromedp.Void](`window.__sameDocument = true`),
		chromedp.Click(chromedp.CSS(`#nav-tasks`)),
		chromedp.WaitVisible(chromedp.CSS(runRow+`[data-state="running"] button.task-cancel`)),
		chromedp.WaitVisible(chromedp.CSS(deadRow+`[data-state="dead"] button.task-retry`)))
	if p := step1(ctx, t, "the running task's processor", chromedp.Text(chromedp.CSS(runRow+` td.task-processor`))); strings.TrimSpace(p) != "test-worker/1" {
		t.Errorf("the running task's processor cell: got %q, want test-worker/1", p)
	}

	// The running task's detail: its attempt is the task's own, running.
	runDetail := fmt.Sprintf(`#task-detail-body[data-task-id="%d"]`, running.ID)
	step(ctx, t, "the running task's detail with its running attempt",
		chromedp.Click(chromedp.CSS(runRow+` td.task-kind`)),
		chromedp.WaitVisible(chromedp.CSS(runDetail+`[data-state="running"]`)),
		waitTrue(`document.querySelector('#td-attempts li[data-outcome="running"]')?.textContent.includes("test-worker/1") &&
			document.querySelectorAll("#td-attempts li").length === 1`))

	const reason = "the quarter was re-run by hand"
	step(ctx, t, "Cancel on the running task, confirmed",
		chromedp.Click(chromedp.CSS(runRow+` button.task-cancel`)),
		chromedp.WaitVisible(chromedp.CSS(runRow+` input.reason`)),
		chromedp.SendKeys(chromedp.CSS(runRow+` input.reason`), reason),
		chromedp.Click(chromedp.CSS(runRow+` button.confirm-yes`)))
	step(ctx, t, "the running task's row and detail shown cancelled, its attempt with the reason",
		chromedp.WaitVisible(chromedp.CSS(runRow+`[data-state="cancelled"] button.task-retry`)),
		waitTrue(`document.querySelector('`+runRow+` .task-state').textContent === "cancelled"`),
		chromedp.WaitVisible(chromedp.CSS(runDetail+`[data-state="cancelled"]`)),
		waitTrue(fmt.Sprintf(`document.querySelector('#td-attempts li[data-outcome="cancelled"] pre.attempt-error')?.textContent === %q &&
			document.querySelectorAll("#td-attempts li").length === 1`, reason)))
	if got := getTask(t, r, running.ID); got.State != "cancelled" || got.LastError == nil || *got.LastError != reason {
		t.Errorf("task %d after Cancel: %+v, want cancelled with last_error %q", running.ID, got, reason)
	}

	step(ctx, t, "Retry on the dead task, confirmed",
		chromedp.Click(chromedp.CSS(deadRow+` button.task-retry`)),
		chromedp.Click(chromedp.CSS(deadRow+` button.confirm-yes`)))
	step(ctx, t, "the dead task's row shown back in the queue",
		waitTrue(`["pending", "running"].includes(document.querySelector('`+deadRow+`')?.dataset.state)`))
	if got := getTask(t, r, dead.ID); got.State != "pending" && got.State != "running" {
		t.Errorf("task %d after Retry: %s, want pending or running", dead.ID, got.State)
	}
	step(ctx, t, "no reload", waitTrue(`window.__sameDocument === true`))

	// The retried task's detail: its failed attempt, with its error.
	failedAttempt := `#td-attempts li[data-outcome="failed"]`
	step(ctx, t, "the retried task's detail with its failed attempt",
		chromedp.Click(chromedp.CSS(deadRow+` td.task-kind`)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#task-detail-body[data-task-id="%d"]`, dead.ID))),
		chromedp.WaitVisible(chromedp.CSS(failedAttempt)),
		waitTrue(fmt.Sprintf(`(() => { const li = document.querySelector(%q);
			return li.querySelector("pre.attempt-error")?.textContent === %q && li.textContent.includes("test-worker/2") && li.textContent.includes("fence %d"); })()`,
			failedAttempt, failure, failed.Fence)))
	saveScreenshot(ctx, t, "dashboard-tasks.png")

	// The pending-by-kind panel leads to the kind's pending tasks.
	pendingRow := `#pending-kinds tr[data-queue="reports"][data-kind="report.render"]`
	step(ctx, t, "the pending-by-kind row of the retried task's kind",
		chromedp.Click(chromedp.CSS(`#nav-overview`)),
		chromedp.WaitVisible(chromedp.CSS(pendingRow)),
		chromedp.Click(chromedp.CSS(pendingRow+` td:nth-child(2) a`)),
		chromedp.WaitVisible(chromedp.CSS(`#tasks-view`)),
		waitTrue(`document.getElementById("tf-kind").value === "report.render" && document.getElementById("tf-queue").value === "reports" &&
			document.getElementById("tf-state").value === "pending"`),
		waitTrue(fmt.Sprintf(`(() => { const rows = [...document.querySelectorAll("#task-rows tr")];
			return rows.length === 1 && rows[0].dataset.taskId === "%d"; })()`, dead.ID)))
}

// TestDashboardSchedules opens the schedules view of a replica that runs
// the scheduler, with two schedules made through the API that tick every
// second: one whose tasks do their work, holding a lock, and one whose
// tasks fail at once. The last task cell follows each tick as the stream
// reports it, without a reload; the outcomes show the state and the error;
// the last task's detail shows its lock and its schedule; and Remove, with
// its inline confirmation, takes the schedule out of the page and the
// database.
func TestDashboardSchedules(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	r := startReplica(t, testkit.Leasehold(t), db.URL)
	ctx := newBrowser(t, chromium)

	// "sleep" is the kind the replica's own workers run.
	const name, lock, broken = "report:every-second", "printer:3", "broken-every-second"
	r.mustCall(t, "POST", "/api/schedules", map[string]any{"name": name, "cron": "@every 1s", "kind": "sleep",
		"task_data": map[string]any{"sleep_duration_seconds": 0}, "lock": lock}, http.StatusCreated)
	r.mustCall(t, "POST", "/api/schedules", map[string]any{"name": broken, "cron": "@every 1s", "kind": "sleep",
		"task_data": map[string]any{"nap": 1}, "max_attempts": 1}, http.StatusCreated)
	row := fmt.Sprintf(`#schedule-rows tr[data-schedule=%q]`, name)
	brokenRow := fmt.Sprintf(`#schedule-rows tr[data-schedule=%q]`, broken)
	lastTask := fmt.Sprintf(`document.querySelector(%q)?.dataset.taskId`, row+` td.sched-last-task`)

	step(ctx, t, "the schedules view with both schedules",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		chromedp.Evaluate[chromedp.Void](`window.__sameDocument = true`),
		chromedp.Click(chromedp.CSS(`#nav-schedules`)),
		chromedp.WaitVisible(chromedp.CSS(`#schedules-view`)),
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(brokenRow)),
		waitTrue(fmt.Sprintf(`(() => { const tr = document.querySelector(%q);
			return tr.querySelector(".sched-cron").textContent.startsWith("@every 1s · UTC") && tr.querySelector(".sched-kind").textContent === "sleep" &&
				tr.querySelector(".sched-lock").textContent === %q && tr.querySelector(".sched-next").textContent !== ""; })()`, row, lock)))

	// The last task cell follows the ticks: a task, then a later one.
	step(ctx, t, "a first tick's task in the last task cell", waitTrue(lastTask+` > 0`))
	first := step1(ctx, t, "the last task's id", chromedp.Evaluate[string](lastTask))
	step(ctx, t, "the next tick's task in the last task cell, without a reload",
		waitTrue(fmt.Sprintf(`Number(%s) > %s`, lastTask, first)),
		waitTrue(`window.__sameDocument === true`))
	// What the page showed is the schedule's last task, or an earlier one.
	shown := mustInt(t, step1(ctx, t, "the last task's id", chromedp.Evaluate[string](lastTask)))
	var got struct {
		LastTask *struct {
			ID int64 `json:"id"`
		} `json:"last_task"`
	}
	mustDecode(t, r.mustCall(t, "GET", "/api/schedules/"+url.PathEscape(name), nil, http.StatusOK), &got)
	if got.LastTask == nil || got.LastTask.ID < shown {
		t.Errorf("the API's last task %+v, after the page showed task %d", got.LastTask, shown)
	}

	// The outcomes: a task done, and the broken schedule's dead with its error.
	step(ctx, t, "the outcome of a task that did its work",
		waitTrue(fmt.Sprintf(`document.querySelector(%q)?.dataset.state === "done"`, row+` td.sched-outcome`)))
	step(ctx, t, "the broken schedule's outcome, dead with its error",
		waitTrue(fmt.Sprintf(`(() => { const td = document.querySelector(%q);
			return td?.dataset.state === "dead" && td.querySelector(".sched-error")?.textContent.includes("sleep_duration_seconds"); })()`, brokenRow+` td.sched-outcome`)))
	saveScreenshot(ctx, t, "dashboard-schedules.png")

	// The last task's detail in the tasks view: its lock and its schedule,
	// which leads back to the schedule's row. The row and the detail are
	// redrawn as the schedules tick, their links with them: clickLive clicks
	// the link that is there.
	step(ctx, t, "the last task's detail with its lock and its schedule",
		clickLive(row+` td.sched-last-task a`),
		chromedp.WaitVisible(chromedp.CSS(`#tasks-view`)),
		chromedp.WaitVisible(chromedp.CSS(`#task-detail-body`)),
		waitTrue(fmt.Sprintf(`(() => { const fact = (k) => document.querySelector('#td-facts dd[data-fact="' + k + '"]')?.textContent;
			return fact("lock") === %q && fact("schedule") === %q && /\d/.test(fact("schedule tick") ?? ""); })()`, lock, name)),
		clickLive(`#td-facts dd[data-fact="schedule"] a`),
		chromedp.WaitVisible(chromedp.CSS(`#schedules-view`)),
		chromedp.WaitVisible(chromedp.CSS(row+`.selected`)))

	step(ctx, t, "Remove on the schedule, confirmed",
		clickLive(row+` button.schedule-remove`),
		chromedp.WaitVisible(chromedp.CSS(row+` button.confirm-yes`)),
		clickLive(row+` button.confirm-yes`))
	step(ctx, t, "the removed schedule's row gone, the other's still there",
		waitTrue(fmt.Sprintf(`document.querySelector(%q) === null && document.querySelector(%q) !== null`, row, brokenRow)),
		waitTrue(`document.getElementById("schedules-error").textContent === ""`),
		waitTrue(`window.__sameDocument === true`))
	r.mustCall(t, "GET", "/api/schedules/"+url.PathEscape(name), nil, http.StatusNotFound)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not a whole number: %v", s, err)
	}
	return n
}

// restTask is the part of a task the browser tests read.
type restTask struct {
	ID        int64   `json:"id"`
	State     string  `json:"state"`
	Fence     int64   `json:"fence"`
	LastError *string `json:"last_error"`
}

func mustDecode(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
}

func createTask(t *testing.T, r *replica, body map[string]any) restTask {
	t.Helper()
	var tk restTask
	mustDecode(t, r.mustCall(t, "POST", "/api/tasks", body, http.StatusCreated), &tk)
	return tk
}

func claimTask(t *testing.T, r *replica, processor, kind string) restTask {
	t.Helper()
	var tk restTask
	mustDecode(t, r.mustCall(t, "POST", "/api/tasks/next", map[string]any{"processor": processor, "kinds": []string{kind}}, http.StatusOK), &tk)
	return tk
}

func getTask(t *testing.T, r *replica, id int64) restTask {
	t.Helper()
	var tk restTask
	mustDecode(t, r.mustCall(t, "GET", fmt.Sprintf("/api/tasks/%d", id), nil, http.StatusOK), &tk)
	return tk
}

// measureCommitToDOM acquires n leases one after another and logs how long
// each took to appear in the page: from the API's answer (the commit is
// before it) and from the request (the commit is after it), so the true
// figure lies between the two. The page's own clock stamps the DOM change.
func measureCommitToDOM(ctx context.Context, t *testing.T, r *replica, n int) {
	t.Helper()
	step(ctx, t, "the row observer", chromedp.Evaluate[chromedp.Void](`(() => {
		window.__seen = {};
		new MutationObserver((records) => {
			const at = performance.timeOrigin + performance.now();
			for (const rec of records) for (const node of rec.addedNodes) {
				const res = node.dataset && node.dataset.resource;
				if (res && !(res in window.__seen)) window.__seen[res] = at;
			}
		}).observe(document.getElementById("leases"), { childList: true });
	})()`))
	fromResponse := make([]float64, 0, n)
	fromRequest := make([]float64, 0, n)
	for i := range n {
		resource := fmt.Sprintf("latency:%02d", i)
		sent := time.Now()
		r.mustCall(t, "POST", "/api/leases", map[string]any{"resource": resource, "holder": "timer", "ttl_seconds": 300}, http.StatusCreated)
		answered := time.Now()
		seen := step1[float64](ctx, t, "the row of "+resource,
			chromedp.Poll[float64](fmt.Sprintf(`window.__seen[%q]`, resource), chromedp.WithPollingTimeout(stepTimeout)))
		fromResponse = append(fromResponse, seen-msSinceEpoch(answered))
		fromRequest = append(fromRequest, seen-msSinceEpoch(sent))
	}
	t.Logf("lease change → DOM over %d acquisitions: p50 %.1f ms, p99 %.1f ms after the API answered; p50 %.1f ms, p99 %.1f ms after the request was sent",
		n, percentile(fromResponse, 50), percentile(fromResponse, 99), percentile(fromRequest, 50), percentile(fromRequest, 99))
}

func msSinceEpoch(t time.Time) float64 { return float64(t.UnixMicro()) / 1000 }

// percentile is the nearest-rank p-th percentile of xs.
func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := max(0, int(math.Ceil(p/100*float64(len(s))))-1)
	return s[i]
}

// ---- The browser -----------------------------------------------------------

// ensureChromium returns the path of Debian's chromium, installing the
// package when it is missing and the test may (root with apt-get).
func ensureChromium(t *testing.T) string {
	t.Helper()
	const path = "/usr/bin/chromium"
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if os.Geteuid() != 0 {
		t.Skipf("no %s and not root, so the test cannot install it; run: sudo apt-get install -y chromium", path)
	}
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		t.Skipf("no %s and no apt-get to install it with: install Chromium at %s", path, path)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	t.Logf("installing chromium with apt-get (once per machine)")
	// Another test process may hold the dpkg lock (PostgreSQL's install): wait for it.
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=300", "update", "-qq"},
		{"-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq", "--no-install-recommends", "chromium"},
	} {
		cmd := exec.CommandContext(ctx, aptGet, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("apt-get installed chromium but there is no %s: %v", path, err)
	}
	return path
}

// newBrowser starts headless Chromium with a fresh profile and a
// 1280×800 window, and returns a tab's context that ends with the test.
// Uncaught exceptions in the page fail the test.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	ctx, cancelTest := context.WithTimeout(context.Background(), testTimeout)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit, before TempDir goes
		cancelTest()
	})
	var mu sync.Mutex
	var exceptions []string
	if err := chromedp.Listen(tabCtx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			exceptions = append(exceptions, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error()+" at "+e.ExceptionDetails.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range exceptions {
			t.Errorf("uncaught exception in the page: %s", e)
		}
	})
	if err := chromedp.Do(tabCtx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tabCtx
}

// step runs actions that wait on the page, failing the test with what it
// waited for when they do not succeed within stepTimeout.
func step(ctx context.Context, t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		t.Fatalf("waiting for %s: %v\n%s", what, err, pageState(ctx))
	}
}

// pageState describes what the page showed, for a failed step's message.
func pageState(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({
		hash: location.hash,
		connection: document.getElementById("connection")?.textContent,
		signinShown: !document.getElementById("signin")?.hidden,
		tasksError: document.getElementById("tasks-error")?.textContent,
		taskRows: [...document.querySelectorAll("#task-rows tr")].map(tr => tr.dataset.taskId + ":" + tr.dataset.state + ":" + tr.querySelector("td.actions")?.textContent),
		schedulesError: document.getElementById("schedules-error")?.textContent,
		scheduleRows: [...document.querySelectorAll("#schedule-rows tr")].map(tr => tr.dataset.schedule + ":" +
			tr.querySelector("td.sched-last-task")?.dataset.taskId + ":" + tr.querySelector("td.sched-outcome")?.dataset.state + ":" + tr.querySelector("td.actions")?.textContent),
	})`))
	if err != nil {
		return "(the page's state could not be read: " + err.Error() + ")"
	}
	return "the page: " + s
}

// step1 is step for one action with a value.
func step1[T any](ctx context.Context, t *testing.T, what string, action chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(sctx, action)
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return v
}

// waitTrue waits until a JavaScript expression is true in the page.
func waitTrue(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(stepTimeout))
}

// clickLive waits until the first element matching the CSS selector sel is
// shown and is what a pointer at its centre would hit, and clicks it, in one
// turn of the page's event loop. The page redraws parts of itself as the
// stream reports changes; chromedp.Click, which finds a node, then asks for
// its place, then sends the mouse events, fails or clicks its successor when
// the node is replaced between those steps. Here the element clicked is the
// one just found, whatever the page redraws before or after.
func clickLive(sel string) chromedp.Action[chromedp.Void] {
	return waitTrue(fmt.Sprintf(`((el) => {
		if (!el) return false;
		el.scrollIntoView({ block: "nearest", inline: "nearest" });
		const r = el.getBoundingClientRect();
		if (r.width === 0 || r.height === 0) return false;
		const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
		if (!hit || !el.contains(hit)) return false;
		el.click();
		return true;
	})(document.querySelector(%q))`, sel))
}

// saveScreenshot writes the whole page as a PNG to .artifacts/ at the root
// of the repository.
func saveScreenshot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	png := step1(ctx, t, "the screenshot", chromedp.FullScreenshot(100))
	dir := filepath.Join(repoRoot(t), ".artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// ---- The replica -----------------------------------------------------------

// replica is a `leasehold serve` child process.
type replica struct {
	url    string
	client *http.Client
	// token, when set, goes with every mustCall as its Bearer token.
	token string
}

// startReplica runs `leasehold serve` on a free port of 127.0.0.1 with the
// database at dbURL and any further flags in args, and returns once it is
// ready. It stops (SIGTERM) when
// the test ends; its log is printed when the test failed.
func startReplica(t *testing.T, bin, dbURL string, args ...string) *replica {
	t.Helper()
	args = append([]string{"demo", "replica", "--addr", "127.0.0.1:0", "--database-url", dbURL,
		"--instance", "browser-test", "--workers", "4", "--sim-crash-rate", "0", "--sim-spike-rate", "0",
		"--generator-rate", "4", "--generator-sleep", "200ms-1s", "--shutdown-grace", "0s"}, args...)
	cmd := exec.Command(bin, args...)
	// Its configuration is its flags, not whatever LEASEHOLD_* the test runs under.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	addr := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			logs.Write(append(line, '\n'))
			var entry struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(line, &entry) == nil && entry.Message == "serving" {
				select {
				case addr <- entry.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	exited := make(chan error, 1)
	go func() {
		<-copied // Wait closes the pipe: read it all first
		exited <- cmd.Wait()
	}()
	r := &replica{client: &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}}
	t.Cleanup(func() {
		r.client.CloseIdleConnections()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		var err error
		select {
		case err = <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			err = <-exited
		}
		if err != nil {
			t.Errorf("leasehold serve did not stop cleanly on SIGTERM: %v", err)
		}
		if t.Failed() {
			t.Logf("replica log:\n%s", logs.String())
		}
	})
	select {
	case a := <-addr:
		r.url = "http://" + a
	case err := <-exited:
		t.Fatalf("leasehold serve exited before serving: %v\n%s", err, logs.String())
	case <-time.After(time.Minute):
		t.Fatalf("leasehold serve did not start within a minute\n%s", logs.String())
	}
	// Ready: the database answers and the listener (the stream's source) is up.
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := r.client.Get(r.url + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("leasehold serve not ready within a minute (last: %v)\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not waiting out a guess
	}
}

// mustCall sends a JSON request and fails the test unless the answer has
// the status want; it returns the body.
func (r *replica) mustCall(t *testing.T, method, path string, body any, want int) []byte {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	res, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if res.StatusCode != want {
		t.Fatalf("%s %s: got %d %s, want %d", method, path, res.StatusCode, got, want)
	}
	return got
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
