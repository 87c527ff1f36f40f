package leasehold_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLibraryDependencies: what a program that imports the library links
// is the library's own packages, the standard library and pgx's, zerolog's,
// x/sync's and the cron parser's (schedules); never leasehold's harnesses (the benchmarks, the chaos
// soak, the local PostgreSQL, the demo's supervisor and front door), its
// server or its tests' helpers.
func TestLibraryDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		".", "./lease", "./task", "./schedule").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := []string{
		"github.com/leasehold/leasehold", "github.com/jackc/", "github.com/rs/zerolog", "github.com/robfig/cron/v3",
		"github.com/mattn/go-colorable", "github.com/mattn/go-isatty", "golang.org/x/sync/", "golang.org/x/sys/", "golang.org/x/text/",
	}
	forbidden := []string{
		"/internal/bench", "/internal/chaos", "/internal/checker", "/internal/localpg", "/internal/supervise",
		"/internal/frontdoor", "/internal/server", "/internal/hub", "/internal/pgtest", "/internal/browsertest",
		"/internal/generator", "/internal/instance", "/cmd/",
	}
	for _, p := range strings.Fields(string(out)) {
		ok := false
		for _, a := range allowed {
			ok = ok || strings.HasPrefix(p, a)
		}
		for _, f := range forbidden {
			if strings.Contains(p, f) {
				ok = false
			}
		}
		if !ok {
			t.Errorf("the library depends on %s", p)
		}
	}
}
