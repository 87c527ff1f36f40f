package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/lease"
)

const leaseUsage = `leasehold lease: acquire, renew, release and look at leases over the REST API

usage:
  leasehold lease acquire --resource R [--slots K] [--holder H] [--ttl 30s] [--wait 0s] [--json]
  leasehold lease renew   --resource R [--holder H] [--fence N] [--ttl D] [--json]
  leasehold lease release --resource R [--holder H] [--fence N] [--json]
  leasehold lease get     ID | --resource R [--json]
  leasehold lease list    [--state all|active|expired|released|renewed] [--prefix P] [--limit N] [--after-id N] [--json]
  leasehold lease limit   --resource R [--slots K] [--rate N/PERIOD] [--json]
  leasehold lease limits  [--after R] [--limit N] [--json]

With --slots K, acquire takes a free slot of R, a key of K slots (up to K
holders at once, each on a lease of its own, R#N, with its own fence); K is
R's limit if it has none yet. "lease limit" shows R's limit, its slots held
and the tasks waiting on it, and with --slots sets it (raising it wakes the
waiting tasks at once; lowering it lets the holders above it finish).

Every command takes --url (env LEASEHOLD_URL, default http://localhost:8080) and
--api-token (env LEASEHOLD_API_TOKEN). --holder defaults to LEASEHOLD_HOLDER, else
the host name, so that a later command on the same host names the same holder.
Output is a table, or with --json the API's JSON. Exit status: 0 done; 75 the
lease is held by another holder (acquire, after --wait if given); 76 the holder
holds no active lease on the resource (renew, release); 1 any other failure;
2 bad usage.
`

// Exit statuses of the lease and exec commands besides 0, 1 (a failure)
// and 2 (bad usage); exec also exits with its command's own status.
const (
	// exitNotWon: the lease is held by another holder (after --wait, if
	// given). 75 is EX_TEMPFAIL of sysexits.h: try again later.
	exitNotWon = 75
	// exitLost: the lease was lost (exec: while its command ran, which was
	// stopped); for renew and release, the holder holds no active lease.
	exitLost = 76
)

// exitStatus is an outcome with an exit status of its own: main exits with
// code, after printing err when there is one.
type exitStatus struct {
	code int
	err  error
}

func (e exitStatus) Error() string {
	if e.err == nil {
		return "exit status " + strconv.Itoa(e.code)
	}
	return e.err.Error()
}

func (e exitStatus) Unwrap() error { return e.err }

// Defaults of the client commands.
const defaultURL = "http://localhost:8080"

// clientFlags are the flags of every command that talks to the REST API.
type clientFlags struct {
	url, token string
}

func addClientFlags(fs *flag.FlagSet, getenv func(string) string) *clientFlags {
	var c clientFlags
	url := getenv("LEASEHOLD_URL")
	if url == "" {
		url = defaultURL
	}
	fs.StringVar(&c.url, "url", url, "the leasehold server (env LEASEHOLD_URL)")
	fs.StringVar(&c.token, "api-token", getenv("LEASEHOLD_API_TOKEN"), "the server's API token, if it has one (env LEASEHOLD_API_TOKEN)")
	return &c
}

// requestTimeout bounds each request of the CLI; a waiting acquisition
// gets its wait on top.
const requestTimeout = 30 * time.Second

// connect returns a client of the server and a function that closes its
// idle connections, for when the command is done. A bad --url is a usage
// error.
func (c *clientFlags) connect() (*leasehold.Leases, func(), error) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	client, err := leasehold.NewRemoteClient(leasehold.RemoteConfig{
		URL: c.url, Token: c.token, HTTPClient: &http.Client{Transport: transport, Timeout: requestTimeout},
	}, leasehold.Config{})
	if err != nil {
		return nil, nil, usagef("--url: %s", strings.TrimPrefix(err.Error(), leasehold.ErrInvalidConfig.Error()+": "))
	}
	return client.Leases(), transport.CloseIdleConnections, nil
}

// describe words a failed request for the user: the server's own sentence
// when it answered, what to check when it could not be reached.
func (c *clientFlags) describe(err error) error {
	var transport *url.Error
	if errors.As(err, &transport) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot reach leasehold at %s (%w); check that it runs, or point --url (LEASEHOLD_URL) at it", c.url, transport.Err)
	}
	var status *leasehold.StatusError
	if errors.As(err, &status) && status.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("%w (pass the server's token with --api-token or LEASEHOLD_API_TOKEN)", err)
	}
	return err
}

// acquireWaiting acquires the lease of p, waiting up to wait in all for a
// held resource to come free. One request waits at most lease.MaxWait, so
// a longer wait asks again until it is over. It returns the acquisition
// and when the first request was sent (a lease's local deadline may count
// from then: it is earlier than the winning request's).
func acquireWaiting(ctx context.Context, client *leasehold.Leases, p lease.AcquireParams, wait time.Duration) (lease.Acquisition, time.Time, error) {
	sent := time.Now()
	deadline := sent.Add(wait)
	for {
		p.Wait = min(max(time.Until(deadline), 0), lease.MaxWait).Truncate(time.Second)
		acq, err := client.Acquire(ctx, p)
		var held *lease.HeldError
		if !errors.As(err, &held) || ctx.Err() != nil || time.Until(deadline) < time.Second {
			return acq, sent, err
		}
	}
}

// defaultHolder is the holder of the lease commands when --holder is not
// given: LEASEHOLD_HOLDER, else the host name, the same from one command
// to the next on a host, so that a release names the holder an earlier
// acquire used.
func defaultHolder(getenv func(string) string) string {
	if h := getenv("LEASEHOLD_HOLDER"); h != "" {
		return h
	}
	host, _ := os.Hostname()
	return host
}

// durationFlag parses the value of a duration flag, within [lo, hi], in
// whole seconds when whole is set; the error names the flag and an example.
func durationFlag(name, raw string, lo, hi time.Duration, whole bool, example string) (time.Duration, error) {
	d, err := time.ParseDuration(raw)
	switch {
	case err != nil, d < lo, d > hi:
		return 0, fmt.Errorf("--%s %q must be a duration between %s and %s, e.g. %s", name, raw, shortDuration(lo), shortDuration(hi), example)
	case whole && d%time.Second != 0:
		return 0, fmt.Errorf("--%s %q must be whole seconds, e.g. %s", name, raw, example)
	}
	return d, nil
}

// shortDuration writes d without its zero minutes and seconds: 24h, not
// 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// joinUsage makes one usage error of every mistake found, or nil.
func joinUsage(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return usagef("%s", strings.Join(msgs, "; "))
}

// runLease is "leasehold lease <command>".
func runLease(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, leaseUsage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "acquire", "renew", "release":
		return runLeaseChange(ctx, cmd, rest, getenv, stdout, stderr)
	case "get":
		return runLeaseGet(ctx, rest, getenv, stdout, stderr)
	case "list":
		return runLeaseList(ctx, rest, getenv, stdout, stderr)
	case "limit", "limits":
		return runLeaseLimit(ctx, cmd, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, leaseUsage)
		return nil
	default:
		fmt.Fprint(stderr, leaseUsage)
		return usagef("unknown lease command %q; use acquire, renew, release, get, list, limit or limits", cmd)
	}
}

// runLeaseChange is acquire, renew and release: one lease of one holder.
func runLeaseChange(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold lease "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	resource := fs.String("resource", "", "the resource, e.g. report:nightly (required)")
	holder := fs.String("holder", defaultHolder(getenv), "the holder (env LEASEHOLD_HOLDER; default the host name)")
	asJSON := fs.Bool("json", false, "print the lease as the API's JSON instead of a table")
	var ttl, wait, fence string
	var slots int
	if cmd != "release" {
		help := "the lease's time to live, whole seconds from 1s to 1h (default the server's --lease-ttl)"
		if cmd == "renew" {
			help = "a new time to live, whole seconds from 1s to 1h (default the lease's own)"
		}
		fs.StringVar(&ttl, "ttl", "", help)
	}
	if cmd == "acquire" {
		fs.StringVar(&wait, "wait", "0s", "while another holder holds it, wait this long for it, e.g. 5m")
		fs.IntVar(&slots, "slots", 0, "take a free slot of R, a key of this many slots, 1 to 1000 (default: R's own lease)")
	} else {
		fs.StringVar(&fence, "fence", "", "the fence of the acquisition, which must match (default: any)")
	}
	err := parse(fs, args, stderr)
	if err != nil {
		return err
	}
	var errs []error
	if *resource == "" {
		errs = append(errs, errors.New("--resource is required, e.g. --resource report:nightly"))
	}
	if *holder == "" {
		errs = append(errs, errors.New("--holder is empty and the host name is unknown; pass --holder"))
	}
	var p struct {
		ttl, wait time.Duration
		fence     int64
	}
	if ttl != "" {
		if p.ttl, err = durationFlag("ttl", ttl, time.Second, time.Hour, true, "30s"); err != nil {
			errs = append(errs, err)
		}
	}
	if wait != "" {
		if p.wait, err = durationFlag("wait", wait, 0, 24*time.Hour, false, "5m"); err != nil {
			errs = append(errs, err)
		}
	}
	if slots < 0 || slots > lease.MaxSlots {
		errs = append(errs, fmt.Errorf("--slots %d must be from 1 to %d, e.g. --slots 3", slots, lease.MaxSlots))
	}
	if fence != "" {
		n, err := strconv.ParseInt(fence, 10, 64)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("--fence %q must be a positive integer, the fence of an acquisition", fence))
		}
		p.fence = n
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	client, done, err := cf.connect()
	if err != nil {
		return err
	}
	defer done()

	var l lease.Lease
	switch cmd {
	case "acquire":
		var acq lease.Acquisition
		acq, _, err = acquireWaiting(ctx, client, lease.AcquireParams{Resource: *resource, Holder: *holder, TTL: p.ttl, Slots: slots}, p.wait)
		l = acq.Lease
	case "renew":
		l, err = client.Renew(ctx, lease.RenewParams{Resource: *resource, Holder: *holder, Fence: p.fence, TTL: p.ttl})
	case "release":
		l, err = client.Release(ctx, lease.ReleaseParams{Resource: *resource, Holder: *holder, Fence: p.fence})
	}
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		return exitStatus{exitNotWon, heldMessage(held, p.wait)}
	case errors.Is(err, lease.ErrNotHeld):
		with := ""
		if p.fence != 0 {
			with = fmt.Sprintf(" with fence %d", p.fence)
		}
		return exitStatus{exitLost, fmt.Errorf("%s holds no active lease on %s%s: it expired, was released or was taken over; acquire it again",
			*holder, *resource, with)}
	case err != nil:
		return cf.describe(err)
	}
	return printLease(stdout, *asJSON, l)
}

// heldMessage says who holds the lease, until when, and what to do.
func heldMessage(held *lease.HeldError, waited time.Duration) error {
	l := held.Lease
	what := "pass --wait to wait for it"
	if waited > 0 {
		what = "still held after waiting " + waited.String()
	}
	return fmt.Errorf("%s is held by %s until %s (fence %d); %s",
		l.Resource, l.Holder, apitime.Format(l.ExpiresAt), l.Fence, what)
}

// runLeaseGet is "leasehold lease get ID" or "get --resource R".
func runLeaseGet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold lease get", flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	resource := fs.String("resource", "", "the resource whose lease to show, instead of an ID")
	asJSON := fs.Bool("json", false, "print the lease as the API's JSON instead of a table")
	pos, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	var id int64
	switch {
	case len(pos) > 1:
		return usagef("lease get takes one lease ID, not %q", pos)
	case len(pos) == 1 && *resource != "":
		return usagef("lease get takes a lease ID or --resource, not both")
	case len(pos) == 1:
		id, err = strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id < 1 {
			return usagef("lease ID %q must be a positive integer, e.g. leasehold lease get 7", pos[0])
		}
	case *resource == "":
		return usagef("lease get needs a lease ID or --resource, e.g. leasehold lease get --resource report:nightly")
	}
	client, done, err := cf.connect()
	if err != nil {
		return err
	}
	defer done()

	var l lease.Lease
	if id != 0 {
		l, err = client.Get(ctx, id)
		if errors.Is(err, lease.ErrNotFound) {
			return fmt.Errorf("no lease has ID %d; list them with leasehold lease list", id)
		}
	} else {
		l, err = leaseOf(ctx, client, *resource)
	}
	if err != nil {
		return cf.describe(err)
	}
	return printLease(stdout, *asJSON, l)
}

// leaseOf finds the lease of resource, the one lease a resource has: the
// API lists by prefix, so it pages through the resources that start with
// it for the one that is it.
func leaseOf(ctx context.Context, c *leasehold.Leases, resource string) (lease.Lease, error) {
	p := lease.ListParams{Filter: lease.FilterAll, Prefix: resource, Limit: 1000}
	for {
		page, err := c.List(ctx, p)
		if err != nil {
			return lease.Lease{}, err
		}
		for _, l := range page {
			if l.Resource == resource {
				return l, nil
			}
		}
		if len(page) < int(p.Limit) {
			return lease.Lease{}, fmt.Errorf("%s has no lease: it was never acquired", resource)
		}
		p.AfterID = page[len(page)-1].ID
	}
}

// runLeaseList is "leasehold lease list": one page of leases in id order.
func runLeaseList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold lease list", flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	state := fs.String("state", lease.FilterAll, "all, active, expired, released, or renewed (ever renewed)")
	prefix := fs.String("prefix", "", "only resources that start with this, e.g. report:")
	limit := fs.String("limit", "", "at most this many leases, 1 to 10000 (default the server's, 1000)")
	after := fs.String("after-id", "", "only leases with a greater ID: the next page after the last ID shown")
	asJSON := fs.Bool("json", false, "print a JSON array of the API's lease objects instead of a table")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	p := lease.ListParams{Filter: *state, Prefix: *prefix}
	var errs []error
	switch *state {
	case lease.FilterAll, string(lease.StateActive), string(lease.StateExpired), string(lease.StateReleased), lease.FilterRenewed:
	default:
		errs = append(errs, fmt.Errorf("--state %q must be all, active, expired, released or renewed", *state))
	}
	if *limit != "" {
		n, err := strconv.ParseInt(*limit, 10, 32)
		if err != nil || n < 1 || n > 10000 {
			errs = append(errs, fmt.Errorf("--limit %q must be an integer between 1 and 10000", *limit))
		}
		p.Limit = int32(n)
	}
	if *after != "" {
		n, err := strconv.ParseInt(*after, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--after-id %q must be a lease ID, a non-negative integer", *after))
		}
		p.AfterID = n
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	client, done, err := cf.connect()
	if err != nil {
		return err
	}
	defer done()
	leases, err := client.List(ctx, p)
	if err != nil {
		return cf.describe(err)
	}
	if err := printLeaseList(stdout, *asJSON, leases); err != nil {
		return err
	}
	if n := len(leases); !*asJSON && n > 0 && (n == int(p.Limit) || (p.Limit == 0 && n == 1000)) {
		fmt.Fprintf(stderr, "there may be more: the next page is leasehold lease list --after-id %d\n", leases[n-1].ID)
	}
	return nil
}

// printLease writes a lease as a table of one row, or as the API's JSON.
func printLease(w io.Writer, asJSON bool, l lease.Lease) error {
	if asJSON {
		return json.NewEncoder(w).Encode(l)
	}
	return leaseTable(w, []lease.Lease{l})
}

// printLeaseList writes leases as a table, or as a JSON array of the API's
// lease objects.
func printLeaseList(w io.Writer, asJSON bool, leases []lease.Lease) error {
	if asJSON {
		if leases == nil {
			leases = []lease.Lease{}
		}
		return json.NewEncoder(w).Encode(leases)
	}
	return leaseTable(w, leases)
}

func leaseTable(w io.Writer, leases []lease.Lease) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRESOURCE\tHOLDER\tFENCE\tSTATE\tTTL\tEXPIRES_AT")
	for _, l := range leases {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n",
			l.ID, l.Resource, l.Holder, l.Fence, l.State, l.TTL(), apitime.Format(l.ExpiresAt))
	}
	return tw.Flush()
}

// parseInterspersed parses flags wherever they stand among args ("lease
// get 7 --json" as well as "lease get --json 7") and returns the other
// arguments.
func parseInterspersed(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	fs.SetOutput(stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagError(err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runLeaseLimit is "leasehold lease limit" (one key's limit, set with
// --slots) and "leasehold lease limits" (a page of them).
func runLeaseLimit(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold lease "+cmd, flag.ContinueOnError)
	cf := addClientFlags(fs, getenv)
	asJSON := fs.Bool("json", false, "print the API's JSON instead of a table")
	var resource, after, rate string
	var slots, limit int
	if cmd == "limit" {
		fs.StringVar(&resource, "resource", "", "the key, e.g. imports:acme (required)")
		fs.IntVar(&slots, "slots", 0, "set the key's limit to this many slots, 1 to 1000 (default: only show it)")
		fs.StringVar(&rate, "rate", "", "set the key's rate: at most N of its tasks start in any period, as N/PERIOD, e.g. 50/1m; none removes it")
	} else {
		fs.StringVar(&after, "after", "", "only keys after this one: the next page after the last key shown")
		fs.IntVar(&limit, "limit", 100, "at most this many keys, 1 to 1000")
	}
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var errs []error
	if cmd == "limit" && resource == "" {
		errs = append(errs, errors.New("--resource is required, e.g. --resource imports:acme"))
	}
	if flagSet(fs, "slots") && (slots < 1 || slots > lease.MaxSlots) {
		errs = append(errs, fmt.Errorf("--slots %d must be from 1 to %d, e.g. --slots 3", slots, lease.MaxSlots))
	}
	if limit < 0 || limit > 1000 {
		errs = append(errs, fmt.Errorf("--limit %d must be from 1 to 1000", limit))
	}
	starts, period, rateErr := rateFlag(rate)
	if rateErr != nil {
		errs = append(errs, rateErr)
	}
	if err := joinUsage(errs); err != nil {
		return err
	}
	client, done, err := cf.connect()
	if err != nil {
		return err
	}
	defer done()
	var limits []lease.Limit
	switch {
	case cmd == "limits":
		limits, err = client.Limits(ctx, after, limit)
	case slots > 0 || rate != "":
		var l lease.Limit
		if slots > 0 {
			l, err = client.SetLimit(ctx, resource, slots)
		}
		if err == nil && rate != "" {
			l, err = client.SetRate(ctx, resource, starts, period)
		}
		limits = []lease.Limit{l}
	default:
		var l lease.Limit
		l, err = client.Limit(ctx, resource)
		if errors.Is(err, lease.ErrNotFound) {
			return fmt.Errorf("%s has no limit; set one with leasehold lease limit --resource %s --slots K", resource, resource)
		}
		limits = []lease.Limit{l}
	}
	if err != nil {
		return cf.describe(err)
	}
	if *asJSON {
		if limits == nil {
			limits = []lease.Limit{}
		}
		if cmd == "limit" {
			return json.NewEncoder(stdout).Encode(limits[0])
		}
		return json.NewEncoder(stdout).Encode(limits)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSLOTS\tHELD\tWAITING\tRATE\tSPENT\tUPDATED_AT")
	for _, l := range limits {
		r, spent := "-", "-"
		if l.RateStarts > 0 {
			r, spent = fmt.Sprintf("%d/%s", l.RateStarts, l.RatePeriod), strconv.Itoa(l.RateSpent)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", l.Resource, l.Slots, l.Held, l.Waiting, r, spent, apitime.Format(l.UpdatedAt))
	}
	return tw.Flush()
}

// rateFlag parses --rate N/PERIOD ("none": no rate; "": not given).
func rateFlag(raw string) (int, time.Duration, error) {
	if raw == "" || raw == "none" {
		return 0, 0, nil
	}
	bad := fmt.Errorf("--rate %q must be N/PERIOD, at most N task starts in any PERIOD (N 1 to 1000, PERIOD whole seconds from 1s to 24h), e.g. 50/1m; or none", raw)
	n, p, ok := strings.Cut(raw, "/")
	if !ok {
		return 0, 0, bad
	}
	starts, err := strconv.Atoi(n)
	if err != nil || starts < 1 || starts > lease.MaxSlots {
		return 0, 0, bad
	}
	period, err := time.ParseDuration(p)
	if err != nil || period < time.Second || period > 24*time.Hour || period%time.Second != 0 {
		return 0, 0, bad
	}
	return starts, period, nil
}
