package localpg

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// startAs starts a long sleep under the command name name, and returns it.
func startAs(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program")
	}
	bin := filepath.Join(t.TempDir(), name)
	src, err := os.Open(sleep)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// deadPID returns the PID of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true program")
	}
	return cmd.Process.Pid
}

// pairDir makes a pair directory in dir owned by owner (none when 0) whose node0 server
// is the process server (none when nil).
func pairDir(t *testing.T, dir string, owner int, server *exec.Cmd) string {
	t.Helper()
	d, err := os.MkdirTemp(dir, "localpg-pair-")
	if err != nil {
		t.Fatal(err)
	}
	if owner != 0 {
		if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(strconv.Itoa(owner)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(d, "node0", "15")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if server != nil {
		pidFile := strconv.Itoa(server.Process.Pid) + "\n" + data + "\n"
		if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(pidFile), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestReapOrphanPairs: the pairs of a process that died are stopped and removed when the
// next pair is made; those of a live process, those with no owner recorded, and a process
// that is not a server named in a stale postmaster.pid are left alone.
func TestReapOrphanPairs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // os.TempDir: the pairs of other tests are not this one's

	orphanServer := startAs(t, "postgres")
	orphan := pairDir(t, tmp, deadPID(t), orphanServer)
	stranger := startAs(t, "not-a-server")
	stale := pairDir(t, tmp, deadPID(t), stranger)
	owned := pairDir(t, tmp, os.Getppid(), startAs(t, "postgres"))
	unowned := pairDir(t, tmp, 0, startAs(t, "postgres"))

	reaped, err := reapOrphanPairs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(reaped) != 2 {
		t.Errorf("reaped %v; want the orphan and the stale pair", reaped)
	}
	for _, d := range []string{orphan, stale} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: %v; want it removed", d, err)
		}
	}
	for _, d := range []string{owned, unowned} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v; want it left", d, err)
		}
	}
	if err := orphanServer.Wait(); err == nil {
		t.Error("the orphaned server exited cleanly; want it stopped by a signal")
	}
	if !alive(stranger.Process.Pid) {
		t.Error("a process named in a stale postmaster.pid, not a server, was stopped; want it left alone")
	}
}
