// Package supervise runs child processes and restarts each one that exits, as a hosting
// platform restarts a crashed replica, until its context ends; then it stops them: SIGTERM,
// and SIGKILL for those still running after a grace period.
//
// Each child runs in a process group of its own, so that a Ctrl-C at the terminal reaches
// only the supervising process, which then stops the children in order; and it is sent
// SIGTERM should the supervising process die without stopping it (Linux's parent-death
// signal), so that no replica outlives the demo.
package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Child is one supervised program.
type Child struct {
	// Name names the child in the log and prefixes every line of its output.
	Name string
	// Command returns the command of one start; it is called before every start, so each
	// may differ (a new port, say). Its Stdout, Stderr and process attributes are the
	// supervisor's to set.
	Command func() (*exec.Cmd, error)
	// Started, if set, is called after each start with the child's pid.
	Started func(pid int)
	// Exited, if set, is called after each exit with what Wait returned.
	Exited func(err error)
}

// Supervisor runs children. Set its fields before Run; the zero value of each is usable.
type Supervisor struct {
	// Output receives the children's stdout and stderr, line by line, each line prefixed
	// with the child's name. Nil discards.
	Output io.Writer
	// Log receives one line per start, exit, restart and kill.
	Log zerolog.Logger
	// ExitReasons names exit statuses with a meaning of their own, for the log.
	ExitReasons map[int]string
	// Grace is how long a child has to exit after SIGTERM before it is killed; default 15 s.
	Grace time.Duration
	// Backoff is the delay before the first restart of a child that exited; it doubles
	// with each exit in quick succession, up to MaxBackoff. Defaults 500 ms and 10 s.
	Backoff, MaxBackoff time.Duration

	outMu sync.Mutex // one line of Output at a time
	mu    sync.Mutex
	procs map[string]*os.Process // the running process of each child
}

// stableRun is how long a child must have run for its next restart to use the first backoff.
const stableRun = 10 * time.Second

// Run starts every child and restarts each one that exits, until ctx ends; then it stops
// them all and returns once every child has exited. It returns an error only when children
// is unusable.
func (s *Supervisor) Run(ctx context.Context, children []Child) error {
	seen := map[string]bool{}
	for _, c := range children {
		if c.Name == "" || c.Command == nil || seen[c.Name] {
			return fmt.Errorf("supervise: each child needs a unique name and a command (got %q)", c.Name)
		}
		seen[c.Name] = true
	}
	var wg sync.WaitGroup
	for _, c := range children {
		wg.Go(func() { s.keep(ctx, c) })
	}
	wg.Wait()
	return nil
}

// PIDs returns the pid of each running child.
func (s *Supervisor) PIDs() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	pids := make(map[string]int, len(s.procs))
	for name, p := range s.procs {
		pids[name] = p.Pid
	}
	return pids
}

// Kill sends SIGKILL to the running process of the named child, as a crash would end it,
// and returns its pid; it is restarted like any child that exits.
func (s *Supervisor) Kill(name string) (int, error) {
	return s.Signal(name, syscall.SIGKILL)
}

// Signal sends sig to the running process of the named child and returns its pid. A child
// that exits of it is restarted like any other; one stopped with SIGSTOP stays stopped (and
// deaf to the SIGTERM that ends Run) until it is sent SIGCONT.
func (s *Supervisor) Signal(name string, sig os.Signal) (int, error) {
	s.mu.Lock()
	p := s.procs[name]
	s.mu.Unlock()
	if p == nil {
		return 0, fmt.Errorf("%s is not running", name)
	}
	if err := p.Signal(sig); err != nil {
		return p.Pid, fmt.Errorf("send %v to %s (pid %d): %w", sig, name, p.Pid, err)
	}
	return p.Pid, nil
}

// keep runs c again and again until ctx ends.
func (s *Supervisor) keep(ctx context.Context, c Child) {
	first, most, grace := s.Backoff, s.MaxBackoff, s.Grace
	if first <= 0 {
		first = 500 * time.Millisecond
	}
	if most < first {
		most = max(10*time.Second, first)
	}
	if grace <= 0 {
		grace = 15 * time.Second
	}
	delay := first
	for ctx.Err() == nil {
		began := time.Now()
		started, err := s.runOnce(ctx, c, grace)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) >= stableRun {
			delay = first
		}
		if started {
			s.Log.Warn().Str("child", c.Name).Str("status", s.describe(err)).Stringer("backoff", delay).
				Msgf("%s exited (%s); restarting in %v", c.Name, s.describe(err), delay)
		} else {
			s.Log.Error().Str("child", c.Name).Err(err).Stringer("backoff", delay).
				Msgf("%s could not start (%v); trying again in %v", c.Name, err, delay)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, most)
	}
}

// runOnce starts c and waits until it exits, or stops it when ctx ends. It returns what
// Wait returned, or (started false) why the child could not start.
func (s *Supervisor) runOnce(ctx context.Context, c Child, grace time.Duration) (started bool, err error) {
	cmd, err := c.Command()
	if err != nil {
		return false, err
	}
	out := &lineWriter{mu: &s.outMu, w: s.Output, prefix: []byte(c.Name + " | ")}
	if s.Output == nil {
		out.w = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	// Should a grandchild keep the output pipe open, do not wait for it past this.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return false, err
	}
	pid := cmd.Process.Pid
	s.setProc(c.Name, cmd.Process)
	s.Log.Info().Str("child", c.Name).Int("pid", pid).Msgf("started %s pid=%d", c.Name, pid)
	if c.Started != nil {
		c.Started(pid)
	}

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-exited:
		case <-time.After(grace):
			s.Log.Warn().Str("child", c.Name).Int("pid", pid).
				Msgf("%s pid=%d still running %v after SIGTERM; killing it", c.Name, pid, grace)
			_ = cmd.Process.Kill()
			err = <-exited
		}
		s.Log.Info().Str("child", c.Name).Int("pid", pid).Str("status", s.describe(err)).
			Msgf("stopped %s pid=%d (%s)", c.Name, pid, s.describe(err))
	}
	out.flush()
	s.setProc(c.Name, nil)
	if c.Exited != nil {
		c.Exited(err)
	}
	return true, err
}

func (s *Supervisor) setProc(name string, p *os.Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs == nil {
		s.procs = map[string]*os.Process{}
	}
	if p == nil {
		delete(s.procs, name)
	} else {
		s.procs[name] = p
	}
}

// describe says how a child ended: "exit status 3 (simulated crash)", "signal: killed", ….
func (s *Supervisor) describe(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if reason, ok := s.ExitReasons[exitErr.ExitCode()]; ok {
			return exitErr.Error() + ", " + reason
		}
	}
	return err.Error()
}

// lineWriter writes whole lines to w, each with prefix, holding mu for each so that the
// lines of several children never interleave.
type lineWriter struct {
	mu      *sync.Mutex
	w       io.Writer
	prefix  []byte
	partial []byte
}

// maxLine is the longest line kept waiting for its end; longer ones are written in pieces.
const maxLine = 64 << 10

func (l *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.partial = append(l.partial, p...)
			if len(l.partial) >= maxLine {
				l.flush()
			}
			break
		}
		l.partial = append(l.partial, p[:i+1]...)
		l.writeLine()
		p = p[i+1:]
	}
	return n, nil
}

// flush writes what is left of an unfinished line, ending it.
func (l *lineWriter) flush() {
	if len(l.partial) > 0 {
		l.partial = append(l.partial, '\n')
		l.writeLine()
	}
}

func (l *lineWriter) writeLine() {
	line := make([]byte, 0, len(l.prefix)+len(l.partial))
	line = append(append(line, l.prefix...), l.partial...)
	l.partial = l.partial[:0]
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(line) // the demo's stderr: nowhere to report a failure to
}
