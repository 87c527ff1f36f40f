package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/lab/procstat"
)

// pairPattern names the directories NewPair makes for itself, in os.TempDir.
const pairPattern = "localpg-pair-*"

// ownerFile, in a pair's own directory, holds the PID of the process that made it.
const ownerFile = "owner.pid"

// writeOwner records this process as the owner of the pair directory dir.
func writeOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// reapOrphanPairs stops the servers of the pairs whose owning process is gone and removes
// their directories: a test binary killed outright (a go test stopped by SIGKILL, a
// timeout) runs no cleanup, and its pair would run on, two servers and their ports, until
// the machine restarts. A directory without an owner (being made, or by an older build)
// is left alone, as is every pair whose owner lives. It returns the directories removed.
func reapOrphanPairs(ctx context.Context) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), pairPattern))
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // no owner recorded: not ours to judge
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || owner == os.Getpid() || alive(owner) {
			continue
		}
		if err := stopOrphanServers(ctx, dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("localpg: remove the orphaned pair %s: %w", dir, err))
			continue
		}
		reaped = append(reaped, dir)
	}
	return reaped, errors.Join(errs...)
}

// stopOrphanServers stops, immediately (SIGQUIT), each server whose data directory lies in
// the pair directory dir, and waits until it is gone. A postmaster.pid whose process is
// not a postgres server (a PID the kernel gave another program since) is left alone.
func stopOrphanServers(ctx context.Context, dir string) error {
	pidFiles, err := filepath.Glob(filepath.Join(dir, "node*", "*", "postmaster.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		pid, _, err := procstat.PostmasterPID(filepath.Dir(f))
		if err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err != nil || st.Comm != "postgres" || st.State == 'Z' {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("localpg: stop the orphaned server %d of %s: %w", pid, dir, err)
		}
		for alive(pid) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("localpg: wait for the orphaned server %d of %s: %w", pid, dir, context.Cause(ctx))
			case <-time.After(pollInterval):
			}
		}
	}
	return nil
}
