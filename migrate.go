package leasehold

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/schema"
)

// Migrate applies leasehold's migrations to pool's database (the schema
// first on its search_path), as `leasehold migrate` does, and returns the
// versions it applied (none when the database is up to date). Any number
// of processes may call it at once: one migrates, the others wait and then
// find nothing to do. Run it as the owner of the tables; the workers may
// run as a role with only the grants of docs/least-privilege.sql.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: Migrate needs a *pgxpool.Pool, not nil", ErrInvalidConfig)
	}
	return schema.Migrate(ctx, pool)
}
