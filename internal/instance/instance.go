// Package instance keeps the record of the live replicas: each replica
// registers what it is at start and holds the lease instance:<id> while it
// runs; the live replicas are those holding theirs.
package instance

import (
	"context"
	"encoding/json"
	"fmt"
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

// LeaseResource is the name of a replica's instance lease.
func LeaseResource(id string) string { return "instance:" + id }

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
