// Package schema holds leasehold's migrations and applies them.
//
// Migrations are the files NNNN_name.sql in this directory, in goose's
// annotated format (an "-- +goose Up" section, then "-- +goose Down"), which
// sqlc also reads to learn the schema. They are embedded in the binary.
// Migrate applies the pending ones, each in its own transaction, while it
// holds a session-level advisory lock, so any number of replicas may start at
// the same moment: one migrates, the others wait and then find nothing to do.
package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// lockKey is the advisory lock every migrating session takes: "leasemig".
const lockKey int64 = 0x6c656173656d6967

// Migration is one embedded migration file.
type Migration struct {
	Version int64
	Name    string
	Up      string
}

var fileName = regexp.MustCompile(`^(\d{4,})_([a-z0-9_]+)\.sql$`)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration %q: name must look like 0001_name.sql", e.Name())
		}
		version, _ := strconv.ParseInt(m[1], 10, 64)
		body, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		up, err := upSection(string(body))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: version, Name: strings.TrimSuffix(path.Base(e.Name()), ".sql"), Up: up})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return int(a.Version - b.Version) })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share a version", ms[i-1].Name, ms[i].Name)
		}
	}
	return ms, nil
}

// upSection returns the text between "-- +goose Up" and "-- +goose Down".
func upSection(body string) (string, error) {
	const up, down = "-- +goose Up", "-- +goose Down"
	_, rest, ok := strings.Cut(body, up)
	if !ok {
		return "", errors.New(`no "-- +goose Up" line`)
	}
	rest, _, _ = strings.Cut(rest, down)
	return rest, nil
}

// Latest is the version of the newest embedded migration.
func Latest() (int64, error) {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].Version, nil
}

// Applied returns the newest version applied to the database, 0 for none.
func Applied(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var v int64
	err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM leasehold_migrations`).Scan(&v)
	if err != nil {
		var missing bool
		if qerr := pool.QueryRow(ctx, `SELECT to_regclass('leasehold_migrations') IS NULL`).Scan(&missing); qerr == nil && missing {
			return 0, nil
		}
		return 0, err
	}
	return v, nil
}

// Migrate applies every pending migration and returns the versions it
// applied (none when another replica got there first). When none is
// pending it only reads: a runtime role without DDL rights (see
// docs/operations/least-privilege.sql) can run it.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	if v, err := Applied(ctx, pool); err == nil && len(ms) > 0 && v >= ms[len(ms)-1].Version {
		return nil, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()

	// A session lock, not a transaction lock: it spans all the migrations'
	// transactions. It is released explicitly, and by the server if this
	// session dies.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		return nil, fmt.Errorf("migrate: take the migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must go even when ctx was cancelled.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // closing the session frees the lock
		}
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS leasehold_migrations (
		version    bigint PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: create leasehold_migrations: %w", err)
	}
	var current int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM leasehold_migrations`).Scan(&current); err != nil {
		return nil, fmt.Errorf("migrate: read applied version: %w", err)
	}

	var applied []int64
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// The simple protocol runs a file of many statements in one go.
			if _, err := tx.Conn().PgConn().Exec(ctx, m.Up).ReadAll(); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO leasehold_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// PrepareSession gives a new session the settings leasehold's queries are
// written for: every pool of the runtime runs it on each connection
// (pgxpool.Config.AfterConnect).
//
// plan_cache_mode=force_generic_plan: every query is an index-bound
// statement whose best plan does not depend on its parameters, and pgx
// prepares each once per session. PostgreSQL's default (auto) kept
// planning the claim and the batched completion afresh on every execution,
// unable to tell a generic plan would do (their arrays' lengths are
// unknown to it): in a busy queue's profile, planning was an eighth of the
// database's work. The plan that matters does not rest on this alone: the
// claim's pick of due tasks is pinned to its index (schema/0010).
//
// A SET rather than a startup parameter, which a transaction-mode pooler
// would refuse: through one, the setting reaches the server sessions the
// statements happen to run on, and where it does not, only planning costs
// more.
//
// It also makes sure that the fences of the server's current timeline lie
// above anything an earlier primary could have handed out
// (fence_epoch_check, schema/0013): a promoted standby starts a new
// timeline, and every session on it is new, so a failover that lost
// transactions never makes a fence repeat. It refuses a session on a
// standby with ErrStandby, so that a pool keeps only sessions it can write
// on. On a database whose migrations predate the check it only sets the
// plan cache mode.
func PrepareSession(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		return fmt.Errorf("prepare session: %w", err)
	}
	var floor *int64
	err := conn.QueryRow(ctx, `SELECT fence_epoch_check()`).Scan(&floor)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42883": // undefined_function: not migrated that far
		return nil
	case err != nil:
		return fmt.Errorf("prepare session: check the fences of the database's timeline: %w", err)
	case floor == nil:
		return ErrStandby
	}
	return nil
}

// ErrStandby is the error of a session that reached a server in recovery (a standby), where no
// lease can be granted and nothing written.
var ErrStandby = errors.New("the database is a standby (in recovery): nothing can be written there; name the primary, or every host with target_session_attrs=read-write")
