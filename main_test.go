package leasehold_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// exampleDB is the database the runnable examples use: one for them all,
// made by TestMain.
var exampleDB pgtest.DB

// TestMain runs the tests (or, in a child process a test started, that
// child's part), with a database for the examples, and then checks that no
// goroutine was left behind.
func TestMain(m *testing.M) {
	if role := os.Getenv(childRole); role != "" {
		os.Exit(runChild(role))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	db, drop, err := pgtest.Open(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "no database for the examples:", err)
		os.Exit(1)
	}
	exampleDB = db
	code := m.Run()
	drop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
