package procstat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrPIDFile is the error of a PID file whose first line is not a PID.
var ErrPIDFile = errors.New("procstat: a PID file's first line is not a PID")

// PostmasterPID reads the postmaster's PID from the postmaster.pid of PostgreSQL's data
// directory dataDir, its first line. It also returns the file's path, for messages. The
// error is the file's (os.ErrNotExist when the server is down and left none) or wraps
// ErrPIDFile.
func PostmasterPID(dataDir string) (pid int, path string, err error) {
	path = filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, path, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, path, fmt.Errorf("%w: %s begins %q", ErrPIDFile, path, first)
	}
	return pid, path, nil
}
