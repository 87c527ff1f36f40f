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

// The wait counts from the start of the failed pass: a pass that took
// longer than the wait to fail is retried at once, one that failed
// quickly after the wait.
func TestRetryCountsFromThePassStart(t *testing.T) {
	t.Parallel()
	began := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, want := retryAt(began, 1), began.Add(50*time.Millisecond); !got.Equal(want) {
		t.Errorf("retryAt after one failure = %v, want %v", got, want)
	}
	// A pass that failed 800 ms after it began (a slow refusal) is due
	// again already, whatever the failures before it.
	failedAt := began.Add(800 * time.Millisecond)
	for _, failures := range []int{1, 4, 1000} {
		if at := retryAt(began, failures); at.After(failedAt) {
			t.Errorf("after %d failure(s), a pass that failed 800 ms after it began is retried %v after failing, want at once",
				failures, at.Sub(failedAt))
		}
	}
}
