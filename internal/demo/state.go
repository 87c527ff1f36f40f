package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/db"
)

// Resource is the lease that elects the generating replica.
const Resource = "leasehold:generator"

// Status is the generator as every replica sees it: the cluster-wide
// switch, and the replica holding the generator lease, if any.
type Status struct {
	Started   bool
	ChangedAt time.Time
	ChangedBy string
	Holder    *string // nil while no replica holds the lease
	Fence     *int64
}

// Switch names the switch as the API and the live stream do: "STARTED" or
// "STOPPED" (the words the NOTIFY on leasehold_generator carries too).
func (s Status) Switch() string {
	if s.Started {
		return "STARTED"
	}
	return "STOPPED"
}

// State reads and sets the generator's started/stopped switch, which lives
// in the database so that every replica answers the same.
type State struct {
	q *db.Queries
}

// NewState returns the switch on the pool.
func NewState(pool *pgxpool.Pool) *State { return &State{q: db.New(pool)} }

// Get returns the generator's status.
func (s *State) Get(ctx context.Context) (Status, error) {
	r, err := s.q.GeneratorGet(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("generator status: %w", err)
	}
	return Status{Started: r.Started, ChangedAt: r.ChangedAt, ChangedBy: r.ChangedBy, Holder: r.Holder, Fence: r.Fence}, nil
}

// Set starts (started true) or stops generation cluster-wide; by names who
// asked. Every replica is told by NOTIFY on leasehold_generator.
func (s *State) Set(ctx context.Context, started bool, by string) error {
	if _, err := s.q.GeneratorSet(ctx, db.GeneratorSetParams{Started: started, ChangedBy: by}); err != nil {
		return fmt.Errorf("set generator: %w", err)
	}
	return nil
}
