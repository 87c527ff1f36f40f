// Command task runs Task (taskfile.dev), the task runner of Taskfile.yml,
// from the tool module in tools/: `go tool task run` and `go tool task
// test` work on a machine with only Go, while Task's own dependencies
// (cloud SDKs, terminal UIs) stay out of leasehold's go.mod, and so out of
// the module graph of every program that imports leasehold. It execs
// `go tool -modfile=<repo>/tools/go.mod task ARGS...` in the current
// directory; the first run builds Task from source.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		fmt.Fprintln(os.Stderr, "task: run it inside the leasehold module (go env GOMOD names no go.mod)")
		os.Exit(2)
	}
	cmd := exec.Command("go", append([]string{"tool", "-modfile=" + filepath.Join(filepath.Dir(mod), "tools", "go.mod"), "task"}, os.Args[1:]...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "task:", err)
		os.Exit(1)
	}
}
