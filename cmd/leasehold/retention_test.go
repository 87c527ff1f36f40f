package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestRetentionFlags: a week by default, from the environment, overridden
// by the flags; 0 keeps forever.
func TestRetentionFlags(t *testing.T) {
	t.Parallel()
	const week = 7 * 24 * time.Hour
	for _, tc := range []struct {
		args               []string
		env                []string
		tasks, leaseEvents time.Duration
	}{
		{nil, nil, week, week},
		{nil, []string{"LEASEHOLD_TASK_RETENTION", "720h", "LEASEHOLD_LEASE_HISTORY_RETENTION", "0"}, 720 * time.Hour, 0},
		{[]string{"--task-retention", "0", "--lease-history-retention", "1m"}, []string{"LEASEHOLD_TASK_RETENTION", "720h"}, 0, time.Minute},
		{[]string{"--lease-history-retention", "36h30m"}, nil, week, 36*time.Hour + 30*time.Minute},
	} {
		c := serveConfig(t, tc.args, env(tc.env...))
		if c.TaskRetention != tc.tasks || c.LeaseHistoryRetention != tc.leaseEvents {
			t.Errorf("args %q env %q: task retention %s, lease history retention %s; want %s, %s",
				tc.args, tc.env, c.TaskRetention, c.LeaseHistoryRetention, tc.tasks, tc.leaseEvents)
		}
	}
}

// TestServeRejectsBadRetention: a negative, unparsable or too short
// retention is refused before anything starts, naming the flag and what
// to give instead.
func TestServeRejectsBadRetention(t *testing.T) {
	t.Parallel()
	const noDB = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, tc := range []struct {
		args []string
		env  []string
		want []string
	}{
		{[]string{"--task-retention", "-1h"}, nil, []string{`--task-retention "-1h"`, "0 (keep forever)", "at least 1m", "168h"}},
		{[]string{"--task-retention", "a week"}, nil, []string{`--task-retention "a week"`}},
		{[]string{"--task-retention", "7"}, nil, []string{`--task-retention "7"`}},
		{[]string{"--lease-history-retention", "30s"}, nil, []string{`--lease-history-retention "30s"`, "at least 1m"}},
		{nil, []string{"LEASEHOLD_LEASE_HISTORY_RETENTION", "7d"}, []string{`--lease-history-retention "7d"`}},
		{nil, []string{"LEASEHOLD_TASK_RETENTION", "-5m", "LEASEHOLD_LEASE_HISTORY_RETENTION", "forever"},
			[]string{`--task-retention "-5m"`, `--lease-history-retention "forever"`}},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := run(ctx, args, env(append([]string{"DATABASE_URL", noDB}, tc.env...)...), &stdout, &stderr)
		cancel()
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q (env %q): got %v, want a usage error (exit status 2)", args, tc.env, err)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("run %q (env %q): got %q, want it to say %q", args, tc.env, err, want)
			}
		}
	}
}

// TestServePrunes: a replica with the reaper role prunes what its
// retention no longer keeps, and logs the round; lease history with a
// retention of 0 stays, but for the lease rows of the tasks pruned, which
// go with their tasks.
func TestServePrunes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	// Test setup as the tables' owner: three tasks that ended a month ago,
	// the lease row of one of them, and a lease released as long ago, with
	// their history.
	for _, sql := range []string{
		`INSERT INTO tasks (task_data, state, created_at, processed_at)
			SELECT '{}', 'done', now() - interval '31 days', now() - interval '30 days' FROM generate_series(1, 3)`,
		`INSERT INTO leases (resource, holder, fence, ttl_seconds, expires_at, released_at)
			VALUES ('old', 'h', nextval('lease_fence_seq'), 30, now() - interval '30 days', now() - interval '30 days'),
			       ('task:' || (SELECT min(id) FROM tasks), 'w', nextval('lease_fence_seq'), 30, now() - interval '30 days', now() - interval '30 days')`,
		`UPDATE lease_events SET at = now() - interval '30 days'`,
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	c := serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "pruning-replica", "--roles", "api,reaper",
		"--task-retention", "24h", "--lease-history-retention", "0"}, env("DATABASE_URL", db.URL))
	r := startReplica(t, c)
	waitFor(t, r, "the reaper's pruning round", func() bool {
		return strings.Contains(r.logs.String(), `"message":"pruned old tasks and lease history"`)
	})
	if !strings.Contains(r.logs.String(), `"tasks":3,`) {
		t.Errorf("the round's log line does not count the 3 tasks:\n%s", r.logs)
	}
	if !strings.Contains(r.logs.String(), `"leases":1,`) {
		t.Errorf("the round's log line does not count the task's lease row:\n%s", r.logs)
	}
	var tasks, leases, events, taskLeases, taskEvents int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM leases WHERE resource = 'old'),
		(SELECT count(*) FROM lease_events WHERE resource = 'old'),
		(SELECT count(*) FROM leases WHERE resource LIKE 'task:%'), (SELECT count(*) FROM lease_events WHERE resource LIKE 'task:%')`).
		Scan(&tasks, &leases, &events, &taskLeases, &taskEvents); err != nil {
		t.Fatal(err)
	}
	if tasks != 0 || leases != 1 || events != 1 || taskLeases != 0 || taskEvents != 1 {
		t.Errorf("after pruning: %d tasks, %d old lease rows, %d old events, %d task lease rows, %d task lease events; "+
			"want 0, 1, 1 (lease history kept forever), 0 (gone with its task), 1 (history)", tasks, leases, events, taskLeases, taskEvents)
	}
}
