package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/leaseholdtest"
)

// freshDatabase is a database of the test's own on DATABASE_URL's server,
// migrated, with the app's tables, dropped at the end.
func freshDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		t.Fatal("these tests need a PostgreSQL: set DATABASE_URL (go run ./cmd/leasehold localdb prints one)")
	}
	admin, err := pgx.Connect(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "signup_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if conn, err := pgx.Connect(context.Background(), base); err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
			_ = conn.Close(context.Background())
		}
	})
	if _, err := leasehold.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestSignupInsertsTheWelcome: a signup's transaction holds the user and
// its welcome; rolled back, neither. No worker runs: leaseholdtest reads
// what the transaction inserted.
func TestSignupInsertsTheWelcome(t *testing.T) {
	pool := freshDatabase(t)
	workers, err := newWorkers(pool)
	if err != nil {
		t.Fatal(err)
	}
	client, err := leasehold.NewClient(pool, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // the test rolls back
	leaseholdtest.RequireNotInsertedTx[WelcomeEmail](t.Context(), t, tx, "")
	id, err := signup(t.Context(), tx, client, "ada@example.com")
	if err != nil {
		t.Fatal(err)
	}
	welcome := leaseholdtest.RequireInsertedTx[WelcomeEmail](t.Context(), t, tx, "")
	if welcome.Args.UserID != id || welcome.Args.Email != "ada@example.com" {
		t.Errorf("the welcome inserted: %+v; want one for user %d, ada@example.com", welcome.Args, id)
	}
}

// TestSendWelcome: the worker writes the email under the task's fence,
// once however often it runs: leaseholdtest runs its Work without a queue.
func TestSendWelcome(t *testing.T) {
	pool := freshDatabase(t)
	var id int64
	if err := pool.QueryRow(t.Context(), `INSERT INTO users (email) VALUES ('bo@example.com') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := leaseholdtest.Work(t.Context(), sendWelcome(pool), WelcomeEmail{UserID: id, Email: "bo@example.com"}, &leaseholdtest.WorkOpts{ID: 7, Fence: 42})
		if err != nil || res.Outcome != leaseholdtest.Completed {
			t.Fatalf("Work: %+v, %v; want it completed", res, err)
		}
	}
	var n int
	var fence int64
	if err := pool.QueryRow(t.Context(), `SELECT count(*), max(fence) FROM sent_emails WHERE user_id = $1`, id).Scan(&n, &fence); err != nil || n != 1 || fence != 42 {
		t.Errorf("sent emails: %d under fence %d (%v); want one, under the task's fence 42", n, fence, err)
	}
}

// TestSignupEndToEnd: POST /signup, then the replica's workers send the
// welcome; leaseholdtest.WaitIdle waits for them, no sleep.
func TestSignupEndToEnd(t *testing.T) {
	pool := freshDatabase(t)
	workers, err := newWorkers(pool)
	if err != nil {
		t.Fatal(err)
	}
	client, err := leasehold.NewClient(pool, leasehold.Config{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer client.Stop(context.Background()) //nolint:errcheck // the test's end
	srv := httptest.NewServer(routes(pool, client))
	defer srv.Close()
	res, err := http.Post(srv.URL+"/signup", "application/json", strings.NewReader(`{"email": "cy@example.com"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /signup: %s", res.Status)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := leaseholdtest.WaitIdle(ctx, client); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM sent_emails e JOIN users u ON u.id = e.user_id WHERE u.email = 'cy@example.com'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("welcomes sent to cy@example.com: %d (%v); want one", n, err)
	}
}
