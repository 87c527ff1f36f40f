package main

import (
	"errors"
	"io"
	"testing"
)

func TestChaosRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"chaos", "--duration", "0s"},
		{"chaos", "--duration", "soon"},
		{"chaos", "--replicas", "0"},
		{"chaos", "--replicas", "27"},
		{"chaos", "--fault-interval", "1ms"},
		{"chaos", "--faults", "kill,flood"},
		{"chaos", "--faults", ""},
		{"chaos", "--lease-ttl", "1500ms"},
		{"chaos", "--drain-timeout", "-1s"},
		{"chaos", "--replica-log-level", "loud"},
		{"chaos", "--report", "no-such-directory/report.md"},
		{"chaos", "extra"},
		{"chaos", "--standby", "async"},
		{"chaos", "--standby", "maybe"},
		{"chaos", "--faults", "failover"},
		{"chaos", "--standby", "sync", "--faults", "db-restart"},
	} {
		err := run(t.Context(), args, env(), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q: got %v, want a usage error", args, err)
		}
	}
}
