package browsertest

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// restPause is a paused queue as GET /api/queues/paused lists it.
type restPause struct {
	Queue  string  `json:"queue"`
	Until  *string `json:"until"`
	Reason string  `json:"reason"`
}

// pausedQueues reads the paused queues from the API.
func pausedQueues(t *testing.T, r *replica) []restPause {
	t.Helper()
	var ps []restPause
	mustDecode(t, r.mustCall(t, "GET", "/api/queues/paused", nil, http.StatusOK), &ps)
	return ps
}

// pauseOf is queue's pause among ps, and whether it is paused.
func pauseOf(ps []restPause, queue string) (restPause, bool) {
	i := slices.IndexFunc(ps, func(p restPause) bool { return p.Queue == queue })
	if i < 0 {
		return restPause{}, false
	}
	return ps[i], true
}

// TestDashboardFlowControl opens the overview of a replica with a queue
// paused and a key limited (3 slots, 1 start an hour) through the API:
// the queues panel shows the pause with its reason and end, the limited
// keys panel the key's slots held, tasks waiting, rate spent and next
// start. Then the page's own controls resume the queue, pause it again
// with a reason (inline confirmation) and pause another queue from the
// form; each change is in the database (GET /api/queues/paused), and a
// reload shows what the stream's snapshot says.
func TestDashboardFlowControl(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium and a replica; skipped with -short")
	}
	chromium := ensureChromium(t)
	db := pgtest.New(t)
	r := startReplica(t, testkit.Leasehold(t), db.URL)
	ctx := newBrowser(t, chromium)

	// A kind the replica's workers do not run: only the test claims it.
	const key, queue, kind = "imports:acme", "reports", "report.render"
	r.mustCall(t, "PUT", "/api/limits/"+key, map[string]any{"slots": 3}, http.StatusOK)
	r.mustCall(t, "PUT", "/api/limits/"+key, map[string]any{"rate_starts": 1, "rate_period_seconds": 3600}, http.StatusOK)
	for range 3 {
		createTask(t, r, map[string]any{"task_data": map[string]any{}, "kind": kind, "queue": queue, "lock": key, "lock_limit": 3})
	}
	// One slot held by the test's worker (its start spends the hour's
	// rate), one by a program.
	claimTask(t, r, "test-worker/1", kind)
	r.mustCall(t, "POST", "/api/leases", map[string]any{"resource": key, "holder": "exec-1", "slots": 3, "ttl_seconds": 3600}, http.StatusCreated)
	until := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	r.mustCall(t, "PUT", "/api/queues/"+queue+"/pause", map[string]any{"reason": "importer bug", "until": until.Format(time.RFC3339)}, http.StatusOK)

	row := fmt.Sprintf(`#queues tr[data-queue=%q]`, queue)
	keyRow := fmt.Sprintf(`#limits tr[data-key=%q]`, key)
	cell := func(sel string) string { return fmt.Sprintf(`document.querySelector(%q)?.textContent`, sel) }
	step(ctx, t, "the paused queue with its reason and end",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="paused"] button.queue-resume`)),
		waitTrue(cell(row+` td.queue-reason`)+` === "importer bug"`),
		waitTrue(cell(row+` .queue-since`)+`.endsWith(" ago")`),
		waitTrue(cell(row+` .queue-until`)+`.startsWith("until ") && `+cell(row+` .queue-until`)+`.includes("(in ")`),
		waitTrue(cell(`#queues-note`)+` === "1 paused"`))
	step(ctx, t, "the limited key with its slots held, tasks waiting and rate",
		chromedp.WaitVisible(chromedp.CSS(keyRow)),
		waitTrue(cell(keyRow+` td.limit-held`)+` === "2 / 3"`),
		waitTrue(cell(keyRow+` td.limit-waiting`)+` === "2"`),
		waitTrue(cell(keyRow+` td.limit-rate`)+` === "1 / 1 per hour"`),
		waitTrue(cell(keyRow+` td.limit-next`)+`.startsWith("in ")`))
	saveScreenshot(ctx, t, "dashboard-flow.png")

	step(ctx, t, "Resume, one click",
		chromedp.Evaluate[chromedp.Void](`window.__sameDocument = true`),
		clickLive(row+` button.queue-resume`),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="active"] button.queue-pause`)),
		waitTrue(cell(`#queues-note`)+` === "none paused"`),
		waitTrue(`document.getElementById("flow-error").textContent === ""`))
	if p, paused := pauseOf(pausedQueues(t, r), queue); paused {
		t.Errorf("after Resume the API lists %s as paused: %+v", queue, p)
	}

	const reason = "the importer rewrites the files"
	step(ctx, t, "Pause with a reason, confirmed",
		clickLive(row+` button.queue-pause`),
		chromedp.WaitVisible(chromedp.CSS(row+` input.reason`)),
		chromedp.SendKeys(chromedp.CSS(row+` input.reason`), reason),
		clickLive(row+` button.confirm-yes`),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="paused"] button.queue-resume`)),
		waitTrue(fmt.Sprintf(`%s === %q`, cell(row+` td.queue-reason`), reason)),
		waitTrue(cell(row+` .queue-until`)+` === "until resumed"`),
		waitTrue(`document.getElementById("flow-error").textContent === ""`))
	if p, paused := pauseOf(pausedQueues(t, r), queue); !paused || p.Reason != reason || p.Until != nil {
		t.Errorf("after Pause the API lists %s as %+v (paused %v), want paused with the reason %q and no until", queue, p, paused, reason)
	}

	// A queue the page does not list: the form pauses it.
	const other = "mail"
	otherRow := fmt.Sprintf(`#queues tr[data-queue=%q]`, other)
	step(ctx, t, "another queue paused from the form",
		chromedp.SendKeys(chromedp.CSS(`#pause-queue`), other),
		chromedp.SendKeys(chromedp.CSS(`#pause-reason`), "bounces"),
		chromedp.Click(chromedp.CSS(`#pause-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(otherRow+`[data-state="paused"]`)),
		waitTrue(cell(otherRow+` td.queue-reason`)+` === "bounces"`),
		waitTrue(cell(`#queues-note`)+` === "2 paused"`),
		waitTrue(`window.__sameDocument === true`))
	if p, paused := pauseOf(pausedQueues(t, r), other); !paused || p.Reason != "bounces" {
		t.Errorf("after the form's Pause the API lists %s as %+v (paused %v), want paused with the reason %q", other, p, paused, "bounces")
	}

	// A new connection's snapshot says the same.
	step(ctx, t, "both pauses after a reload",
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`#connection.connected`)),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="paused"]`)),
		chromedp.WaitVisible(chromedp.CSS(otherRow+`[data-state="paused"]`)),
		waitTrue(fmt.Sprintf(`%s === %q`, cell(row+` td.queue-reason`), reason)))
}
