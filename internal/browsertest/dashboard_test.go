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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/leasehold/leasehold/internal/pgtest"
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
	r := startReplica(t, buildLeasehold(t), db.URL)
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

	measureCommitToDOM(ctx, t, r, 50)

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
	r := startReplica(t, buildLeasehold(t), db.URL, "--api-token", token, "--roles", "api")
	ctx := newBrowser(t, chromium)

	step(ctx, t, "the sign-in box",
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#signin`)),
		waitTrue(`document.getElementById("connection").textContent === "disconnected"`))
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
		chromedp.WaitVisible(chromedp.CSS(`tr[data-resource="instance:browser-test"]`)))
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
		t.Fatalf("waiting for %s: %v", what, err)
	}
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

// buildLeasehold builds the leasehold command into a temporary directory.
func buildLeasehold(t *testing.T) string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build leasehold with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "leasehold")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gocmd, "build", "-o", bin, "github.com/leasehold/leasehold/cmd/leasehold").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// replica is a `leasehold serve` child process.
type replica struct {
	url    string
	client *http.Client
}

// startReplica runs `leasehold serve` on a free port of 127.0.0.1 with the
// database at dbURL and any further flags in args, and returns once it is
// ready. It stops (SIGTERM) when
// the test ends; its log is printed when the test failed.
func startReplica(t *testing.T, bin, dbURL string, args ...string) *replica {
	t.Helper()
	args = append([]string{"serve", "--addr", "127.0.0.1:0", "--database-url", dbURL,
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
