package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// childEnv makes the test binary act as a child instead of running the tests.
const childEnv = "SUPERVISE_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}

// child is the supervised program: once its SIGTERM handler is in place it says hello, then
//
//	serve     runs until SIGTERM, then exits 0
//	crash     writes a line without its end to stderr and exits 3
//	stubborn  ignores SIGTERM
func child(mode string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fmt.Printf("hello from pid %d\n", os.Getpid())
	switch mode {
	case "crash":
		fmt.Fprintf(os.Stderr, "partial line without end")
		return 3
	case "stubborn":
		select {}
	}
	<-term
	fmt.Println("got SIGTERM")
	return 0
}

// waitOutput waits until out holds the hello of every pid (checked at every write), for
// at most 20 s.
func waitOutput(t *testing.T, out *syncBuffer, pids ...int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for _, pid := range pids {
		hello := fmt.Sprintf("hello from pid %d\n", pid)
		for {
			written := out.written()
			if strings.Contains(out.String(), hello) {
				break
			}
			select {
			case <-written:
			case <-timeout:
				t.Fatalf("waited 20s for the hello of pid %d in\n%s", pid, out.String())
			}
		}
	}
}

// syncBuffer is a bytes.Buffer the supervisor and the test can share.
type syncBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	next chan struct{} // closed by the next Write; nil until written asks for it
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next != nil {
		close(b.next)
		b.next = nil
	}
	return b.buf.Write(p)
}

// written returns a channel closed by the next Write: taken before reading the buffer,
// it tells of any write that the read may have missed.
func (b *syncBuffer) written() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next == nil {
		b.next = make(chan struct{})
	}
	return b.next
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// events records the pids each child started with and the ends of each start, in order.
type events struct {
	mu     sync.Mutex
	pids   map[string][]int
	exits  map[string][]error
	change chan struct{}
}

func newEvents() *events {
	return &events{pids: map[string][]int{}, exits: map[string][]error{}, change: make(chan struct{}, 1)}
}

func (e *events) child(name, mode string) Child {
	return Child{
		Name: name,
		Command: func() (*exec.Cmd, error) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+mode)
			return cmd, nil
		},
		Started: func(pid int) { e.record(func() { e.pids[name] = append(e.pids[name], pid) }) },
		Exited:  func(err error) { e.record(func() { e.exits[name] = append(e.exits[name], err) }) },
	}
}

func (e *events) record(f func()) {
	e.mu.Lock()
	f()
	e.mu.Unlock()
	select {
	case e.change <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds (checked under the lock at every event), for at most 20 s.
func (e *events) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		e.mu.Lock()
		ok := cond()
		e.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-e.change:
		case <-timeout:
			t.Fatalf("waited 20s for %s", what)
		}
	}
}

// start runs s over children until the returned stop is called.
func start(t *testing.T, s *Supervisor, children ...Child) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, children) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("Run did not return within 30s of cancellation")
		}
	}
	t.Cleanup(stop)
	return stop
}

func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestRestartsAndStops(t *testing.T) {
	t.Parallel()
	var out, log syncBuffer
	s := &Supervisor{
		Output: &out, Log: zerolog.New(&log), Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		ExitReasons: map[int]string{3: "simulated crash"},
	}
	e := newEvents()
	stop := start(t, s, e.child("replica-a", "serve"), e.child("replica-b", "serve"), e.child("crasher", "crash"))

	e.waitFor(t, "both servers started and the crasher restarted twice", func() bool {
		return len(e.pids["replica-a"]) == 1 && len(e.pids["replica-b"]) == 1 && len(e.exits["crasher"]) >= 2
	})
	if !strings.Contains(log.String(), "crasher exited (exit status 3, simulated crash); restarting in") {
		t.Errorf("log: no line for the crasher's exit with its reason in\n%s", log.String())
	}

	// A kill -9 is a crash too: the child is started again, as a new process. It is
	// killed once it has said hello, so that the output shows what it wrote before.
	e.mu.Lock()
	first := e.pids["replica-b"][0]
	e.mu.Unlock()
	waitOutput(t, &out, first)
	if pid, err := s.Kill("replica-b"); err != nil || pid != first {
		t.Fatalf("Kill(replica-b): %d, %v; want %d, nil", pid, err, first)
	}
	e.waitFor(t, "replica-b started again", func() bool { return len(e.pids["replica-b"]) == 2 })
	e.mu.Lock()
	second, exit := e.pids["replica-b"][1], e.exits["replica-b"][0]
	e.mu.Unlock()
	if second == first {
		t.Errorf("replica-b restarted with the pid of the killed process, %d", first)
	}
	var exitErr *exec.ExitError
	if !errors.As(exit, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("replica-b's exit: got %v, want killed by SIGKILL", exit)
	}
	pids := s.PIDs()
	if pids["replica-a"] == 0 || pids["replica-b"] != second {
		t.Errorf("PIDs: got %v, want replica-a running and replica-b at %d", pids, second)
	}

	waitOutput(t, &out, pids["replica-a"], second)
	stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, pids := range e.pids {
		for _, pid := range pids {
			if !gone(pid) {
				t.Errorf("%s pid %d still exists after Run returned", name, pid)
			}
		}
	}
	for _, name := range []string{"replica-a", "replica-b"} {
		if last := e.exits[name][len(e.exits[name])-1]; last != nil {
			t.Errorf("%s stopped with %v, want exit status 0 (it exits on SIGTERM)", name, last)
		}
	}
	if pids := s.PIDs(); len(pids) != 0 {
		t.Errorf("PIDs after Run returned: %v, want none", pids)
	}
	if _, err := s.Kill("replica-a"); err == nil {
		t.Errorf("Kill after Run returned: nil, want an error")
	}

	// Every line is whole and prefixed, unfinished ones too.
	for _, want := range []string{
		fmt.Sprintf("replica-b | hello from pid %d\n", first),
		"crasher | partial line without end\n",
		"replica-a | got SIGTERM\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output: no %q in\n%s", want, out.String())
		}
	}
	for line := range strings.Lines(out.String()) {
		if !strings.Contains(line, " | ") {
			t.Errorf("output line without a prefix: %q", line)
		}
	}
}

// TestSignal: a child stopped with SIGSTOP handles the SIGTERM sent meanwhile once it is
// continued: it exits cleanly and is started again.
func TestSignal(t *testing.T) {
	t.Parallel()
	var out, log syncBuffer
	s := &Supervisor{Output: &out, Log: zerolog.New(&log), Backoff: 10 * time.Millisecond}
	e := newEvents()
	start(t, s, e.child("replica-a", "serve"))
	e.waitFor(t, "the child started", func() bool { return len(e.pids["replica-a"]) == 1 })
	first := s.PIDs()["replica-a"]
	waitOutput(t, &out, first)

	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGTERM} {
		if pid, err := s.Signal("replica-a", sig); err != nil || pid != first {
			t.Fatalf("Signal(replica-a, %v): %d, %v; want %d, nil", sig, pid, err, first)
		}
	}
	if pid, err := s.Signal("replica-a", syscall.SIGCONT); err != nil || pid != first {
		t.Fatalf("Signal(replica-a, SIGCONT): %d, %v; want %d, nil", pid, err, first)
	}
	e.waitFor(t, "replica-a started again", func() bool { return len(e.pids["replica-a"]) == 2 })
	e.mu.Lock()
	exit := e.exits["replica-a"][0]
	e.mu.Unlock()
	if exit != nil {
		t.Errorf("replica-a after SIGTERM: %v, want exit status 0", exit)
	}
	if _, err := s.Signal("nobody", syscall.SIGTERM); err == nil {
		t.Errorf("Signal to a child that does not exist: nil, want an error")
	}
}

func TestKillsAfterGrace(t *testing.T) {
	t.Parallel()
	var out, log syncBuffer
	s := &Supervisor{Output: &out, Log: zerolog.New(&log), Grace: 300 * time.Millisecond}
	e := newEvents()
	stop := start(t, s, e.child("stubborn", "stubborn"))
	e.waitFor(t, "the child started", func() bool { return len(e.pids["stubborn"]) == 1 })
	waitOutput(t, &out, s.PIDs()["stubborn"])
	stop()

	e.mu.Lock()
	defer e.mu.Unlock()
	var exitErr *exec.ExitError
	if exits := e.exits["stubborn"]; len(exits) != 1 || !errors.As(exits[0], &exitErr) ||
		exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("exits: got %v, want one, by SIGKILL", exits)
	}
	if !strings.Contains(log.String(), "still running") {
		t.Errorf("log: no word of the kill after the grace period in\n%s", log.String())
	}
}

func TestCommandFailsThenRecovers(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	s := &Supervisor{Log: zerolog.New(&log), Backoff: 10 * time.Millisecond}
	e := newEvents()
	c := e.child("flaky", "serve")
	tries := 0
	command := c.Command
	c.Command = func() (*exec.Cmd, error) {
		tries++
		if tries == 1 {
			return nil, errors.New("no free port")
		}
		if tries == 2 {
			return exec.Command("/nonexistent/leasehold"), nil
		}
		return command()
	}
	stop := start(t, s, c)
	e.waitFor(t, "the child started on the third try", func() bool { return len(e.pids["flaky"]) == 1 })
	stop()
	if got := strings.Count(log.String(), "could not start"); got != 2 {
		t.Errorf("log: %d lines saying it could not start, want 2:\n%s", got, log.String())
	}
}

func TestRunRefusesBadChildren(t *testing.T) {
	t.Parallel()
	cmd := func() (*exec.Cmd, error) { return exec.Command("true"), nil }
	for _, children := range [][]Child{
		{{Name: "", Command: cmd}},
		{{Name: "a"}},
		{{Name: "a", Command: cmd}, {Name: "a", Command: cmd}},
	} {
		if err := (&Supervisor{}).Run(t.Context(), children); err == nil {
			t.Errorf("Run(%+v): nil, want an error", children)
		}
	}
}

func TestLineWriter(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var out bytes.Buffer
	w := &lineWriter{mu: &mu, w: &out, prefix: []byte("x | ")}
	for _, p := range []string{"one\ntw", "o\n", "", "three\nfour\nfi", "ve"} {
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Errorf("Write(%q) = %d, %v; want %d, nil", p, n, err, len(p))
		}
	}
	w.flush()
	w.flush()
	if got, want := out.String(), "x | one\nx | two\nx | three\nx | four\nx | five\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}

	out.Reset()
	if _, err := w.Write(bytes.Repeat([]byte("y"), maxLine+10)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "\n"); got != 1 {
		t.Errorf("a line over %d bytes: %d lines written so far, want 1 (written in pieces)", maxLine, got)
	}
}
