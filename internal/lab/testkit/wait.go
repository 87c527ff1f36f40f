package testkit

import (
	"os"
	"testing"
	"time"
)

// Patience bounds every wait for a condition: long, so that a loaded
// machine never reaches it while the code works, and only a broken test
// fails on it instead of hanging. LEASEHOLD_TEST_PATIENCE (a duration)
// replaces it.
var Patience = patience()

func patience() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("LEASEHOLD_TEST_PATIENCE")); err == nil && d > 0 {
		return d
	}
	return 2 * time.Minute
}

// WaitFor polls cond until it holds. When Patience runs out first the test
// fails, naming what it waited for and, from more, what it saw.
func WaitFor(t testing.TB, what string, cond func() bool, more ...func() string) {
	t.Helper()
	deadline := time.Now().Add(Patience)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			for _, m := range more {
				msg += "\n" + m()
			}
			t.Fatalf("waited %s for %s, in vain%s", Patience, what, msg)
		}
		time.Sleep(pause) // a poll of the test's own, not the product's
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Receive returns the next value from ch, failing the test when Patience
// runs out first.
func Receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(Patience)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %s for %s, in vain", Patience, what)
		var zero T
		return zero
	}
}
