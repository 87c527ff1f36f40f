package localpg

import (
	"context"
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
