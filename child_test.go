package leasehold_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
)

// Child processes: a test that must kill a process with -9 starts this
// test binary again with childRole set, and reads what the child prints.
const (
	childRole = "LEASEHOLD_TEST_CHILD"
	childDB   = "LEASEHOLD_TEST_CHILD_DATABASE_URL"
	childID   = "LEASEHOLD_TEST_CHILD_ID"
)

// runChild is a child's whole life: the role's, until it is killed or told
// to stop (SIGTERM).
func runChild(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(childDB))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	switch role {
	case "worker":
		return childWorker(ctx, pool)
	case "elector":
		return childElector(ctx, pool)
	}
	fmt.Println("error: unknown role", role)
	return 2
}

// childWorker runs the kind "slow": it prints "started <id> <fence>" and
// waits for its context to end.
func childWorker(ctx context.Context, pool *pgxpool.Pool) int {
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc[slowArgs](func(ctx context.Context, t *leasehold.Task[slowArgs]) error {
		fmt.Printf("started %d %d\n", t.ID, t.Fence)
		<-ctx.Done()
		return ctx.Err()
	}), leasehold.KindConfig{}); err != nil {
		fmt.Println("error", err)
		return 1
	}
	c, err := leasehold.NewClient(pool, leasehold.Config{ID: os.Getenv(childID), Workers: workers, TaskTTL: 2 * time.Second})
	if err == nil {
		err = c.Start(ctx)
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ready")
	<-ctx.Done()
	_ = c.Stop(context.Background())
	return 0
}

// childElector campaigns for "leader:test" and prints "leading <fence>" and
// "stopped" as its callbacks are called, "leader <holder>" for another's.
func childElector(ctx context.Context, pool *pgxpool.Pool) int {
	c, err := leasehold.NewClient(pool, leasehold.Config{ID: os.Getenv(childID)})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	e, err := c.NewElector(leasehold.ElectorConfig{
		Resource: "leader:test", Keep: lease.KeepConfig{TTL: 2 * time.Second},
		Callbacks: leasehold.Callbacks{
			OnStartedLeading: func(ctx context.Context, l lease.Lease) { fmt.Printf("leading %d\n", l.Fence) },
			OnStoppedLeading: func() { fmt.Println("stopped") },
			OnNewLeader:      func(holder string) { fmt.Println("leader", holder) },
		},
	})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ready")
	_ = e.Run(ctx)
	return 0
}

// child is a running child process and the lines it printed.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

// startChild starts this test binary as a child of role on the database,
// named id, and returns once it said it is ready.
func startChild(t *testing.T, role, dbURL, id string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRole+"="+role, childDB+"="+dbURL, childID+"="+id)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 64)}
	go func() {
		defer close(c.lines)
		r := bufio.NewScanner(out)
		for r.Scan() {
			c.lines <- r.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c.expect(t, "ready")
	return c
}

// expect waits for the child's next line that starts with prefix and
// returns it; a line saying "error" fails the test.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	timer := time.NewTimer(giveUp)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("the child exited before printing %q", prefix)
			}
			if strings.HasPrefix(line, "error") {
				t.Fatalf("the child: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timer.C:
			t.Fatalf("the child did not print %q within %s", prefix, giveUp)
		}
	}
}

// kill kills the child with SIGKILL and waits for it.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}
