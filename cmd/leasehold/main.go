// Command leasehold is one replica of the lease service and its tools: see
// usage below and the README.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"
)

const usage = `leasehold: leases and a task queue on PostgreSQL

usage:
  leasehold serve    [flags]   run one replica (REST API, reaper, ...)
  leasehold migrate  [flags]   apply the database migrations and exit
  leasehold demo     [flags]   a local PostgreSQL (unless DATABASE_URL is set), 3 replicas and a round-robin front door on :8080
                               (leasehold demo replica [flags] is one of its replicas: serve with the demo's roles and faults)
  leasehold bench    [flags]   measure the hot paths on your database (see docs/guide/cli.md)
  leasehold lease    CMD [flags]   acquire, renew, release, get or list leases, and set keys' limits, over a server's REST API (see docs/guide/cli.md)
  leasehold exec     [flags] -- CMD ARGS...   run CMD only while holding a lease: leasehold exec --resource R -- CMD ARGS...
  leasehold work     [flags] -- CMD ARGS...   a task worker for any program: leasehold work --kind K -- CMD ARGS... runs CMD for each task of kind K
  leasehold task     CMD [flags]   add, get, list, cancel or retry tasks over a server's REST API (see docs/guide/cli.md)
  leasehold schedule CMD [flags]   add, replace, get, list or remove schedules (a task per cron tick) over a server's REST API
  leasehold queue    CMD [flags]   pause, resume or list paused queues over a server's REST API
  leasehold localdb  [--stop]  start or reuse the local development PostgreSQL and print its URL; --stop stops it
  leasehold version            print the version

Run "leasehold <command> -h" for the flags of a command.
`

func init() {
	// Log times with milliseconds: failovers and expiries are read off the logs.
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// errUsage marks errors of the command line: exit status 2. Alone, it
// means the usage was printed already.
var errUsage = errors.New("usage")

// usageError is a command-line error with its own message.
type usageError struct{ err error }

func (e usageError) Error() string      { return e.err.Error() }
func (e usageError) Unwrap() error      { return e.err }
func (usageError) Is(target error) bool { return target == errUsage }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func main() {
	var ctx context.Context
	var stop context.CancelFunc
	if len(os.Args) > 1 && os.Args[1] == "exec" {
		// exec takes the signals itself, to pass them on to its command.
		ctx, stop = context.WithCancel(context.Background())
	} else {
		ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	}
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	var status exitStatus
	if errors.As(err, &status) {
		if status.err != nil {
			fmt.Fprintln(os.Stderr, "leasehold:", status.err)
		}
		os.Exit(status.code)
	}
	if err != nil {
		if err != errUsage { //nolint:errorlint // the bare sentinel: usage was printed
			fmt.Fprintln(os.Stderr, "leasehold:", err)
		}
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run is the whole program; main only supplies the process's environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest, getenv, stderr)
	case "migrate":
		return runMigrate(ctx, rest, getenv, stdout, stderr)
	case "demo":
		return runDemo(ctx, rest, getenv, stderr)
	case "bench":
		return runBench(ctx, rest, getenv, stdout, stderr)
	case "localdb":
		return runLocalDB(ctx, rest, stdout, stderr)
	case "lease":
		return runLease(ctx, rest, getenv, stdout, stderr)
	case "exec":
		return runExec(ctx, rest, getenv, stdout, stderr)
	case "work":
		return runWork(ctx, rest, getenv, stderr)
	case "task":
		return runTask(ctx, rest, getenv, stdout, stderr)
	case "schedule":
		return runSchedule(ctx, rest, getenv, stdout, stderr)
	case "queue":
		return runQueue(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usagef("unknown command %q", cmd)
	}
}
