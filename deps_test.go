package leasehold_test

import (
	"os/exec"
	"path/filepath"
	"slices"
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
	for _, p := range strings.Fields(string(out)) {
		if !allowedDependency(p) {
			t.Errorf("the library depends on %s", p)
		}
	}
}

// forbidden are the module's packages a library user's program must not
// link: the demo, the lab (benchmarks, soaks, test helpers), the service
// and the command line.
var forbidden = []string{
	"/internal/demo", "/internal/lab", "/internal/bench", "/internal/chaos", "/internal/checker", "/internal/localpg",
	"/internal/supervise", "/internal/frontdoor", "/internal/server", "/internal/hub", "/internal/pgtest",
	"/internal/browsertest", "/internal/instance", "/cmd/",
}

func allowedDependency(p string) bool {
	allowed := []string{
		"github.com/leasehold/leasehold", "github.com/jackc/", "github.com/rs/zerolog", "github.com/robfig/cron/v3",
		"github.com/mattn/go-colorable", "github.com/mattn/go-isatty", "golang.org/x/sync/", "golang.org/x/sys/", "golang.org/x/text/",
	}
	ok := false
	for _, a := range allowed {
		ok = ok || strings.HasPrefix(p, a)
	}
	for _, f := range forbidden {
		if strings.Contains(p, f) {
			ok = false
		}
	}
	return ok
}

// TestScratchProgramLinksNoDemo builds a program of a library user's
// (testdata/scratch: a remote client with a worker, a lease, a schedule)
// and lists what it links: the packages it depends on, and the packages of
// the symbols in its binary. None is the demo's (its generator, its sleep
// kind, its simulated crash's os.Exit), the lab's, the service's or the
// command line's.
func TestScratchProgramLinksNoDemo(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./testdata/scratch").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if !slices.Contains(pkgs, "github.com/leasehold/leasehold/internal/worker") {
		t.Fatalf("the scratch program does not link the workers; it tests nothing: %q", pkgs)
	}
	for _, p := range pkgs {
		if p != "github.com/leasehold/leasehold/testdata/scratch" && !allowedDependency(p) {
			t.Errorf("a library user's program links %s", p)
		}
	}
	bin := filepath.Join(t.TempDir(), "scratch")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/scratch").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	syms, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	linked := map[string]bool{}
	for _, line := range strings.Split(string(syms), "\n") {
		if i := strings.Index(line, "github.com/leasehold/leasehold/"); i >= 0 {
			name := line[i+len("github.com/leasehold/leasehold/"):]
			if j := strings.IndexAny(name, ".("); j > 0 {
				linked[name[:j]] = true
			}
		}
	}
	for p := range linked {
		for _, f := range forbidden {
			if strings.HasPrefix("/"+p, f) {
				t.Errorf("the scratch program's binary holds code of %s", p)
			}
		}
	}
	if !linked["internal/worker"] {
		t.Errorf("no symbol of internal/worker in the binary: the listing is wrong (%v)", linked)
	}
}
