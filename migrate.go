package leasehold

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/schema"
)

// Migrate applies leasehold's migrations to pool's database (the schema
// first on its search_path), as `leasehold migrate` does, and returns the
// versions it applied (none when the database is up to date). Any number
// of processes may call it at once: one migrates, the others wait and then
// find nothing to do. Run it as the owner of the tables; the workers may
// run as a role with only the grants of docs/operations/least-privilege.sql.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: Migrate needs a *pgxpool.Pool, not nil", ErrInvalidConfig)
	}
	return schema.Migrate(ctx, pool)
}

// PrepareSession is for the AfterConnect of the program's pgxpool.Config:
// it gives each new session the settings leasehold's statements are
// planned for (generic plans), and on a database that fails over it keeps
// fences unique: the first session on a promoted primary's new timeline
// moves the fences past anything the old primary could have handed out,
// even in transactions that asynchronous replication lost, before any
// lease is granted on it. It refuses a session on a standby with
// ErrStandby, so that the pool keeps only sessions it can write on. A
// pool without it works, but without those two: set it on the pool of a
// database with a standby.
func PrepareSession(ctx context.Context, conn *pgx.Conn) error {
	return schema.PrepareSession(ctx, conn)
}

// ErrStandby is the error of a session of the pool that reached a server in recovery (a
// standby), where nothing can be written; name the primary, or every host
// with target_session_attrs=read-write, in the pool's URL.
var ErrStandby = schema.ErrStandby
