package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sessionConfig is the configuration of the replica's session-level work,
// which a transaction-mode pooler breaks: the LISTEN session, which lasts as
// long as the replica, and the migrations, whose advisory lock spans their
// transactions. It is that of --listen-database-url when given, so that
// DATABASE_URL (pool, the pool's configuration) may point at such a pooler;
// otherwise pool itself.
//
// A URL of its own is checked here by connecting once, so that a mistake in
// it stops the replica at start with an error naming the flag.
func sessionConfig(ctx context.Context, c config, pool *pgxpool.Config) (*pgxpool.Config, error) {
	if c.ListenDatabaseURL == "" {
		return pool, nil
	}
	const flagName = "--listen-database-url (env LEASEHOLD_LISTEN_DATABASE_URL)"
	cfg, err := poolConfig(c.ListenDatabaseURL, pool.ConnConfig.RuntimeParams["application_name"])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if err := conn.Close(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	return cfg, nil
}
