package localpg

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestEnsureStartedAndStop brings up a cluster of its own (its own directory and port, so that
// the shared development cluster is left alone), sees that the first call started it and the
// second found it running, stops it, and stops it again, which does nothing.
func TestEnsureStartedAndStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tmp := t.TempDir()
	base := filepath.Join(tmp, "pg")
	// As root the server runs as the postgres user, which must be able to reach base:
	// t.TempDir makes tmp and its parent for the owner only.
	for _, dir := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	baseOf := func() (string, error) { return base, nil }
	log := testLog{t}

	url, started, err := ensure(ctx, baseOf, port, log)
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("first ensure: %v", err)
	}
	// Stop it even when the test fails half-way.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := stop(ctx, base, port, log); err != nil {
			t.Errorf("stop at the end of the test: %v", err)
		}
	})
	if !started {
		t.Errorf("first ensure on an empty directory: started false, want true")
	}
	if url != URL(port, Database) {
		t.Errorf("first ensure: url %q, want %q", url, URL(port, Database))
	}

	if _, started, err := ensure(ctx, baseOf, port, log); err != nil || started {
		t.Errorf("second ensure: started %v, err %v; want false, nil (it runs already)", started, err)
	}

	if err := stop(ctx, base, port, log); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := probe(ctx, url); err == nil {
		t.Errorf("after stop the server still answers at %s", url)
	}
	if err := stop(ctx, base, port, log); err != nil {
		t.Errorf("stop of a stopped server: %v, want nil", err)
	}
	if err := stop(ctx, filepath.Join(t.TempDir(), "none"), port, log); err != nil {
		t.Errorf("stop where no cluster was ever made: %v, want nil", err)
	}

	// And it comes back.
	if _, started, err := ensure(ctx, baseOf, port, log); err != nil || !started {
		t.Errorf("ensure after stop: started %v, err %v; want true, nil", started, err)
	}
}
