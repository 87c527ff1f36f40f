package localpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/lab/procstat"
)

// PairConfig says how NewPair builds a primary and its standby. The zero value is an
// asynchronous pair in a new temporary directory that logs nothing.
type PairConfig struct {
	// Synchronous makes the primary wait, on every commit, until the standby has flushed the
	// commit's WAL (synchronous_standby_names naming it, synchronous_commit = on), so that a
	// failover loses no acknowledged transaction. False: the primary does not wait, and a
	// failover loses what the standby had not received.
	Synchronous bool
	// Dir is the directory the nodes' data directories are made in, which the postgres OS
	// user must be able to reach when running as root. Empty: a new temporary directory,
	// which Close removes.
	Dir string
	// Log receives one line per step (nil discards).
	Log io.Writer
}

// Pair is a primary PostgreSQL server and a streaming standby of it, each with a data
// directory of its own on a free port of 127.0.0.1, for the tests and the chaos soak that fail
// over: promote the standby, then rebuild the old primary as the standby of the new one, as
// often as they like. The standby streams from the primary over a physical replication slot
// named after it.
//
// In synchronous mode the primary names its standby in synchronous_standby_names only while
// the standby streams: after a failover the new primary accepts writes on its own until Rebuild
// attaches the old one, as Patroni's (non-strict) synchronous mode does. A commit acknowledged
// in that window lives on one server only.
//
// Primary, Standby and URL may be called from any goroutine; the methods that change the
// pair (Promote, Rebuild, the pauses, Close) must be called one at a time.
type Pair struct {
	cfg     PairConfig
	dir     string
	ownsDir bool // Close removes dir
	nodes   [2]*Node
	logw    io.Writer

	mu      sync.Mutex
	primary int // index in nodes
}

// Node is one server of a Pair.
type Node struct {
	name string // application_name, and the name of its slot on the other node
	c    *cluster
}

// replicationConf is the settings file each node includes after leasehold.conf; Pair rewrites
// it whenever a node's role changes.
const replicationConf = "replication.conf"

// pollInterval is how often the pair looks again at a condition it waits for.
const pollInterval = 20 * time.Millisecond

// NewPair creates a primary with database Database (initdb on an empty data directory,
// configured for streaming replication and pg_rewind), starts it, and builds a streaming
// standby of it (pg_basebackup over a replication slot). It installs the server as Ensure
// does. Close the pair when done with it.
func NewPair(ctx context.Context, cfg PairConfig) (_ *Pair, err error) {
	p := &Pair{cfg: cfg, dir: cfg.Dir, logw: cfg.Log}
	if p.logw == nil {
		p.logw = io.Discard
	}
	if p.dir == "" {
		if reaped, err := reapOrphanPairs(ctx); err != nil {
			fmt.Fprintf(p.logw, "localpg: stopping orphaned pairs: %v\n", err)
		} else if len(reaped) > 0 {
			fmt.Fprintf(p.logw, "localpg: stopped and removed %d orphaned pair(s) whose process had died: %v\n", len(reaped), reaped)
		}
		if p.dir, err = os.MkdirTemp("", strings.TrimSuffix(pairPattern, "*")); err != nil {
			return nil, fmt.Errorf("localpg: create a directory for the pair: %w", err)
		}
		if err := writeOwner(p.dir); err != nil {
			_ = os.RemoveAll(p.dir)
			return nil, fmt.Errorf("localpg: %w", err)
		}
		p.ownsDir = true
		// As root the servers run as the postgres user, who must reach their directories.
		if err := os.Chmod(p.dir, 0o755); err != nil {
			_ = os.RemoveAll(p.dir)
			return nil, fmt.Errorf("localpg: %w", err)
		}
	}
	defer func() {
		if err != nil {
			_ = p.Close(context.WithoutCancel(ctx))
		}
	}()

	var ports [2]int
	for i := range ports {
		for ports[i] == 0 || (i == 1 && ports[1] == ports[0]) {
			if ports[i], err = freePort(); err != nil {
				return nil, err
			}
		}
	}
	for i := range p.nodes {
		base := filepath.Join(p.dir, "node"+strconv.Itoa(i))
		if err := os.Mkdir(base, 0o755); err != nil {
			return nil, fmt.Errorf("localpg: create the directory of a node: %w", err)
		}
		var c *cluster
		if i == 0 {
			c, err = newCluster(ctx, base, ports[i], p.logw)
		} else {
			c, err = clusterOf(p.nodes[0].c.bin, base, ports[i], p.logw)
		}
		if err != nil {
			return nil, err
		}
		// The log lives beside the data directory, not in it: pg_basebackup and pg_rewind
		// would copy the other node's log over it.
		c.logFile = filepath.Join(base, "server.log")
		if err := c.chown(base); err != nil {
			return nil, err
		}
		p.nodes[i] = &Node{name: "node" + strconv.Itoa(i), c: c}
	}

	primary := p.nodes[0]
	if err := primary.c.initdb(ctx); err != nil {
		return nil, err
	}
	if err := appendInclude(primary.c); err != nil {
		return nil, err
	}
	if err := p.writeReplicationConf(primary, nil, nil, false); err != nil {
		return nil, err
	}
	if _, err := primary.c.ensure(ctx); err != nil {
		return nil, err
	}
	if _, err := p.attach(ctx, primary, p.nodes[1], false); err != nil {
		return nil, err
	}
	return p, nil
}

// appendInclude makes postgresql.conf include replicationConf, after leasehold.conf so that
// its settings win. pg_basebackup and pg_rewind copy postgresql.conf to the other node.
func appendInclude(c *cluster) error {
	return appendFile(filepath.Join(c.dataDir, "postgresql.conf"),
		"\n# The node's part in its pair (internal/localpg/standby.go).\ninclude_if_exists = '"+replicationConf+"'\n")
}

// appendFile adds text at the end of the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	_, err = f.WriteString(text)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeReplicationConf writes n's replicationConf: as a primary when upstream is nil, naming
// syncStandby in synchronous_standby_names unless it is nil; as a standby of upstream
// otherwise, streaming from it unless paused.
func (p *Pair) writeReplicationConf(n, upstream, syncStandby *Node, paused bool) error {
	var b strings.Builder
	b.WriteString(`# Written by leasehold (internal/localpg/standby.go): edits here are lost.
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
# pg_rewind needs every hint-bit change in the WAL (or data checksums).
wal_log_hints = on
synchronous_commit = on
# A standby whose stream was cut retries after this long (default 5s): failovers and
# ResumeStreaming take effect at once.
wal_retrieve_retry_interval = '200ms'
# TCP only: pg_rewind cannot copy a socket in the data directory, and pg_basebackup would
# copy the socket's lock file, which then stops the copy from starting.
unix_socket_directories = ''
`)
	names := ""
	if syncStandby != nil {
		names = syncStandby.name
	}
	fmt.Fprintf(&b, "synchronous_standby_names = %s\n", quoteConf(names))
	if upstream != nil {
		conninfo := ""
		if !paused {
			conninfo = upstream.conninfo("postgres") + " application_name=" + n.name
		}
		fmt.Fprintf(&b, "primary_conninfo = %s\nprimary_slot_name = %s\n", quoteConf(conninfo), quoteConf(n.name))
	}
	path := filepath.Join(n.c.dataDir, replicationConf)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return n.c.chown(path)
}

// attach makes standby, whose server is down, a streaming standby of primary: it (re)creates
// standby's slot on primary, rewinds standby's data directory with pg_rewind when rewind is
// true (a fresh pg_basebackup when that fails, or when rewind is false), starts it and waits
// until it streams, and in synchronous mode until the primary waits for it. It reports
// whether pg_rewind did the job.
func (p *Pair) attach(ctx context.Context, primary, standby *Node, rewind bool) (rewound bool, err error) {
	err = primary.exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, standby.name)
	if err != nil {
		return false, fmt.Errorf("localpg: drop the old slot %s on %s: %w", standby.name, primary.name, err)
	}
	// Reserved at once, so that the primary keeps the WAL from here on until the standby
	// streams.
	if err := primary.exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, standby.name); err != nil {
		return false, fmt.Errorf("localpg: create the slot %s on %s: %w", standby.name, primary.name, err)
	}

	bin := filepath.Dir(standby.c.bin.pgCtl)
	if rewind {
		p.logf("rewinding %s to follow %s (pg_rewind)", standby.name, primary.name)
		out, err := standby.c.run(ctx, filepath.Join(bin, "pg_rewind"),
			"--target-pgdata="+standby.c.dataDir, "--source-server="+primary.conninfo("postgres"))
		if err == nil {
			rewound = true
		} else {
			p.logf("pg_rewind of %s failed, copying %s afresh instead: %v\n%s", standby.name, primary.name, err, lastLines(out, 10))
		}
	}
	if !rewound {
		p.logf("copying %s into %s (pg_basebackup)", primary.name, standby.name)
		if err := os.RemoveAll(standby.c.dataDir); err != nil {
			return false, fmt.Errorf("localpg: remove the data directory of %s: %w", standby.name, err)
		}
		out, err := standby.c.run(ctx, filepath.Join(bin, "pg_basebackup"),
			"--pgdata="+standby.c.dataDir, "--dbname="+primary.conninfo("postgres"),
			"--wal-method=stream", "--checkpoint=fast", "--slot="+standby.name)
		if err != nil {
			return false, fmt.Errorf("localpg: pg_basebackup of %s into %s failed: %w\n%s",
				primary.name, standby.c.dataDir, err, lastLines(out, 20))
		}
	}
	signal := filepath.Join(standby.c.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return rewound, fmt.Errorf("localpg: write %s: %w", signal, err)
	}
	if err := standby.c.chown(signal); err != nil {
		return rewound, err
	}
	if err := p.writeReplicationConf(standby, primary, nil, false); err != nil {
		return rewound, err
	}
	if err := standby.c.start(ctx, errors.New("a standby being built")); err != nil {
		return rewound, err
	}
	if err := p.waitStreaming(ctx, primary, standby); err != nil {
		return rewound, err
	}
	if !p.cfg.Synchronous {
		return rewound, nil
	}
	if err := p.writeReplicationConf(primary, nil, standby, false); err != nil {
		return rewound, err
	}
	if err := primary.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return rewound, fmt.Errorf("localpg: reload the configuration of %s: %w", primary.name, err)
	}
	return rewound, primary.poll(ctx, "the primary waiting for "+standby.name+" on every commit",
		`SELECT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = $1 AND sync_state = 'sync')`, standby.name)
}

// waitStreaming waits until standby streams from primary.
func (p *Pair) waitStreaming(ctx context.Context, primary, standby *Node) error {
	return primary.poll(ctx, standby.name+" streaming from "+primary.name,
		`SELECT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming')`, standby.name)
}

// Primary is the node that is the primary, or was until it was stopped, until Promote makes
// the other one the primary.
func (p *Pair) Primary() *Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[p.primary]
}

// Standby is the node that is not Primary: the standby, or the old primary between Promote and
// Rebuild.
func (p *Pair) Standby() *Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[1-p.primary]
}

// URL is a multi-host URL of database Database that names both nodes with
// target_session_attrs=read-write, so that a client connects to whichever is the primary.
func (p *Pair) URL() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(User, Password),
		Host:     fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", p.nodes[0].c.port, p.nodes[1].c.port),
		Path:     "/" + Database,
		RawQuery: "sslmode=disable&target_session_attrs=read-write",
	}
	return u.String()
}

// Promote promotes the standby (pg_ctl promote), waits until it accepts writes and makes it
// Primary. It does not stop the old primary: stop it first (Node.Crash, Node.Kill), or there
// are two primaries, which is what a split brain is. After Promote the new primary names no
// synchronous standby, even in synchronous mode, until Rebuild attaches one.
func (p *Pair) Promote(ctx context.Context) error {
	standby := p.Standby()
	p.logf("promoting %s", standby.name)
	// The new primary must not wait on commits for a standby that is not there.
	if err := p.writeReplicationConf(standby, nil, nil, false); err != nil {
		return err
	}
	out, err := standby.c.run(ctx, standby.c.bin.pgCtl, "promote", "--wait", "--timeout=60", "--pgdata="+standby.c.dataDir)
	if err != nil {
		return fmt.Errorf("localpg: pg_ctl promote of %s failed: %w\n%s", standby.name, err, lastLines(out, 10))
	}
	if err := standby.poll(ctx, standby.name+" accepting writes", `SELECT NOT pg_is_in_recovery()`); err != nil {
		return err
	}
	// pg_rewind reads the new timeline from the source's control file, which only the first
	// checkpoint after promotion writes. Without it pg_rewind finds nothing to do.
	if err := standby.exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("localpg: checkpoint after promoting %s: %w", standby.name, err)
	}
	if err := standby.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("localpg: reload the configuration of %s: %w", standby.name, err)
	}
	p.mu.Lock()
	p.primary = 1 - p.primary
	p.mu.Unlock()
	return nil
}

// Rebuild makes Standby, the old primary, a streaming standby of Primary: it stops its server
// when it runs (immediate mode), rewinds its data directory to where the two diverged
// (pg_rewind), or copies Primary afresh (pg_basebackup) when that fails, starts it and waits
// until it streams, and in synchronous mode until Primary waits for it on every commit.
// It reports whether pg_rewind did the job. Rebuild after Promote, so that failovers repeat.
func (p *Pair) Rebuild(ctx context.Context) (rewound bool, err error) {
	primary, standby := p.Primary(), p.Standby()
	if err := standby.Crash(ctx); err != nil {
		return false, err
	}
	if err := p.writeReplicationConf(primary, nil, nil, false); err != nil {
		return false, err
	}
	rewound, err = p.attach(ctx, primary, standby, true)
	if err != nil && rewound {
		// Rewound, but it could not follow: the new primary no longer had
		// a WAL segment the rewound directory needed (seen once in a
		// 10-minute soak with a failover a minute). A fresh copy needs none.
		p.logf("%s, rewound, did not become a standby of %s (%v); copying %s afresh", standby.name, primary.name, err, primary.name)
		_ = standby.Crash(ctx) // whatever of it runs; an error means nothing does
		_, err = p.attach(ctx, primary, standby, false)
		return false, err
	}
	return rewound, err
}

// ReopenOld starts Standby, the old primary after Promote, on its own and read-only, to read
// what it had: its server recovers all the WAL it wrote (in asynchronous mode that may hold
// commits the new primary never received) and then refuses writes by default
// (default_transaction_read_only), so that a client of URL, which asks for a read-write
// session, never uses it. Rebuild makes it the standby afterwards, as after any failover.
func (p *Pair) ReopenOld(ctx context.Context) error {
	old := p.Standby()
	if err := p.writeReplicationConf(old, nil, nil, false); err != nil {
		return err
	}
	err := appendFile(filepath.Join(old.c.dataDir, replicationConf),
		"# Reopened to be read (ReopenOld): the pair's primary is the other node.\ndefault_transaction_read_only = on\n")
	if err != nil {
		return fmt.Errorf("localpg: %w", err)
	}
	p.logf("reopening %s, the old primary, read-only", old.name)
	// pg_ctl start waits until the server accepts connections: after its crash
	// recovery, which replays the WAL to its end.
	return old.c.start(ctx, errors.New("the old primary being reopened"))
}

// WaitReplayed waits until the standby has replayed the WAL up to the primary's current
// position, so that it shows every transaction committed before the call. It waits until ctx
// ends when replay or streaming is paused.
func (p *Pair) WaitReplayed(ctx context.Context) error {
	primary, standby := p.Primary(), p.Standby()
	var lsn string
	if err := primary.queryRow(ctx, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		return fmt.Errorf("localpg: read the WAL position of %s: %w", primary.name, err)
	}
	return standby.poll(ctx, standby.name+" replaying up to "+lsn,
		`SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn)
}

// PauseReplay pauses the standby's replay of the WAL (pg_wal_replay_pause): it keeps
// receiving, and in synchronous mode confirming, the primary's WAL, but shows none of it
// until ResumeReplay. A promotion replays what it received first.
func (p *Pair) PauseReplay(ctx context.Context) error {
	standby := p.Standby()
	if err := standby.exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		return fmt.Errorf("localpg: pause replay on %s: %w", standby.name, err)
	}
	return standby.poll(ctx, "replay paused on "+standby.name, `SELECT pg_get_wal_replay_pause_state() = 'paused'`)
}

// ResumeReplay resumes the replay that PauseReplay paused.
func (p *Pair) ResumeReplay(ctx context.Context) error {
	standby := p.Standby()
	if err := standby.exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		return fmt.Errorf("localpg: resume replay on %s: %w", standby.name, err)
	}
	return nil
}

// PauseStreaming cuts the standby off the primary's WAL (it forgets primary_conninfo) and
// waits until it no longer streams: in asynchronous mode what the primary commits meanwhile
// is lost by a failover; in synchronous mode commits on the primary wait until
// ResumeStreaming.
func (p *Pair) PauseStreaming(ctx context.Context) error {
	primary, standby := p.Primary(), p.Standby()
	if err := p.setStreaming(ctx, primary, standby, true); err != nil {
		return err
	}
	if err := standby.poll(ctx, standby.name+" no longer receiving", `SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver)`); err != nil {
		return err
	}
	return primary.poll(ctx, standby.name+" no longer streaming from "+primary.name,
		`SELECT NOT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = $1)`, standby.name)
}

// ResumeStreaming undoes PauseStreaming and waits until the standby streams again.
func (p *Pair) ResumeStreaming(ctx context.Context) error {
	primary, standby := p.Primary(), p.Standby()
	if err := p.setStreaming(ctx, primary, standby, false); err != nil {
		return err
	}
	return p.waitStreaming(ctx, primary, standby)
}

func (p *Pair) setStreaming(ctx context.Context, primary, standby *Node, paused bool) error {
	if err := p.writeReplicationConf(standby, primary, nil, paused); err != nil {
		return err
	}
	if err := standby.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("localpg: reload the configuration of %s: %w", standby.name, err)
	}
	return nil
}

// Close stops both servers (immediate mode: their data is thrown away) and removes their
// data directories, and the pair's directory when NewPair made it.
func (p *Pair) Close(ctx context.Context) error {
	var errs []error
	for _, n := range p.nodes {
		if n == nil {
			continue
		}
		if err := n.Crash(ctx); err != nil {
			errs = append(errs, err)
			continue // its files may still be in use
		}
		if err := os.RemoveAll(n.c.base); err != nil {
			errs = append(errs, err)
		}
	}
	if p.ownsDir && len(errs) == 0 {
		if err := os.RemoveAll(p.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *Pair) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(p.logw, "localpg: "+format+"\n", args...)
}

// Name is the node's application_name, which names its replication slot on the other node.
func (n *Node) Name() string { return n.name }

// Port is the TCP port of 127.0.0.1 the node listens on.
func (n *Node) Port() int { return n.c.port }

// URL is the URL of database Database on the node.
func (n *Node) URL() string { return URL(n.c.port, Database) }

// InRecovery reports whether the node is a standby (pg_is_in_recovery).
func (n *Node) InRecovery(ctx context.Context) (bool, error) {
	var in bool
	if err := n.queryRow(ctx, `SELECT pg_is_in_recovery()`, nil, &in); err != nil {
		return false, fmt.Errorf("localpg: ask %s whether it is in recovery: %w", n.name, err)
	}
	return in, nil
}

// Timeline is the node's current timeline ID: on a primary, that of the WAL it writes; on a
// standby, that of the WAL it receives, or of its last restartpoint when it receives none.
// Every promotion starts a new, greater timeline.
func (n *Node) Timeline(ctx context.Context) (uint32, error) {
	var tli int64
	err := n.queryRow(ctx, `
		SELECT CASE
			WHEN NOT pg_is_in_recovery() THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
			ELSE coalesce((SELECT received_tli FROM pg_stat_wal_receiver WHERE received_tli > 0),
				(SELECT timeline_id FROM pg_control_checkpoint()))
		END`, nil, &tli)
	if err != nil {
		return 0, fmt.Errorf("localpg: read the timeline of %s: %w", n.name, err)
	}
	return uint32(tli), nil
}

// Crash stops the node's server as a power cut would (pg_ctl stop in immediate mode): no
// checkpoint, and sessions are cut off at once. It does nothing when the server is down.
func (n *Node) Crash(ctx context.Context) error { return n.c.stop(ctx, "immediate") }

// Kill kills the node's server with SIGKILL, the postmaster and every process it forked, as
// the kernel's OOM killer or a dead machine would, and waits until they are gone. It does
// nothing when the server is down.
func (n *Node) Kill(ctx context.Context) error {
	pid, _, err := procstat.PostmasterPID(n.c.dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("localpg: the server to kill: %w", err)
	}
	n.c.logf("killing PostgreSQL on 127.0.0.1:%d (SIGKILL to postmaster %d and its children)", n.c.port, pid)
	// Stopped, the postmaster forks no new child while we list them, nor restarts the ones
	// we kill.
	if err := syscall.Kill(pid, syscall.SIGSTOP); errors.Is(err, syscall.ESRCH) {
		return n.removeLockFiles() // it died by itself
	} else if err != nil {
		return fmt.Errorf("localpg: stop postmaster %d: %w", pid, err)
	}
	pids := append([]int{pid}, childrenOf(pid)...)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		for alive(pid) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("localpg: wait for PID %d to die: %w", pid, context.Cause(ctx))
			case <-time.After(pollInterval):
			}
		}
	}
	return n.removeLockFiles()
}

// removeLockFiles removes the postmaster.pid a killed server leaves behind: a postmaster
// that lingers as a zombie (nobody may reap it) keeps its PID, so a new server would take
// the file for a live one's. (The nodes have no unix socket, hence no socket lock file.)
func (n *Node) removeLockFiles() error {
	path := filepath.Join(n.c.dataDir, "postmaster.pid")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("localpg: remove %s: %w", path, err)
	}
	return nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	stats, _ := procstat.Children(pid)
	children := make([]int, len(stats))
	for i, st := range stats {
		children[i] = st.PID
	}
	return children
}

// alive reports whether process pid exists and is not a zombie (or has a
// stat line that cannot be read).
func alive(pid int) bool {
	st, err := procstat.Read(pid)
	if err != nil {
		return errors.Is(err, procstat.ErrFormat)
	}
	return st.State != 'Z'
}

// conninfo is a libpq connection string of database db on the node, for the server programs.
func (n *Node) conninfo(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s", n.c.port, User, Password, db)
}

// exec runs sql on database postgres of the node, on a connection of its own.
func (n *Node) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, URL(n.c.port, "postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// queryRow runs sql with args on database postgres of the node and scans its one row into dest.
func (n *Node) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return queryRowAt(ctx, URL(n.c.port, "postgres"), sql, args, dest...)
}

// poll runs sql, which returns one boolean, on database postgres of the node until it returns
// true or ctx ends: see pollAt.
func (n *Node) poll(ctx context.Context, what, sql string, args ...any) error {
	return pollAt(ctx, URL(n.c.port, "postgres"), what, sql, args...)
}

// queryRowAt runs sql with args on a new connection to url and scans its one row into dest.
func queryRowAt(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// pollAt runs sql, which returns one boolean, on url until it returns true or ctx ends; what
// says what it waits for. Errors (the server restarting, say) count as false, and the last one
// is reported if ctx ends.
func pollAt(ctx context.Context, url, what, sql string, args ...any) error {
	var lastErr error
	for {
		var ok bool
		lastErr = queryRowAt(ctx, url, sql, args, &ok)
		if lastErr == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("localpg: wait for %s: %w (last error: %w)", what, context.Cause(ctx), lastErr)
			}
			return fmt.Errorf("localpg: wait for %s: %w", what, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}
