// Package procstat reads what leasehold needs of a process from Linux's
// /proc/<pid>/stat (its command name, state, parent and CPU time), and the PID
// of a PostgreSQL server from its data directory.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is a process's line of /proc/<pid>/stat, in part.
type Stat struct {
	PID   int
	Comm  string // the command name, without the parentheses around it
	State byte   // R, S, D, Z (a zombie), …
	PPID  int
	// UTime and STime are the process's own CPU time, user and system;
	// CUTime and CSTime those of the children it reaped. All in clock ticks.
	UTime, STime, CUTime, CSTime int64
}

// CPU is the process's CPU ticks and those of the children it reaped.
func (s Stat) CPU() int64 { return s.UTime + s.STime + s.CUTime + s.CSTime }

// ErrFormat is the error of a stat line that cannot be read.
var ErrFormat = errors.New("procstat: not a /proc/<pid>/stat line")

// Read reads the stat line of process pid. The error is the file's (the
// process is gone, or there is no /proc) or wraps ErrFormat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return Parse(string(b))
}

// Parse parses a /proc/<pid>/stat line. The command name, the second field,
// is in parentheses and may hold spaces and parentheses itself, so the
// fields after it are counted from the last ')'.
func Parse(line string) (Stat, error) {
	open := strings.IndexByte(line, '(')
	end := strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return Stat{}, fmt.Errorf("%w: no command name in parentheses", ErrFormat)
	}
	f := strings.Fields(line[end+1:]) // f[0] is field 3, the state
	if len(f) < 15 {
		return Stat{}, fmt.Errorf("%w: %d fields", ErrFormat, len(f)+2)
	}
	var err error
	num := func(field int) int64 {
		n, e := strconv.ParseInt(f[field-3], 10, 64)
		err = errors.Join(err, e)
		return n
	}
	st := Stat{Comm: line[open+1 : end], State: f[0][0]}
	pid, e := strconv.Atoi(strings.TrimSpace(line[:open]))
	err = errors.Join(err, e)
	st.PID, st.PPID = pid, int(num(4))
	st.UTime, st.STime, st.CUTime, st.CSTime = num(14), num(15), num(16), num(17)
	if err != nil {
		return Stat{}, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return st, nil
}

// Children returns the stat lines of the live processes whose parent is
// ppid. A process that exits while /proc is read is left out.
func Children(ppid int) ([]Stat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	var out []Stat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == ppid {
			continue
		}
		if st, err := Read(pid); err == nil && st.PPID == ppid {
			out = append(out, st)
		}
	}
	return out, nil
}
