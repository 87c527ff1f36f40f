package reaper

import (
	"testing"
	"time"
)

// A failed pass is retried soon enough that an expiry due meanwhile is
// still announced within its second: quickly after one failure, and never
// later than maxPassRetry however long the database stays away.
func TestPassRetry(t *testing.T) {
	t.Parallel()
	want := []time.Duration{50, 100, 200, 250, 250}
	for i, w := range want {
		if got := passRetry(i + 1); got != w*time.Millisecond {
			t.Errorf("after %d failure(s): retry in %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := passRetry(1000); got != maxPassRetry {
		t.Errorf("after 1000 failures: retry in %v, want %v", got, maxPassRetry)
	}
	if maxPassRetry >= time.Second/2 {
		t.Errorf("maxPassRetry %v leaves less than half the expiry's second for the pass itself", maxPassRetry)
	}
}
