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

// The leasehold command, built once per test process.
var built struct {
	once sync.Once
	dir  string
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
	built.once.Do(func() {
		gocmd, err := exec.LookPath("go")
		if err != nil {
			built.err = err
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "leasehold-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "leasehold")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		built.out, built.err = exec.CommandContext(ctx, gocmd, "build", "-o", built.bin, "github.com/leasehold/leasehold/cmd/leasehold").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("testkit: build leasehold: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// RemoveBuilds removes the command Leasehold built, if it did.
func RemoveBuilds() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
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
