package examples_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// lineLog collects a process's output, line by line, for a test to wait on.
type lineLog struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
	changed chan struct{} // closed and replaced at every new line
}

func newLineLog() *lineLog { return &lineLog{changed: make(chan struct{})} }

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

// snapshot returns the lines so far and a channel closed at the next one.
func (l *lineLog) snapshot() ([]string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[:len(l.lines):len(l.lines)], l.changed
}

// waitFor returns the first line that match accepts, failing the test when
// none comes within giveUp.
func (l *lineLog) waitFor(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(giveUp)
	defer timer.Stop()
	for {
		lines, changed := l.snapshot()
		for _, line := range lines {
			if match(line) {
				return line
			}
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("no %s within %s", what, giveUp)
		}
	}
}

func (l *lineLog) String() string {
	lines, _ := l.snapshot()
	return strings.Join(lines, "\n")
}

// cleanEnv is the test's environment without what would configure
// leasehold or send loopback requests through a proxy.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "LEASEHOLD_") || name == "DATABASE_URL" || strings.HasSuffix(strings.ToLower(name), "_proxy") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// proc is a process the test started.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lineLog // stdout and stderr
	done chan struct{}
	err  error // what Wait returned, once done is closed
}

func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, out: newLineLog(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			lines, _ := p.out.snapshot()
			if len(lines) > 200 {
				lines = lines[len(lines)-200:]
			}
			t.Logf("%s's output (the last %d lines):\n%s", name, len(lines), strings.Join(lines, "\n"))
		}
	})
	return p
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// wait returns what Wait returned, failing the test when the process is
// still running after within.
func (p *proc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s still running %s after SIGTERM", p.name, within)
	}
	return p.err
}

// stop sends SIGTERM and waits, as wait does.
func (p *proc) stop(t *testing.T, within time.Duration) error {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	return p.wait(t, within)
}

// api is a client of a leasehold replica's REST API.
type api struct {
	url, token string
	client     *http.Client
}

// do sends body (unless nil) as JSON and decodes the answer into out
// (unless nil); it returns the status.
func (a api) do(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, a.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

// apiTask is what the test reads of a task.
type apiTask struct {
	ID              int64           `json:"id"`
	Kind            string          `json:"kind"`
	State           string          `json:"state"`
	Processor       *string         `json:"processor"`
	Attempts        int             `json:"attempts"`
	TaskOutput      json.RawMessage `json:"task_output"`
	LastError       *string         `json:"last_error"`
	LastHeartbeatAt *string         `json:"last_heartbeat_at"`
}

func (a api) task(t *testing.T, id int64) apiTask {
	t.Helper()
	var got apiTask
	if status := a.do(t, http.MethodGet, fmt.Sprintf("/api/tasks/%d", id), nil, &got); status != http.StatusOK {
		t.Fatalf("GET /api/tasks/%d: %d", id, status)
	}
	return got
}

// waitTasks polls the tasks until done accepts them all.
func (a api) waitTasks(t *testing.T, what string, ids []int64, done func(apiTask) bool) map[int64]apiTask {
	t.Helper()
	deadline := time.Now().Add(giveUp)
	for {
		got := map[int64]apiTask{}
		for _, id := range ids {
			if tk := a.task(t, id); done(tk) {
				got[id] = tk
			}
		}
		if len(got) == len(ids) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks %s within %s", len(got), len(ids), what, giveUp)
		}
		time.Sleep(50 * time.Millisecond) // a harness's poll of the API
	}
}

// serveReplica builds leasehold and runs one replica, with an API token, on
// the database at dbURL; it returns once /readyz answers 200.
func serveReplica(t *testing.T, dbURL, token string) (*proc, api) {
	t.Helper()
	bin := testkit.Leasehold(t)
	// Only the API: serve's own workers run the sleep kind, and no other.
	// At debug level, the log says when a claim starts to wait.
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--instance", "workers-test", "--roles", "api",
		"--log-level", "debug")
	cmd.Env = cleanEnv("DATABASE_URL="+dbURL, "LEASEHOLD_API_TOKEN="+token)
	cmd.WaitDelay = 10 * time.Second
	p := startProc(t, "leasehold serve", cmd)
	var addr string
	p.out.waitFor(t, `"serving" in the replica's log`, func(line string) bool {
		var l struct{ Message, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "serving" {
			addr = l.Addr
			return true
		}
		return false
	})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	a := api{url: "http://" + addr, token: token, client: client}
	deadline := time.Now().Add(giveUp)
	for a.do(t, http.MethodGet, "/readyz", nil, nil) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("leasehold serve not ready within %s", giveUp)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, a
}

// workerLine is a line a worker prints when it is done with a task.
var workerLine = regexp.MustCompile(`^task (\d+) \((\w+), fence \d+\): (done|failed|lease lost)`)

// outcomes returns, by task id, what a worker printed it did with each
// task.
func outcomes(l *lineLog) map[int64][]string {
	lines, _ := l.snapshot()
	got := map[int64][]string{}
	for _, line := range lines {
		if m := workerLine.FindStringSubmatch(line); m != nil {
			id, _ := strconv.ParseInt(m[1], 10, 64) // digits, by the pattern
			got[id] = append(got[id], m[3])
		}
	}
	return got
}

// exampleWorker is one of the example workers, as the test runs it.
type exampleWorker struct {
	lang, interpreter, script string
	install                   string // what provides the interpreter
	proc                      *proc
	processor                 string
}

// start runs the worker (a new process) against the replica and returns
// once its first claim waits for a task, as the replica's log says.
func (w *exampleWorker) start(t *testing.T, server *proc, a api) {
	t.Helper()
	cmd := exec.Command(w.interpreter, w.script)
	cmd.Env = cleanEnv("LEASEHOLD_URL="+a.url, "LEASEHOLD_API_TOKEN="+a.token, "LEASEHOLD_KINDS=greet")
	w.proc = startProc(t, w.lang+" worker", cmd)
	line := w.proc.out.waitFor(t, w.lang+" worker's first line", func(line string) bool { return strings.HasPrefix(line, "worker ") })
	if _, err := fmt.Sscanf(line, "worker %s claiming greet from "+a.url, &w.processor); err != nil {
		t.Fatalf("%s worker's first line %q: %v", w.lang, line, err)
	}
	server.out.waitFor(t, w.processor+"'s claim waiting", func(line string) bool {
		var l struct{ Message, Processor string }
		return json.Unmarshal([]byte(line), &l) == nil && l.Message == "claim waits for a task" && l.Processor == w.processor
	})
}

// TestWorkers runs the Python and the Node example workers against a real
// replica, both at once on one queue: every task is completed once, by one
// of them, with the handler's output; a failing handler's task dies with
// its error; a cancelled task's worker lets go of it and reports nothing;
// a long task stays held by its heartbeats; SIGTERM lets the task in hand
// finish, and ends a waiting worker at once, exit status 0 both.
func TestWorkers(t *testing.T) {
	t.Parallel()
	workers := []*exampleWorker{
		{lang: "Python", interpreter: "python3", script: filepath.Join("python", "worker.py"), install: "python3"},
		{lang: "Node", interpreter: "node", script: filepath.Join("node", "worker.mjs"), install: "Node 18+ (Debian: apt-get install nodejs)"},
	}
	for _, w := range workers {
		if _, err := exec.LookPath(w.interpreter); err != nil {
			t.Skipf("%s not found on PATH: install %s to run the %s worker example", w.interpreter, w.install, w.lang)
		}
	}
	db := pgtest.New(t)
	const token = "workers-test-token"
	server, a := serveReplica(t, db.URL, token)

	// Both workers wait for a task before there is one: the first tasks go
	// one to each.
	for _, w := range workers {
		w.start(t, server, a)
	}

	type newTask struct {
		Kind        string         `json:"kind"`
		TaskData    map[string]any `json:"task_data"`
		TTLSeconds  int            `json:"ttl_seconds"`
		MaxAttempts int            `json:"max_attempts,omitempty"`
	}
	const good = 20
	var batch []newTask
	for i := range good {
		batch = append(batch, newTask{Kind: "greet", TTLSeconds: 3, TaskData: map[string]any{"name": fmt.Sprintf("user%d", i), "seconds": 0.1}})
	}
	batch = append(batch,
		newTask{Kind: "greet", TTLSeconds: 3, MaxAttempts: 1, TaskData: map[string]any{"name": "x", "fail": true}},
		// Longer than its TTL: only its heartbeats keep it.
		newTask{Kind: "greet", TTLSeconds: 2, TaskData: map[string]any{"name": "slow", "seconds": 4}},
		// Cancelled while it runs.
		newTask{Kind: "greet", TTLSeconds: 2, TaskData: map[string]any{"name": "never", "seconds": 120}},
	)
	var inserted []apiTask
	if status := a.do(t, http.MethodPost, "/api/tasks", batch, &inserted); status != http.StatusCreated || len(inserted) != len(batch) {
		t.Fatalf("POST /api/tasks: %d, %d tasks; want 201 and %d", status, len(inserted), len(batch))
	}
	ids := make([]int64, len(inserted))
	for i, tk := range inserted {
		ids[i] = tk.ID
	}
	failing, slow, cancelled := ids[good], ids[good+1], ids[good+2]

	held := a.waitTasks(t, "running", []int64{cancelled}, func(tk apiTask) bool { return tk.State == "running" })[cancelled]
	if status := a.do(t, http.MethodPost, fmt.Sprintf("/api/tasks/%d/cancel", cancelled), map[string]string{"reason": "no longer needed"}, nil); status != http.StatusAccepted {
		t.Fatalf("cancel task %d: %d, want 202", cancelled, status)
	}
	final := a.waitTasks(t, "done, dead or cancelled", ids, func(tk apiTask) bool {
		return tk.State == "done" || tk.State == "dead" || tk.State == "cancelled"
	})
	// A cancelled task's holder hears of it at its next heartbeat.
	holder := workers[0]
	if *held.Processor == workers[1].processor {
		holder = workers[1]
	}
	holder.proc.out.waitFor(t, fmt.Sprintf("'lease lost' for the cancelled task %d from the %s worker", cancelled, holder.lang), func(line string) bool {
		return strings.HasPrefix(line, fmt.Sprintf("task %d ", cancelled)) && strings.Contains(line, "lease lost")
	})

	byWorker := map[int64][]string{} // what the workers printed, by task, "lang:outcome"
	count := map[string]int{}
	for _, w := range workers {
		for id, outs := range outcomes(w.proc.out) {
			for _, o := range outs {
				byWorker[id] = append(byWorker[id], w.lang+":"+o)
				if o == "done" {
					count[w.lang]++
				}
			}
		}
	}
	t.Logf("tasks completed: %v", count)
	for i, id := range ids[:good] {
		tk := final[id]
		want := fmt.Sprintf(`{"greeting":"hello, user%d"}`, i)
		if tk.State != "done" || compactJSON(tk.TaskOutput) != want {
			t.Errorf("task %d: %s with output %s; want done with %s", id, tk.State, tk.TaskOutput, want)
		}
		if done := countOf(byWorker[id], ":done"); done != 1 {
			t.Errorf("task %d: the workers printed %v; want it completed exactly once", id, byWorker[id])
		}
	}
	for _, w := range workers {
		if count[w.lang] == 0 {
			t.Errorf("the %s worker completed no task; both waited when the tasks came, so each should have had some", w.lang)
		}
	}
	if tk := final[failing]; tk.State != "dead" || tk.LastError == nil || *tk.LastError != "the task asked to fail" || tk.Attempts != 1 {
		t.Errorf("failing task %d: %+v (last_error %v); want dead after 1 attempt with last_error %q", failing, tk, deref(tk.LastError), "the task asked to fail")
	}
	if tk := final[slow]; tk.State != "done" || tk.Attempts != 1 || tk.LastHeartbeatAt == nil || compactJSON(tk.TaskOutput) != `{"greeting":"hello, slow"}` {
		t.Errorf("slow task %d: %+v; want done in its first attempt, kept by heartbeats, greeting slow", slow, tk)
	}
	if tk := final[cancelled]; tk.State != "cancelled" || countOf(byWorker[cancelled], ":done") != 0 || countOf(byWorker[cancelled], ":failed") != 0 {
		t.Errorf("cancelled task %d: %s, the workers printed %v; want cancelled, and nothing reported", cancelled, tk.State, byWorker[cancelled])
	}

	// SIGTERM to a worker with a task in hand: it finishes the task,
	// reports it and exits 0. Both wait, so the two tasks go one to each.
	var last []apiTask
	if status := a.do(t, http.MethodPost, "/api/tasks", []newTask{
		{Kind: "greet", TTLSeconds: 3, TaskData: map[string]any{"name": "last0", "seconds": 1.5}},
		{Kind: "greet", TTLSeconds: 3, TaskData: map[string]any{"name": "last1", "seconds": 1.5}},
	}, &last); status != http.StatusCreated || len(last) != 2 {
		t.Fatalf("POST /api/tasks: %d, %d tasks; want 201 and 2", status, len(last))
	}
	lastIDs := []int64{last[0].ID, last[1].ID}
	running := a.waitTasks(t, "running at once, one in each worker", lastIDs, func(tk apiTask) bool { return tk.State == "running" })
	// The server counts a task running once it is claimed; the worker has
	// it in hand only when the answer has reached it, and says so.
	for _, w := range workers {
		w.proc.out.waitFor(t, w.lang+" worker's word that it started one of the last tasks", func(line string) bool {
			return strings.HasSuffix(line, ": started") &&
				(strings.HasPrefix(line, fmt.Sprintf("task %d ", lastIDs[0])) || strings.HasPrefix(line, fmt.Sprintf("task %d ", lastIDs[1])))
		})
	}
	for _, w := range workers {
		w.proc.signal(t, syscall.SIGTERM)
	}
	for _, w := range workers {
		if err := w.proc.wait(t, giveUp); err != nil {
			t.Errorf("%s worker, stopped with a task in hand: %v; want exit status 0", w.lang, err)
		}
		w.proc.out.waitFor(t, w.lang+" worker's word that it finishes its task", func(line string) bool {
			return line == "stopping: finishing the task in hand first"
		})
	}
	for i, id := range lastIDs {
		tk := a.task(t, id)
		if want := fmt.Sprintf(`{"greeting":"hello, last%d"}`, i); tk.State != "done" || compactJSON(tk.TaskOutput) != want ||
			*tk.Processor != *running[id].Processor {
			t.Errorf("task %d, in hand at SIGTERM: %+v; want done by %s with %s", id, tk, *running[id].Processor, want)
		}
	}

	// SIGTERM to a worker waiting for a task ends the wait at once, well
	// before its 30 s, exit status 0.
	for _, w := range workers {
		w.start(t, server, a)
		if err := w.proc.stop(t, 10*time.Second); err != nil {
			t.Errorf("%s worker, stopped while waiting for a task: %v; want exit status 0", w.lang, err)
		}
	}
	for _, w := range workers {
		if lines, _ := w.proc.out.snapshot(); lines[len(lines)-1] != "stopped" {
			t.Errorf("%s worker's last line: %q; want %q", w.lang, lines[len(lines)-1], "stopped")
		}
	}
}

func countOf(outs []string, suffix string) int {
	n := 0
	for _, o := range outs {
		if strings.HasSuffix(o, suffix) {
			n++
		}
	}
	return n
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
