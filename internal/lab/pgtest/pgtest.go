// Package pgtest gives tests a real PostgreSQL: a fresh database per test,
// created from a migrated template so that it takes milliseconds, and
// dropped when the test ends. The server is DATABASE_URL's or, when that is
// unset, the local development cluster, brought up on first use.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/schema"
)

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
)

// ServerURL returns the URL of the PostgreSQL server the tests use.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		serverURL = os.Getenv("DATABASE_URL")
		if serverURL == "" {
			serverURL, serverErr = localpg.Ensure(context.Background(), io.Discard)
		}
	})
	if serverErr != nil {
		t.Fatalf("pgtest: no PostgreSQL: %v", serverErr)
	}
	return serverURL
}

// withDatabase returns rawURL naming database name instead.
func withDatabase(t testing.TB, rawURL, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("pgtest: DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func admin(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ServerURL(t))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	return conn
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// template returns the name of a database holding the current migrations,
// made once per migration set and shared by every test process.
func template(t testing.TB) string {
	t.Helper()
	templateOnce.Do(func() {
		ms, err := schema.Migrations()
		if err != nil {
			templateErr = err
			return
		}
		h := sha256.New()
		for _, m := range ms {
			fmt.Fprintf(h, "%d\x00%s\x00", m.Version, m.Up)
		}
		templateName = "leasehold_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]
		templateErr = makeTemplate(t, templateName)
	})
	if templateErr != nil {
		t.Fatalf("pgtest: template database: %v", templateErr)
	}
	return templateName
}

func makeTemplate(t testing.TB, name string) error {
	ctx := context.Background()
	conn := admin(t)
	defer conn.Close(ctx)
	// Test processes run in parallel: one builds the template, the rest wait.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7366)`); err != nil {
		return err
	}
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock(7366)`) //nolint:errcheck // closing the session frees it too
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	building := name + "_building"
	if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{building}.Sanitize()+` WITH (FORCE)`); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{building}.Sanitize()); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, withDatabase(t, ServerURL(t), building))
	if err != nil {
		return err
	}
	_, err = schema.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return err
	}
	// Renamed only when complete, so a crash leaves no half-built template.
	_, err = conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{building}.Sanitize()+` RENAME TO `+pgx.Identifier{name}.Sanitize())
	return err
}

// DB is a fresh database for one test.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// New returns a fresh, migrated database, dropped when the test ends.
func New(t testing.TB) DB {
	t.Helper()
	return create(t, template(t))
}

// NewEmpty returns a fresh database with no migrations applied.
func NewEmpty(t testing.TB) DB {
	t.Helper()
	return create(t, "template0")
}

func create(t testing.TB, tmpl string) DB {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "leasehold_test_" + hex.EncodeToString(b[:])
	conn := admin(t)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` TEMPLATE `+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	dbURL := withDatabase(t, ServerURL(t), name)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	// The settings a replica's sessions run with.
	cfg.AfterConnect = schema.PrepareSession
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		conn := admin(t)
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return DB{Name: name, URL: dbURL, Pool: pool}
}

// Open is New for code that has no testing.TB: a TestMain, or the
// databases of runnable examples. The database is dropped by the function
// it returns.
func Open(ctx context.Context) (DB, func(), error) {
	r := &recorder{}
	var db DB
	func() {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); !ok || !errors.Is(err, errRecorded) {
					panic(v)
				}
			}
		}()
		db = create(r, template(r))
	}()
	if r.err != nil {
		return DB{}, func() {}, r.err
	}
	return db, r.cleanup, nil
}

// errRecorded is what recorder.Fatalf panics with, to stop the caller as
// testing.TB's Fatalf would.
var errRecorded = errors.New("pgtest: failed")

// recorder is a testing.TB outside a test: Fatalf records the error and
// stops the caller; cleanups run when cleanup is called.
type recorder struct {
	testing.TB // nil: only the methods below are called
	err        error
	cleanups   []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.err = fmt.Errorf(format, args...)
	panic(errRecorded)
}

func (r *recorder) Errorf(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *recorder) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}
