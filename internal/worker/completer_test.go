package worker

import (
	"context"
	"slices"
	"testing"

	"github.com/leasehold/leasehold/internal/taskstore"
)

// TestCompleterKeepsBatchesWhole drives the completer's batching with a
// statement that returns when the test says: a batch goes at once when no
// statement is in flight; while one is, a second goes only once it holds
// half the pool's workers; never more than two are in flight.
func TestCompleterKeepsBatchesWhole(t *testing.T) {
	c := newCompleter(&Pool{Workers: 6})
	c.secondBatch = 3 // half the workers, were they enough
	sent := make(chan []int64)
	finish := make(chan struct{})
	c.send = func(b []completeReq) {
		ids := make([]int64, len(b))
		for i, r := range b {
			ids[i] = r.c.ID
		}
		sent <- ids
		<-finish
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		c.run(ctx)
		close(stopped)
	}()
	// Each request returns once the completer has taken it in.
	complete := func(ids ...int64) {
		for _, id := range ids {
			c.reqs <- completeReq{c: taskstore.Completion{ID: id}}
		}
	}
	want := func(ids ...int64) {
		t.Helper()
		if got := <-sent; !slices.Equal(got, ids) {
			t.Fatalf("sent a batch of %v, want %v", got, ids)
		}
	}

	complete(1)
	want(1) // nothing in flight: at once
	complete(2, 3, 4)
	want(2, 3, 4) // beside the first only as a batch of three, not of 2 alone
	complete(5, 6, 7, 8)
	finish <- struct{}{} // one of the two ends: now the waiting four go
	want(5, 6, 7, 8)
	finish <- struct{}{}
	finish <- struct{}{}
	complete(9)
	want(9) // alone, once nothing is in flight
	finish <- struct{}{}

	cancel()
	<-stopped
}

// TestCompleterSecondBatchOfLargePoolsOnly: a second statement carries half
// a large pool's workers, and a small pool never sends one.
func TestCompleterSecondBatchOfLargePoolsOnly(t *testing.T) {
	for _, c := range []struct{ workers, want int }{
		{1, minSecondBatch}, {4, minSecondBatch}, {49, minSecondBatch},
		{50, minSecondBatch}, {100, 50}, {300, 150},
	} {
		if got := newCompleter(&Pool{Workers: c.workers}).secondBatch; got != c.want {
			t.Errorf("%d workers: a second batch of %d, want %d", c.workers, got, c.want)
		}
	}
}
