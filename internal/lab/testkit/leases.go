package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"
)

// CheckLeaseHistory verifies the lease guarantees on a resource's history:
// holding intervals [acquired, min(released, expires_at)) never overlap and
// fences strictly increase.
func CheckLeaseHistory(t *testing.T, pool *pgxpool.Pool, resource string) {
	t.Helper()
	events, err := leasestore.NewStore(pool).Events(context.Background(), lease.EventsParams{Resource: resource, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if len(events) == 0 {
		t.Fatalf("%s: no history", resource)
	}
	var (
		holding bool
		end     time.Time // end of the current or last holding interval
		fence   int64
	)
	for _, e := range events {
		switch e.Kind {
		case "acquired":
			if e.Fence <= fence {
				t.Fatalf("%s: event %d: fence %d after fence %d", resource, e.ID, e.Fence, fence)
			}
			if e.At.Before(end) {
				t.Fatalf("%s: event %d: %s acquired at %s while the previous holder held it until %s",
					resource, e.ID, e.Holder, e.At, end)
			}
			fence, holding, end = e.Fence, true, e.ExpiresAt
		case "renewed":
			if !holding || e.Fence != fence {
				t.Fatalf("%s: event %d: renewal of fence %d, current fence %d (holding=%v)", resource, e.ID, e.Fence, fence, holding)
			}
			end = e.ExpiresAt
		case "released", "expired":
			if e.Fence != fence {
				t.Fatalf("%s: event %d: %s of fence %d, current fence %d", resource, e.ID, e.Kind, e.Fence, fence)
			}
			holding = false
			if e.ExpiresAt.Before(end) {
				end = e.ExpiresAt
			}
		}
	}
}
