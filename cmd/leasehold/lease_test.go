package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// cliExitCode is the status main exits with for what run returned.
func cliExitCode(err error) int {
	var status exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &status):
		return status.code
	case errors.Is(err, errUsage):
		return 2
	default:
		return 1
	}
}

// cli runs leasehold commands in-process against one replica.
type cli struct {
	t      *testing.T
	getenv func(string) string
}

// run runs "leasehold args..." and returns its stdout, its error and the
// exit status main would give.
func (c cli) run(args ...string) (string, int, error) {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(c.t.Context(), args, c.getenv, &stdout, &stderr)
	if err == nil && stderr.Len() > 0 && !strings.HasPrefix(stderr.String(), "there may be more") {
		c.t.Errorf("leasehold %q succeeded but wrote to stderr: %s", args, &stderr)
	}
	return stdout.String(), cliExitCode(err), err
}

// ok runs "leasehold args..." and fails the test unless it succeeds.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	out, _, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("leasehold %q: %v", args, err)
	}
	return out
}

// okJSON runs a command with --json and decodes its output into a T.
func okJSON[T any](c cli, args ...string) T {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		c.t.Fatalf("leasehold %q --json: decode %q: %v", args, out, err)
	}
	return v
}

// fails runs "leasehold args..." and wants it to fail with the exit status
// code and an error saying each of want.
func (c cli) fails(code int, args []string, want ...string) {
	c.t.Helper()
	out, got, err := c.run(args...)
	if got != code {
		c.t.Errorf("leasehold %q: got exit status %d (%v), want %d", args, got, err, code)
		return
	}
	if out != "" {
		c.t.Errorf("leasehold %q failed but wrote %q to stdout", args, out)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		c.t.Errorf("leasehold %q: error %q, want one line", args, msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			c.t.Errorf("leasehold %q: error %q, want it to say %q", args, msg, w)
		}
	}
}

// cliLease is the lease object of the API, as --json prints it.
type cliLease struct {
	ID         int64   `json:"id"`
	Resource   string  `json:"resource"`
	Holder     string  `json:"holder"`
	Fence      int64   `json:"fence"`
	State      string  `json:"state"`
	TTLSeconds int     `json:"ttl_seconds"`
	CreatedAt  string  `json:"created_at"`
	RenewedAt  *string `json:"renewed_at"`
	ReleasedAt *string `json:"released_at"`
	ExpiresAt  string  `json:"expires_at"`
}

// tableRows parses a table the lease commands print: the header, then one
// map per row from column name to value.
func tableRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := strings.Fields(lines[0])
	if strings.Join(header, " ") != "ID RESOURCE HOLDER FENCE STATE TTL EXPIRES_AT" {
		t.Fatalf("table header: got %q, want ID RESOURCE HOLDER FENCE STATE TTL EXPIRES_AT", lines[0])
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := strings.Fields(line)
		if len(cells) != len(header) {
			t.Fatalf("table row %q: got %d cells, want %d", line, len(cells), len(header))
		}
		row := map[string]string{}
		for i, h := range header {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	return rows
}

// TestLeaseCommands drives acquire, renew, release, get and list against a
// replica that requires an API token, given in the environment, as tables
// and as JSON, with the exit statuses of refusals.
func TestLeaseCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "cli-token-of-the-test"
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--api-token", token},
		env("DATABASE_URL", db.URL)))
	a := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token, "LEASEHOLD_HOLDER", "holder-a")}
	b := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token)}

	// acquire: a table of the new lease; the holder from LEASEHOLD_HOLDER.
	rows := tableRows(t, a.ok("lease", "acquire", "--resource", "cli:job", "--ttl", "1m"))
	if len(rows) != 1 || rows[0]["RESOURCE"] != "cli:job" || rows[0]["HOLDER"] != "holder-a" ||
		rows[0]["STATE"] != "active" || rows[0]["TTL"] != "1m0s" {
		t.Fatalf("acquire table: got %v, want one active row of cli:job held by holder-a, TTL 1m0s", rows)
	}
	// Again, as JSON: the same lease, not new.
	l := okJSON[cliLease](a, "lease", "acquire", "--resource", "cli:job", "--ttl", "1m")
	if strconv.FormatInt(l.Fence, 10) != rows[0]["FENCE"] || strconv.FormatInt(l.ID, 10) != rows[0]["ID"] || l.TTLSeconds != 60 {
		t.Errorf("acquire --json: got %+v, want the lease of the table %v", l, rows[0])
	}

	// Another holder (the host name by default) is refused: 75, naming a.
	host, _ := os.Hostname()
	b.fails(exitNotWon, []string{"lease", "acquire", "--resource", "cli:job"}, "cli:job is held by holder-a", "fence "+rows[0]["FENCE"], "--wait")
	b.fails(exitNotWon, []string{"lease", "acquire", "--resource", "cli:job", "--wait", "1s"}, "held by holder-a", "after waiting 1s")
	if got := okJSON[cliLease](b, "lease", "acquire", "--resource", "cli:other"); got.Holder != host {
		t.Errorf("acquire without --holder or LEASEHOLD_HOLDER: holder %q, want the host name %q", got.Holder, host)
	}

	// renew with the fence; a wrong fence or holder is 76.
	fence := strconv.FormatInt(l.Fence, 10)
	renewed := okJSON[cliLease](a, "lease", "renew", "--resource", "cli:job", "--fence", fence, "--ttl", "2m")
	if renewed.Fence != l.Fence || renewed.TTLSeconds != 120 || renewed.ExpiresAt < l.ExpiresAt {
		t.Errorf("renew: got %+v, want fence %d, TTL 120 s, expiring no earlier than %s", renewed, l.Fence, l.ExpiresAt)
	}
	a.fails(exitLost, []string{"lease", "renew", "--resource", "cli:job", "--fence", strconv.FormatInt(l.Fence+1000, 10)},
		"holder-a holds no active lease on cli:job with fence")
	b.fails(exitLost, []string{"lease", "renew", "--resource", "cli:job", "--holder", "stranger"}, "stranger holds no active lease")

	// get by ID (flags after it too) and by resource; list by state and prefix.
	byID := okJSON[cliLease](b, "lease", "get", strconv.FormatInt(l.ID, 10))
	byResource := okJSON[cliLease](b, "lease", "get", "--resource", "cli:job")
	if !reflect.DeepEqual(byID, byResource) || byID.Holder != "holder-a" || byID.TTLSeconds != 120 {
		t.Errorf("get: by ID %+v, by resource %+v; want the same, renewed lease of holder-a", byID, byResource)
	}
	if rows := tableRows(t, b.ok("lease", "get", "--resource", "cli:job")); len(rows) != 1 || rows[0]["ID"] != strconv.FormatInt(l.ID, 10) {
		t.Errorf("get table: got %v, want the row of lease %d", rows, l.ID)
	}
	listed := tableRows(t, b.ok("lease", "list", "--state", "active", "--prefix", "cli:"))
	if len(listed) != 2 || listed[0]["RESOURCE"] != "cli:job" || listed[1]["RESOURCE"] != "cli:other" {
		t.Errorf("list --state active --prefix cli: got %v, want cli:job and cli:other", listed)
	}
	page := okJSON[[]cliLease](b, "lease", "list", "--prefix", "cli:", "--limit", "1")
	next := okJSON[[]cliLease](b, "lease", "list", "--prefix", "cli:", "--after-id", strconv.FormatInt(page[0].ID, 10))
	if len(page) != 1 || page[0].Resource != "cli:job" || len(next) != 1 || next[0].Resource != "cli:other" {
		t.Errorf("list pages: got %+v then %+v, want cli:job then cli:other", page, next)
	}
	if got := okJSON[[]cliLease](b, "lease", "list", "--state", "released"); len(got) != 0 {
		t.Errorf("list --state released: got %+v, want an empty array", got)
	}

	// release; a second release is 76.
	released := okJSON[cliLease](a, "lease", "release", "--resource", "cli:job", "--fence", fence)
	if released.State != "released" || released.ReleasedAt == nil {
		t.Errorf("release: got %+v, want it released", released)
	}
	a.fails(exitLost, []string{"lease", "release", "--resource", "cli:job"}, "holder-a holds no active lease on cli:job")
	b.fails(1, []string{"lease", "get", "999999"}, "no lease has ID 999999")
	b.fails(1, []string{"lease", "get", "--resource", "cli:never"}, "cli:never has no lease")

	// Without the token: the server's 401, and how to pass the token.
	noToken := cli{t, env("LEASEHOLD_URL", r.url)}
	noToken.fails(1, []string{"lease", "list"}, "401", "--api-token")
	// Nobody there: what to check.
	nobody := cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}
	nobody.fails(1, []string{"lease", "list"}, "cannot reach leasehold at http://127.0.0.1:1", "--url")
}

// TestLeaseCommandsRejectBadUsage: mistakes on the command line are exit
// status 2 with a message naming them, before anything is sent.
func TestLeaseCommandsRejectBadUsage(t *testing.T) {
	t.Parallel()
	c := cli{t, env("LEASEHOLD_URL", "http://127.0.0.1:1")}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"lease"}, []string{"usage"}},
		{[]string{"lease", "steal"}, []string{`"steal"`, "acquire, renew, release, get, list, limit or limits"}},
		{[]string{"lease", "acquire"}, []string{"--resource is required"}},
		{[]string{"lease", "acquire", "--resource", "r", "--ttl", "1500ms"}, []string{`--ttl "1500ms"`, "whole seconds"}},
		{[]string{"lease", "acquire", "--resource", "r", "--ttl", "2h"}, []string{`--ttl "2h"`, "between 1s and 1h"}},
		{[]string{"lease", "acquire", "--resource", "r", "--wait", "soon"}, []string{`--wait "soon"`}},
		{[]string{"lease", "acquire", "--resource", "r", "--fence", "3"}, []string{"fence"}},
		{[]string{"lease", "renew", "--resource", "r", "--fence", "0"}, []string{`--fence "0"`, "positive integer"}},
		{[]string{"lease", "release", "--resource", "r", "--ttl", "30s"}, []string{"ttl"}},
		{[]string{"lease", "release", "--resource", "r", "stray"}, []string{"stray"}},
		{[]string{"lease", "get"}, []string{"lease ID or --resource"}},
		{[]string{"lease", "get", "seven"}, []string{`"seven"`, "positive integer"}},
		{[]string{"lease", "get", "7", "8"}, []string{"one lease ID"}},
		{[]string{"lease", "get", "7", "--resource", "r"}, []string{"not both"}},
		{[]string{"lease", "list", "--state", "stale"}, []string{`--state "stale"`}},
		{[]string{"lease", "list", "--limit", "0"}, []string{`--limit "0"`}},
		{[]string{"lease", "list", "--after-id", "-1"}, []string{`--after-id "-1"`}},
		{[]string{"lease", "list", "--url", "localhost:8080"}, []string{"--url", "http://"}},
		// Every mistake at once, each named.
		{[]string{"lease", "acquire", "--ttl", "0s", "--wait", "-1s"}, []string{"--resource", `--ttl "0s"`, `--wait "-1s"`}},
	} {
		_, code, err := c.run(tc.args...)
		if code != 2 {
			t.Errorf("leasehold %q: got exit status %d (%v), want 2", tc.args, code, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("leasehold %q: error %q, want it to say %q", tc.args, err, w)
			}
		}
	}
}

// TestLeaseAcquireWaitsPastOneRequest: --wait beyond what one request may
// wait (lease.MaxWait) is taken (the acquisition asks again as each
// request's wait ends), and wins the lease once its holder releases it.
func TestLeaseAcquireWaitsPastOneRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api"}, env("DATABASE_URL", db.URL)))
	a := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_HOLDER", "holder-a")}
	b := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_HOLDER", "holder-b")}
	a.ok("lease", "acquire", "--resource", "long:wait", "--ttl", "1h")

	type result struct {
		out  string
		code int
		err  error
	}
	got := make(chan result, 1)
	go func() {
		out, code, err := b.run("lease", "acquire", "--resource", "long:wait", "--wait", "20m", "--json")
		got <- result{out, code, err}
	}()
	// Released whether b's request waits already or not: b wins it, by
	// waiting or at once, and is never refused for its long --wait.
	a.ok("lease", "release", "--resource", "long:wait")
	res := <-got
	var l cliLease
	if res.code != 0 || json.Unmarshal([]byte(res.out), &l) != nil || l.Holder != "holder-b" || l.State != "active" {
		t.Fatalf("lease acquire --wait 20m: exit %d, %v, %q; want holder-b to win the released lease", res.code, res.err, res.out)
	}
}
