package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
)

const execUsage = `usage: leasehold exec --resource R [--slots K] [--ttl 30s] [--holder H] [--wait D] [--grace D] -- CMD ARGS...

Runs CMD only while holding the lease on R: acquires it (waiting up to --wait
while another holder has it), starts CMD with LEASEHOLD_RESOURCE,
LEASEHOLD_HOLDER and LEASEHOLD_FENCE in its environment, renews the lease while
CMD runs, and releases it when CMD exits. When the lease is lost CMD is stopped:
SIGTERM, then SIGKILL after --grace (10s, or half the --ttl when that is
shorter). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 sent to leasehold exec are passed on to CMD.

With --slots K, R is a key of K slots: up to K commands run at once, each
under a slot's lease of its own (LEASEHOLD_RESOURCE is the slot's, R#N, and
LEASEHOLD_FENCE its fence). K is R's limit if it has none yet; "leasehold
lease limit --resource R --slots K" changes it.

Exit status: CMD's own (128+N when a signal N ended it); 75 the lease could not
be won (held by another holder, and no --wait or it ran out); 76 the lease was
lost while CMD ran (CMD was stopped); 126/127 CMD could not be started / found;
2 bad usage; 1 any other failure (the server could not be reached, ...).

flags:
`

// execSignals are the signals leasehold exec passes on to its command:
// those that ask a program to stop, and the two user signals. While it
// waits for the lease, the first four end the wait instead.
var execSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// execOptions is a parsed "leasehold exec" command line.
type execOptions struct {
	client    *clientFlags
	resource  string
	holder    string
	ttl       time.Duration
	wait      time.Duration
	grace     time.Duration
	slots     int      // R is a key of that many slots (0: one lease, R's)
	passToken bool     // CMD gets LEASEHOLD_API_TOKEN
	argv      []string // CMD ARGS...
}

// keep is how the lease is kept while CMD runs. The holder's deadline
// (when it counts the lease as lost without a successful renewal) comes
// TTL/10 + grace before the lease can expire on the server, so that CMD,
// given SIGTERM at the deadline and SIGKILL a grace later, is gone before
// anyone else can win the lease; renewals come at a third of what is left.
func (o execOptions) keep() lease.KeepConfig {
	c := lease.KeepConfig{TTL: o.ttl, Margin: o.ttl / 10, Grace: o.grace}
	c.RenewInterval = c.Window() / 3
	return c
}

// defaultExecGrace is --grace when it is not given and half the --ttl is
// longer.
const defaultExecGrace = 10 * time.Second

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func parseExec(args []string, getenv func(string) string, stderr io.Writer) (execOptions, error) {
	fs := flag.NewFlagSet("leasehold exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), execUsage)
		fs.PrintDefaults()
	}
	o := execOptions{client: addClientFlags(fs, getenv)}
	fs.StringVar(&o.resource, "resource", "", "the resource whose lease CMD runs under, e.g. report:nightly (required)")
	fs.IntVar(&o.slots, "slots", 0, "run under any free slot of R, a key of this many slots (1 to 1000), so that that many commands run at once (default: one lease, R's own)")
	fs.BoolVar(&o.passToken, "pass-token", false, "give CMD the API token in LEASEHOLD_API_TOKEN, for a command that calls the API itself (by default CMD does not see it)")
	fs.StringVar(&o.holder, "holder", "", "the holder, which must be unique among the invocations that may run at once (default <hostname>-<pid>)")
	ttl := fs.String("ttl", "30s", "the lease's time to live, whole seconds from 1s to 1h")
	wait := fs.String("wait", "0s", "while another holder holds the lease, wait this long for it (0s: exit 75 at once), e.g. 5m")
	grace := fs.String("grace", "", "when the lease is lost, how long CMD has between SIGTERM and SIGKILL; at most half the --ttl (default 10s, or half the --ttl when that is shorter)")
	if err := fs.Parse(args); err != nil {
		return o, flagError(err)
	}
	o.argv = fs.Args()
	var errs []error
	var err error
	if o.resource == "" {
		errs = append(errs, errors.New("--resource is required, e.g. leasehold exec --resource report:nightly -- ./nightly.sh"))
	}
	if flagSet(fs, "slots") && (o.slots < 1 || o.slots > lease.MaxSlots) {
		errs = append(errs, fmt.Errorf("--slots %d must be from 1 to %d, e.g. --slots 3", o.slots, lease.MaxSlots))
	}
	if len(o.argv) == 0 {
		errs = append(errs, errors.New("no command to run: put it after --, e.g. leasehold exec --resource report:nightly -- ./nightly.sh"))
	}
	if o.ttl, err = durationFlag("ttl", *ttl, time.Second, time.Hour, true, "30s"); err != nil {
		errs = append(errs, err)
	}
	if o.wait, err = durationFlag("wait", *wait, 0, 24*time.Hour, false, "5m"); err != nil {
		errs = append(errs, err)
	}
	if !flagSet(fs, "grace") {
		// The default adapts to the TTL, so that a short --ttl alone is a
		// valid command line: at most half of it still stops CMD, grace
		// included, before the lease can expire.
		o.grace = min(defaultExecGrace, o.ttl/2)
	} else if o.grace, err = durationFlag("grace", *grace, 0, 30*time.Minute, false, "10s"); err != nil {
		errs = append(errs, err)
	} else if o.ttl > 0 && o.grace > o.ttl/2 {
		errs = append(errs, fmt.Errorf("--grace %s must be at most half the --ttl %s: CMD must be stopped, grace included, before the lease can expire; shorten --grace, lengthen --ttl, or leave --grace out for min(10s, half the --ttl)", o.grace, o.ttl))
	}
	if o.holder == "" {
		o.holder = hostPID()
	}
	return o, joinUsage(errs)
}

// runExec is "leasehold exec": CMD runs only while this process holds the
// lease on --resource (see execUsage). It exits through an exitStatus
// unless it fails before CMD could start.
//
// It takes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 itself
// (main leaves them to it) to pass them on to CMD. CMD runs in a session
// of its own, so that a Ctrl-C at a terminal reaches it once, through
// leasehold exec, and so that stopping it stops what it started too; and
// it is killed should leasehold exec die without stopping it (kill -9),
// since nobody would renew the lease. ctx ending counts as a SIGTERM.
func runExec(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseExec(args, getenv, stderr)
	if err != nil {
		return err
	}
	client, done, err := o.client.connect()
	if err != nil {
		return err
	}
	defer done()

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, execSignals...)
	defer signal.Stop(sigs)

	won, sent, err := winLease(ctx, client, o, sigs)
	if err != nil {
		return err
	}
	// The holding lives until CMD has exited, whatever happens to ctx. Its
	// first deadline counts from when the winning request was sent; one
	// that waited for the lease (or found it already ours) is renewed
	// first, so that the deadline counts from a request sent now.
	keep := o.keep()
	l := won.Lease
	if !won.New || time.Since(sent) > keep.RenewInterval {
		sent = time.Now()
		l, err = client.Renew(context.WithoutCancel(ctx), lease.RenewParams{Resource: l.Resource, Holder: o.holder, Fence: l.Fence, TTL: o.ttl})
		switch {
		case errors.Is(err, lease.ErrNotHeld):
			return exitStatus{exitNotWon, fmt.Errorf("the lease on %s lapsed between winning it and keeping it; %s did not run", won.Lease.Resource, o.argv[0])}
		case err != nil:
			releaseQuietly(client, o)
			return fmt.Errorf("keep the lease on %s: %w", o.resource, o.client.describe(err))
		}
	}
	h, err := client.Keep(context.WithoutCancel(ctx), l, sent, keep)
	if err != nil { // cannot happen: parseExec checked the configuration
		releaseQuietly(client, o)
		return err
	}
	return runHolding(ctx, client, h, o, sigs, stdout, stderr)
}

// winLease acquires the lease, waiting up to o.wait for it, and returns
// the acquisition and when its request was sent. A signal that asks to
// stop (or ctx ending) ends the wait; CMD then never runs.
func winLease(ctx context.Context, client *leasehold.Leases, o execOptions, sigs <-chan os.Signal) (lease.Acquisition, time.Time, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var won lease.Acquisition
	sent := time.Now()
	go func() {
		var err error
		won, _, err = acquireWaiting(wctx, client, lease.AcquireParams{Resource: o.resource, Holder: o.holder, TTL: o.ttl, Slots: o.slots}, o.wait)
		done <- err
	}()
	var err error
	var stop os.Signal
wait:
	for {
		select {
		case err = <-done:
			break wait
		case s := <-sigs:
			if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
				continue // nobody to pass them on to yet
			}
			stop = s
			cancel()
			err = <-done
			break wait
		}
	}
	var held *lease.HeldError
	switch {
	case stop != nil || ctx.Err() != nil:
		// The lease may have been won just as the wait was cut short.
		releaseQuietly(client, o)
		if stop != nil {
			sig := stop.(syscall.Signal)
			return lease.Acquisition{}, sent, exitStatus{128 + int(sig), fmt.Errorf("signal %d (%s) while waiting for the lease on %s; %s did not run", int(sig), sig, o.resource, o.argv[0])}
		}
		return lease.Acquisition{}, sent, ctx.Err()
	case err == nil:
		return won, sent, nil
	case errors.As(err, &held):
		return lease.Acquisition{}, sent, exitStatus{exitNotWon, heldMessage(held, o.wait)}
	case leasehold.IsTransient(err):
		// The lease may have been won although the answer was lost.
		releaseQuietly(client, o)
	}
	return lease.Acquisition{}, sent, fmt.Errorf("acquire the lease on %s: %w", o.resource, o.client.describe(err))
}

// releaseTimeout bounds the release of the lease when CMD is done.
const releaseTimeout = 10 * time.Second

// releaseQuietly gives up whatever lease o's holder may hold on the
// resource (on any of its slots, with --slots), when exec ends without
// knowing.
func releaseQuietly(client *leasehold.Leases, o execOptions) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if o.slots == 0 {
		_, _ = client.Release(ctx, lease.ReleaseParams{Resource: o.resource, Holder: o.holder})
		return
	}
	for n := 1; n <= o.slots && ctx.Err() == nil; n++ {
		_, _ = client.Release(ctx, lease.ReleaseParams{Resource: lease.SlotName(o.resource, n), Holder: o.holder})
	}
}

// runHolding runs CMD under the held lease until CMD exits, stopping it
// when the lease is lost, and releases the lease after it.
func runHolding(ctx context.Context, client *leasehold.Leases, h *leasehold.Holding, o execOptions,
	sigs <-chan os.Signal, stdout, stderr io.Writer) error {
	l := h.Lease()
	name := filepath.Base(o.argv[0])
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Env = append(childEnv(o.passToken, o.client.token),
		"LEASEHOLD_RESOURCE="+l.Resource, "LEASEHOLD_HOLDER="+l.Holder, "LEASEHOLD_FENCE="+strconv.FormatInt(l.Fence, 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// A session of its own (see runExec); Pdeathsig is sent when the thread
	// that started CMD ends, so this goroutine keeps its thread until CMD
	// has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// Should what CMD started keep a pipe of ours open (when stdout is not
	// a file), do not wait for it past this.
	cmd.WaitDelay = time.Second
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		rerr := h.Release(rctx)
		cancel()
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		if rerr != nil {
			err = fmt.Errorf("%w (and the lease could not be released: %w)", err, rerr)
		}
		return exitStatus{code, fmt.Errorf("start %s: %w", o.argv[0], err)}
	}
	group := -cmd.Process.Pid // CMD leads its session and process group
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var (
		lost       error
		killTimer  *time.Timer
		kill       <-chan time.Time
		ctxDone    = ctx.Done()
		holdingEnd = h.Context().Done()
		waitErr    error
	)
run:
	for {
		select {
		case waitErr = <-exited:
			break run
		case s := <-sigs:
			_ = syscall.Kill(group, s.(syscall.Signal))
		case <-ctxDone:
			ctxDone = nil
			_ = syscall.Kill(group, syscall.SIGTERM)
		case <-holdingEnd:
			holdingEnd = nil
			lost = h.Err()
			fmt.Fprintf(stderr, "leasehold exec: lost the lease on %s (fence %d): %s; stopping %s (SIGTERM, then SIGKILL after %s)\n",
				l.Resource, l.Fence, lostReason(lost), name, o.grace)
			_ = syscall.Kill(group, syscall.SIGTERM)
			killTimer = time.NewTimer(o.grace)
			kill = killTimer.C
		case <-kill:
			kill = nil
			fmt.Fprintf(stderr, "leasehold exec: %s still runs %s after SIGTERM; SIGKILL\n", name, o.grace)
			_ = syscall.Kill(group, syscall.SIGKILL)
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if cmd.ProcessState == nil {
		return errors.Join(fmt.Errorf("wait for %s: %w", name, waitErr), h.Release(rctx))
	}
	status, how := exitOf(cmd.ProcessState)
	if lost != nil {
		// What CMD started and left behind would run on without the lease.
		_ = syscall.Kill(group, syscall.SIGKILL)
		// CMD is gone: a lease given up at its deadline is released now
		// (the last renewal may have landed although its answer did not);
		// refused, and nothing changes, when it lapsed or was refused.
		_ = h.Release(rctx)
		return exitStatus{exitLost, fmt.Errorf("lost the lease on %s (fence %d) while %s ran: %s; %s was stopped (it %s)",
			l.Resource, l.Fence, name, lostReason(lost), name, how)}
	}
	switch err := h.Release(rctx); {
	case errors.Is(err, lease.ErrNotHeld):
		return exitStatus{exitLost, fmt.Errorf("%s %s, but the lease on %s (fence %d) had been lost before it could be released (expired, released or taken over)",
			name, how, l.Resource, l.Fence)}
	case err != nil:
		fmt.Fprintf(stderr, "leasehold exec: could not release the lease on %s (%v); it expires on its own within %s\n",
			l.Resource, o.client.describe(err), o.ttl)
	}
	if status == 0 {
		return nil
	}
	return exitStatus{code: status}
}

// lostReason words why a holding lost its lease.
func lostReason(err error) string {
	if errors.Is(err, lease.ErrNotHeld) {
		return "a renewal was refused (the lease expired, was released or was taken over)"
	}
	return err.Error() // ErrDeadline, with the last renewal's error
}

// exitOf returns the status a shell would give for how a process ended
// (128+N for a signal N), and words it.
func exitOf(ps *os.ProcessState) (int, string) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), fmt.Sprintf("was ended by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return ps.ExitCode(), "exited with status " + strconv.Itoa(ps.ExitCode())
}

// childEnv is the environment of a command exec or work runs: this
// process's, without the API token (a command that does not call the API
// has no use for it, and one that logs its environment would leak it), or
// with the token the command line gave when pass asks for it.
func childEnv(pass bool, token string) []string {
	env := withoutEnv(os.Environ(), "LEASEHOLD_API_TOKEN")
	if pass && token != "" {
		env = append(env, "LEASEHOLD_API_TOKEN="+token)
	}
	return env
}
