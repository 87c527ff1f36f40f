package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestFlowControlCommands: lease acquire --slots, lease limit (show, set a
// limit and a rate), lease limits, and queue pause, paused and resume,
// each against a replica, with their refusals.
func TestFlowControlCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const token = "cli-token-of-the-test"
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--roles", "api", "--api-token", token},
		env("DATABASE_URL", db.URL)))
	c := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token, "LEASEHOLD_HOLDER", "holder-a")}
	other := cli{t, env("LEASEHOLD_URL", r.url, "LEASEHOLD_API_TOKEN", token, "LEASEHOLD_HOLDER", "holder-b")}

	rows := tableRows(t, c.ok("lease", "acquire", "--resource", "imports", "--slots", "1"))
	if len(rows) != 1 || rows[0]["RESOURCE"] != "imports#1" {
		t.Fatalf("acquire --slots 1: %v, want the slot imports#1", rows)
	}
	other.fails(exitNotWon, []string{"lease", "acquire", "--resource", "imports", "--slots", "1"}, "imports#1 is held by holder-a")
	c.fails(1, []string{"lease", "limit", "--resource", "exports"}, "exports has no limit")

	rows = cells(t, c.ok("lease", "limit", "--resource", "imports", "--slots", "2", "--rate", "30/1m"))
	if len(rows) != 1 || rows[0]["SLOTS"] != "2" || rows[0]["HELD"] != "1" || rows[0]["RATE"] != "30/1m0s" || rows[0]["SPENT"] != "0" {
		t.Fatalf("limit --slots 2 --rate 30/1m: %v", rows)
	}
	rows = tableRows(t, other.ok("lease", "acquire", "--resource", "imports", "--slots", "1"))
	if len(rows) != 1 || rows[0]["RESOURCE"] != "imports#2" {
		t.Fatalf("a second holder after the limit was raised to 2: %v, want imports#2", rows)
	}
	rows = cells(t, c.ok("lease", "limits"))
	if len(rows) != 1 || rows[0]["KEY"] != "imports" || rows[0]["HELD"] != "2" {
		t.Errorf("limits: %v, want imports with 2 held", rows)
	}
	rows = cells(t, c.ok("lease", "limit", "--resource", "imports", "--rate", "none"))
	if rows[0]["RATE"] != "-" {
		t.Errorf("limit --rate none: %v, want no rate", rows)
	}
	for _, bad := range [][]string{
		{"lease", "limit", "--resource", "imports", "--rate", "30"},
		{"lease", "limit", "--resource", "imports", "--rate", "30/1.5s"},
		{"lease", "limit", "--resource", "imports", "--slots", "0"},
		{"lease", "acquire", "--resource", "imports", "--slots", "1001"},
		{"queue", "pause"},
		{"queue", "pause", "--queue", "bulk", "--until", "tomorrow"},
		{"queue", "stop"},
	} {
		c.fails(2, bad)
	}

	rows = cells(t, c.ok("queue", "pause", "--queue", "bulk", "--reason", "a bug"))
	if len(rows) != 1 || rows[0]["QUEUE"] != "bulk" || rows[0]["UNTIL"] != "until resumed" || rows[0]["REASON"] != "a bug" {
		t.Fatalf("queue pause: %v", rows)
	}
	if out := c.ok("queue", "paused"); !strings.Contains(out, "bulk") || !strings.Contains(out, "a bug") {
		t.Errorf("queue paused: %q, want bulk and its reason", out)
	}
	if out := c.ok("queue", "resume", "--queue", "bulk"); out != "resumed bulk\n" {
		t.Errorf("queue resume: %q", out)
	}
	c.fails(exitLost, []string{"queue", "resume", "--queue", "bulk"}, "not paused")
	if out := c.ok("queue", "paused", "--json"); out != "[]\n" {
		t.Errorf("queue paused --json after the resume: %q, want []", out)
	}
}

// cells reads a table the commands print (columns two or more spaces
// apart) as rows by header.
func cells(t *testing.T, out string) []map[string]string {
	t.Helper()
	gap := regexp.MustCompile(`\s{2,}`)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := gap.Split(lines[0], -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		cs := gap.Split(strings.TrimSpace(line), -1)
		if len(cs) != len(header) {
			t.Fatalf("table row %q: %d cells, want %d (%q)", line, len(cs), len(header), header)
		}
		row := map[string]string{}
		for i, h := range header {
			row[h] = cs[i]
		}
		rows = append(rows, row)
	}
	return rows
}
