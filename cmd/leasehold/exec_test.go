package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/lease"
)

// The test binary doubles as the processes of these tests: with
// LEASEHOLD_TEST_MAIN=1 in its environment it is leasehold (main), and
// with childArg as its first argument it is a command that leasehold exec
// runs (testChild). exec passes its environment on to its command, so the
// child is told apart first.
const childArg = "leasehold-test-child"

func init() {
	if len(os.Args) > 2 && os.Args[1] == childArg {
		os.Exit(testChild(os.Args[2], os.Args[3:]))
	}
	if os.Getenv("LEASEHOLD_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
}

// testChild is a command run by leasehold exec. It appends what happens to
// it to the file log, one line each: "start HOLDER FENCE RESOURCE" first
// (from the environment exec gives it), then per mode:
//
//   - exit=N: exits with status N at once;
//   - kill: kills itself with SIGKILL;
//   - stdin: reads its stdin to the end, logs "end" and exits 0; a SIGTERM
//     or SIGINT is logged as "signal NAME" and ends it with status 5;
//   - ignore-term: the same, except that it logs SIGTERM as "ignored" and
//     goes on reading;
//   - marker=DIR: creates DIR/marker (O_EXCL: logs "overlap" and exits 3
//     if it exists: another child runs), reads its stdin to the end, removes
//     the marker and logs "end";
//   - clocked: as stdin, and logs "began HOLDER NANOS" after the start and
//     "ended HOLDER NANOS" before the end, by its own clock.
func testChild(log string, modes []string) int {
	f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return 100
	}
	defer f.Close()
	record := func(format string, args ...any) {
		_, _ = fmt.Fprintf(f, format+"\n", args...)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	record("start %s %s %s", os.Getenv("LEASEHOLD_HOLDER"), os.Getenv("LEASEHOLD_FENCE"), os.Getenv("LEASEHOLD_RESOURCE"))
	mode, arg, _ := strings.Cut(modes[0], "=")
	var marker string
	holder := os.Getenv("LEASEHOLD_HOLDER")
	if mode == "clocked" {
		record("began %s %d", holder, time.Now().UnixNano())
	}
	switch mode {
	case "exit":
		n, _ := strconv.Atoi(arg)
		return n
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "marker":
		marker = filepath.Join(arg, "marker")
		m, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			record("overlap %v", err)
			return 3
		}
		m.Close()
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	for {
		select {
		case <-eof:
			if marker != "" {
				if err := os.Remove(marker); err != nil {
					record("marker gone %v", err)
					return 4
				}
			}
			if mode == "clocked" {
				record("ended %s %d", holder, time.Now().UnixNano())
			}
			record("end")
			return 0
		case s := <-sigs:
			if mode == "ignore-term" && s == syscall.SIGTERM {
				record("ignored %s", s)
				continue
			}
			record("signal %s", s)
			return 5
		}
	}
}

// childLog is the file a test's children write to.
type childLog string

func newChildLog(t *testing.T) childLog { return childLog(filepath.Join(t.TempDir(), "child.log")) }

// lines returns the lines written so far.
func (l childLog) lines() []string {
	b, _ := os.ReadFile(string(l))
	var lines []string
	for line := range strings.Lines(string(b)) {
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
	return lines
}

// has reports whether a line starts with prefix.
func (l childLog) has(prefix string) bool {
	for _, line := range l.lines() {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

func (l childLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// starts returns the start lines as [holder, fence, resource].
func (l childLog) starts() [][]string {
	var out [][]string
	for _, line := range l.lines() {
		f := strings.Split(line, " ")
		if f[0] == "start" && len(f) == 4 {
			out = append(out, f[1:])
		}
	}
	return out
}

// child is the command line of a test child writing to log.
func (l childLog) child(t *testing.T, modes ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{exe, childArg, string(l)}, modes...)
}

// execProc is a "leasehold exec" process.
type execProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	done   chan struct{} // closed when it exited
}

// startExec runs "leasehold exec --url URL args..." as a process of its own.
func startExec(t *testing.T, url string, args ...string) *execProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &execProc{
		cmd:    exec.Command(exe, append([]string{"exec", "--url", url}, args...)...),
		stderr: &syncBuffer{},
		done:   make(chan struct{}),
	}
	// Its configuration is its flags, not whatever LEASEHOLD_* the test runs under.
	environ := []string{"LEASEHOLD_TEST_MAIN=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			environ = append(environ, kv)
		}
	}
	p.cmd.Env = environ
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
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
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("leasehold exec still ran at the end of the test; killed it\noutput:\n%s", p.stderr)
		}
	})
	return p
}

// holder is the default holder of the process: <hostname>-<pid>.
func (p *execProc) holder() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(p.cmd.Process.Pid)
}

// exitCode waits for the process to exit and returns its status.
func (p *execProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second): // keeps a broken test from hanging
		t.Fatalf("leasehold exec did not exit within 60s\noutput:\n%s", p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// wantExit waits for the process to exit with status code, its output
// saying each of want.
func (p *execProc) wantExit(t *testing.T, code int, want ...string) {
	t.Helper()
	if got := p.exitCode(t); got != code {
		t.Errorf("leasehold exec: got exit status %d, want %d\noutput:\n%s", got, code, p.stderr)
	}
	for _, w := range want {
		if !strings.Contains(p.stderr.String(), w) {
			t.Errorf("leasehold exec output: want it to say %q, got:\n%s", w, p.stderr)
		}
	}
}

// pollExec waits until cond holds, for at most 30 s.
func pollExec(t *testing.T, what string, cond func() bool, context ...fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var sb strings.Builder
			for _, c := range context {
				fmt.Fprintf(&sb, "\n%s", c)
			}
			t.Fatalf("waited 30s for %s%s", what, sb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// execReplica starts a replica for the exec tests, logging at debug level
// (which says when an acquisition waits). The rate limit is off, as by
// default: the tests' polling all comes from 127.0.0.1.
func execReplica(t *testing.T) *replica {
	t.Helper()
	db := pgtest.New(t)
	return startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--log-level", "debug"},
		env("DATABASE_URL", db.URL)))
}

// replicaSawWait reports whether the replica logged that holder's acquisition waits.
func replicaSawWait(r *replica, holder string) bool {
	sc := bufio.NewScanner(strings.NewReader(r.logs.String()))
	for sc.Scan() {
		var l struct {
			Message string `json:"message"`
			Holder  string `json:"holder"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "acquisition waits for the lease" && l.Holder == holder {
			return true
		}
	}
	return false
}

// leaseNamed returns the lease of resource through the API.
func (r *replica) leaseNamed(t *testing.T, resource string) cliLease {
	t.Helper()
	all := call[struct {
		Leases []cliLease `json:"leases"`
	}](t, r, "GET", "/api/leases?prefix="+resource, "", http.StatusOK)
	for _, l := range all.Leases {
		if l.Resource == resource {
			return l
		}
	}
	t.Fatalf("no lease on %s", resource)
	return cliLease{}
}

// TestExecMutualExclusion is the test of done: two leasehold exec
// processes started at once on one resource never run their commands at the
// same time. The winner's command holds its marker file while the loser is
// seen waiting for the lease (--wait); once the winner's command is done,
// the loser's runs, woken by the release.
func TestExecMutualExclusion(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	log := newChildLog(t)
	dir := t.TempDir()
	procs := make([]*execProc, 2)
	for i := range procs {
		procs[i] = startExec(t, r.url, append([]string{"--resource", "nightly", "--ttl", "3s", "--grace", "1s", "--wait", "1m", "--"},
			log.child(t, "marker="+dir)...)...)
	}
	byHolder := map[string]*execProc{procs[0].holder(): procs[0], procs[1].holder(): procs[1]}

	pollExec(t, "a command to start", func() bool { return len(log.starts()) > 0 }, log, procs[0].stderr, procs[1].stderr)
	first := log.starts()[0]
	winner := byHolder[first[0]]
	if winner == nil {
		t.Fatalf("the command ran as holder %q, want one of %v", first[0], byHolder)
	}
	loser := procs[0]
	if loser == winner {
		loser = procs[1]
	}
	pollExec(t, "the other exec to wait for the lease", func() bool { return replicaSawWait(r, loser.holder()) }, log, loser.stderr)
	if n := len(log.starts()); n != 1 {
		t.Fatalf("%d commands started while one held the lease, want 1\n%s", n, log)
	}
	// Renewals go on while the command runs: the lease outlives two TTLs
	// (3 s), the winner's all along.
	pollExec(t, "the winner's lease to outlive two TTLs", func() bool {
		l := r.leaseNamed(t, "nightly")
		if l.Holder != winner.holder() || l.State != "active" {
			t.Fatalf("lease while the winner's command runs: got %+v, want the winner's, active", l)
		}
		created, _ := time.Parse(time.RFC3339Nano, l.CreatedAt)
		expires, _ := time.Parse(time.RFC3339Nano, l.ExpiresAt)
		return expires.Sub(created) > 2*3*time.Second
	})
	if err := winner.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	winner.wantExit(t, 0)

	pollExec(t, "the second command to start", func() bool { return len(log.starts()) == 2 }, log, loser.stderr)
	if err := loser.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	loser.wantExit(t, 0)

	want := []string{"start " + winner.holder(), "end", "start " + loser.holder(), "end"}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("children's log:\n%s\nwant %d lines: %q", log, len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("children's log line %d: got %q, want %q ...", i+1, lines[i], w)
		}
	}
	starts := log.starts()
	f1, _ := strconv.ParseInt(starts[0][1], 10, 64)
	f2, _ := strconv.ParseInt(starts[1][1], 10, 64)
	if f1 < 1 || f2 <= f1 || starts[0][2] != "nightly" {
		t.Errorf("LEASEHOLD_FENCE of the commands: %d then %d on %s; want positive and increasing, on nightly", f1, f2, starts[0][2])
	}
	if l := r.leaseNamed(t, "nightly"); l.State != "released" || l.Holder != loser.holder() || l.Fence != f2 {
		t.Errorf("lease after both ran: got %+v, want the second holder's, fence %d, released", l, f2)
	}
}

// TestExecNotWon: while another holder holds the lease, exec exits 75
// without running its command, at once without --wait, and when --wait runs
// out.
func TestExecNotWon(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	call[cliLease](t, r, "POST", "/api/leases", `{"resource":"busy","holder":"other","ttl_seconds":600}`, http.StatusCreated)
	log := newChildLog(t)
	startExec(t, r.url, append([]string{"--resource", "busy", "--"}, log.child(t, "exit=0")...)...).
		wantExit(t, exitNotWon, "busy is held by other", "--wait")
	startExec(t, r.url, append([]string{"--resource", "busy", "--wait", "1s", "--"}, log.child(t, "exit=0")...)...).
		wantExit(t, exitNotWon, "busy is held by other", "after waiting 1s")
	if lines := log.lines(); len(lines) != 0 {
		t.Errorf("the command ran without the lease: %q", lines)
	}
}

// TestExecInterruptedWait: a SIGTERM while exec waits for the lease ends the
// wait, 128+15, and the command never runs.
func TestExecInterruptedWait(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	call[cliLease](t, r, "POST", "/api/leases", `{"resource":"busy","holder":"other","ttl_seconds":600}`, http.StatusCreated)
	log := newChildLog(t)
	p := startExec(t, r.url, append([]string{"--resource", "busy", "--wait", "5m", "--"}, log.child(t, "exit=0")...)...)
	pollExec(t, "exec to wait for the lease", func() bool { return replicaSawWait(r, p.holder()) }, p.stderr)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wantExit(t, 128+int(syscall.SIGTERM), "while waiting for the lease on busy")
	if lines := log.lines(); len(lines) != 0 {
		t.Errorf("the command ran without the lease: %q", lines)
	}
	if l := r.leaseNamed(t, "busy"); l.Holder != "other" || l.State != "active" {
		t.Errorf("lease after the interrupted wait: got %+v, want other's, active", l)
	}
}

// TestExecLeaseLost: when another client releases exec's lease (its holder
// and fence, read from the command's environment), exec stops the command
// with SIGTERM and exits 76; a command that ignores SIGTERM gets SIGKILL
// after --grace.
func TestExecLeaseLost(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	for _, tc := range []struct {
		mode   string
		logged string // by the child on SIGTERM
		output []string
	}{
		{"stdin", "signal terminated", []string{"lost the lease on lost-stdin", "sh was stopped"}},
		{"ignore-term", "ignored terminated", []string{"lost the lease on lost-ignore-term", "SIGKILL", "was ended by signal 9"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			resource := "lost-" + tc.mode
			log := newChildLog(t)
			// Through sh, which execs the child: the output names sh.
			child := strings.Join(log.child(t, tc.mode), " ")
			p := startExec(t, r.url, "--resource", resource, "--ttl", "4s", "--grace", "1s", "--", "sh", "-c", "exec "+child)
			pollExec(t, "the command to start", func() bool { return len(log.starts()) == 1 }, log, p.stderr)
			s := log.starts()[0]
			body := fmt.Sprintf(`{"resource":%q,"holder":%q,"fence":%s}`, resource, s[0], s[1])
			call[cliLease](t, r, "DELETE", "/api/leases/release", body, http.StatusOK)

			p.wantExit(t, exitLost, tc.output...)
			if !log.has(tc.logged) {
				t.Errorf("the command's log: want %q, got:\n%s", tc.logged, log)
			}
			if log.has("end") {
				t.Errorf("the command ran to its end after the lease was lost:\n%s", log)
			}
		})
	}
}

// TestExecPassesStatus: exec exits with its command's status (128+N for a
// signal N) and releases the lease after it; the command sees the lease in
// its environment.
func TestExecPassesStatus(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	for _, tc := range []struct {
		mode string
		code int
	}{
		{"exit=0", 0},
		{"exit=7", 7},
		{"kill", 128 + int(syscall.SIGKILL)},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			resource := "status-" + strings.ReplaceAll(tc.mode, "=", "-")
			log := newChildLog(t)
			p := startExec(t, r.url, append([]string{"--resource", resource, "--holder", "job-" + tc.mode, "--"}, log.child(t, tc.mode)...)...)
			p.wantExit(t, tc.code)
			starts := log.starts()
			l := r.leaseNamed(t, resource)
			if len(starts) != 1 || starts[0][0] != "job-"+tc.mode || starts[0][1] != strconv.FormatInt(l.Fence, 10) || starts[0][2] != resource {
				t.Errorf("the command's environment: got %q, want holder job-%s, fence %d, resource %s", starts, tc.mode, l.Fence, resource)
			}
			if l.State != "released" {
				t.Errorf("lease after the command exited: got %+v, want it released", l)
			}
		})
	}
	// A command that cannot be found: 127, and the lease is not kept.
	startExec(t, r.url, "--resource", "status-missing", "--", filepath.Join(t.TempDir(), "no-such-command")).
		wantExit(t, 127, "no-such-command")
	if l := r.leaseNamed(t, "status-missing"); l.State != "released" {
		t.Errorf("lease after a command that could not start: got %+v, want it released", l)
	}
}

// TestExecForwardsSignals: SIGTERM and SIGINT sent to exec reach the
// command; exec exits with the command's status once it has stopped, and
// releases the lease.
func TestExecForwardsSignals(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			resource := "signal-" + strconv.Itoa(int(sig))
			log := newChildLog(t)
			p := startExec(t, r.url, append([]string{"--resource", resource, "--"}, log.child(t, "stdin")...)...)
			pollExec(t, "the command to start", func() bool { return len(log.starts()) == 1 }, log, p.stderr)
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			p.wantExit(t, 5) // the child's status on a signal
			if want := "signal " + sig.String(); !log.has(want) {
				t.Errorf("the command's log: want %q, got:\n%s", want, log)
			}
			if l := r.leaseNamed(t, resource); l.State != "released" {
				t.Errorf("lease after the command stopped: got %+v, want it released", l)
			}
		})
	}
}

// TestExecRejectsBadUsage: mistakes on the command line are exit status 2
// with a message naming them, before anything is sent or run.
func TestExecRejectsBadUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"exec", "--", "true"}, []string{"--resource is required"}},
		{[]string{"exec", "--resource", "r"}, []string{"no command to run"}},
		{[]string{"exec", "--resource", "r", "--ttl", "1.5s", "--", "true"}, []string{`--ttl "1.5s"`, "whole seconds"}},
		{[]string{"exec", "--resource", "r", "--ttl", "0s", "--", "true"}, []string{`--ttl "0s"`}},
		{[]string{"exec", "--resource", "r", "--wait", "forever", "--", "true"}, []string{`--wait "forever"`}},
		{[]string{"exec", "--resource", "r", "--grace", "-1s", "--", "true"}, []string{`--grace "-1s"`}},
		{[]string{"exec", "--resource", "r", "--ttl", "10s", "--grace", "6s", "--", "true"}, []string{"--grace 6s must be at most half the --ttl 10s"}},
		// The default's value, given explicitly, is held to the rule too.
		{[]string{"exec", "--resource", "r", "--ttl", "5s", "--grace", "10s", "--", "true"}, []string{"--grace 10s must be at most half the --ttl 5s", "leave --grace out"}},
		{[]string{"exec", "--resource", "r", "--url", "ftp://x", "--", "true"}, []string{"--url"}},
		{[]string{"exec", "--resource", "r", "--slots", "0", "--", "true"}, []string{"--slots 0 must be from 1 to 1000"}},
		{[]string{"exec", "--bogus", "--", "true"}, []string{"bogus"}},
		// Every mistake at once, each named.
		{[]string{"exec", "--ttl", "x", "--wait", "-1s"}, []string{"--resource", "no command", `--ttl "x"`, `--wait "-1s"`}},
	} {
		err := run(context.Background(), tc.args, env("LEASEHOLD_URL", "http://127.0.0.1:1"), io.Discard, io.Discard)
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
	// And as a process: main exits 2.
	startExec(t, "http://127.0.0.1:1", "--resource", "r").wantExit(t, 2, "no command to run")
}

// TestExecGraceDefault: without --grace, the grace is 10s or half the
// --ttl when that is shorter, so that a short --ttl alone is a valid
// command line; a --grace given is taken as given, within half the --ttl.
func TestExecGraceDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 10 * time.Second}, // --ttl 30s
		{[]string{"--ttl", "1h"}, 10 * time.Second},
		{[]string{"--ttl", "20s"}, 10 * time.Second},
		{[]string{"--ttl", "5s"}, 2500 * time.Millisecond},
		{[]string{"--ttl", "1s"}, 500 * time.Millisecond},
		{[]string{"--ttl", "5s", "--grace", "2s"}, 2 * time.Second},
		{[]string{"--ttl", "5s", "--grace", "2.5s"}, 2500 * time.Millisecond},
		{[]string{"--ttl", "1h", "--grace", "20m"}, 20 * time.Minute},
		{[]string{"--ttl", "5s", "--grace", "0s"}, 0},
	} {
		args := append(append([]string{"--resource", "r"}, tc.args...), "--", "true")
		o, err := parseExec(args, env(), io.Discard)
		if err != nil {
			t.Errorf("parse %q: %v", args, err)
			continue
		}
		if o.grace != tc.want {
			t.Errorf("parse %q: grace %s, want %s", args, o.grace, tc.want)
		}
		if k := o.keep(); k.Margin >= k.TTL || k.RenewInterval <= 0 {
			t.Errorf("parse %q: keeps the lease with %+v, want a margin under the TTL and renewals", args, k)
		}
	}
}

// TestExecShortTTL: "leasehold exec --resource R --ttl 5s -- CMD", whose
// default --grace would exceed half the TTL, runs CMD under the lease and
// exits with CMD's status.
func TestExecShortTTL(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	log := newChildLog(t)
	p := startExec(t, r.url, append([]string{"--resource", "short-ttl", "--ttl", "5s", "--"}, log.child(t, "exit=3")...)...)
	p.wantExit(t, 3)
	if starts := log.starts(); len(starts) != 1 {
		t.Errorf("the command ran %d times, want once: %q\noutput:\n%s", len(starts), starts, p.stderr)
	}
	if l := r.leaseNamed(t, "short-ttl"); l.State != "released" || l.TTLSeconds != 5 {
		t.Errorf("lease after the command exited: got %+v, want it released, with a TTL of 5 s", l)
	}
}

// TestExecSlots: ten leasehold exec --slots 3 started at once keep three
// commands running and the other seven waiting; as commands end, waiting
// ones take their slots, until all ten ran. By the commands' own clocks,
// never more than three ran at once, each under a slot of the key with a
// fence of its own.
func TestExecSlots(t *testing.T) {
	t.Parallel()
	r := execReplica(t)
	log := newChildLog(t)
	procs := map[string]*execProc{}
	for range 10 {
		p := startExec(t, r.url, append([]string{"--resource", "imports", "--slots", "3", "--ttl", "5s", "--grace", "1s", "--wait", "2m", "--"},
			log.child(t, "clocked")...)...)
		procs[p.holder()] = p
	}
	stderrs := func() []fmt.Stringer {
		var out []fmt.Stringer
		for _, p := range procs {
			out = append(out, p.stderr)
		}
		return append(out, log)
	}
	ended := map[string]bool{}
	for len(ended) < len(procs) {
		// Three run (or all that are left), and the others wait.
		want := min(3, len(procs)-len(ended))
		running := func() []string {
			var hs []string
			for _, s := range log.starts() {
				if !ended[s[0]] {
					hs = append(hs, s[0])
				}
			}
			return hs
		}
		pollExec(t, fmt.Sprintf("%d commands to run", want), func() bool { return len(running()) >= want }, stderrs()...)
		for h, p := range procs {
			if !ended[h] && !slices.Contains(running(), h) {
				pollExec(t, h+" to wait for a slot", func() bool { return replicaSawWait(r, h) }, p.stderr)
			}
		}
		if got := running(); len(got) != want {
			t.Fatalf("%d commands running at once (%v), want %d\n%s", len(got), got, want, log)
		}
		// The first of them ends; a waiting one takes its slot.
		h := running()[0]
		if err := procs[h].stdin.Close(); err != nil {
			t.Fatal(err)
		}
		procs[h].wantExit(t, 0)
		ended[h] = true
	}

	type span struct{ began, ended int64 }
	spans := map[string]*span{}
	for _, line := range log.lines() {
		f := strings.Fields(line)
		if len(f) != 3 || (f[0] != "began" && f[0] != "ended") {
			continue
		}
		at, _ := strconv.ParseInt(f[2], 10, 64)
		if spans[f[1]] == nil {
			spans[f[1]] = &span{}
		}
		if f[0] == "began" {
			spans[f[1]].began = at
		} else {
			spans[f[1]].ended = at
		}
	}
	most := 0
	for _, a := range spans {
		n := 0
		for _, b := range spans {
			if b.began <= a.began && a.began < b.ended {
				n++
			}
		}
		most = max(most, n)
	}
	if len(spans) != 10 || most != 3 {
		t.Errorf("%d commands ran, at most %d at once by their own clocks; want 10, at most 3\n%s", len(spans), most, log)
	}
	fences := map[string]bool{}
	for _, s := range log.starts() {
		if key, ok := lease.SlotKey(s[2]); !ok || key != "imports" || fences[s[1]] {
			t.Errorf("a command ran on %s with fence %s; want a slot of imports, a fence of its own", s[2], s[1])
		}
		fences[s[1]] = true
	}
}
