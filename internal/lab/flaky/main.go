// Command flaky runs the tests of some packages many times, each run while
// a second copy of the whole suite runs beside it for load, and prints how
// often each test failed: the proof that a suite passes every time, or the
// list of what does not.
//
//	go run ./internal/lab/flaky [-runs 10] [-load=true] [-timeout 30m] [packages]
//
// (go tool task flaky, with PKGS and RUNS.) The packages default to the
// soak, the command and the library: ./internal/lab/chaos ./cmd/leasehold .
// Each run is `go test -race -count=1 -json` of one package, the packages
// taking turns. The load is `go test -race -count=1 ./...` of the module,
// again and again until the last run ends; its own failures are reported
// apart (each as it comes, with the lines that say why), since a test that
// fails under load fails there too. It exits 1 when a run failed.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	runs := flag.Int("runs", 10, "runs of each package")
	load := flag.Bool("load", true, "run a second copy of the suite beside, for load")
	timeout := flag.Duration("timeout", 30*time.Minute, "go test's -timeout of each run")
	flag.Parse()
	pkgs := flag.Args()
	if len(pkgs) == 0 {
		pkgs = []string{"./internal/lab/chaos", "./cmd/leasehold", "."}
	}
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "flaky: -runs must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, pkgs, *runs, *load, *timeout)
	stop()
	os.Exit(code)
}

// result is what became of one test over the runs.
type result struct {
	pkg, test string
	passed    int
	failed    int
	first     string // the output of its first failure
}

func run(ctx context.Context, pkgs []string, runs int, load bool, timeout time.Duration) int {
	// What the tests keep for go test -artifacts (a failed soak's whole
	// logs), one directory per run.
	artifacts, err := os.MkdirTemp("", "flaky-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "flaky:", err)
		return 1
	}
	fmt.Printf("flaky: the tests' artifacts (a failed soak keeps its processes' logs) go to %s\n", artifacts)
	started := time.Now()
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadRuns loadStats
	var wg sync.WaitGroup
	if load {
		wg.Go(func() { loadRuns.loop(loadCtx) })
	}
	results := map[string]*result{}
	var (
		failedRuns []string
		walls      = map[string][]time.Duration{}
	)
	for i := 1; i <= runs && ctx.Err() == nil; i++ {
		for _, pkg := range pkgs {
			t0 := time.Now()
			out := filepath.Join(artifacts, fmt.Sprintf("%s-run%d", strings.NewReplacer("/", "_", ".", "_").Replace(pkg), i))
			if err := os.MkdirAll(out, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, "flaky:", err)
			}
			ok, err := testOnce(ctx, pkg, timeout, out, results)
			walls[pkg] = append(walls[pkg], time.Since(t0))
			status := "ok"
			switch {
			case err != nil:
				status = "error: " + err.Error()
				failedRuns = append(failedRuns, fmt.Sprintf("%s run %d: %v", pkg, i, err))
			case !ok:
				status = "FAIL"
				failedRuns = append(failedRuns, fmt.Sprintf("%s run %d", pkg, i))
			}
			fmt.Printf("flaky: run %d/%d of %s: %s in %s (load: %s)\n", i, runs, pkg, status,
				time.Since(t0).Round(time.Second), loadRuns.String())
		}
	}
	stopLoad()
	wg.Wait()

	fmt.Printf("\nflaky: %d run(s) of each of %s in %s, beside %s\n", runs, strings.Join(pkgs, " "),
		time.Since(started).Round(time.Second), loadRuns.String())
	for _, pkg := range pkgs {
		fmt.Printf("  %s: wall time per run %s\n", pkg, spread(walls[pkg]))
	}
	loadRuns.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(loadRuns.failed)) {
		fmt.Printf("  in the load: %s failed in %d run(s)\n", name, loadRuns.failed[name])
	}
	loadRuns.mu.Unlock()
	var flaky []*result
	for _, r := range results {
		if r.failed > 0 {
			flaky = append(flaky, r)
		}
	}
	sort.Slice(flaky, func(i, j int) bool {
		if flaky[i].pkg != flaky[j].pkg {
			return flaky[i].pkg < flaky[j].pkg
		}
		return flaky[i].test < flaky[j].test
	})
	tests := 0
	for _, r := range results {
		if !strings.Contains(r.test, "/") {
			tests++
		}
	}
	fmt.Printf("  %d top-level tests, %d failed run(s)\n", tests, len(failedRuns))
	if len(flaky) == 0 && len(failedRuns) == 0 {
		fmt.Println("  every test passed every run")
		return 0
	}
	for _, r := range flaky {
		fmt.Printf("\n  FAILED %d of %d: %s %s\n", r.failed, r.failed+r.passed, r.pkg, r.test)
		for line := range strings.Lines(tail(r.first, 40)) {
			fmt.Print("    " + line)
		}
	}
	for _, f := range failedRuns {
		fmt.Println("  failed run:", f)
	}
	return 1
}

// telling returns the lines of a test's output that say why it failed (a
// failed check, a checker's finding, a subtest's failure), then its last n
// lines.
func telling(output string, n int) string {
	w := why(output)
	if w != "" {
		w += "... the output's last lines:\n"
	}
	return w + tail(output, n)
}

// why returns the lines of a test's output that say why it failed: a
// failed check, a checker's finding, a subtest's failure.
func why(output string) string {
	var b strings.Builder
	for line := range strings.Lines(output) {
		if strings.Contains(line, "VIOLATION") || strings.Contains(line, "PROBLEM") ||
			strings.Contains(line, "--- FAIL") || strings.Contains(line, "_test.go:") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// event is a line of go test -json.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// testOnce runs the package's tests once and adds each test's outcome to
// results; ok is whether the run passed.
func testOnce(ctx context.Context, pkg string, timeout time.Duration, artifacts string, results map[string]*result) (bool, error) {
	// Each failure is printed as it comes (its output's tail), so that a
	// long session of runs shows what failed without waiting for its end.
	failed := func(pkg, test, output string) {
		fmt.Printf("flaky: FAIL %s %s:\n", pkg, test)
		for line := range strings.Lines(telling(output, 60)) {
			fmt.Print("    " + line)
		}
	}
	return goTest(ctx, results, os.Stderr, failed, "-timeout", timeout.String(), "-artifacts", "-outputdir", artifacts, pkg)
}

// goTest runs go test -race -count=1 -json with args and adds each test's
// outcome to results; ok is whether the run passed. failed, when not nil,
// is called with the output of each test (or package) that failed.
func goTest(ctx context.Context, results map[string]*result, stderr io.Writer, failed func(pkg, test, output string), args ...string) (bool, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"test", "-race", "-count=1", "-json"}, args...)...)
	cmd.Stderr = stderr
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	if err := cmd.Start(); err != nil {
		return false, err
	}
	outputs := map[string]*strings.Builder{}
	pkgFailed := false
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			b := outputs[key]
			if b == nil {
				b = &strings.Builder{}
				outputs[key] = b
			}
			if b.Len() < 256<<10 {
				b.WriteString(e.Output)
			}
		case "pass", "fail":
			if e.Test == "" {
				pkgFailed = pkgFailed || e.Action == "fail"
				if e.Action == "fail" {
					r := entry(results, e.Package, "(package)")
					r.failed++
					if r.first == "" && outputs[key] != nil {
						r.first = outputs[key].String()
					}
					if failed != nil && outputs[key] != nil {
						failed(e.Package, "(package)", outputs[key].String())
					}
				}
				continue
			}
			r := entry(results, e.Package, e.Test)
			if e.Action == "pass" {
				r.passed++
			} else {
				r.failed++
				if r.first == "" && outputs[key] != nil {
					r.first = outputs[key].String()
				}
				if failed != nil && outputs[key] != nil {
					failed(e.Package, e.Test, outputs[key].String())
				}
			}
		}
	}
	werr := cmd.Wait()
	var exitErr *exec.ExitError
	if werr != nil && !errors.As(werr, &exitErr) {
		return false, werr
	}
	return !pkgFailed && werr == nil, nil
}

func entry(results map[string]*result, pkg, test string) *result {
	key := pkg + " " + test
	r := results[key]
	if r == nil {
		r = &result{pkg: pkg, test: test}
		results[key] = r
	}
	return r
}

// loadStats counts the load's runs of the suite.
type loadStats struct {
	mu       sync.Mutex
	runs     int
	failures int
	running  bool
	failed   map[string]int // test → failed runs
}

func (l *loadStats) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == 0 && !l.running {
		return "no load"
	}
	return fmt.Sprintf("%d load run(s) of the suite done, %d failed", l.runs, l.failures)
}

// loop runs the whole suite again and again until ctx ends; the run under
// way when it ends is stopped and not counted.
func (l *loadStats) loop(ctx context.Context) {
	for ctx.Err() == nil {
		l.mu.Lock()
		l.running = true
		l.mu.Unlock()
		results := map[string]*result{}
		// A failure of the load is said as it comes, briefly (the lines
		// that say why): the same test may fail there first.
		failed := func(pkg, test, output string) {
			var b strings.Builder
			fmt.Fprintf(&b, "flaky: FAIL in the load: %s %s:\n", pkg, test)
			for line := range strings.Lines(why(output)) {
				b.WriteString("    " + line)
			}
			fmt.Print(b.String())
		}
		ok, _ := goTest(ctx, results, io.Discard, failed, "./...")
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		l.runs++
		if !ok {
			l.failures++
		}
		if l.failed == nil {
			l.failed = map[string]int{}
		}
		for _, r := range results {
			if r.failed > 0 {
				l.failed[r.pkg+" "+r.test]++
			}
		}
		l.mu.Unlock()
	}
}

// spread words durations as min–max (median).
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) string { return d.Round(time.Second).String() }
	return fmt.Sprintf("%s–%s (median %s)", r(s[0]), r(s[len(s)-1]), r(s[len(s)/2]))
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "")
}
