package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// workReplica starts a replica for the work tests: the API and the reaper
// (which puts a task whose lease lapsed back in the queue, waking the
// waiting claims), without the rate limit that the tests' polling, all from
// 127.0.0.1, would run into.
func workReplica(t *testing.T, extra ...string) (*replica, pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	args := append([]string{"--addr", "127.0.0.1:0", "--roles", "api,reaper", "--rate-limit", "0"}, extra...)
	return startReplica(t, serveConfig(t, args, env("DATABASE_URL", db.URL))), db
}

// addTask inserts a task through the API (body: a task object).
func addTask(t *testing.T, r *replica, body string) task.Task {
	t.Helper()
	return call[task.Task](t, r, "POST", "/api/tasks", body, http.StatusCreated)
}

func getTask(t *testing.T, r *replica, id int64) task.Task {
	t.Helper()
	return call[task.Task](t, r, "GET", "/api/tasks/"+strconv.FormatInt(id, 10), "", http.StatusOK)
}

// waitUntil retries cond every 20 ms until it holds, for at most 60 s; the
// failure shows what of more there is.
func waitUntil(t *testing.T, what string, cond func() bool, more ...fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var sb strings.Builder
			for _, m := range more {
				fmt.Fprintf(&sb, "\n%s", m)
			}
			t.Fatalf("waited 60s for %s%s", what, sb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finished waits until the task is done, dead or cancelled, and returns it.
func finished(t *testing.T, r *replica, id int64, more ...fmt.Stringer) task.Task {
	t.Helper()
	var got task.Task
	waitUntil(t, fmt.Sprintf("task %d to finish", id), func() bool {
		got = getTask(t, r, id)
		return got.State == task.StateDone || got.State == task.StateDead || got.State == task.StateCancelled
	}, more...)
	return got
}

// inWork is a "leasehold work" run in this process, as main runs it.
type inWork struct {
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan struct{}
	err    error // what run returned, once done is closed
}

// startWork runs "leasehold work --url url --log-level debug args..." in
// this process until stop (ctx ending is main's SIGTERM or SIGINT) or the
// end of the test.
func startWork(t *testing.T, url string, args ...string) *inWork {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	w := &inWork{logs: &syncBuffer{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = run(ctx, append([]string{"work", "--url", url, "--log-level", "debug"}, args...), env(), io.Discard, w.logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(60 * time.Second):
			t.Errorf("leasehold work did not return within 60s of its shutdown\nlogs:\n%s", w.logs)
		}
	})
	return w
}

// stop shuts the worker down and returns what run returned.
func (w *inWork) stop(t *testing.T) error {
	t.Helper()
	w.cancel()
	return w.wait(t)
}

// wait waits for run to return, for at most 60 s.
func (w *inWork) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-w.done:
		return w.err
	case <-time.After(60 * time.Second):
		t.Fatalf("leasehold work did not return within 60s\nlogs:\n%s", w.logs)
		return nil
	}
}

// records parses the JSON log records in logs.
func records(logs string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

// logged reports whether a record has the message (a prefix of it) and the
// fields given, as name, value pairs.
func logged(logs fmt.Stringer, message string, fields ...any) bool {
	for _, rec := range records(logs.String()) {
		if msg, _ := rec["message"].(string); !strings.HasPrefix(msg, message) {
			continue
		}
		ok := true
		for i := 0; i+1 < len(fields); i += 2 {
			want, _ := json.Marshal(fields[i+1])
			got, _ := json.Marshal(rec[fields[i].(string)])
			ok = ok && string(want) == string(got)
		}
		if ok {
			return true
		}
	}
	return false
}

// workProc is "leasehold work" as a process of its own: the test binary,
// which is leasehold with LEASEHOLD_TEST_MAIN=1 (exec_test.go).
type workProc struct {
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

func startWorkProc(t *testing.T, url string, args ...string) *workProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &workProc{
		cmd:  exec.Command(exe, append([]string{"work", "--url", url, "--log-level", "debug"}, args...)...),
		logs: &syncBuffer{},
		done: make(chan struct{}),
	}
	// Its configuration is its flags, not whatever LEASEHOLD_* the test runs under.
	environ := []string{"LEASEHOLD_TEST_MAIN=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			environ = append(environ, kv)
		}
	}
	p.cmd.Env = environ
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("leasehold work still ran at the end of the test; killed it\noutput:\n%s", p.logs)
		}
	})
	return p
}

// processor is the name of the process's slot n: <hostname>-<pid>/w<n>.
func (p *workProc) processor(n int) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d/w%d", host, p.cmd.Process.Pid, n)
}

func (p *workProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to leasehold work: %v", sig, err)
	}
}

// exitCode waits for the process to exit, for at most 60 s, and returns its status.
func (p *workProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("leasehold work did not exit within 60s\noutput:\n%s", p.logs)
	}
	return p.cmd.ProcessState.ExitCode()
}

// shellLog is the file the tests' shell commands append to, one line per
// event.
type shellLog string

func newShellLog(t *testing.T) shellLog { return shellLog(filepath.Join(t.TempDir(), "log")) }

// dir is the log's directory, the first argument of the shell commands.
func (l shellLog) dir() string { return filepath.Dir(string(l)) }

func (l shellLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// line returns the first line starting with prefix, split into fields;
// nil when there is none.
func (l shellLog) line(prefix string) []string {
	for line := range strings.Lines(l.String()) {
		if strings.HasPrefix(line, prefix) {
			return strings.Fields(line)
		}
	}
	return nil
}

func (l shellLog) has(prefix string) bool { return l.line(prefix) != nil }

// touch creates the file name in the log's directory: what a command
// waits for.
func (l shellLog) touch(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(l.dir(), name), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sh is the command line of a shell script that gets the log's directory
// as $1.
func (l shellLog) sh(script string) []string {
	return []string{"--", "/bin/sh", "-c", script, "sh", l.dir()}
}

// outcomeScript is a CMD whose behaviour is the task's kind.
const outcomeScript = `
case "$LEASEHOLD_KIND" in
json) cat ;;
text) echo "note from task $LEASEHOLD_TASK_ID" >&2; printf 'hello, <world>\n\n' ;;
env) cat >/dev/null; printf '{"id":"%s","fence":"%s","attempt":"%s","kind":"%s","queue":"%s","processor":"%s"}' \
	"$LEASEHOLD_TASK_ID" "$LEASEHOLD_FENCE" "$LEASEHOLD_ATTEMPT" "$LEASEHOLD_KIND" "$LEASEHOLD_QUEUE" "$LEASEHOLD_PROCESSOR" ;;
empty) cat >/dev/null ;;
fail) echo "first line" >&2; echo "something broke" >&2; exit 3 ;;
noisy) head -c 10000 /dev/zero | tr '\0' x >&2; printf '\nthe end\n' >&2; exit 4 ;;
big) head -c 2000000 /dev/zero | tr '\0' a ;;
killed) kill -9 $$ ;;
esac
`

// TestWorkOutcomes: one worker runs tasks of several kinds and queues
// through a shell command. Exit 0 completes the task with stdout as
// task_output (a JSON value as is, else a string; nothing is null), with the
// task in the command's environment; non-zero fails the attempt with the end
// of stderr and how the command ended; stdout over the bound fails it with a
// message. Tasks of other kinds or queues are left alone, though older.
func TestWorkOutcomes(t *testing.T) {
	t.Parallel()
	r, _ := workReplica(t)
	// Older than the rest, which a claim takes first: left alone only
	// because their kind or queue is not the worker's.
	otherKind := addTask(t, r, `{"kind":"other","task_data":{}}`)
	otherQueue := addTask(t, r, `{"kind":"json","queue":"q3","task_data":{}}`)
	once := `,"max_attempts":1`
	ids := map[string]int64{}
	for _, tc := range []struct{ kind, queue, data string }{
		{"json", "default", `{"n":5,"s":"<x>","list":[1,2]}`},
		{"text", "default", `{}`},
		{"env", "q2", `{}`},
		{"empty", "default", `{}`},
		{"fail", "default", `{}`},
		{"noisy", "q2", `{}`},
		{"big", "default", `{}`},
		{"killed", "default", `{}`},
	} {
		ids[tc.kind] = addTask(t, r, fmt.Sprintf(`{"kind":%q,"queue":%q,"task_data":%s%s}`, tc.kind, tc.queue, tc.data, once)).ID
	}
	log := newShellLog(t)
	args := []string{"--concurrency", "3", "--queue", "default", "--queue", "q2"}
	for _, k := range []string{"json", "text", "env", "empty", "fail", "noisy", "big", "killed"} {
		args = append(args, "--kind", k)
	}
	w := startWork(t, r.url, append(args, log.sh(outcomeScript)...)...)

	got := map[string]task.Task{}
	for kind, id := range ids {
		got[kind] = finished(t, r, id, w.logs)
	}
	jsonOut := func(kind string) any {
		t.Helper()
		tk := got[kind]
		if tk.State != task.StateDone {
			t.Errorf("%s task: state %s (last error %q), want done", kind, tk.State, tk.LastError)
			return nil
		}
		var v any
		if err := json.Unmarshal(tk.TaskOutput, &v); err != nil && len(tk.TaskOutput) > 0 {
			t.Errorf("%s task: task_output %s: %v", kind, tk.TaskOutput, err)
		}
		return v
	}
	var data any
	_ = json.Unmarshal([]byte(`{"n":5,"s":"<x>","list":[1,2]}`), &data)
	if out := jsonOut("json"); !reflect.DeepEqual(out, data) {
		t.Errorf("json task (cat of its stdin): task_output %v, want its task_data %v", out, data)
	}
	if out := jsonOut("text"); out != "hello, <world>" {
		t.Errorf("text task: task_output %#v, want the string \"hello, <world>\" (trailing newlines dropped)", out)
	}
	if out := jsonOut("empty"); out != nil || got["empty"].TaskOutput != nil {
		t.Errorf("empty task: task_output %s, want null", got["empty"].TaskOutput)
	}
	envTask := got["env"]
	wantEnv := map[string]any{
		"id": strconv.FormatInt(envTask.ID, 10), "fence": strconv.FormatInt(envTask.Fence, 10), "attempt": "1",
		"kind": "env", "queue": "q2", "processor": envTask.Processor,
	}
	if out := jsonOut("env"); !reflect.DeepEqual(out, wantEnv) {
		t.Errorf("env task: the command's environment %v, want %v", out, wantEnv)
	}
	host, _ := os.Hostname()
	if p := envTask.Processor; !strings.HasPrefix(p, fmt.Sprintf("%s-%d/w", host, os.Getpid())) {
		t.Errorf("env task: processor %q, want <hostname>-<pid>/w<N>", p)
	}

	for _, tc := range []struct {
		kind string
		want []string // in last_error
		end  string   // its last line
	}{
		{"fail", []string{"first line\nsomething broke"}, "exit status 3"},
		{"noisy", []string{"...xxx", "xxx\nthe end"}, "exit status 4"},
		{"big", []string{"stdout (2000000 bytes) does not fit in task_output", "1 MiB"}, ""},
		{"killed", []string{"(nothing on stderr)"}, "killed by signal 9 (killed) (nothing on stderr)"},
	} {
		tk := got[tc.kind]
		if tk.State != task.StateDead {
			t.Errorf("%s task: state %s, want dead (failed, with max_attempts 1)", tc.kind, tk.State)
		}
		for _, w := range tc.want {
			if !strings.Contains(tk.LastError, w) {
				t.Errorf("%s task: last_error %q, want it to say %q", tc.kind, tk.LastError, w)
			}
		}
		lines := strings.Split(tk.LastError, "\n")
		if tc.end != "" && lines[len(lines)-1] != tc.end {
			t.Errorf("%s task: last_error ends with %q, want %q", tc.kind, lines[len(lines)-1], tc.end)
		}
		if n := len(tk.LastError); n > maxErrorBytes {
			t.Errorf("%s task: last_error is %d bytes, want at most %d", tc.kind, n, maxErrorBytes)
		}
	}
	if n := len(got["noisy"].LastError); n < maxErrorBytes-100 {
		t.Errorf("noisy task: last_error is %d bytes, want the tail of stderr, close to %d", n, maxErrorBytes)
	}

	// The command's stderr is in the worker's log, a record per line.
	if !logged(w.logs, fmt.Sprintf("note from task %d", ids["text"]), "stream", "stderr", "task", ids["text"]) {
		t.Errorf("the worker's log has no record of the text task's stderr:\n%s", w.logs)
	}
	if err := w.stop(t); err != nil {
		t.Errorf("leasehold work after its shutdown: got %v, want nil", err)
	}
	for _, id := range []int64{otherKind.ID, otherQueue.ID} {
		if tk := getTask(t, r, id); tk.State != task.StatePending || tk.Attempts != 0 {
			t.Errorf("task %d of kind %s in queue %s: %s after %d attempts, want pending and never claimed", id, tk.Kind, tk.Queue, tk.State, tk.Attempts)
		}
	}
}

// cancelScript logs its start and its pid; a polite command stops on
// SIGTERM, logging it, a stubborn one logs it and goes on.
const cancelScript = `
echo "start $LEASEHOLD_TASK_ID $$" >> "$1/log"
case "$LEASEHOLD_KIND" in
polite) trap 'echo "term $LEASEHOLD_TASK_ID" >> "$1/log"; exit 143' TERM ;;
stubborn) trap 'echo "ignored $LEASEHOLD_TASK_ID" >> "$1/log"' TERM ;;
esac
while :; do sleep 0.05; done
`

// TestWorkCancel: a task cancelled while its command runs stops the
// command, with SIGTERM then SIGKILL after --kill-grace, and nothing is
// reported for it. The tasks' TTL is 60 s, so a held heartbeat waits some
// 17 s on the server: a command stopped well before that learnt of the
// cancellation from the 409 that the server answered its waiting heartbeat
// with at once, not from the next heartbeat.
func TestWorkCancel(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	log := newShellLog(t)
	w := startWork(t, r.url, append([]string{"--kind", "polite", "--kind", "stubborn", "--concurrency", "2", "--kill-grace", "1s"},
		log.sh(cancelScript)...)...)
	polite := addTask(t, r, `{"kind":"polite","task_data":{},"ttl_seconds":60}`)
	stubborn := addTask(t, r, `{"kind":"stubborn","task_data":{},"ttl_seconds":60}`)
	for _, id := range []int64{polite.ID, stubborn.ID} {
		waitUntil(t, fmt.Sprintf("task %d's command to start", id), func() bool { return log.has(fmt.Sprintf("start %d ", id)) }, log, w.logs)
		// Its first held heartbeat has renewed the lease (firstHeldHeartbeat
		// after the claim) and waits on the server: the cancel is pushed.
		waitUntil(t, fmt.Sprintf("task %d's first heartbeat", id), func() bool {
			var renewed bool
			err := db.Pool.QueryRow(t.Context(), `SELECT last_heartbeat_at > started_at FROM tasks WHERE id = $1`, id).Scan(&renewed)
			return err == nil && renewed
		}, log, w.logs)
	}

	cancelled := time.Now()
	for _, id := range []int64{polite.ID, stubborn.ID} {
		call[task.Task](t, r, "POST", fmt.Sprintf("/api/tasks/%d/cancel", id), `{"reason":"changed my mind"}`, http.StatusAccepted)
	}
	waitUntil(t, "the polite command to get SIGTERM", func() bool { return log.has(fmt.Sprintf("term %d", polite.ID)) }, log, w.logs)
	took := time.Since(cancelled)
	t.Logf("the command got SIGTERM %v after the cancellation (promised within 1 s)", took)
	// Not a benchmark: a generous bound, still well below a held
	// heartbeat's wait (TTL 60 s: (60 − 6 − 1)/3 s, 17 s in whole seconds).
	if took > 10*time.Second {
		t.Errorf("the command got SIGTERM %v after the cancellation; want it well before a held heartbeat's wait is over", took)
	}

	// A task cancelled as soon as its command starts, before its first held
	// heartbeat is sent, hears of it from that heartbeat: within
	// firstHeldHeartbeat, not an interval.
	early := addTask(t, r, `{"kind":"polite","task_data":{},"ttl_seconds":60}`)
	waitUntil(t, "the early task's command to start", func() bool { return log.has(fmt.Sprintf("start %d ", early.ID)) }, log, w.logs)
	cancelled = time.Now()
	call[task.Task](t, r, "POST", fmt.Sprintf("/api/tasks/%d/cancel", early.ID), `{"reason":"changed my mind"}`, http.StatusAccepted)
	waitUntil(t, "the early command to get SIGTERM", func() bool { return log.has(fmt.Sprintf("term %d", early.ID)) }, log, w.logs)
	took = time.Since(cancelled)
	t.Logf("a command cancelled at its start got SIGTERM %v after the cancellation", took)
	if took > 10*time.Second {
		t.Errorf("the early command got SIGTERM %v after the cancellation; want it well before a held heartbeat's wait is over", took)
	}

	// The stubborn command goes on after SIGTERM, until SIGKILL.
	waitUntil(t, "the stubborn command to get SIGTERM", func() bool { return log.has(fmt.Sprintf("ignored %d", stubborn.ID)) }, log, w.logs)
	pid, err := strconv.Atoi(log.line(fmt.Sprintf("start %d ", stubborn.ID))[2])
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the stubborn command to be gone", func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }, log, w.logs)
	if !logged(w.logs, "CMD still runs after SIGTERM and the kill grace; SIGKILL", "task", stubborn.ID) {
		t.Errorf("the worker's log does not say it sent the stubborn command SIGKILL:\n%s", w.logs)
	}
	for _, id := range []int64{polite.ID, stubborn.ID, early.ID} {
		waitUntil(t, fmt.Sprintf("the worker to say task %d was cancelled", id), func() bool {
			return logged(w.logs, "the task was cancelled; its handler was stopped and nothing is reported", "task", id)
		}, w.logs)
	}
	if err := w.stop(t); err != nil {
		t.Errorf("leasehold work after its shutdown: got %v, want nil", err)
	}
	// Nothing was reported: the tasks are as the cancellation left them.
	for _, id := range []int64{polite.ID, stubborn.ID, early.ID} {
		tk := getTask(t, r, id)
		if tk.State != task.StateCancelled || tk.LastError != "changed my mind" {
			t.Errorf("task %d: state %s, last error %q; want cancelled with the cancellation's reason", id, tk.State, tk.LastError)
		}
		if outcomes := attemptOutcomes(t, db, id); !reflect.DeepEqual(outcomes, []string{"cancelled"}) {
			t.Errorf("task %d: history %q, want one attempt, cancelled", id, outcomes)
		}
	}
	if logged(w.logs, "the task could not be recorded") || logged(w.logs, "task failed") || logged(w.logs, "task completed") {
		t.Errorf("the worker tried to report a cancelled task:\n%s", w.logs)
	}
}

// attempt is an entry of a task's history.
type attempt struct {
	Processor string `json:"processor"`
	Fence     int64  `json:"fence"`
	Outcome   string `json:"outcome"`
	Error     string `json:"error"`
}

// history is the task's earlier attempts, from the database.
func history(t *testing.T, db pgtest.DB, id int64) []attempt {
	t.Helper()
	var raw []byte
	if err := db.Pool.QueryRow(t.Context(), `SELECT earlier_attempts FROM tasks WHERE id = $1`, id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var as []attempt
	if err := json.Unmarshal(raw, &as); err != nil {
		t.Fatal(err)
	}
	return as
}

func attemptOutcomes(t *testing.T, db pgtest.DB, id int64) []string {
	t.Helper()
	var out []string
	for _, a := range history(t, db, id) {
		out = append(out, a.Outcome)
	}
	return out
}

// pauseScript: the first attempt waits for the file go, the others go on at
// once; each prints its fence.
const pauseScript = `
echo "start $LEASEHOLD_TASK_ID $LEASEHOLD_FENCE $LEASEHOLD_ATTEMPT" >> "$1/log"
if [ "$LEASEHOLD_ATTEMPT" = 1 ]; then
	while [ ! -e "$1/go" ]; do sleep 0.02; done
fi
echo "end $LEASEHOLD_FENCE" >> "$1/log"
printf '{"fence": %s}' "$LEASEHOLD_FENCE"
`

// TestWorkLeaseLostWhilePaused: a worker stopped (SIGSTOP) past its task's
// TTL loses the task to another worker, which completes it under a greater
// fence. Its command meanwhile finishes too; when the first worker goes on
// (SIGCONT) its lease has lapsed by its own clock: it reports nothing, and
// the hand-back it sends under its fence is refused. The task's history has
// the first attempt expired, and its completion is the second worker's.
func TestWorkLeaseLostWhilePaused(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	log := newShellLog(t)
	first := startWorkProc(t, r.url, append([]string{"--kind", "pause", "--kill-grace", "0s"}, log.sh(pauseScript)...)...)
	tk := addTask(t, r, `{"kind":"pause","task_data":{},"ttl_seconds":2}`)
	waitUntil(t, "the first attempt's command to start", func() bool { return log.has("start ") }, log, first.logs)
	start := log.line("start ")
	firstFence, _ := strconv.ParseInt(start[2], 10, 64)
	first.signal(t, syscall.SIGSTOP)

	second := startWork(t, r.url, append([]string{"--kind", "pause", "--processor", "second"}, log.sh(pauseScript)...)...)
	done := finished(t, r, tk.ID, log, second.logs)
	var out struct{ Fence int64 }
	if err := json.Unmarshal(done.TaskOutput, &out); err != nil || done.State != task.StateDone || done.Processor != "second/w1" ||
		done.Fence <= firstFence || out.Fence != done.Fence {
		t.Fatalf("the task: %s by %s, fence %d, task_output %s; want done by second/w1 with a fence above %d, which its output names",
			done.State, done.Processor, done.Fence, done.TaskOutput, firstFence)
	}
	// The first attempt's command finishes too, while its worker is stopped.
	log.touch(t, "go")
	waitUntil(t, "the first attempt's command to finish", func() bool { return log.has(fmt.Sprintf("end %d", firstFence)) }, log)

	first.signal(t, syscall.SIGCONT)
	waitUntil(t, "the first worker to count its lease lost", func() bool {
		return logged(first.logs, "the task's lease was given up at its deadline", "task", tk.ID, "fence", firstFence)
	}, first.logs)
	first.signal(t, syscall.SIGTERM)
	if code := first.exitCode(t); code != 0 {
		t.Errorf("the first worker after SIGTERM: exit status %d, want 0\n%s", code, first.logs)
	}
	if logged(first.logs, "task completed") || logged(first.logs, "the task could not be recorded as completed") {
		t.Errorf("the first worker tried to complete the task it had lost:\n%s", first.logs)
	}
	if again := getTask(t, r, tk.ID); again.Fence != done.Fence || string(again.TaskOutput) != string(done.TaskOutput) {
		t.Errorf("the task after the first worker went on: fence %d, output %s; want the second's, %d and %s",
			again.Fence, again.TaskOutput, done.Fence, done.TaskOutput)
	}
	h := history(t, db, tk.ID)
	if len(h) != 1 || h[0].Outcome != task.OutcomeExpired || h[0].Fence != firstFence || h[0].Processor != first.processor(1) {
		t.Errorf("the task's history: %+v, want one attempt, fence %d of %s, expired", h, firstFence, first.processor(1))
	}
	if err := second.stop(t); err != nil {
		t.Errorf("the second worker after its shutdown: got %v, want nil", err)
	}
}

// shutdownScript: a "finish" command waits for the file go, a "hang" one
// forever; both log SIGTERM and stop on it.
const shutdownScript = `
echo "start $LEASEHOLD_TASK_ID" >> "$1/log"
trap 'echo "term $LEASEHOLD_TASK_ID" >> "$1/log"; exit 143' TERM
case "$LEASEHOLD_KIND" in
finish) while [ ! -e "$1/go" ]; do sleep 0.02; done; echo '"finished"' ;;
hang) while :; do sleep 0.05; done ;;
esac
`

// TestWorkGracefulShutdown: SIGTERM to leasehold work while two commands
// run. The one that finishes within --shutdown-grace completes its task;
// the other is stopped after the grace and its task handed back, pending
// again with the attempt not counted. Then it exits 0.
func TestWorkGracefulShutdown(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	log := newShellLog(t)
	p := startWorkProc(t, r.url, append([]string{"--kind", "finish", "--kind", "hang", "--concurrency", "2",
		"--shutdown-grace", "3s", "--kill-grace", "2s"}, log.sh(shutdownScript)...)...)
	fin := addTask(t, r, `{"kind":"finish","task_data":{}}`)
	hang := addTask(t, r, `{"kind":"hang","task_data":{}}`)
	for _, id := range []int64{fin.ID, hang.ID} {
		waitUntil(t, fmt.Sprintf("task %d's command to start", id), func() bool { return log.has(fmt.Sprintf("start %d", id)) }, log, p.logs)
	}
	p.signal(t, syscall.SIGTERM)
	waitUntil(t, "the worker to start its shutdown", func() bool { return logged(p.logs, "remote worker pool stopping") }, p.logs)
	log.touch(t, "go")
	if code := p.exitCode(t); code != 0 {
		t.Errorf("leasehold work after SIGTERM: exit status %d, want 0\n%s", code, p.logs)
	}

	if got := getTask(t, r, fin.ID); got.State != task.StateDone || string(got.TaskOutput) != `"finished"` {
		t.Errorf("the task that finished within the grace: %s, output %s; want done, \"finished\"", got.State, got.TaskOutput)
	}
	got := getTask(t, r, hang.ID)
	if got.State != task.StatePending || got.Attempts != 0 {
		t.Errorf("the task still running after the grace: %s after %d attempts, want pending with the attempt not counted", got.State, got.Attempts)
	}
	if h := history(t, db, hang.ID); len(h) != 1 || h[0].Outcome != task.OutcomeRequeued || !strings.Contains(h[0].Error, "exit status 143") {
		t.Errorf("its history: %+v, want one attempt, requeued, saying how the command ended", h)
	}
	if !log.has(fmt.Sprintf("term %d", hang.ID)) || log.has(fmt.Sprintf("term %d", fin.ID)) {
		t.Errorf("the commands' log:\n%s\nwant SIGTERM for the one still running after the grace only", log)
	}
}

// TestWorkServerProblems: a server that cannot be reached is asked again
// with backoff until the worker is stopped (then exit 0); one that refuses
// the claims for good (a missing token) ends the worker, exit status 1,
// with a message saying what to fix.
func TestWorkServerProblems(t *testing.T) {
	t.Parallel()
	log := newShellLog(t)
	nobody := startWork(t, "http://127.0.0.1:1", append([]string{"--kind", "k"}, log.sh("cat")...)...)
	waitUntil(t, "the worker to say it cannot reach the server", func() bool { return logged(nobody.logs, "a claim failed") }, nobody.logs)
	if err := nobody.stop(t); err != nil {
		t.Errorf("leasehold work stopped while the server was unreachable: got %v, want nil", err)
	}

	r, _ := workReplica(t, "--api-token", "work-token-of-the-test")
	noToken := startWork(t, r.url, append([]string{"--kind", "k"}, log.sh("cat")...)...)
	err := noToken.wait(t)
	if code := cliExitCode(err); code != 1 || !strings.Contains(fmt.Sprint(err), "401") || !strings.Contains(fmt.Sprint(err), "--api-token") {
		t.Errorf("leasehold work without the server's token: exit status %d (%v), want 1 saying 401 and --api-token", code, err)
	}
	// With the token (from the environment) it works.
	tk := addTaskWithToken(t, r, "work-token-of-the-test")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"work", "--kind", "k"}, log.sh("cat")...), env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", "work-token-of-the-test"), io.Discard, logs)
	}()
	waitUntil(t, "the task to be done", func() bool {
		status, body := r.get(t, fmt.Sprintf("/api/tasks/%d", tk), "work-token-of-the-test")
		var got task.Task
		return status == http.StatusOK && json.Unmarshal(body, &got) == nil && got.State == task.StateDone
	}, logs)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("leasehold work with the token, after its shutdown: got %v, want nil", err)
	}
}

func addTaskWithToken(t *testing.T, r *replica, token string) int64 {
	t.Helper()
	status, body := r.request(t, "POST", "/api/tasks", `{"kind":"k","task_data":{"a":1}}`, token)
	var tk task.Task
	if status != http.StatusCreated || json.Unmarshal(body, &tk) != nil {
		t.Fatalf("POST /api/tasks: %d %s", status, body)
	}
	return tk.ID
}

// TestWorkRejectsBadUsage: mistakes on the command line are exit status 2
// with a message naming them, before anything is sent or run.
func TestWorkRejectsBadUsage(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("p", 252)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"work", "--", "cat"}, []string{"--kind is required"}},
		{[]string{"work", "--kind", "k"}, []string{"no command to run", "--"}},
		{[]string{"work", "--kind", "k", "--concurrency", "0", "--", "cat"}, []string{`--concurrency "0"`, "between 1 and 1024"}},
		{[]string{"work", "--kind", "k", "--concurrency", "many", "--", "cat"}, []string{`--concurrency "many"`}},
		{[]string{"work", "--kind", "", "--", "cat"}, []string{"--kind is empty"}},
		{[]string{"work", "--kind", "k", "--queue", "a\tb", "--", "cat"}, []string{"--queue", "control character"}},
		{[]string{"work", "--kind", "k", "--shutdown-grace", "soon", "--", "cat"}, []string{`--shutdown-grace "soon"`}},
		{[]string{"work", "--kind", "k", "--kill-grace", "-1s", "--", "cat"}, []string{`--kill-grace "-1s"`}},
		{[]string{"work", "--kind", "k", "--processor", long, "--concurrency", "10", "--", "cat"}, []string{"--processor", "the limit is 255"}},
		{[]string{"work", "--kind", "k", "--log-level", "loud", "--", "cat"}, []string{`--log-level "loud"`}},
		{[]string{"work", "--kind", "k", "--url", "ftp://x", "--", "cat"}, []string{"--url", "http://"}},
		{[]string{"work", "--kind", "k", "--", "/no/such/command"}, []string{`CMD "/no/such/command" cannot be run`}},
		{[]string{"work", "--bogus", "--", "cat"}, []string{"bogus"}},
		// Every mistake at once, each named.
		{[]string{"work", "--concurrency", "-3"}, []string{"--kind is required", `--concurrency "-3"`, "no command to run"}},
	} {
		err := run(t.Context(), tc.args, env("LEASEHOLD_URL", "http://127.0.0.1:1"), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q: got %v, want a usage error (exit status 2)", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("run %q: error %q, want it to say %q", tc.args, err, w)
			}
		}
	}
	// And as a process: main exits 2, saying what to fix.
	p := startWorkProc(t, "http://127.0.0.1:1", "--", "cat")
	if code := p.exitCode(t); code != 2 || !strings.Contains(p.logs.String(), "--kind is required") {
		t.Errorf("leasehold work without --kind: exit status %d, output %q; want 2 saying --kind is required", code, p.logs)
	}
}

// apiRecorder is a reverse proxy in front of a replica that records the
// requests it forwards. Its mode changes the heartbeats with wait_seconds:
// "old" answers them as a release before held heartbeats did (400, an
// unknown field); "early" has them answered early, as a replica that
// shuts down does: the first, third, fifth… at once, the others only
// worker.HeldHeartbeatGap after they came (still early), so that the worker
// sends the next on that answer, at a time the recorder knows.
// "502-once" answers the first heartbeat of all 502, as a front door whose
// replica died under the request does; "502-once-requeue" the first
// hand-back, "502-once-list" the first list of tasks. "lost-answers"
// forwards every heartbeat and answers it 502, as if the answer were lost
// after the renewal committed, and answers 502 to every completion until
// lostFor after the first heartbeat went on.
type apiRecorder struct {
	url     string
	mode    string
	failed  bool // a "502-once" mode: its request is answered
	lostFor time.Duration
	beat    time.Time // "lost-answers": when the first heartbeat went on

	mu       sync.Mutex
	requests []recorded
	held     int // "early": the held heartbeats so far
}

// recorded is one request through an apiRecorder.
type recorded struct {
	at                  time.Time
	method, path, query string
	body                map[string]any
	// forwarded is when it went on to the replica: its answer, and
	// whatever the client did on that answer, came later.
	forwarded time.Time
	// late: "early" held it worker.HeldHeartbeatGap before forwarding it.
	late bool
}

func newAPIRecorder(t *testing.T, target, mode string) *apiRecorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	a := &apiRecorder{mode: mode}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		rec := recorded{at: time.Now(), method: r.Method, path: r.URL.Path, query: r.URL.RawQuery}
		_ = json.Unmarshal(raw, &rec.body)
		_, held := rec.body["wait_seconds"]
		held = held && strings.HasSuffix(r.URL.Path, "/heartbeat")
		a.mu.Lock()
		i := len(a.requests)
		if held && a.mode == "early" {
			a.held++
			rec.late = a.held%2 == 0
		}
		a.requests = append(a.requests, rec)
		fail := !a.failed && (a.mode == "502-once" && strings.HasSuffix(r.URL.Path, "/heartbeat") ||
			a.mode == "502-once-requeue" && strings.HasSuffix(r.URL.Path, "/requeue") ||
			a.mode == "502-once-list" && r.Method == http.MethodGet && r.URL.Path == "/api/tasks")
		a.failed = a.failed || fail
		a.mu.Unlock()
		switch {
		case fail:
			answer502(w)
			return
		case held && a.mode == "old":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"unknown field \"wait_seconds\"; remove it (see the README for the fields of this request)"}`)
			return
		case held && a.mode == "early":
			var body map[string]any
			_ = json.Unmarshal(raw, &body)
			delete(body, "wait_seconds")
			plain, _ := json.Marshal(body)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(plain)), int64(len(plain))
			if rec.late {
				// A server holding the answer a while, not a wait for
				// something to happen.
				select {
				case <-time.After(worker.HeldHeartbeatGap):
				case <-r.Context().Done():
				}
			}
		}
		a.mu.Lock()
		lostBeat := a.mode == "lost-answers" && strings.HasSuffix(r.URL.Path, "/heartbeat")
		if lostBeat && a.beat.IsZero() {
			a.beat = time.Now()
		}
		lostCompletion := a.mode == "lost-answers" && strings.HasSuffix(r.URL.Path, "/complete") &&
			(a.beat.IsZero() || time.Since(a.beat) < a.lostFor)
		if !lostCompletion {
			a.requests[i].forwarded = time.Now()
		}
		a.mu.Unlock()
		switch {
		case lostCompletion:
			answer502(w)
		case lostBeat:
			proxy.ServeHTTP(httptest.NewRecorder(), r)
			answer502(w)
		default:
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// answer502 answers as a front door whose replica died under the request does.
func answer502(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprint(w, `{"error":"the replica failed before it answered; the request may or may not have taken effect, check and retry"}`)
}

// heartbeats returns the heartbeats of task id so far.
func (a *apiRecorder) heartbeats(id int64) []recorded {
	a.mu.Lock()
	defer a.mu.Unlock()
	var beats []recorded
	for _, r := range a.requests {
		if r.method == http.MethodPut && r.path == fmt.Sprintf("/api/tasks/%d/heartbeat", id) {
			beats = append(beats, r)
		}
	}
	return beats
}

// heartbeatWaits returns the wait_seconds of each heartbeat of task id so
// far (-1 for one without).
func (a *apiRecorder) heartbeatWaits(id int64) []int {
	var waits []int
	for _, r := range a.heartbeats(id) {
		waits = append(waits, waitSeconds(r))
	}
	return waits
}

// waitSeconds is the wait_seconds of a heartbeat, -1 for one without.
func waitSeconds(r recorded) int {
	w, ok := r.body["wait_seconds"].(float64)
	if !ok {
		return -1
	}
	return int(w)
}

// String lists the requests, for a failure's message.
func (a *apiRecorder) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var sb strings.Builder
	for _, r := range a.requests {
		fmt.Fprintf(&sb, "%s %s?%s %v\n", r.method, r.path, r.query, r.body)
	}
	return sb.String()
}

// goScript waits for the file go, then prints done.
const goScript = `while [ ! -e "$1/go" ]; do sleep 0.02; done; echo '"done"'`

// TestWorkHeldHeartbeats: while CMD runs, the worker polls nothing: the
// task's heartbeats are held ones, the first right after the claim, each
// waiting on the server its interval in whole seconds (17 s for a TTL of
// 60 s and a kill grace of 1 s), and it sends no other request until CMD
// ends and the task is completed.
func TestWorkHeldHeartbeats(t *testing.T) {
	t.Parallel()
	r, _ := workReplica(t)
	api := newAPIRecorder(t, r.url, "")
	log := newShellLog(t)
	w := startWork(t, api.url, append([]string{"--kind", "held", "--kill-grace", "1s"}, log.sh(goScript)...)...)
	tk := addTask(t, r, `{"kind":"held","task_data":{},"ttl_seconds":60}`)
	waitUntil(t, "a heartbeat of the task", func() bool { return len(api.heartbeatWaits(tk.ID)) > 0 }, api, w.logs)
	log.touch(t, "go")
	if got := finished(t, r, tk.ID, api, w.logs); got.State != task.StateDone {
		t.Fatalf("the task: %s (%s), want done", got.State, got.LastError)
	}
	stopping := time.Now()
	if err := w.stop(t); err != nil {
		t.Errorf("leasehold work after its shutdown: got %v, want nil", err)
	}
	for _, wait := range api.heartbeatWaits(tk.ID) {
		if wait != 17 {
			t.Errorf("a heartbeat with wait_seconds %d; want every one held 17 s\n%s", wait, api)
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	for _, req := range api.requests {
		switch {
		case req.method != http.MethodGet:
		case req.at.After(stopping) && req.path == "/api/tasks" && strings.Contains(req.query, "state=running"):
			// the shutdown's one look for a task claimed as it cut the claim off
		default:
			t.Errorf("the worker sent %s %s?%s; want no polling, only claims, heartbeats and the completion", req.method, req.path, req.query)
		}
	}
}

// TestWorkOldServer: a server that refuses wait_seconds on heartbeats (a
// release before held heartbeats) still keeps the worker's tasks alive: the
// worker says so once and heartbeats without it, at the interval, and the
// task runs past its TTL to its completion.
func TestWorkOldServer(t *testing.T) {
	t.Parallel()
	r, _ := workReplica(t)
	api := newAPIRecorder(t, r.url, "old")
	log := newShellLog(t)
	w := startWork(t, api.url, append([]string{"--kind", "old", "--kill-grace", "0s"}, log.sh(goScript)...)...)
	// TTL 4 s: heartbeats every 1.2 s, a held one would wait 1 s.
	tk := addTask(t, r, `{"kind":"old","task_data":{},"ttl_seconds":4}`)
	plain := func() int {
		n := 0
		for _, wait := range api.heartbeatWaits(tk.ID) {
			if wait == -1 {
				n++
			}
		}
		return n
	}
	// Past the TTL: the plain heartbeats kept the lease.
	waitUntil(t, "four plain heartbeats", func() bool { return plain() >= 4 }, api, w.logs)
	log.touch(t, "go")
	if got := finished(t, r, tk.ID, api, w.logs); got.State != task.StateDone || got.Attempts != 1 {
		t.Fatalf("the task: %s after %d attempts (%s), want done in its first", got.State, got.Attempts, got.LastError)
	}
	if err := w.stop(t); err != nil {
		t.Errorf("leasehold work after its shutdown: got %v, want nil", err)
	}
	if n := strings.Count(w.logs.String(), "the service does not take wait_seconds on heartbeats"); n != 1 {
		t.Errorf("the worker said %d times that the server does not hold heartbeats; want once\n%s", n, w.logs)
	}
	if held := len(api.heartbeatWaits(tk.ID)) - plain(); held != 1 {
		t.Errorf("%d heartbeats with wait_seconds; want one, the first, refused\n%s", held, api)
	}
}

// TestWorkHeldHeartbeatAnsweredEarly: held heartbeats answered early, as
// a replica that shuts down answers them, are not sent in a loop: the next
// goes no sooner than worker.HeldHeartbeatGap after the last was sent. The
// task runs on and is completed.
//
// When the worker sent a heartbeat is not seen here, only when it came,
// which may be any time later on a busy machine; so the gap is bounded
// from what is seen: a heartbeat answered at once (b) that was itself sent
// on the answer to a late one (a) was sent after a was forwarded, so the
// one after it (c) came at least HeldHeartbeatGap after a was forwarded.
// A worker that sent c on b's answer would send it a round trip later.
func TestWorkHeldHeartbeatAnsweredEarly(t *testing.T) {
	t.Parallel()
	r, _ := workReplica(t)
	api := newAPIRecorder(t, r.url, "early")
	log := newShellLog(t)
	w := startWork(t, api.url, append([]string{"--kind", "early", "--kill-grace", "1s"}, log.sh(goScript)...)...)
	tk := addTask(t, r, `{"kind":"early","task_data":{},"ttl_seconds":60}`)
	const n = 6 // two gaps to measure: after the third heartbeat, and after the fifth
	waitUntil(t, fmt.Sprintf("%d heartbeats of the task", n), func() bool { return len(api.heartbeatWaits(tk.ID)) >= n }, api, w.logs)
	log.touch(t, "go")
	if got := finished(t, r, tk.ID, api, w.logs); got.State != task.StateDone {
		t.Fatalf("the task: %s (%s), want done", got.State, got.LastError)
	}
	if err := w.stop(t); err != nil {
		t.Errorf("leasehold work after its shutdown: got %v, want nil", err)
	}
	beats, measured := api.heartbeats(tk.ID), 0
	for i := 2; i < len(beats); i++ {
		a, b, c := beats[i-2], beats[i-1], beats[i]
		if !a.late || b.late || waitSeconds(b) <= 0 {
			continue
		}
		measured++
		if gap := c.at.Sub(a.forwarded); gap < worker.HeldHeartbeatGap {
			t.Errorf("heartbeat %d came %v after heartbeat %d was forwarded, so less than that after heartbeat %d, which was answered at once, was sent; want at least %v\n%s",
				i+1, gap, i-1, i, worker.HeldHeartbeatGap, api)
		}
	}
	if measured == 0 {
		t.Errorf("no heartbeat answered at once followed one answered late; want the gap after one measured\n%s", api)
	}
}

// TestWorkShutdownHandsBackACutClaim: the shutdown cuts off a slot's waiting claim, and the
// server may have claimed a task for it just then, an answer that never arrives. The worker
// looks for such tasks as it stops and hands each back. Here the task is claimed for the
// slot's processor before the worker starts (as the server would have claimed it for the
// cut claim), and the worker is stopped while that slot's claim waits. The look, or the
// hand-back, may meet a replica that fails under it (a 502 that says nothing): the worker
// asks again, rather than leave the task to its lease.
func TestWorkShutdownHandsBackACutClaim(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"", "502-once-list", "502-once-requeue"} {
		t.Run(cmp.Or(mode, "answered"), func(t *testing.T) {
			t.Parallel()
			r, db := workReplica(t)
			rec := newAPIRecorder(t, r.url, mode)
			created := addTask(t, r, `{"kind":"cut","task_data":{}}`)
			held := call[task.Task](t, r, "POST", "/api/tasks/next", `{"processor":"cutter/w1","kinds":["cut"]}`, http.StatusOK)
			if held.ID != created.ID {
				t.Fatalf("claimed task %d, want %d", held.ID, created.ID)
			}
			w := startWork(t, rec.url, "--processor", "cutter", "--concurrency", "1", "--kind", "cut", "--", "true")
			waitUntil(t, "the slot's claim to wait on the server", func() bool {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				for _, q := range rec.requests {
					if q.path == "/api/tasks/next" && q.body["processor"] == "cutter/w1" {
						return true
					}
				}
				return false
			}, rec, w.logs)
			if err := w.stop(t); err != nil {
				t.Fatalf("leasehold work: %v\n%s", err, w.logs)
			}
			if mode != "" && !rec.failed {
				t.Fatalf("no request was answered 502 (%s)", mode)
			}
			got := getTask(t, r, created.ID)
			if got.State != task.StatePending || got.Attempts != 0 {
				t.Errorf("the task claimed for the cut claim is %s after %d attempts; want pending, the attempt not counted\n%s", got.State, got.Attempts, w.logs)
			}
			if h := history(t, db, created.ID); len(h) != 1 || h[0].Outcome != task.OutcomeRequeued || !strings.Contains(h[0].Error, "stopped as it claimed") {
				t.Errorf("its history: %+v, want the attempt requeued by the shutdown", h)
			}
			if !logged(w.logs, "handing back a task claimed as the stop cut its claim off", "task", float64(created.ID)) {
				t.Errorf("the worker did not say it handed the task back:\n%s", w.logs)
			}
		})
	}
}

// TestWorkHandsBackWhenTheHeartbeatAfterAClaimFails: a claim that waited sends a heartbeat
// before CMD runs. When that heartbeat fails with an answer that says nothing (a 502: it may or
// may not have renewed the lease), CMD does not run and the task goes back at once, rather
// than wait out its lease; the worker then claims it again and runs it.
func TestWorkHandsBackWhenTheHeartbeatAfterAClaimFails(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	api := newAPIRecorder(t, r.url, "502-once")
	w := startWork(t, api.url, "--processor", "hb", "--concurrency", "1", "--kind", "after", "--", "true")
	waitUntil(t, "the worker's claim to wait", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return len(api.requests) > 0
	}, api, w.logs)
	// The claim must have waited a tenth of the task's TTL (2 s) for the heartbeat to be sent:
	// time itself is the condition.
	time.Sleep(300 * time.Millisecond)
	tk := addTask(t, r, `{"kind":"after","task_data":{},"ttl_seconds":2}`)
	got := finished(t, r, tk.ID, api, w.logs)
	if got.State != task.StateDone || got.Attempts != 1 {
		t.Fatalf("the task: %s after %d attempts (%s), want done in 1, the handed-back one not counted", got.State, got.Attempts, got.LastError)
	}
	h := history(t, db, tk.ID)
	if len(h) != 1 || h[0].Outcome != task.OutcomeRequeued || !strings.Contains(h[0].Error, "heartbeat after its claim failed") {
		t.Errorf("its earlier attempts: %+v; want the one handed back as its heartbeat failed\n%s", h, w.logs)
	}
}

// TestWorkRecordsPastTheDeadlineWhileTheLeaseIsLive: a heartbeat renewed the lease but its
// answer was lost, so the worker's local deadline comes while the service still holds the
// lease for it. A completion that could not be recorded before that deadline is asked again
// under its fence, and recorded: the task is done in one attempt, rather than left running
// until its lease lapses and then run again.
func TestWorkRecordsPastTheDeadlineWhileTheLeaseIsLive(t *testing.T) {
	t.Parallel()
	r, db := workReplica(t)
	api := newAPIRecorder(t, r.url, "lost-answers")
	// The task's TTL is 4 s, the worker's grace 2 s (half of it): its deadline is 1.6 s after
	// the claim, and a heartbeat that reached the service holds the lease 4 s past its arrival.
	// The completions fail from the handler's return (0.8 s) until 2.5 s after the first
	// heartbeat: past the deadline, within the lease.
	api.lostFor = 2500 * time.Millisecond
	tk := addTask(t, r, `{"kind":"late","task_data":{},"ttl_seconds":4}`)
	w := startWork(t, api.url, "--processor", "late", "--concurrency", "1", "--kind", "late", "--", "sleep", "0.8")
	got := finished(t, r, tk.ID, api, w.logs)
	if got.State != task.StateDone || got.Attempts != 1 {
		t.Errorf("the task: %s after %d attempts; want done in 1, its completion recorded while the lease was live\n%s", got.State, got.Attempts, w.logs)
	}
	if h := history(t, db, tk.ID); len(h) != 0 {
		t.Errorf("its earlier attempts: %+v; want none", h)
	}
	if beats := api.heartbeats(tk.ID); len(beats) == 0 {
		t.Errorf("no heartbeat was sent: the handler returned before one was due, and the test shows nothing")
	}
	if !strings.Contains(w.logs.String(), "retrying while its lease could be live") {
		t.Errorf("the worker did not retry the completion:\n%s", w.logs)
	}
}
