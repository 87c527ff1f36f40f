package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/bench"
	"github.com/leasehold/leasehold/internal/pgtest"
)

// TestBenchDrainProcesses runs `leasehold bench --processes` as a user
// would: drain's replicas are processes of the binary too, and both figures
// come back in the JSON.
func TestBenchDrainProcesses(t *testing.T) {
	t.Parallel()
	exe := buildLeasehold(t)
	cmd := exec.CommandContext(t.Context(), exe, "bench", "--scenarios", "drain", "--processes",
		"--tasks", "60", "--replicas", "2", "--workers", "2", "--json")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.ServerURL(t))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("leasehold bench: %v\n%s", err, stderr.String())
	}
	var rep bench.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout.String())
	}
	var inProcess, processes bool
	for _, r := range rep.Results {
		if r.Scenario != "drain" || r.Value <= 0 {
			t.Errorf("unexpected figure %+v", r)
		}
		inProcess = inProcess || strings.HasSuffix(r.Case, "in-process")
		processes = processes || strings.HasSuffix(r.Case, "processes")
	}
	if !inProcess || !processes {
		t.Fatalf("drain figures %+v; want one in-process and one with processes", rep.Results)
	}
}
