package db_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNoStaleGeneratedFiles: sqlc diff catches generated files that differ
// from what sqlc would write, not those left behind when a queries file is
// removed or renamed. Every Go file here must be one sqlc writes.
func TestNoStaleGeneratedFiles(t *testing.T) {
	queries, err := filepath.Glob("../../queries/*.sql")
	if err != nil || len(queries) == 0 {
		t.Fatalf("no queries found (%v)", err)
	}
	// batch.go holds the :batch* queries of every file.
	want := []string{"db.go", "models.go", "batch.go"}
	for _, q := range queries {
		want = append(want, filepath.Base(q)+".go")
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if !slices.Contains(want, name) {
			t.Errorf("internal/db/%s is not generated from queries/ (stale?); delete it or run go tool task generate", name)
		}
	}
}
