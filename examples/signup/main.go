// Command signup is a small web app on leasehold, run as one of several
// replicas on one PostgreSQL database:
//
//   - POST /signup {"email": "..."} inserts the user and a welcome_email
//     task in one transaction: no user without a welcome, no welcome for a
//     signup that failed;
//   - every replica's workers send the welcome emails (here: a row in
//     sent_emails, written under the task's fence), each exactly once;
//   - the "nightly" job (here every -nightly-every) runs on the elected
//     replica only, and writes its run under the leadership's fence.
//
// Run two or three of them against one database:
//
//	DATABASE_URL=postgres://... go run . -addr :8081 -id a
//	DATABASE_URL=postgres://... go run . -addr :8082 -id b
//	curl --json '{"email": "ada@example.com"}' localhost:8081/signup
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/lease"
)

// WelcomeEmail is the task a signup inserts.
type WelcomeEmail struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// Kind names the task's kind.
func (WelcomeEmail) Kind() string { return "welcome_email" }

const schema = `
CREATE TABLE IF NOT EXISTS users (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email      text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS sent_emails (
    user_id bigint NOT NULL REFERENCES users (id),
    task_id bigint NOT NULL,
    fence   bigint NOT NULL,
    sent_by text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, task_id)
);
CREATE TABLE IF NOT EXISTS nightly_runs (
    fence  bigint NOT NULL,
    run_by text NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now()
);`

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "signup:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout *os.File) error {
	fs := flag.NewFlagSet("signup", flag.ContinueOnError)
	addr := fs.String("addr", ":8081", "listen address")
	id := fs.String("id", "", "this replica's name (default: host and pid)")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL (env DATABASE_URL)")
	every := fs.Duration("nightly-every", 24*time.Hour, "how often the elected replica runs the nightly job")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("no database: set DATABASE_URL or -database-url")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// leasehold's tables, then the app's: safe from every replica at once.
	if _, err := leasehold.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, schema); err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}

	workers, err := newWorkers(pool)
	if err != nil {
		return err
	}
	client, err := leasehold.NewClient(pool, leasehold.Config{ID: *id, Workers: workers, Logger: log})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()

	nightly, err := client.NewElector(leasehold.ElectorConfig{
		Resource: "signup:nightly",
		Keep:     lease.KeepConfig{TTL: 5 * time.Second},
		Callbacks: leasehold.Callbacks{
			OnStartedLeading: func(ctx context.Context, l lease.Lease) {
				fmt.Fprintf(stdout, "leading the nightly job under fence %d\n", l.Fence)
				runNightly(ctx, pool, client.ID(), l.Fence, *every)
			},
			OnStoppedLeading: func() { fmt.Fprintln(stdout, "stopped leading the nightly job") },
		},
	})
	if err != nil {
		return err
	}
	electing := make(chan error, 1)
	go func() { electing <- nightly.Run(ctx) }()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: routes(pool, client), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "listening on %s as %s\n", ln.Addr(), client.ID())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-electing
}

// sendWelcome is the worker of WelcomeEmail: the task's fence goes with
// what it writes, and ON CONFLICT keeps a retried attempt from sending
// twice.
func sendWelcome(pool *pgxpool.Pool) leasehold.Worker[WelcomeEmail] {
	return leasehold.WorkFunc(func(ctx context.Context, t *leasehold.Task[WelcomeEmail]) error {
		_, err := pool.Exec(ctx, `INSERT INTO sent_emails (user_id, task_id, fence, sent_by) VALUES ($1, $2, $3, $4)
			ON CONFLICT DO NOTHING`, t.Args.UserID, t.ID, t.Fence, t.Processor)
		return err
	})
}

// newWorkers are the app's workers.
func newWorkers(pool *pgxpool.Pool) (*leasehold.Workers, error) {
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, sendWelcome(pool), leasehold.KindConfig{MaxAttempts: 10, Timeout: 30 * time.Second}); err != nil {
		return nil, err
	}
	return workers, nil
}

// errTaken: the email has signed up already.
var errTaken = errors.New("that email has signed up already")

// signup inserts the user and, in the same transaction, the welcome: the
// welcome exists if and only if the user does.
func signup(ctx context.Context, tx pgx.Tx, client *leasehold.Client, email string) (int64, error) {
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO users (email) VALUES ($1) ON CONFLICT (email) DO NOTHING RETURNING id`, email).Scan(&id); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, errTaken
		}
		return 0, err
	}
	if _, err := client.InsertTx(ctx, tx, WelcomeEmail{UserID: id, Email: email}, nil); err != nil {
		return 0, err
	}
	return id, nil
}

// routes serves POST /signup.
func routes(pool *pgxpool.Pool, client *leasehold.Client) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /signup", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Email string `json:"email"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !strings.Contains(req.Email, "@") {
			http.Error(w, `{"error": "send {\"email\": \"...\"}"}`, http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
		id, err := signup(ctx, tx, client, req.Email)
		switch {
		case errors.Is(err, errTaken):
			http.Error(w, `{"error": "that email has signed up already"}`, http.StatusConflict)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"user_id": id})
	})
	return mux
}

// runNightly runs the nightly job every interval while ctx lasts (the
// leadership): each run is written under the leadership's fence.
func runNightly(ctx context.Context, pool *pgxpool.Pool, by string, fence int64, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		if _, err := pool.Exec(ctx, `INSERT INTO nightly_runs (fence, run_by) VALUES ($1, $2)`, fence, by); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "nightly:", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
