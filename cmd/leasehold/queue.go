package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/task"
)

const queueUsage = `leasehold queue: pause and resume queues over the REST API

usage:
  leasehold queue pause  --queue Q [--until T] [--reason R] [--json]
  leasehold queue resume --queue Q
  leasehold queue paused [--json]

A paused queue's pending tasks are not claimed by any worker, embedded or
remote; its running tasks finish. --until (RFC 3339) ends the pause on its own;
without it the queue stays paused until resumed. Resuming wakes the waiting
workers at once. Pausing and resuming need a token with the admin scope.

Every command takes --url (env LEASEHOLD_URL, default http://localhost:8080) and
--api-token (env LEASEHOLD_API_TOKEN). Exit status: 0 done; 76 resume of a
queue that is not paused; 1 any other failure; 2 bad usage.
`

// runQueue is "leasehold queue": pause, resume, paused.
func runQueue(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, queueUsage)
		return errUsage
	}
	cmd := args[0]
	switch cmd {
	case "pause", "resume", "paused":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, queueUsage)
		return nil
	default:
		fmt.Fprint(stderr, queueUsage)
		return usagef("unknown queue command %q; use pause, resume or paused", cmd)
	}
	fs := flag.NewFlagSet("leasehold queue "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	var queue, until, reason string
	var asJSON bool
	if cmd != "paused" {
		fs.StringVar(&queue, "queue", "", "the queue, e.g. imports (required)")
	}
	if cmd == "pause" {
		fs.StringVar(&until, "until", "", "end the pause on its own at this RFC 3339 time, e.g. 2030-01-02T15:04:05Z (default: when resumed)")
		fs.StringVar(&reason, "reason", "", "why, shown with the pause")
	}
	if cmd != "resume" {
		fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	}
	if err := parse(fs, args[1:], stderr); err != nil {
		return err
	}
	var errs []error
	if cmd != "paused" {
		if queue == "" {
			errs = append(errs, errors.New("--queue is required, e.g. --queue imports"))
		}
		errs = append(errs, checkNameFlags(fs, map[string]string{"queue": queue})...)
	}
	var at time.Time
	if until != "" {
		var err error
		if at, err = time.Parse(time.RFC3339Nano, until); err != nil || at.Year() < 1 || at.Year() > 9999 {
			errs = append(errs, fmt.Errorf("--until %q must be an RFC 3339 time, e.g. 2030-01-02T15:04:05Z", until))
		}
	}
	if len(reason) > 1000 {
		errs = append(errs, fmt.Errorf("--reason is %d bytes; at most 1000", len(reason)))
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	api, done, err := cf.rest(1, requestTimeout)
	if err != nil {
		return err
	}
	defer done()
	tasks := restclient.Tasks{C: api}
	var pauses []task.QueuePause
	switch cmd {
	case "pause":
		var p task.QueuePause
		p, err = tasks.PauseQueue(ctx, queue, at, reason)
		pauses = []task.QueuePause{p}
	case "resume":
		var resumed bool
		if resumed, err = tasks.ResumeQueue(ctx, queue); err == nil && !resumed {
			return exitStatus{exitLost, fmt.Errorf("the queue %s is not paused", queue)}
		}
		if err == nil {
			fmt.Fprintf(stdout, "resumed %s\n", queue)
			return nil
		}
	case "paused":
		pauses, err = tasks.PausedQueues(ctx)
	}
	if err != nil {
		return cf.describe(err)
	}
	if asJSON {
		if cmd == "pause" {
			return json.NewEncoder(stdout).Encode(pauses[0])
		}
		if pauses == nil {
			pauses = []task.QueuePause{}
		}
		return json.NewEncoder(stdout).Encode(pauses)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPAUSED_AT\tUNTIL\tREASON")
	for _, p := range pauses {
		u := "until resumed"
		if p.Until != nil {
			u = apitime.Format(*p.Until)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Queue, apitime.Format(p.PausedAt), u, orDash(p.Reason))
	}
	return tw.Flush()
}
