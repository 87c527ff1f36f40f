package procstat_test

import (
	"errors"
	"os"
	"testing"

	"github.com/leasehold/leasehold/internal/lab/procstat"
)

func TestParse(t *testing.T) {
	t.Parallel()
	// A command name with a space and a parenthesis, as a process may call itself.
	line := "26642 (postgres: x) y) S 1 26642 26642 0 -1 4194304 52671 5635390 0 36 16 136 9799 6596 20 0 1 0 3195092\n"
	got, err := procstat.Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procstat.Stat{PID: 26642, Comm: "postgres: x) y", State: 'S', PPID: 1, UTime: 16, STime: 136, CUTime: 9799, CSTime: 6596}
	if got != want {
		t.Errorf("Parse: got %+v, want %+v", got, want)
	}
	if got.CPU() != 16+136+9799+6596 {
		t.Errorf("CPU: %d", got.CPU())
	}
	for _, bad := range []string{"12 (short) S 1 2", "no parentheses at all", "x (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"} {
		if _, err := procstat.Parse(bad); !errors.Is(err, procstat.ErrFormat) {
			t.Errorf("Parse(%q): %v, want ErrFormat", bad, err)
		}
	}
}

// TestReadSelf reads this process and finds it among its parent's children.
func TestReadSelf(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != os.Getpid() || st.PPID != os.Getppid() || st.State == 'Z' {
		t.Errorf("Read(self): %+v; want pid %d, parent %d, alive", st, os.Getpid(), os.Getppid())
	}
	children, err := procstat.Children(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range children {
		found = found || c.PID == os.Getpid()
	}
	if !found {
		t.Errorf("Children(%d) does not list this process (%d): %+v", os.Getppid(), os.Getpid(), children)
	}
}

func TestPostmasterPID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, _, err := procstat.PostmasterPID(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no file: %v, want os.ErrNotExist", err)
	}
	path := dir + "/postmaster.pid"
	// As PostgreSQL writes it: the PID, the data directory, the start time, the port, …
	if err := os.WriteFile(path, []byte("4242\n"+dir+"\n1764600000\n5432\n\n127.0.0.1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid, got, err := procstat.PostmasterPID(dir); err != nil || pid != 4242 || got != path {
		t.Errorf("PostmasterPID = %d, %q, %v; want 4242, %q", pid, got, err, path)
	}
	for _, bad := range []string{"", "\n", "x\n", "-3\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := procstat.PostmasterPID(dir); !errors.Is(err, procstat.ErrPIDFile) {
			t.Errorf("file %q: %v, want ErrPIDFile", bad, err)
		}
	}
}
