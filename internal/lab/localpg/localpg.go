// Package localpg brings up leasehold's own PostgreSQL cluster for development and tests.
//
// The cluster is not the distribution's (Debian's 15/main): it has a data directory of its own,
// listens only on 127.0.0.1 at port LEASEHOLD_PG_PORT (default 54329) and keeps running after the
// process that started it exits, so that the next Ensure finds it up and returns at once.
//
// Where the data directory lives:
//
//	root       /var/tmp/leasehold-pg/<major>, owned by and run as the postgres OS user
//	           (initdb and postgres refuse to run as root)
//	otherwise  ${XDG_CACHE_HOME:-$HOME/.cache}/leasehold/pg/<major>, run as the current user
//
// Beside it, a lock file serialises every Ensure on the machine, so that any number of processes
// may call Ensure at the same moment.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Connection settings of the local cluster.
const (
	// PortEnv names the environment variable that overrides DefaultPort.
	PortEnv = "LEASEHOLD_PG_PORT"
	// DefaultPort is the TCP port the local cluster listens on when PortEnv is unset.
	DefaultPort = 54329
	// User is the cluster's superuser.
	User = "postgres"
	// Password is User's password for TCP connections (scram-sha-256).
	Password = "leasehold"
	// Database is the database Ensure creates and returns the URL of.
	Database = "leasehold"
)

// ErrNotInstalled is returned by Ensure when no PostgreSQL server binaries can be found and
// Ensure cannot install them (it does so only as root on a machine with apt-get).
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) were found " +
	"neither in /usr/lib/postgresql/*/bin nor on PATH: install the PostgreSQL server " +
	"(apt-get install postgresql) or set DATABASE_URL to an existing database")

// probeTimeout bounds one connection attempt to see whether the cluster answers. A refused
// connection fails at once; the timeout only matters when something listens but does not answer.
const probeTimeout = 2 * time.Second

// answerWait bounds how long probe asks again a server that listens but
// has not answered within probeTimeout.
const answerWait = 30 * time.Second

// URL returns the URL of database db on the local cluster at port.
func URL(port int, db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", User, Password, port, db)
}

// Ensure returns the URL of database "leasehold" on leasehold's local PostgreSQL cluster, first
// bringing the cluster up when it does not answer: installing the server (as root, with apt-get)
// when no binaries are found, initialising the data directory, starting the server and creating
// the database, as needed. It logs one line per step to logw (nil discards); when the cluster
// already answers it returns at once and logs nothing.
//
// Ensure does not look at DATABASE_URL: callers that honour it check it first.
func Ensure(ctx context.Context, logw io.Writer) (string, error) {
	url, _, err := EnsureStarted(ctx, logw)
	return url, err
}

// EnsureStarted is Ensure that also reports whether this call started the server (false when
// it was running already), so that a caller that started it can Stop it when it is done and
// one that found it running leaves it to whoever started it.
func EnsureStarted(ctx context.Context, logw io.Writer) (url string, started bool, err error) {
	port, err := portFromEnv(os.Getenv(PortEnv))
	if err != nil {
		return "", false, err
	}
	return ensure(ctx, baseDir, port, logw)
}

// ensure is EnsureStarted on the cluster under the directory base returns, at port.
func ensure(ctx context.Context, base func() (string, error), port int, logw io.Writer) (string, bool, error) {
	if logw == nil {
		logw = io.Discard
	}
	url := URL(port, Database)
	if probe(ctx, url) == nil {
		return url, false, nil
	}

	dir, err := base()
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("create the local PostgreSQL directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return "", false, err
	}
	defer unlock()
	// Whoever held the lock before us may have brought the cluster up.
	if probe(ctx, url) == nil {
		return url, false, nil
	}

	c, err := newCluster(ctx, dir, port, logw)
	if err != nil {
		return "", false, err
	}
	started, err := c.ensure(ctx)
	if err != nil {
		return "", started, err
	}
	if err := probe(ctx, url); err != nil {
		return "", started, fmt.Errorf("local PostgreSQL in %s was started but does not answer at %s: %w",
			c.dataDir, url, err)
	}
	return url, started, nil
}

// Stop stops leasehold's local PostgreSQL cluster (pg_ctl stop, fast mode: open sessions are
// cut off) and waits until it is down; it does nothing when the server does not run. Call it
// only after EnsureStarted said it started the server: others may be using a server they
// found running. It logs one line to logw (nil discards) when it stops the server.
func Stop(ctx context.Context, logw io.Writer) error {
	port, err := portFromEnv(os.Getenv(PortEnv))
	if err != nil {
		return err
	}
	dir, err := baseDir()
	if err != nil {
		return err
	}
	return stop(ctx, dir, port, logw)
}

// stop is Stop on the cluster under base.
func stop(ctx context.Context, base string, port int, logw io.Writer) error {
	if logw == nil {
		logw = io.Discard
	}
	if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
		return nil // never brought up here
	}
	bin, err := findBinaries(debianRoot, exec.LookPath)
	if errors.Is(err, ErrNotInstalled) {
		return nil // nothing could have started it
	}
	if err != nil {
		return err
	}
	c, err := clusterOf(bin, base, port, logw)
	if err != nil {
		return err
	}
	// Under the lock, so that an Ensure running meanwhile waits and then starts it afresh.
	unlock, err := lockFile(ctx, filepath.Join(base, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	// Fast: open sessions are cut off (their transactions roll back) rather than waited for.
	return c.stop(ctx, "fast")
}

// portFromEnv parses the value of PortEnv; empty means DefaultPort.
func portFromEnv(v string) (int, error) {
	if v == "" {
		return DefaultPort, nil
	}
	port, err := strconv.Atoi(v)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("%s=%q is not a TCP port: set it to a number between 1 and 65535 or unset it", PortEnv, v)
	}
	return port, nil
}

// baseDir returns the directory that holds the data directory of each major version and the lock.
func baseDir() (string, error) {
	if os.Geteuid() == 0 {
		return "/var/tmp/leasehold-pg", nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find a directory for the local PostgreSQL cluster: %w", err)
	}
	return filepath.Join(cache, "leasehold", "pg"), nil
}

// probe connects to url and closes the connection at once. A refused
// connection fails at once. A server that listens but is slow to answer
// is asked again, each attempt bounded by probeTimeout, until answerWait
// has passed: on a loaded machine a running server's authentication alone
// has taken over 2 s, and taking that for "does not answer" failed a test.
func probe(ctx context.Context, url string) error {
	give := time.Now().Add(answerWait)
	for {
		err := probeOnce(ctx, url)
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || time.Now().After(give) {
			return err
		}
	}
}

// probeOnce is one attempt of probe.
func probeOnce(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// createDatabase creates Database unless it exists, connecting to the postgres database.
func (c *cluster) createDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, URL(c.port, "postgres"))
	if err != nil {
		return fmt.Errorf("connect to local PostgreSQL in %s: %w", c.dataDir, err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", Database).Scan(&exists)
	if err != nil {
		return fmt.Errorf("look for database %s: %w", Database, err)
	}
	if exists {
		return nil
	}
	c.logf("creating database %s", Database)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{Database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: someone beat us to it
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", Database, err)
	}
	return nil
}
