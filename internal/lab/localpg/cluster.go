package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/lab/procstat"
)

// debianRoot holds one bin directory per installed major version on Debian and Ubuntu.
const debianRoot = "/usr/lib/postgresql"

// maxSocketPath is the longest unix socket path the kernel takes (sun_path less its NUL).
const maxSocketPath = 107

// cluster is one data directory of one major version, and how to run its programs.
type cluster struct {
	bin     binaries
	base    string // parent of dataDir, holding the lock; the working directory of every child
	dataDir string
	logFile string
	port    int
	owner   *owner // the OS user the server runs as; nil: the current user
	logw    io.Writer
}

// owner is the OS user that owns the data directory and runs the server when we are root.
type owner struct {
	uid, gid uint32
	home     string
}

// binaries are the server programs of one major version.
type binaries struct {
	initdb, pgCtl string
	major         string // "15", or "9.6" before version 10
}

func newCluster(ctx context.Context, base string, port int, logw io.Writer) (*cluster, error) {
	bin, err := findBinaries(debianRoot, exec.LookPath)
	if errors.Is(err, ErrNotInstalled) && os.Geteuid() == 0 {
		if _, aptErr := exec.LookPath("apt-get"); aptErr == nil {
			if err := aptInstall(ctx, logw); err != nil {
				return nil, err
			}
			bin, err = findBinaries(debianRoot, exec.LookPath)
		}
	}
	if err != nil {
		return nil, err
	}
	return clusterOf(bin, base, port, logw)
}

// clusterOf is the cluster of the server programs bin under base.
func clusterOf(bin binaries, base string, port int, logw io.Writer) (*cluster, error) {
	c := &cluster{
		bin:     bin,
		base:    base,
		dataDir: filepath.Join(base, bin.major),
		port:    port,
		logw:    logw,
	}
	c.logFile = filepath.Join(c.dataDir, "server.log")
	if os.Geteuid() == 0 {
		var err error
		if c.owner, err = lookupOwner(User); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ensure initialises the data directory when it holds no cluster, starts the server unless it
// answers, and creates the database unless it exists; started says whether it started the
// server. The caller holds the lock.
func (c *cluster) ensure(ctx context.Context) (started bool, err error) {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.initdb(ctx); err != nil {
			return false, err
		}
	} else if err != nil {
		return false, fmt.Errorf("look for the local PostgreSQL cluster: %w", err)
	}
	if err := probe(ctx, URL(c.port, "postgres")); err != nil {
		if err := c.start(ctx, err); err != nil {
			return false, err
		}
		started = true
	}
	return started, c.createDatabase(ctx)
}

// stop stops the server when it runs, waiting until it is down. The caller holds the lock.
// mode is pg_ctl's: "fast" cuts open sessions off and shuts down cleanly; "immediate" kills
// the server without a checkpoint, as a crash would, and the next start recovers from the WAL.
func (c *cluster) stop(ctx context.Context, mode string) error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		return nil // no cluster, so no server
	}
	// pg_ctl status: 0 running, 3 not running, 4 no data directory.
	if _, err := c.run(ctx, c.bin.pgCtl, "status", "--pgdata="+c.dataDir); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) && (exitErr.ExitCode() == 3 || exitErr.ExitCode() == 4) {
			return nil
		}
		return fmt.Errorf("pg_ctl status in %s: %w", c.dataDir, err)
	}
	c.logf("stopping PostgreSQL %s on 127.0.0.1:%d (%s)", c.bin.major, c.port, mode)
	out, err := c.run(ctx, c.bin.pgCtl, "stop", "--wait", "--timeout=60", "--mode="+mode, "--pgdata="+c.dataDir)
	if err != nil {
		return fmt.Errorf("pg_ctl stop in %s failed: %w\n%s", c.dataDir, err, lastLines(out, 10))
	}
	return nil
}

// initdb creates the cluster in a scratch directory and renames it into place, so that a data
// directory with PG_VERSION is always a complete one, even after initdb was interrupted.
func (c *cluster) initdb(ctx context.Context) error {
	c.logf("initialising a PostgreSQL %s cluster in %s", c.bin.major, c.dataDir)
	scratch := c.dataDir + ".init"
	if err := os.RemoveAll(scratch); err != nil {
		return fmt.Errorf("remove the leftovers of an earlier initdb: %w", err)
	}
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return fmt.Errorf("create the data directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	if err := c.chown(scratch); err != nil {
		return err
	}

	pwfile, err := c.writeFile(c.base, "pwfile-*", Password+"\n")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(pwfile) }()

	out, err := c.run(ctx, c.bin.initdb,
		"--pgdata="+scratch,
		"--username="+User,
		"--pwfile="+pwfile,
		"--auth-host=scram-sha-256",
		// The socket lives in the data directory, which only the owner can enter.
		"--auth-local=trust",
		"--encoding=UTF8",
		"--no-locale",
	)
	if err != nil {
		return fmt.Errorf("initdb %s failed: %w\n%s", scratch, err, lastLines(out, 20))
	}

	// Settings that follow the environment (the port) are rewritten into leasehold.conf before
	// every start; postgresql.conf itself stays as initdb wrote it, plus this include.
	f, err := os.OpenFile(filepath.Join(scratch, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open postgresql.conf: %w", err)
	}
	_, err = f.WriteString("\n# leasehold's settings, rewritten before every start.\ninclude_if_exists = 'leasehold.conf'\n")
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	if err := os.Rename(scratch, c.dataDir); err != nil {
		return fmt.Errorf("move the new cluster into place: %w", err)
	}
	return nil
}

// start writes leasehold.conf and starts the server, waiting until it accepts connections;
// probeErr says why the server did not answer. When the start fails, the error ends with the
// server log.
func (c *cluster) start(ctx context.Context, probeErr error) error {
	if err := c.clearStalePID(ctx); err != nil {
		return err
	}
	// A server that runs but did not answer was started with another port, or is refusing
	// connections: restarting it would cut off whoever uses it, so say so instead.
	if out, err := c.run(ctx, c.bin.pgCtl, "status", "--pgdata="+c.dataDir); err == nil {
		status, _, _ := strings.Cut(string(out), "\n")
		return fmt.Errorf("PostgreSQL in %s runs (%s) but does not answer at 127.0.0.1:%d (%w): "+
			"if it was started with another %s, use that or stop it with pg_ctl stop -D %s",
			c.dataDir, strings.TrimPrefix(status, "pg_ctl: "), c.port, probeErr, PortEnv, c.dataDir)
	}
	if err := c.writeConf(); err != nil {
		return err
	}
	c.logf("starting PostgreSQL %s on 127.0.0.1:%d (log: %s)", c.bin.major, c.port, c.logFile)
	out, err := c.run(ctx, c.bin.pgCtl, "start", "--wait", "--timeout=60",
		"--pgdata="+c.dataDir, "--log="+c.logFile)
	if err != nil {
		serverLog, _ := os.ReadFile(c.logFile)
		return fmt.Errorf("pg_ctl start in %s failed: %w\n%s\nlast lines of %s:\n%s",
			c.dataDir, err, lastLines(out, 10), c.logFile, lastLines(serverLog, 20))
	}
	return nil
}

// clearStalePID deals with the two ways a postmaster.pid left by a dead server can still block
// a start, which postgres itself takes for a live server because kill(pid, 0) succeeds:
// the dead postmaster lingers as a zombie until its parent (often init) reaps it, so wait
// for that; or, after a reboot, its PID now belongs to an unrelated process, so remove the file.
// It reads /proc and does nothing where there is none.
func (c *cluster) clearStalePID(ctx context.Context) error {
	pid, pidFile, err := procstat.PostmasterPID(c.dataDir)
	if err != nil {
		return nil // none, unreadable or not a PID: let pg_ctl judge
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := procstat.Read(pid)
		if err != nil {
			return nil // gone (or no /proc, or unreadable): postgres sees that for itself
		}
		comm, state := st.Comm, st.State
		switch {
		case state == 'Z' && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
			}
			continue
		case state == 'Z' || comm == "postgres" || comm == "postmaster":
			return nil // let pg_ctl and postgres judge
		}
		c.logf("removing stale %s: PID %d is now %q, not a PostgreSQL server", pidFile, pid, comm)
		if err := os.Remove(pidFile); err != nil {
			return fmt.Errorf("remove stale %s: %w", pidFile, err)
		}
		return nil
	}
}

// writeConf writes the settings that Ensure owns. fsync and synchronous_commit keep their
// durable defaults: tests must see what production sees.
func (c *cluster) writeConf() error {
	socketDir := c.dataDir
	if len(socketDir)+len("/.s.PGSQL.")+len(strconv.Itoa(c.port)) > maxSocketPath {
		socketDir = "" // too long for a unix socket: TCP only
	}
	conf := fmt.Sprintf(`# Written by leasehold (internal/localpg) before every start: edits here are lost.
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = %s
max_connections = 300
logging_collector = off
log_destination = 'stderr'
`, c.port, quoteConf(socketDir))
	path := filepath.Join(c.dataDir, "leasehold.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return c.chown(path)
}

// quoteConf quotes s as a postgresql.conf string.
func quoteConf(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func (c *cluster) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(c.logw, "localpg: "+format+"\n", args...)
}

// run runs a server program as the cluster's owner and returns its combined output.
func (c *cluster) run(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = c.base
	cmd.Env = childEnv(os.Environ(), c.owner)
	if c.owner != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
			Uid: c.owner.uid, Gid: c.owner.gid, Groups: []uint32{},
		}}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The server pg_ctl leaves behind writes to its log file, not to our pipe; should it ever
	// keep the pipe open, do not wait for it.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return out.Bytes(), err
}

// childEnv is env without the libpq variables (PGPORT, PGDATA, …), which would change what
// the server programs do, and with HOME set to the owner's.
func childEnv(env []string, o *owner) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, "PG") || (o != nil && strings.HasPrefix(kv, "HOME=")) {
			continue
		}
		out = append(out, kv)
	}
	if o != nil {
		out = append(out, "HOME="+o.home)
	}
	return out
}

// writeFile writes content to a new file in dir, readable by the owner only, and returns its path.
func (c *cluster) writeFile(dir, pattern, content string) (string, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", fmt.Errorf("create a file in %s: %w", dir, err)
	}
	_, err = f.WriteString(content)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = c.chown(f.Name())
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", f.Name(), err)
	}
	return f.Name(), nil
}

// chown gives path to the cluster's owner, when that is not us.
func (c *cluster) chown(path string) error {
	if c.owner == nil {
		return nil
	}
	if err := os.Chown(path, int(c.owner.uid), int(c.owner.gid)); err != nil {
		return fmt.Errorf("give %s to the %s user: %w", path, User, err)
	}
	return nil
}

func lookupOwner(name string) (*owner, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("as root the local PostgreSQL runs as the %s OS user, which was not found (%w): "+
			"install the PostgreSQL server package, which creates it, or run as a normal user", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has gid %q: %w", name, u.Gid, err)
	}
	return &owner{uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}, nil
}

// aptInstall installs Debian's postgresql package, streaming apt-get's output to logw.
func aptInstall(ctx context.Context, logw io.Writer) error {
	_, _ = fmt.Fprintln(logw, "localpg: no PostgreSQL server found: installing it with apt-get")
	for _, args := range [][]string{{"update"}, {"install", "-y", "postgresql"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = logw, logw
		// The package's scripts may start Debian's own cluster, which may keep our output open.
		cmd.WaitDelay = 10 * time.Second
		if err := cmd.Run(); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
			return fmt.Errorf("apt-get %s failed (%w): install the PostgreSQL server yourself "+
				"or set DATABASE_URL to an existing database", strings.Join(args, " "), err)
		}
	}
	return nil
}

// findBinaries returns the server programs of the highest major version under root (Debian's
// layout: root/<version>/bin), or else the initdb and pg_ctl found by lookPath.
func findBinaries(root string, lookPath func(string) (string, error)) (binaries, error) {
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "bin"))
	var best binaries
	var bestVersion []int
	for _, dir := range dirs {
		major := filepath.Base(filepath.Dir(dir))
		version, ok := parseVersion(major)
		if !ok || !isExecutable(filepath.Join(dir, "postgres")) ||
			!isExecutable(filepath.Join(dir, "initdb")) || !isExecutable(filepath.Join(dir, "pg_ctl")) {
			continue
		}
		if bestVersion == nil || slices.Compare(version, bestVersion) > 0 {
			best = binaries{initdb: filepath.Join(dir, "initdb"), pgCtl: filepath.Join(dir, "pg_ctl"), major: major}
			bestVersion = version
		}
	}
	if bestVersion != nil {
		return best, nil
	}

	initdb, err1 := lookPath("initdb")
	pgCtl, err2 := lookPath("pg_ctl")
	if err1 != nil || err2 != nil {
		return binaries{}, ErrNotInstalled
	}
	out, err := exec.Command(pgCtl, "--version").Output()
	if err != nil {
		return binaries{}, fmt.Errorf("%s --version failed: %w", pgCtl, err)
	}
	major, ok := majorOf(string(out))
	if !ok {
		return binaries{}, fmt.Errorf("cannot tell the PostgreSQL version from %s --version: %q", pgCtl, out)
	}
	return binaries{initdb: initdb, pgCtl: pgCtl, major: major}, nil
}

// majorOf returns the major version in pg_ctl --version output such as
// "pg_ctl (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)": "15", or "9.6" before version 10.
func majorOf(versionOutput string) (string, bool) {
	_, rest, ok := strings.Cut(versionOutput, "(PostgreSQL) ")
	if !ok {
		return "", false
	}
	number := strings.FieldsFunc(rest, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if len(number) == 0 {
		return "", false
	}
	parts := strings.Split(strings.Trim(number[0], "."), ".")
	first, err := strconv.Atoi(parts[0])
	switch {
	case err != nil:
		return "", false
	case first >= 10:
		return parts[0], true
	case len(parts) >= 2:
		return parts[0] + "." + parts[1], true
	}
	return "", false
}

// parseVersion parses a dotted version such as "15" or "9.6".
func parseVersion(s string) ([]int, bool) {
	var version []int
	for part := range strings.SplitSeq(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		version = append(version, n)
	}
	return version, true
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// lastLines returns at most n of the last lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
