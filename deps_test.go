package leasehold_test

import (
	"os"
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

// TestReadmeNamesTheDependencies: the README and the library guide name
// every module the library links that leasehold requires itself (not only
// through another), so that a user reads what `go get` brings.
func TestReadmeNamesTheDependencies(t *testing.T) {
	t.Parallel()
	linked, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{with .Module}}{{.Path}}{{end}}{{end}}", ".", "./lease", "./task", "./schedule").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	direct, err := exec.Command("go", "list", "-m", "-f", "{{if not .Indirect}}{{.Path}}{{end}}", "all").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	requires := map[string]bool{}
	for _, m := range strings.Fields(string(direct)) {
		requires[m] = true
	}
	names := map[string]string{ // as the docs write them
		"github.com/jackc/pgx/v5": "pgx", "github.com/jackc/pgxlisten": "pgxlisten", "github.com/rs/zerolog": "zerolog",
		"github.com/robfig/cron/v3": "robfig/cron", "golang.org/x/text": "golang.org/x/text",
	}
	seen := map[string]bool{}
	for _, m := range strings.Fields(string(linked)) {
		if m == "github.com/leasehold/leasehold" || !requires[m] || seen[m] {
			continue
		}
		seen[m] = true
		name, ok := names[m]
		if !ok {
			t.Errorf("the library links %s, which the docs do not name: add it to the README's and the library guide's sentence, and here", m)
			continue
		}
		for _, doc := range []string{"README.md", "docs/guide/library.md"} {
			b, err := os.ReadFile(doc)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(strings.Fields(string(b)), " "), name) {
				t.Errorf("%s does not name %s (%s), which the library links", doc, name, m)
			}
		}
	}
	if len(seen) < 3 {
		t.Fatalf("found %d modules the library links directly: is the listing right? %v", len(seen), seen)
	}
}
