package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/task"
)

// The tests of this file lose the answer to a renewal (for work, to a
// heartbeat) between the replica and the command: the request arrives and
// renews the lease, the command hears nothing and gives the lease up at its
// deadline. Once its CMD is gone, it must release what it gave up (work:
// hand the task back) under its fence, rather than leave it to an expiry it
// cannot know.

// TestExecReleasesWhatItGaveUp: leasehold exec whose renewal's answer is
// lost stops CMD at its deadline, exits 76, and has released the lease.
func TestExecReleasesWhatItGaveUp(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	front := testkit.NewFront(t, r.url)
	const resource = "exec:lost-answer"
	log := newChildLog(t)
	p := startExec(t, front.URL, append([]string{"--resource", resource, "--ttl", "4s", "--grace", "1s", "--"}, log.child(t, "stdin")...)...)
	pollExec(t, "the command to start", func() bool { return len(log.starts()) == 1 }, log, p.stderr)
	fence, _ := strconv.ParseInt(log.starts()[0][1], 10, 64)
	var lastSeen time.Time
	testkit.WaitFor(t, "a renewal", func() bool {
		at, ok := lastEvent(t, r, resource, fence, "renewed")
		lastSeen = at
		return ok
	})
	front.LoseNext(1, testkit.Route(http.MethodPut, "/api/leases/renew"))
	p.wantExit(t, exitLost, "lost the lease on "+resource)
	renewed, _ := lastEvent(t, r, resource, fence, "renewed")
	if !renewed.After(lastSeen) {
		t.Fatalf("the last renewal is at %s, not after %s, the last one exec heard of: no answer was lost\n%s", renewed, lastSeen, p.stderr)
	}
	released, ok := lastEvent(t, r, resource, fence, "released")
	if !ok {
		t.Fatalf("exec gave the lease up after a renewal whose answer was lost (renewed at %s) and left it to expire; want it released\n%s",
			renewed, p.stderr)
	}
	if expiry := renewed.Add(4 * time.Second); !released.Before(expiry) {
		t.Errorf("released at %s, not before the expiry %s the lost renewal gave it", released, expiry)
	} else {
		t.Logf("released %s before the expiry the lost renewal gave it", expiry.Sub(released).Round(time.Millisecond))
	}
}

// lastEvent is the time of the last event of kind in the history of
// resource under fence, read through the API; false when there is none.
func lastEvent(t *testing.T, r *replica, resource string, fence int64, kind string) (time.Time, bool) {
	t.Helper()
	events := call[[]struct {
		At    time.Time `json:"at"`
		Fence int64     `json:"fence"`
		Kind  string    `json:"kind"`
	}](t, r, "GET", "/api/leases/events?resource="+resource, "", http.StatusOK)
	var last time.Time
	found := false
	for _, e := range events {
		if e.Fence == fence && e.Kind == kind {
			last, found = e.At, true
		}
	}
	return last, found
}

// lostScript: the first attempt runs until SIGTERM, the others complete at
// once.
const lostScript = `
echo "start $LEASEHOLD_TASK_ID $LEASEHOLD_FENCE $LEASEHOLD_ATTEMPT" >> "$1/log"
trap 'echo "term $LEASEHOLD_FENCE" >> "$1/log"; exit 143' TERM
if grep -q "start $LEASEHOLD_TASK_ID" "$1/done" 2>/dev/null; then echo '"again"'; exit 0; fi
echo "start $LEASEHOLD_TASK_ID" >> "$1/done"
while :; do sleep 0.05; done
`

// TestWorkHandsBackWhatItGaveUp: leasehold work whose heartbeat's answer is
// lost stops CMD at the lease's deadline and hands the task back under its
// fence, the attempt not counted; it then runs it again and completes it.
func TestWorkHandsBackWhatItGaveUp(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	front := testkit.NewFront(t, r.url)
	log := newShellLog(t)
	w := startWork(t, front.URL, append([]string{"--processor", "giver", "--concurrency", "1", "--kind", "lost", "--kill-grace", "1s"},
		log.sh(lostScript)...)...)
	tk := addTask(t, r, `{"kind":"lost","task_data":{},"ttl_seconds":4}`)
	waitUntil(t, "the first attempt's command to start", func() bool { return log.has("start ") }, log, w.logs)
	fence, _ := strconv.ParseInt(log.line("start ")[2], 10, 64)
	var lastBeat time.Time
	testkit.WaitFor(t, "a heartbeat of the first attempt", func() bool {
		got := getTask(t, r, tk.ID)
		if got.LastHeartbeatAt != nil && got.StartedAt != nil && got.Fence == fence {
			lastBeat = *got.LastHeartbeatAt
			return lastBeat.After(*got.StartedAt)
		}
		return false
	})
	front.LoseNext(1, testkit.Route(http.MethodPut, "/api/tasks/"+strconv.FormatInt(tk.ID, 10)+"/heartbeat"))
	done := finished(t, r, tk.ID, log, w.logs)
	if done.State != task.StateDone || string(done.TaskOutput) != `"again"` || done.Attempts != 1 {
		t.Fatalf("the task: %s after %d attempts, output %s; want done by its second run, the first not counted\n%s",
			done.State, done.Attempts, done.TaskOutput, w.logs)
	}
	h := history(t, db, tk.ID)
	if len(h) != 1 || h[0].Fence != fence {
		t.Fatalf("the task's history: %+v; want the attempt under fence %d", h, fence)
	}
	var expiresAt time.Time
	var raw []byte
	if err := db.Pool.QueryRow(t.Context(), `SELECT earlier_attempts->0 FROM tasks WHERE id = $1`, tk.ID).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var a task.Attempt
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	expiresAt = a.ExpiresAt
	if !expiresAt.Add(-4 * time.Second).After(lastBeat) {
		t.Fatalf("the attempt's lease ran to %s, renewed no later than the last heartbeat the worker heard of (%s): no answer was lost", expiresAt, lastBeat)
	}
	if h[0].Outcome != task.OutcomeRequeued || !strings.Contains(h[0].Error, "deadline") {
		t.Fatalf("the attempt given up ended %+v; want it handed back (%s) at its deadline, not left to expire\n%s", h[0], task.OutcomeRequeued, w.logs)
	}
	if !log.has("term " + strconv.FormatInt(fence, 10)) {
		t.Errorf("the first attempt's command was not stopped (SIGTERM) as the lease was given up:\n%s", log)
	}
	t.Logf("handed back %s before its lease would have lapsed", a.ExpiresAt.Sub(a.EndedAt).Round(time.Millisecond))
}
