package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/leasehold/leasehold/internal/leasing"
	"github.com/leasehold/leasehold/lease"
)

// Run a job only while holding the lease on its resource: the lease is
// renewed in the background, the job's context is cancelled as soon as the
// lease can no longer be counted on, and the lease is released when the job
// is done. The example needs a running server, so it has no output to check.
func ExampleClient_Hold() {
	ctx := context.Background()
	client, err := leasing.NewClient("http://localhost:8080", leasing.WithToken(os.Getenv("LEASEHOLD_API_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}

	h, err := client.Hold(ctx, "report:nightly", "worker-1", lease.KeepConfig{TTL: 30 * time.Second})
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		fmt.Printf("%s holds it until %s; try again later\n", held.Lease.Holder, held.Lease.ExpiresAt)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer func() {
		// Release stops the renewals and frees the resource at once.
		if err := h.Release(ctx); err != nil && !errors.Is(err, lease.ErrNotHeld) {
			log.Printf("release: %v (the lease will expire on its own)", err)
		}
	}()

	// Hand the fence to whatever the lease protects, so that it can refuse
	// a holder that lost the lease without knowing it yet.
	if err := runNightlyReport(h.Context(), h.Lease().Fence); err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Println("stopped:", h.Err()) // lease.ErrNotHeld, lease.ErrDeadline, ...
			return
		}
		log.Printf("report: %v", err)
	}
}

// runNightlyReport stands for a job that stops when ctx ends.
func runNightlyReport(ctx context.Context, fence int64) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
		fmt.Println("report written under fence", fence)
		return nil
	}
}
