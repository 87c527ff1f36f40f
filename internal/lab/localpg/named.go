package localpg

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Cluster is a cluster of its own beside the development one, for the tests and the chaos
// soak that stop, crash and restart their server, which they must not do to the cluster
// every other test shares. Its data directory is named/<name>/<major> under the development
// cluster's directory and is kept between runs, so only the first Open pays for initdb.
// One Cluster of a name is open at a time, on this machine: a second Open of the name waits
// until the first is closed (or its process died), so that two runs of a suite side by side
// take turns rather than stop each other's server.
type Cluster struct {
	name   string
	base   string
	port   int
	logw   io.Writer
	unlock func() // the name's lock, held from Open to Close
}

var clusterName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Open brings up the cluster called name on a free port of 127.0.0.1 (initialising it on
// first use, installing the server as Ensure does) with database Database created, and
// returns it. It logs its steps to logw (nil discards). Stop it when done with it.
func Open(ctx context.Context, name string, logw io.Writer) (*Cluster, error) {
	if !clusterName.MatchString(name) {
		return nil, fmt.Errorf("localpg: cluster name %q must be 1 to 40 lower-case letters, digits and dashes", name)
	}
	if logw == nil {
		logw = io.Discard
	}
	dir, err := baseDir()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c := &Cluster{name: name, base: filepath.Join(dir, "named", name), port: port, logw: logw}
	if err := os.MkdirAll(filepath.Dir(c.base), 0o755); err != nil {
		return nil, fmt.Errorf("create the local PostgreSQL directory: %w", err)
	}
	if c.unlock, err = lockFile(ctx, c.base+".open"); err != nil {
		return nil, fmt.Errorf("localpg: cluster %q is open in another process: %w", name, err)
	}
	// Left running by a run that was killed: a server of this data directory on another port.
	if err := c.Stop(ctx); err != nil {
		c.unlock()
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.unlock()
		return nil, err
	}
	return c, nil
}

// Close lets another Open of the name go on; with stop, it stops the server first (as Stop).
// The server of a cluster closed without stop runs on, for a look at it.
func (c *Cluster) Close(ctx context.Context, stop bool) error {
	var err error
	if stop {
		err = c.Stop(ctx)
	}
	c.unlock()
	return err
}

// URL is the URL of database Database on the cluster.
func (c *Cluster) URL() string { return URL(c.port, Database) }

// Port is the TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// Start starts the server unless it answers, and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	_, _, err := ensure(ctx, func() (string, error) { return c.base, nil }, c.port, c.logw)
	return err
}

// Stop shuts the server down cleanly (open sessions are cut off); nothing when it is down.
func (c *Cluster) Stop(ctx context.Context) error { return c.halt(ctx, "fast") }

// Crash kills the server as a power cut would (pg_ctl's immediate mode): no checkpoint, and
// the next Start replays the WAL.
func (c *Cluster) Crash(ctx context.Context) error { return c.halt(ctx, "immediate") }

func (c *Cluster) halt(ctx context.Context, mode string) error {
	if err := os.MkdirAll(c.base, 0o755); err != nil {
		return fmt.Errorf("create the local PostgreSQL directory: %w", err)
	}
	cl, err := newCluster(ctx, c.base, c.port, c.logw)
	if err != nil {
		return err
	}
	unlock, err := lockFile(ctx, filepath.Join(c.base, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	return cl.stop(ctx, mode)
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now, below the kernel's
// range of ephemeral ports (from lowPortFloor): the kernel gives the local end of every
// outgoing connection a port of that range, so a port from it could be taken by some
// connection before the server binds it, or while a node of a pair is down for a failover,
// and its start would fail. Only where that range leaves too little room below it does it
// ask the kernel for any free port.
func freePort() (int, error) {
	if lo := ephemeralLow(); lo-lowPortFloor >= 1000 {
		for range 100 {
			port := lowPortFloor + rand.IntN(lo-lowPortFloor)
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				continue // taken: try another
			}
			_ = ln.Close()
			return port, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localpg: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// lowPortFloor is the lowest port freePort picks: above the ports of common services.
const lowPortFloor = 20000

// ephemeralLow is the first port of the kernel's range for the local ends of outgoing
// connections (Linux's default, 32768, when it cannot be read).
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return linuxDefault
	}
	lo, err := strconv.Atoi(fields[0])
	if err != nil || lo <= 0 {
		return linuxDefault
	}
	return lo
}
