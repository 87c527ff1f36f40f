package bench

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/internal/lab/procstat"
)

// pgProcs is PostgreSQL's process tree on this machine: the postmaster and the processes
// it forked (backends, the WAL writer, the checkpointer, autovacuum…).
type pgProcs struct {
	pid  int           // the postmaster's
	how  string        // how it was found
	tick time.Duration // of the times in /proc/<pid>/stat
}

// findServer finds the postmaster of backend, the pid of a session on database, on this
// machine: it is the backend's parent, confirmed by the data directory's postmaster.pid
// (when dataDir is known and readable) or by the backend's process title, which names
// database. When it cannot be found here it returns nil and why, rather than measure some
// other process.
func findServer(backend int, database, dataDir string) (*pgProcs, string) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Sprintf("this machine runs %s, and only Linux's /proc is read for a server's CPU time", runtime.GOOS)
	}
	st, err := procstat.Read(backend)
	if err != nil {
		return nil, fmt.Sprintf("PostgreSQL is not on this machine: no process %d here, the pid its backend reports "+
			"(another host, or a container with a process namespace of its own)", backend)
	}
	s := &pgProcs{pid: st.PPID, tick: clockTick()}
	if dataDir != "" {
		if pid, path, err := procstat.PostmasterPID(dataDir); err == nil {
			if pid != st.PPID {
				return nil, fmt.Sprintf("PostgreSQL is not on this machine: process %d here has parent %d, "+
					"but %s names %d", backend, st.PPID, path, pid)
			}
			s.how = "found by " + path
			return s, ""
		}
	}
	title, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", backend))
	if err != nil || !bytes.Contains(title, []byte(" "+database+" ")) {
		return nil, fmt.Sprintf("PostgreSQL is not on this machine: process %d here is not its backend "+
			"(its title does not name database %s)", backend, database)
	}
	s.how = "found as the parent of a backend whose title names the database"
	return s, ""
}

// tree returns the CPU ticks, user and system, that each live child of the postmaster has
// used so far (its children's included), the postmaster's own reading, and the ticks of the
// whole tree: the children's, and the postmaster's own and those of the children it reaped
// (a backend that exited is counted there). The children are listed between two readings of
// the postmaster, again while a child was reaped in between (up to treeTries times), so that
// no process is counted both as a live child and in the reaped time, nor in neither.
func (s *pgProcs) tree() (children map[int]int64, pm procstat.Stat, whole int64, err error) {
	for try := 1; ; try++ {
		before, err := procstat.Read(s.pid)
		if err != nil {
			return nil, pm, 0, fmt.Errorf("the postmaster (pid %d) is gone: %w", s.pid, err)
		}
		stats, err := procstat.Children(s.pid)
		if err != nil {
			return nil, pm, 0, fmt.Errorf("PostgreSQL's processes: %w", err)
		}
		pm, err = procstat.Read(s.pid)
		if err != nil {
			return nil, pm, 0, fmt.Errorf("the postmaster (pid %d) is gone: %w", s.pid, err)
		}
		if pm.CUTime+pm.CSTime != before.CUTime+before.CSTime && try < treeTries {
			continue
		}
		children = make(map[int]int64, len(stats))
		whole = pm.CPU()
		for _, st := range stats {
			children[st.PID] = st.CPU()
			whole += st.CPU()
		}
		return children, pm, whole, nil
	}
}

// treeTries bounds tree's listings: a server whose children exit faster than they can be
// listed is read as the last listing found it.
const treeTries = 5

// ticksOf returns the CPU ticks process pid has used so far, its children's included;
// false when it is gone.
func (s *pgProcs) ticksOf(pid int) (int64, bool) {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0, false
	}
	return st.CPU(), true
}

// dur converts ticks to time.
func (s *pgProcs) dur(ticks int64) time.Duration { return time.Duration(ticks) * s.tick }

// clockTick is the unit of /proc's times: 1/AT_CLKTCK from the auxiliary vector, which is
// sysconf(_SC_CLK_TCK) without cgo; 10 ms (USER_HZ 100, every Linux Go runs on) when it
// cannot be read.
func clockTick() time.Duration {
	const atClkTck = 17
	b, err := os.ReadFile("/proc/self/auxv")
	if err == nil {
		word := strconv.IntSize / 8
		for ; len(b) >= 2*word; b = b[2*word:] {
			key, val := auxWord(b, word), auxWord(b[word:], word)
			if key == atClkTck && val > 0 {
				return time.Second / time.Duration(val)
			}
		}
	}
	return 10 * time.Millisecond
}

func auxWord(b []byte, word int) uint64 {
	if word == 4 {
		return uint64(binary.NativeEndian.Uint32(b))
	}
	return binary.NativeEndian.Uint64(b)
}
