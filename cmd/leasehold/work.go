package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

const workUsage = `usage: leasehold work --kind K [--kind K2 ...] [--queue Q ...] [--concurrency 1] [--processor NAME]
                      [--shutdown-grace 30s] [--kill-grace 5s] -- CMD ARGS...

A task worker for any program. It claims tasks of the kinds and queues given
from a leasehold server (long-polling POST /api/tasks/next, one claim waiting
per free slot) and runs CMD for each: the task's task_data JSON on its stdin,
LEASEHOLD_TASK_ID, LEASEHOLD_FENCE, LEASEHOLD_ATTEMPT, LEASEHOLD_KIND,
LEASEHOLD_QUEUE and LEASEHOLD_PROCESSOR in its environment, the task's lease
heartbeated while it runs.

  CMD exits 0       the task is completed; task_output is CMD's stdout, the JSON
                    value when it is one, else a JSON string (null when empty)
  CMD exits non-0   the attempt fails, its error the end of CMD's stderr
  lease lost or     CMD gets SIGTERM, then SIGKILL after --kill-grace, and
  task cancelled    nothing is reported; a cancellation reaches CMD within 1 s
  SIGTERM, SIGINT   no new claims; running CMDs get --shutdown-grace to finish,
                    then SIGTERM (SIGKILL after --kill-grace), and their tasks
                    are handed back to the queue

Exit status: 0 after a clean shutdown; 1 the server refused the claims for a
reason that retrying cannot fix (a wrong --api-token, a --url that is not a
leasehold server); 2 bad usage. A server that cannot be reached is asked again,
with backoff, until it answers or the worker is stopped.

flags:
`

// Tunables of leasehold work.
const (
	// maxOutputBytes bounds the task_output of a completion: with the rest
	// of its body it must fit in the API's 1 MiB per request.
	maxOutputBytes = task.MaxPayloadBytes
	// maxLogLine bounds one log record of CMD's stderr; a longer line is
	// logged in pieces.
	maxLogLine = 16 << 10
	// defaultTaskTTL is the lease TTL assumed for a task claimed without
	// one (the server gives every claimed task its own).
	defaultTaskTTL = 30 * time.Second
	// maxConcurrency bounds --concurrency, as serve's --workers.
	maxConcurrency = 1024
	// maxClaimNames bounds the kinds and the queues of one claim (the API's).
	maxClaimNames = 100
)

// workOptions is a parsed "leasehold work" command line.
type workOptions struct {
	client        *clientFlags
	kinds         []string
	queues        []string
	concurrency   int
	processor     string
	shutdownGrace time.Duration
	killGrace     time.Duration
	logLevel      string
	logFormat     string
	passToken     bool     // CMD gets LEASEHOLD_API_TOKEN
	argv          []string // CMD ARGS...
}

// namesFlag is a flag that may be given several times, each a name.
type namesFlag []string

func (n *namesFlag) String() string { return strings.Join(*n, ",") }

func (n *namesFlag) Set(v string) error {
	*n = append(*n, v)
	return nil
}

func parseWork(args []string, getenv func(string) string, stderr io.Writer) (workOptions, error) {
	fs := flag.NewFlagSet("leasehold work", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), workUsage)
		fs.PrintDefaults()
	}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	o := workOptions{client: addClientFlags(fs, getenv)}
	var kinds, queues namesFlag
	fs.Var(&kinds, "kind", "a kind of task CMD runs; repeat it for several (required)")
	fs.Var(&queues, "queue", "a queue to take tasks from; repeat it for several (default: default)")
	concurrency := fs.String("concurrency", "1", "how many tasks run at once, 1 to 1024, each its own CMD")
	fs.BoolVar(&o.passToken, "pass-token", false, "give CMD the API token in LEASEHOLD_API_TOKEN, for a command that calls the API itself (by default CMD does not see it)")
	fs.StringVar(&o.processor, "processor", "", "the worker's name: its slots claim as NAME/w1 ... NAME/wN, which must be unique among live workers (default <hostname>-<pid>)")
	shutdownGrace := fs.String("shutdown-grace", "30s", "on SIGTERM or SIGINT, how long running CMDs may go on before they are stopped and their tasks handed back")
	killGrace := fs.String("kill-grace", "5s", "when a CMD is stopped, the time between SIGTERM and SIGKILL (for a task whose TTL is shorter than twice this, half the TTL)")
	fs.StringVar(&o.logLevel, "log-level", env("LEASEHOLD_LOG_LEVEL", "info"), "debug, info, warn or error; CMD's stderr is logged whatever the level (env LEASEHOLD_LOG_LEVEL)")
	fs.StringVar(&o.logFormat, "log-format", env("LEASEHOLD_LOG_FORMAT", "json"), "json or console (env LEASEHOLD_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return o, flagError(err)
	}
	o.argv = fs.Args()
	const example = "e.g. leasehold work --kind resize -- ./resize.sh"
	var errs []error
	if len(kinds) == 0 {
		errs = append(errs, fmt.Errorf("--kind is required: the kinds of task CMD runs, %s", example))
	}
	if len(queues) == 0 {
		queues = namesFlag{task.DefaultQueue}
	}
	for _, f := range []struct {
		name  string
		names []string
		into  *[]string
	}{{"kind", kinds, &o.kinds}, {"queue", queues, &o.queues}} {
		for _, n := range f.names {
			if err := checkFlagName(f.name, n); err != nil {
				errs = append(errs, err)
			} else if !slices.Contains(*f.into, n) {
				*f.into = append(*f.into, n)
			}
		}
		if len(*f.into) > maxClaimNames {
			errs = append(errs, fmt.Errorf("%d --%s flags; a worker takes at most %d", len(*f.into), f.name, maxClaimNames))
		}
	}
	n, err := strconv.Atoi(*concurrency)
	if err != nil || n < 1 || n > maxConcurrency {
		errs = append(errs, fmt.Errorf("--concurrency %q must be an integer between 1 and %d: how many tasks run at once", *concurrency, maxConcurrency))
	}
	o.concurrency = n
	if o.processor == "" {
		o.processor = hostPID()
	}
	// The longest slot's name must be a valid processor.
	if err := checkFlagName("processor", fmt.Sprintf("%s/w%d", o.processor, max(o.concurrency, 1))); err != nil {
		errs = append(errs, err)
	}
	if o.shutdownGrace, err = durationFlag("shutdown-grace", *shutdownGrace, 0, time.Hour, false, "30s"); err != nil {
		errs = append(errs, err)
	}
	if o.killGrace, err = durationFlag("kill-grace", *killGrace, 0, 10*time.Minute, false, "5s"); err != nil {
		errs = append(errs, err)
	}
	if lv, err := zerolog.ParseLevel(o.logLevel); err != nil || lv == zerolog.NoLevel {
		errs = append(errs, fmt.Errorf("--log-level %q must be debug, info, warn or error", o.logLevel))
	}
	if o.logFormat != "json" && o.logFormat != "console" {
		errs = append(errs, fmt.Errorf("--log-format %q must be json or console", o.logFormat))
	}
	if len(o.argv) == 0 {
		errs = append(errs, fmt.Errorf("no command to run: put it after --, %s", example))
	} else if _, err := exec.LookPath(o.argv[0]); err != nil {
		errs = append(errs, fmt.Errorf("CMD %q cannot be run (%w); name a program on PATH or give its path", o.argv[0], errors.Unwrap(err)))
	}
	return o, joinUsage(errs)
}

// runWork is "leasehold work" (see workUsage). It runs until ctx ends (main
// ends it on SIGTERM or SIGINT), then shuts down gracefully and returns
// nil; or it returns an error when the server refuses its claims for good.
//
// It is the library's remote worker (worker.RemotePool: its claim loop,
// held heartbeats, hand-back and backoff) with a handler that runs CMD:
// what a NewRemoteClient program's handlers get, a command gets.
func runWork(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseWork(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(config{LogLevel: o.logLevel, LogFormat: o.logFormat, Instance: o.processor}, stderr)
	if err != nil {
		return err
	}
	// Per slot, a claim and a heartbeat may be under way at once.
	api, done, err := o.client.rest(2*o.concurrency+2, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	shutdownGrace := o.shutdownGrace
	if shutdownGrace == 0 {
		shutdownGrace = -1 // the pool's "no grace"; its zero is a default
	}
	h := &cmdHandler{o: o, log: log}
	pool := &worker.RemotePool{
		Tasks: restclient.Tasks{C: api}, Instance: o.processor, Name: o.processor, Queues: o.queues, Kinds: o.kinds,
		Handler: h.run, Workers: o.concurrency, Fetchers: o.concurrency, TTL: defaultTaskTTL,
		ShutdownGrace: shutdownGrace, Grace: o.killGrace, Transient: restclient.Transient, Log: log,
	}
	log.Info().Strs("kinds", o.kinds).Strs("queues", o.queues).Int("concurrency", o.concurrency).
		Str("url", o.client.url).Strs("cmd", o.argv).Msg("worker started")
	err = pool.Run(ctx)
	if refused, ok := errors.AsType[*worker.ClaimsRefusedError](err); ok {
		return fmt.Errorf("claim tasks: %w", o.client.describe(refused.Err))
	}
	return err
}

// cmdHandler is the handler of leasehold work: it runs CMD for a task.
type cmdHandler struct {
	o   workOptions
	log zerolog.Logger
}

// run runs CMD for t until it exits, and says what became of it: exit 0
// completes the task with CMD's stdout; another status fails the attempt
// with the end of CMD's stderr. When ctx ends (the lease lost, the task
// cancelled, the shutdown grace over), CMD gets SIGTERM, then SIGKILL after
// the kill grace; a CMD stopped at shutdown answers an error that wraps
// context.Canceled, which hands its task back.
func (h *cmdHandler) run(ctx context.Context, t task.Task) (json.RawMessage, error) {
	log := h.log.With().Int64("task", t.ID).Str("kind", t.Kind).Str("queue", t.Queue).Str("processor", t.Processor).
		Int64("fence", t.Fence).Int32("attempt", t.Attempts).Logger()
	ttl := defaultTaskTTL
	if t.TTLSeconds > 0 {
		ttl = t.TTL()
	}
	res := h.runCmd(ctx, log, t, min(h.o.killGrace, ttl/2))
	switch {
	case res.startErr != nil:
		log.Error().Err(res.startErr).Msg("CMD could not be started; failing the attempt")
		return nil, fmt.Errorf("could not start %s: %w", h.o.argv[0], res.startErr)
	case res.succeeded():
		output, err := res.output()
		if err != nil {
			log.Warn().Err(err).Msg("CMD exited 0, but its output cannot be recorded; failing the attempt")
		}
		return output, err
	case res.stopped == "shutdown":
		return nil, &stoppedAtShutdown{how: fmt.Sprintf("CMD was stopped after the shutdown grace (%s): %s", h.o.shutdownGrace, res.how())}
	default:
		tail, truncated := res.stderr.tail()
		return nil, errors.New(failureText(tail, truncated, res.how()))
	}
}

// stoppedAtShutdown is the handler's answer for a CMD stopped when the
// shutdown grace was over: the pool hands its task back.
type stoppedAtShutdown struct{ how string }

func (e *stoppedAtShutdown) Error() string { return e.how }
func (e *stoppedAtShutdown) Unwrap() error { return context.Canceled }

// cmdResult is what became of one run of CMD.
type cmdResult struct {
	startErr error
	waitErr  error
	state    *os.ProcessState
	stdout   *outputBuffer
	stderr   *stderrSink
	// stopped says why CMD was signalled, if it was: "lost" (the lease lost
	// or the task cancelled) or "shutdown" (the shutdown grace was over).
	stopped string
}

// succeeded reports whether CMD ran and exited 0.
func (r cmdResult) succeeded() bool { return r.state != nil && r.state.Success() }

// how words how CMD ended, as a failure's error ends: "exit status 3".
func (r cmdResult) how() string {
	switch {
	case r.startErr != nil:
		return "not started: " + r.startErr.Error()
	case r.state == nil:
		return "lost track of: " + fmt.Sprint(r.waitErr)
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return "exit status " + strconv.Itoa(r.state.ExitCode())
}

// runCmd runs CMD for t until it exits, with the task's data on its stdin.
// When ctx ends, CMD's process group gets SIGTERM, then SIGKILL after
// grace.
//
// CMD runs in a session of its own: a Ctrl-C at a terminal reaches
// leasehold work only, which decides what becomes of CMD; and stopping CMD
// stops what it started too. Should leasehold work die without stopping it
// (kill -9), the kernel kills CMD (Pdeathsig), since nobody heartbeats its
// lease any more.
func (h *cmdHandler) runCmd(ctx context.Context, log zerolog.Logger, t task.Task, grace time.Duration) cmdResult {
	argv := h.o.argv
	res := cmdResult{stdout: &outputBuffer{max: maxOutputBytes}, stderr: &stderrSink{log: log.Level(zerolog.TraceLevel)}}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(childEnv(h.o.passToken, h.o.client.token),
		"LEASEHOLD_TASK_ID="+strconv.FormatInt(t.ID, 10),
		"LEASEHOLD_FENCE="+strconv.FormatInt(t.Fence, 10),
		"LEASEHOLD_ATTEMPT="+strconv.Itoa(int(t.Attempts)),
		"LEASEHOLD_KIND="+t.Kind,
		"LEASEHOLD_QUEUE="+t.Queue,
		"LEASEHOLD_PROCESSOR="+t.Processor,
	)
	stdin := t.TaskData
	if len(stdin) > 0 {
		stdin = append(bytes.Clone(stdin), '\n')
	}
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = res.stdout, res.stderr
	// Pdeathsig is sent when the thread that started CMD ends: this
	// goroutine keeps its thread until CMD has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// Should what CMD started keep its stdout or stderr open after it
	// exited, do not wait for that past this.
	cmd.WaitDelay = time.Second
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		res.startErr = err
		return res
	}
	log.Debug().Int("pid", cmd.Process.Pid).Msg("CMD started")
	group := -cmd.Process.Pid // CMD leads its session and process group
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var (
		killTimer *time.Timer
		kill      <-chan time.Time
		stopped   = ctx.Done()
	)
run:
	for {
		select {
		case res.waitErr = <-exited:
			break run
		case <-stopped:
			stopped = nil
			res.stopped = "lost"
			if cause := context.Cause(ctx); errors.Is(cause, worker.ErrShutdown) {
				res.stopped = "shutdown"
				log.Info().Stringer("kill_grace", grace).Msg("the shutdown grace is over: stopping CMD (SIGTERM, then SIGKILL after the kill grace) to hand its task back")
			} else {
				log.Warn().Err(cause).Stringer("kill_grace", grace).Msg("stopping CMD: SIGTERM, then SIGKILL after the kill grace")
			}
			_ = syscall.Kill(group, syscall.SIGTERM)
			killTimer = time.NewTimer(grace)
			kill = killTimer.C
		case <-kill:
			kill = nil
			log.Warn().Stringer("kill_grace", grace).Msg("CMD still runs after SIGTERM and the kill grace; SIGKILL")
			_ = syscall.Kill(group, syscall.SIGKILL)
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}
	if res.stopped != "" {
		// What CMD started and left behind would run on without the lease.
		_ = syscall.Kill(group, syscall.SIGKILL)
	}
	res.state = cmd.ProcessState
	res.stderr.flush()
	return res
}

// output is the task_output of a CMD that exited 0: its stdout as the JSON
// value it is, or else as a JSON string without its trailing newlines;
// null when it printed nothing but white space. An error says why it
// cannot be recorded: more than the API takes in a request.
func (r cmdResult) output() (json.RawMessage, error) {
	out, total := r.stdout.bytes()
	tooBig := fmt.Errorf("CMD exited 0, but its stdout (%d bytes) does not fit in task_output, which holds at most %d bytes (1000 KiB, what one request of the API's 1 MiB carries); have CMD write large results elsewhere and print where", total, maxOutputBytes)
	if total > int64(len(out)) {
		return nil, tooBig
	}
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 {
		return json.RawMessage("null"), nil
	}
	var b bytes.Buffer
	if json.Valid(trimmed) {
		if err := json.Compact(&b, trimmed); err != nil {
			return nil, err
		}
	} else {
		// Not JSON: a string, NUL (which PostgreSQL cannot store) replaced,
		// invalid UTF-8 replaced by the encoder.
		s := strings.ReplaceAll(string(bytes.TrimRight(out, "\r\n")), "\x00", "\uFFFD")
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
	}
	if b.Len() > maxOutputBytes {
		return nil, tooBig
	}
	return b.Bytes(), nil
}

// failureText is a failed attempt's error for a CMD that ended how (its
// last line, "exit status 3"): the end of its stderr (tail; truncated when
// more came before it), within what an attempt's error holds
// (worker.FailureText).
func failureText(tail []byte, truncated bool, how string) string {
	s := strings.TrimRight(strings.ToValidUTF8(string(tail), "\uFFFD"), " \t\r\n")
	if s == "" {
		return worker.FailureText(how + " (nothing on stderr)")
	}
	budget := worker.MaxErrorBytes - len(how) - 1
	if truncated || len(s) > budget {
		budget -= len("...")
		cut := max(len(s)-budget, 0)
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		s = "..." + s[cut:]
	}
	return worker.FailureText(s + "\n" + how)
}

// outputBuffer keeps the first max bytes written to it, and counts all.
type outputBuffer struct {
	mu    sync.Mutex
	max   int
	buf   bytes.Buffer
	total int64
}

func (b *outputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// bytes returns what was kept and how much was written.
func (b *outputBuffer) bytes() ([]byte, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Bytes(), b.total
}

// stderrSink is where CMD's stderr goes: each line to the log, as a record
// of its own whatever --log-level (so that the worker's stderr stays one
// log), and the last maxErrorBytes kept for a failure's error.
type stderrSink struct {
	log   zerolog.Logger
	mu    sync.Mutex
	line  []byte
	last  []byte
	total int64
}

func (s *stderrSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(p)
	s.total += int64(n)
	s.last = append(s.last, p...)
	if len(s.last) > 2*maxErrorBytes {
		s.last = s.last[:copy(s.last, s.last[len(s.last)-maxErrorBytes:])]
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			if len(s.line) >= maxLogLine {
				s.emit()
			}
			break
		}
		s.line = append(s.line, p[:i]...)
		s.emit()
		p = p[i+1:]
	}
	return n, nil
}

// emit logs the line gathered so far; the caller holds mu.
func (s *stderrSink) emit() {
	s.log.Info().Str("stream", "stderr").Msg(string(bytes.TrimRight(s.line, "\r")))
	s.line = s.line[:0]
}

// flush logs a last line that ended without a newline.
func (s *stderrSink) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.line) > 0 {
		s.emit()
	}
}

// tail returns the last maxErrorBytes of what was written, and whether
// more came before them.
func (s *stderrSink) tail() ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.last[max(len(s.last)-maxErrorBytes, 0):]
	return bytes.Clone(b), s.total > int64(len(b))
}
