package leasestore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/lease"
)

// Change is the payload the leases trigger NOTIFYs on the leasehold_lease
// channel: a hint that a lease changed, not the lease itself.
type Change struct {
	ID        int64
	EventID   int64 // the lease_events row that records this change
	Resource  string
	Fence     int64
	Kind      string // acquired, renewed, released or expired
	ExpiresAt time.Time
}

// ParseChange decodes a leasehold_lease notification payload.
func ParseChange(payload string) (Change, error) {
	var p struct {
		ID          int64  `json:"id"`
		EventID     int64  `json:"event_id"`
		Resource    string `json:"resource"`
		Fence       int64  `json:"fence"`
		Kind        string `json:"kind"`
		ExpiresAtMS int64  `json:"expires_at_ms"`
	}
	if err := json.Unmarshal([]byte(payload), &p); err != nil {
		return Change{}, fmt.Errorf("lease notification %q: %w", payload, err)
	}
	return Change{ID: p.ID, EventID: p.EventID, Resource: p.Resource, Fence: p.Fence, Kind: p.Kind, ExpiresAt: time.UnixMilli(p.ExpiresAtMS)}, nil
}

// Frees reports whether n, a leasehold_lease notification, says that the
// lease on resource, or on a slot of the key resource, was released or
// expired: the resource, or a slot, may be free now.
func Frees(n notify.Notification, resource string) bool {
	c, err := ParseChange(n.Payload)
	if err != nil || (c.Kind != "released" && c.Kind != "expired") {
		return false
	}
	key, slot := lease.SlotKey(c.Resource)
	return c.Resource == resource || (slot && key == resource)
}
