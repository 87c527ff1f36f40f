package main

import (
	"errors"
	"io"
	"testing"
)

func TestSoakRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--duration", "0s"},
		{"--duration", "soon"},
		{"--replicas", "0"},
		{"--replicas", "27"},
		{"--fault-interval", "1ms"},
		{"--faults", "kill,flood"},
		{"--faults", ""},
		{"--lease-ttl", "1500ms"},
		{"--drain-timeout", "-1s"},
		{"--replica-log-level", "loud"},
		{"--report", "no-such-directory/report.md"},
		{"extra"},
		{"--standby", "async"},
		{"--standby", "maybe"},
		{"--faults", "failover"},
		{"--standby", "sync", "--faults", "db-restart"},
	} {
		err := run(t.Context(), args, func(string) string { return "" }, io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run %q: got %v, want a usage error", args, err)
		}
	}
}
