package localpg

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClusterCrashAndRestart: a named cluster comes up on its own port, loses its server to
// a crash, and comes back with its committed data.
func TestClusterCrashAndRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Open(ctx, "localpg-test", testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background(), true); err != nil {
			t.Error(err)
		}
	})
	if c.Port() == DefaultPort {
		t.Fatalf("named cluster took the development cluster's port %d", c.Port())
	}
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, c.URL())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("DROP TABLE IF EXISTS survivor; CREATE TABLE survivor (v int); INSERT INTO survivor VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	if err := c.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("the crashed server still answers")
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM survivor").Scan(&v); err != nil || v != 42 {
		t.Fatalf("after crash recovery: v=%d err=%v, want 42", v, err)
	}
}

func TestOpenRejectsBadName(t *testing.T) {
	if _, err := Open(context.Background(), "../x", nil); err == nil {
		t.Fatal("Open accepted a name with a path in it")
	}
}

// TestFreePortIsBelowTheEphemeralRange: the ports the servers of pairs and named clusters get
// are never those the kernel hands to the local ends of outgoing connections, which could
// take one before its server binds it.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	if lo-lowPortFloor < 1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", lo)
	}
	for range 20 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < lowPortFloor || port >= lo {
			t.Fatalf("port %d, want one from %d to %d, below the ephemeral range", port, lowPortFloor, lo-1)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		_ = ln.Close()
	}
}
