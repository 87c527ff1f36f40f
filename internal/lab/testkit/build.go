package testkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The commands built for the tests of this process, each once.
var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]*build
}

type build struct {
	once sync.Once
	bin  string
	out  []byte
	err  error
}

// Leasehold returns the path of the leasehold command, built (without the
// race detector, as users run it) the first time a test of the process
// asks for it: tests that run replicas, soaks or the demo as processes of
// the real binary share one build. A package whose tests call it removes
// the build after its tests with RemoveBuilds, in its TestMain.
func Leasehold(t testing.TB) string {
	t.Helper()
	return Build(t, "github.com/leasehold/leasehold/cmd/leasehold", "leasehold")
}

// Soak returns the path of the chaos soak's command (internal/lab/cmd/soak),
// built once as Leasehold is.
func Soak(t testing.TB) string {
	t.Helper()
	return Build(t, "github.com/leasehold/leasehold/internal/lab/cmd/soak", "soak")
}

// Build returns the path of the command pkg, built as name the first time a
// test of the process asks for it.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	builds.mu.Lock()
	if builds.done == nil {
		builds.done = map[string]*build{}
	}
	b := builds.done[pkg]
	if b == nil {
		b = &build{}
		builds.done[pkg] = b
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "leasehold-test-")
		if err != nil {
			builds.mu.Unlock()
			t.Fatalf("testkit: %v", err)
		}
		builds.dir = dir
	}
	dir := builds.dir
	builds.mu.Unlock()
	b.once.Do(func() {
		gocmd, err := exec.LookPath("go")
		if err != nil {
			b.err = err
			return
		}
		b.bin = filepath.Join(dir, name)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		b.out, b.err = exec.CommandContext(ctx, gocmd, "build", "-o", b.bin, pkg).CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("testkit: build %s: %v\n%s", pkg, b.err, b.out)
	}
	return b.bin
}

// RemoveBuilds removes the commands Build built, if it did.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
}

// Main runs a package's tests, removes what Leasehold built, and fails the
// run when goroutines were left behind (goleak), with options for the
// goroutines to ignore.
func Main(m *testing.M, ignore ...goleak.Option) {
	code := m.Run()
	RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(ignore...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
