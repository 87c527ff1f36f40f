package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPooler is returned by NewPooler when PgBouncer is not installed (Debian's package
// pgbouncer; .ci/run installs it).
var ErrNoPooler = errors.New("localpg: pgbouncer was not found (apt-get install pgbouncer)")

// PoolerConfig says how NewPooler sets PgBouncer up.
type PoolerConfig struct {
	// ConnectQuery is what PgBouncer runs on every server connection it opens, before any
	// client uses it (its connect_query), e.g. "SELECT fence_epoch_check()"; empty: nothing.
	ConnectQuery string
	// LoginRetry is how long PgBouncer waits before it tries again to open a server
	// connection after one failed (its server_login_retry): while it waits, every client
	// of the database waits too. Zero: PgBouncer's default, 15 s.
	LoginRetry time.Duration
}

// Pooler is a PgBouncer in transaction mode in front of the primary of a Pair, on a free
// port of 127.0.0.1, for the tests of what such a pooler changes. It does not follow a
// failover by itself, as PgBouncer does not: Follow points it at the new primary, as a
// failover tool moves a virtual IP or a DNS name. Close stops it; Pair.Close does not.
type Pooler struct {
	p    *Pair
	cfg  PoolerConfig
	dir  string
	port int
	bin  string
}

// NewPooler starts PgBouncer in front of p's primary (as the cluster's owner when running
// as root, since PgBouncer refuses to run as root) and waits until it serves database
// Database.
func (p *Pair) NewPooler(ctx context.Context, cfg PoolerConfig) (_ *Pooler, err error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			return nil, ErrNoPooler
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(p.dir, "pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("localpg: create a directory for PgBouncer: %w", err)
	}
	b := &Pooler{p: p, cfg: cfg, dir: dir, port: port, bin: bin}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	c := p.Primary().c
	if err := c.chown(dir); err != nil {
		return nil, err
	}
	users := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(users, []byte(fmt.Sprintf("%q %q\n", User, Password)), 0o600); err != nil {
		return nil, fmt.Errorf("localpg: write %s: %w", users, err)
	}
	if err := c.chown(users); err != nil {
		return nil, err
	}
	if err := b.writeConfig(p.Primary()); err != nil {
		return nil, err
	}
	p.logf("starting PgBouncer (transaction mode) on 127.0.0.1:%d in front of %s", port, p.Primary().name)
	if out, err := c.run(ctx, bin, "-d", b.config()); err != nil {
		return nil, fmt.Errorf("localpg: start PgBouncer: %w\n%s%s", err, out, b.logTail())
	}
	if err := b.waitServing(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// URL is the URL of database Database through the pooler. PgBouncer before 1.21 does not
// keep prepared statements across transactions, so pgx is told to prepare none.
func (b *Pooler) URL() string {
	return URL(b.port, Database) + "&default_query_exec_mode=exec"
}

// Follow points the pooler at n (the new primary after Promote) and reloads it: the server
// connections it opens from then on reach n.
func (b *Pooler) Follow(ctx context.Context, n *Node) error {
	if err := b.writeConfig(n); err != nil {
		return err
	}
	pid, err := b.pid()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("localpg: reload PgBouncer (pid %d): %w", pid, err)
	}
	b.p.logf("PgBouncer now in front of %s", n.name)
	return b.waitServing(ctx)
}

// Close stops PgBouncer and removes its files.
func (b *Pooler) Close() error {
	var err error
	if pid, perr := b.pid(); perr == nil {
		if kerr := syscall.Kill(pid, syscall.SIGTERM); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
			err = fmt.Errorf("localpg: stop PgBouncer (pid %d): %w", pid, kerr)
		}
		for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); {
			time.Sleep(pollInterval)
		}
	}
	return errors.Join(err, os.RemoveAll(b.dir))
}

func (b *Pooler) config() string { return filepath.Join(b.dir, "pgbouncer.ini") }

// writeConfig writes the pooler's configuration, in front of n.
func (b *Pooler) writeConfig(n *Node) error {
	db := fmt.Sprintf("host=127.0.0.1 port=%d dbname=%s", n.c.port, Database)
	if b.cfg.ConnectQuery != "" {
		db += " connect_query='" + strings.ReplaceAll(b.cfg.ConnectQuery, "'", "''") + "'"
	}
	conf := fmt.Sprintf(`; Written by leasehold (internal/localpg/pooler.go): edits here are lost.
[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
; Loopback only, for tests: clients are not asked for a password; the server is, with the
; one in auth_file.
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
pidfile = %s
logfile = %s
`, Database, db, b.port, filepath.Join(b.dir, "users.txt"), filepath.Join(b.dir, "pgbouncer.pid"), filepath.Join(b.dir, "pgbouncer.log"))
	if b.cfg.LoginRetry > 0 {
		conf += fmt.Sprintf("server_login_retry = %g\n", b.cfg.LoginRetry.Seconds())
	}
	path := b.config()
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("localpg: write %s: %w", path, err)
	}
	return b.p.Primary().c.chown(path)
}

func (b *Pooler) pid() (int, error) {
	raw, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.pid"))
	if err != nil {
		return 0, fmt.Errorf("localpg: PgBouncer's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, fmt.Errorf("localpg: PgBouncer's pid file: %w", err)
	}
	return pid, nil
}

// waitServing waits until a query through the pooler is answered.
func (b *Pooler) waitServing(ctx context.Context) error {
	what := fmt.Sprintf("PgBouncer on 127.0.0.1:%d to serve %s", b.port, Database)
	if err := pollAt(ctx, b.URL(), what, `SELECT true`); err != nil {
		return fmt.Errorf("%w%s", err, b.logTail())
	}
	return nil
}

func (b *Pooler) logTail() string {
	raw, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if err != nil {
		return ""
	}
	return "\nlast lines of PgBouncer's log:\n" + lastLines(raw, 10)
}
