// Package examples_test builds and runs the example programs of examples/,
// each a module of its own that imports leasehold as any program would
// (with a replace to this checkout), against a real PostgreSQL.
package examples_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// giveUp bounds every wait, only so that a broken test fails instead of
// hanging.
const giveUp = time.Minute

// libraryNeeds is every module a program that imports leasehold may gain in
// its go.mod: the library's own dependencies (the cron parser for
// schedules among them), nothing of leasehold's tools or tests.
var libraryNeeds = []string{
	"github.com/leasehold/leasehold", "github.com/jackc/pgx/v5", "github.com/jackc/pgpassfile",
	"github.com/jackc/pgservicefile", "github.com/jackc/pgxlisten", "github.com/jackc/puddle/v2",
	"github.com/rs/zerolog", "github.com/mattn/go-colorable", "github.com/mattn/go-isatty",
	"github.com/robfig/cron/v3", "golang.org/x/sync", "golang.org/x/sys", "golang.org/x/text",
}

// build builds the example module in dir into a binary and checks that its
// go.mod requires only what the library needs.
func build(t *testing.T, dir string) string {
	t.Helper()
	edit := exec.Command("go", "mod", "edit", "-json")
	edit.Dir = dir
	raw, err := edit.Output()
	if err != nil {
		t.Fatalf("read %s/go.mod: %v", dir, err)
	}
	var mf struct {
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(raw, &mf); err != nil {
		t.Fatal(err)
	}
	for _, r := range mf.Require {
		if !slices.Contains(libraryNeeds, r.Path) {
			t.Errorf("%s/go.mod requires %s, which the library should not need", dir, r.Path)
		}
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s as a module of its own: %v\n%s", dir, err, out)
	}
	return bin
}

// replica is a running example process and the lines it printed.
type replica struct {
	name  string
	cmd   *exec.Cmd
	addr  string
	lines chan string
}

func start(t *testing.T, bin, dbURL, name string, args ...string) *replica {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-id", name}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, lines: make(chan string, 256)}
	go func() {
		defer close(r.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			r.lines <- s.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := r.expect(t, "listening on ")
	r.addr = strings.Fields(strings.TrimPrefix(line, "listening on "))[0]
	return r
}

func (r *replica) expect(t *testing.T, prefix string) string {
	t.Helper()
	timer := time.NewTimer(giveUp)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				t.Fatalf("%s exited before printing %q", r.name, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timer.C:
			t.Fatalf("%s did not print %q within %s", r.name, prefix, giveUp)
		}
	}
}

func post(t *testing.T, r *replica, body string) int {
	t.Helper()
	resp, err := http.Post("http://"+r.addr+"/signup", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSignup runs two replicas of the signup example: every signup gets its
// welcome email exactly once, whichever replica took it; a signup that
// fails inserts no task; the nightly job runs on the elected replica only,
// and moves to the other, under a greater fence, when it is killed.
func TestSignup(t *testing.T) {
	t.Parallel()
	bin := build(t, "signup")
	db := pgtest.New(t)
	a := start(t, bin, db.URL, "a", "-nightly-every", "100ms")
	b := start(t, bin, db.URL, "b", "-nightly-every", "100ms")
	const n = 20
	for i := range n {
		r := []*replica{a, b}[i%2]
		if status := post(t, r, fmt.Sprintf(`{"email": "user%d@example.com"}`, i)); status != http.StatusCreated {
			t.Fatalf("signup %d on %s: %d", i, r.name, status)
		}
	}
	if status := post(t, a, `{"email": "user3@example.com"}`); status != http.StatusConflict {
		t.Fatalf("a second signup of one email: %d, want 409", status)
	}
	if status := post(t, b, `{"mail": 1}`); status != http.StatusBadRequest {
		t.Fatalf("a bad signup: %d, want 400", status)
	}
	ctx := t.Context()
	deadline := time.Now().Add(giveUp)
	for {
		var sent, users, tasks int
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sent_emails), (SELECT count(*) FROM users),
			(SELECT count(*) FROM tasks WHERE kind = 'welcome_email')`).Scan(&sent, &users, &tasks); err != nil {
			t.Fatal(err)
		}
		if users != n || tasks != n {
			t.Fatalf("%d users, %d welcome tasks; want %d of each (the failed signup inserted neither)", users, tasks, n)
		}
		if sent == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d welcome emails sent within %s", sent, n, giveUp)
		}
		time.Sleep(50 * time.Millisecond) // a harness's poll of the database
	}
	var by []string
	rows, err := db.Pool.Query(ctx, `SELECT DISTINCT split_part(sent_by, '/', 1) FROM sent_emails ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		by = append(by, s)
	}
	t.Logf("welcome emails sent by %v", by)

	// The leader's nightly runs, all under its fence; kill it.
	leader, other := a, b
	var (
		holder string
		fence  int64
	)
	if err := db.Pool.QueryRow(ctx, `SELECT holder, fence FROM leases WHERE resource = 'signup:nightly'`).Scan(&holder, &fence); err != nil {
		t.Fatal(err)
	}
	if holder == "b" {
		leader, other = b, a
	}
	leader.expect(t, "leading the nightly job")
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	line := other.expect(t, "leading the nightly job under fence ")
	var next int64
	if _, err := fmt.Sscanf(line, "leading the nightly job under fence %d", &next); err != nil || next <= fence {
		t.Fatalf("%s took over with %q; want a fence above %d", other.name, line, fence)
	}
	// The new leader says so before its first run has committed: wait for
	// that run.
	for deadline := time.Now().Add(giveUp); ; {
		var runs int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM nightly_runs WHERE fence = $1`, next).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no nightly run under %s's fence %d within %s", other.name, next, giveUp)
		}
		time.Sleep(50 * time.Millisecond) // a harness's poll of the database
	}
	// Each fence's runs are one replica's, and fences only grow with time.
	rows, err = db.Pool.Query(ctx, `SELECT fence, run_by FROM nightly_runs ORDER BY run_at`)
	if err != nil {
		t.Fatal(err)
	}
	runBy := map[int64]string{}
	var last int64
	for rows.Next() {
		var f int64
		var who string
		if err := rows.Scan(&f, &who); err != nil {
			t.Fatal(err)
		}
		if prev, ok := runBy[f]; ok && prev != who {
			t.Errorf("fence %d ran on %s and %s", f, prev, who)
		}
		if f < last {
			t.Errorf("a run under fence %d came after one under %d", f, last)
		}
		runBy[f], last = who, f
	}
	if len(runBy) < 2 {
		t.Errorf("nightly runs under %d fences; want the leader's and its successor's", len(runBy))
	}
}

// TestHello runs the README's "Use it from Go", checking first that the
// README shows hello's code as it is.
func TestHello(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join("hello", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "// README begins\n")
	excerpt, _, ok2 := strings.Cut(rest, "// README ends\n")
	if !ok || !ok2 {
		t.Fatal("hello/main.go has lost its README markers")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if block := "```go\n" + strings.TrimSpace(excerpt) + "\n```\n"; !strings.Contains(string(readme), block) {
		t.Errorf("README.md does not show examples/hello/main.go between its README markers as it is; copy it over:\n%s", block)
	}

	bin := build(t, "hello")
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), giveUp)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hello: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "hello, world (attempt 1, fence ") {
		t.Errorf("hello printed %q", out)
	}
	var state string
	if err := db.Pool.QueryRow(t.Context(), `SELECT state FROM tasks WHERE kind = 'hello'`).Scan(&state); err != nil || state != "done" {
		t.Errorf("the hello task is %q (%v), want done", state, err)
	}
}
