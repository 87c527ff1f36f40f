package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `soak: leasehold's chaos soak

usage:
  soak [flags]       replicas of --leasehold under load and random faults, then the history checked
  soak app [flags]   one of the soak's applications on the Go library (the soak starts them)

Run "soak -h" for the flags.
`

// maxReplicas bounds --replicas: replica-a ... replica-z.
const maxReplicas = 26

// errUsage marks errors of the command line: exit status 2.
var errUsage = errors.New("usage")

type usageError struct{ err error }

func (e usageError) Error() string      { return e.err.Error() }
func (e usageError) Unwrap() error      { return e.err }
func (usageError) Is(target error) bool { return target == errUsage }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// parse parses fs, which takes no positional arguments.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if err != errUsage { //nolint:errorlint // the bare sentinel: usage was printed
			fmt.Fprintln(os.Stderr, "soak:", err)
		}
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "app":
			return runApp(ctx, args[1:], getenv, stderr)
		case "help":
			fmt.Fprint(stdout, usage)
			return nil
		}
	}
	return runSoak(ctx, args, stdout, stderr)
}
