package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/task"
)

// stampScript logs "start <who> <unix ns>" and "end <who> <unix ns>"
// around a wait for the file $2 in the log's directory $1 (or nothing:
// none is waited for when $2 is "-").
const stampScript = `
if [ -n "$LEASEHOLD_TASK_ID" ]; then cat >/dev/null; fi
who="${LEASEHOLD_TASK_ID:+task-$LEASEHOLD_TASK_ID}"; who="${who:-exec}"
echo "start $who $(date +%s%N)" >> "$1/log"
if [ "$2" != "-" ]; then while [ ! -e "$1/$2" ]; do sleep 0.02; done; fi
echo "end $who $(date +%s%N)" >> "$1/log"
`

// stamp reads the time of the log's line "<event> <who> <ns>".
func stamp(t *testing.T, l shellLog, event, who string) time.Time {
	t.Helper()
	f := l.line(event + " " + who + " ")
	if f == nil {
		t.Fatalf("no %q of %s in the log:\n%s", event, who, l)
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, ns)
}

// TestGatedTaskAndExec: a lease-gated task and `leasehold exec --resource`
// on the same resource never run at the same time, in either order: a
// task whose lock exec holds runs once exec is done, and an exec that
// finds a task holding the lock waits for it to end. Real processes: the
// replica's API, `leasehold work` running the task, `leasehold exec`.
func TestGatedTaskAndExec(t *testing.T) {
	t.Parallel()
	r, _ := workReplica(t, "--log-level", "debug")
	log := newShellLog(t)
	script := func(wait string) []string { return []string{"/bin/sh", "-c", stampScript, "sh", log.dir(), wait} }
	work := startWorkProc(t, r.url, append([]string{"--kind", "gated", "--concurrency", "2", "--"}, script("go-task")...)...)

	// exec first: the task waits for it.
	ex := startExec(t, r.url, append([]string{"--resource", "nightly", "--ttl", "10s", "--"}, script("go-exec")...)...)
	waitUntil(t, "exec's command to start", func() bool { return log.has("start exec ") }, log, ex.stderr)
	tk := addTask(t, r, `{"kind":"gated","task_data":{},"lock":"nightly"}`)
	if tk.Lock != "nightly" {
		t.Fatalf("task %+v, want lock nightly", tk)
	}
	log.touch(t, "go-task") // the task's command would finish at once: only the lock holds it back
	log.touch(t, "go-exec")
	ex.wantExit(t, 0)
	done := finished(t, r, tk.ID, log, work.logs)
	who := "task-" + strconv.FormatInt(tk.ID, 10)
	if done.State != task.StateDone {
		t.Fatalf("task %d: %s (%s)", tk.ID, done.State, done.LastError)
	}
	if start, execEnd := stamp(t, log, "start", who), stamp(t, log, "end", "exec"); start.Before(execEnd) {
		t.Errorf("the task's command started %v before exec's ended", execEnd.Sub(start))
	}

	// The task first: exec waits for it.
	if err := os.Remove(filepath.Join(log.dir(), "go-task")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(string(log), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tk2 := addTask(t, r, `{"kind":"gated","task_data":{},"lock":"nightly"}`)
	who2 := "task-" + strconv.FormatInt(tk2.ID, 10)
	waitUntil(t, "the task's command to start", func() bool { return log.has("start " + who2 + " ") }, log, work.logs)
	ex2 := startExec(t, r.url, append([]string{"--resource", "nightly", "--ttl", "10s", "--wait", "1m", "--"}, script("-")...)...)
	waitUntil(t, "exec to wait for the lease", func() bool { return replicaSawWait(r, ex2.holder()) }, ex2.stderr)
	if log.has("start exec ") {
		t.Fatalf("exec's command started while the task held the lock:\n%s", log)
	}
	log.touch(t, "go-task")
	ex2.wantExit(t, 0)
	if execStart, end := stamp(t, log, "start", "exec"), stamp(t, log, "end", who2); execStart.Before(end) {
		t.Errorf("exec's command started %v before the task's ended", end.Sub(execStart))
	}
	if got := finished(t, r, tk2.ID, log, work.logs); got.State != task.StateDone {
		t.Errorf("task %d: %s (%s)", tk2.ID, got.State, got.LastError)
	}
	work.signal(t, syscall.SIGTERM)
	if code := work.exitCode(t); code != 0 {
		t.Errorf("leasehold work after SIGTERM: exit status %d\n%s", code, work.logs)
	}
}

// TestGatedTaskWorkerKilled: the `leasehold work` running a gated task is
// killed (SIGKILL); an exec waiting for the lock gets it once the task's
// lease, and with it the lock's, has run out, never before (how soon after
// is logged; the soak's checker holds the reaper to its second).
func TestGatedTaskWorkerKilled(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t, "--log-level", "debug")
	log := newShellLog(t)
	work := startWorkProc(t, r.url, append([]string{"--kind", "gated", "--"}, "/bin/sh", "-c", stampScript, "sh", log.dir(), "never")...)
	tk := addTask(t, r, `{"kind":"gated","task_data":{},"lock":"report","ttl_seconds":2}`)
	who := "task-" + strconv.FormatInt(tk.ID, 10)
	waitUntil(t, "the task's command to start", func() bool { return log.has("start " + who + " ") }, log, work.logs)
	ex := startExec(t, r.url, append([]string{"--resource", "report", "--ttl", "10s", "--wait", "1m", "--"}, "/bin/sh", "-c", stampScript, "sh", log.dir(), "-")...)
	waitUntil(t, "exec to wait for the lease", func() bool { return replicaSawWait(r, ex.holder()) }, ex.stderr)
	work.signal(t, syscall.SIGKILL)
	killed := time.Now()
	<-work.done
	ex.wantExit(t, 0)
	t.Logf("exec's command started %v after the worker was killed (task TTL 2s)", stamp(t, log, "start", "exec").Sub(killed).Round(time.Millisecond))

	// By the database clock: the lock's holding by the task ended at its
	// last expiry, and exec acquired it within a second of that.
	ctx := context.Background()
	var lockEnd, execGot time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT max(expires_at) FROM lease_events WHERE resource = 'report' AND holder <> $1`, ex.holder()).Scan(&lockEnd); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT at FROM lease_events WHERE resource = 'report' AND holder = $1 AND kind = 'acquired'`, ex.holder()).Scan(&execGot); err != nil {
		t.Fatal(err)
	}
	if d := execGot.Sub(lockEnd); d < 0 {
		t.Errorf("exec acquired the lock %v before the dead worker's lease on it ran out", -d)
	}
	t.Logf("the dead worker's lock ran out at its TTL; exec acquired it %v later", execGot.Sub(lockEnd).Round(time.Millisecond))
	if !strings.Contains(log.String(), "end exec ") {
		t.Errorf("exec's command did not run:\n%s", log)
	}
}
