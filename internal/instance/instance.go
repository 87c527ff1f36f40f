// Package instance keeps the record of the live replicas: each replica
// registers what it is at start and holds the lease leasehold:instance:<id>
// while it runs; the live replicas are those holding theirs.
package instance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
)

// Instance is one live replica.
type Instance struct {
	ID         string    `json:"id"`
	Addr       string    `json:"addr"`
	Roles      []string  `json:"roles"`
	Version    string    `json:"version"`
	StartedAt  time.Time `json:"started_at"`
	LastSeenAt time.Time `json:"last_seen_at"`
}

// MarshalJSON writes timestamps as RFC 3339 UTC with milliseconds.
func (i Instance) MarshalJSON() ([]byte, error) {
	type plain Instance
	return json.Marshal(struct {
		plain
		StartedAt  string `json:"started_at"`
		LastSeenAt string `json:"last_seen_at"`
	}{plain: plain(i), StartedAt: apitime.Format(i.StartedAt), LastSeenAt: apitime.Format(i.LastSeenAt)})
}

// LeaseResource is the name of a replica's instance lease, in the reserved
// namespace (internal/name.ReservedPrefix) that no client may take.
func LeaseResource(id string) string { return leasePrefix + id }

// leasePrefix begins every instance lease; oldLeasePrefix began them before
// they moved into the reserved namespace, and is still counted live while
// replicas of the release before run beside the new ones (a rolling
// upgrade).
const (
	leasePrefix    = "leasehold:instance:"
	oldLeasePrefix = "instance:"
)

// IsLease reports whether resource is a replica's instance lease, in
// either name.
func IsLease(resource string) bool {
	return strings.HasPrefix(resource, leasePrefix) || strings.HasPrefix(resource, oldLeasePrefix)
}

// Store records and lists replicas.
type Store struct {
	q *db.Queries
}

// NewStore returns a store on the pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{q: db.New(pool)} }

// Register records what a replica is; it counts as live while it holds
// its instance lease.
func (s *Store) Register(ctx context.Context, i Instance) error {
	err := s.q.InstanceRegister(ctx, db.InstanceRegisterParams{ID: i.ID, Addr: i.Addr, Roles: i.Roles, Version: i.Version})
	if err != nil {
		return fmt.Errorf("register instance %s: %w", i.ID, err)
	}
	return nil
}

// Live lists the replicas holding their instance lease.
func (s *Store) Live(ctx context.Context) ([]Instance, error) {
	rows, err := s.q.InstanceListLive(ctx)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	out := make([]Instance, len(rows))
	for i, r := range rows {
		out[i] = Instance{ID: r.ID, Addr: r.Addr, Roles: r.Roles, Version: r.Version, StartedAt: r.StartedAt, LastSeenAt: r.LastSeenAt}
	}
	return out, nil
}
