package schema_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

var update = flag.Bool("update", false, "rewrite schema/live/schema.sql from the migrations")

// liveFile is the schema as the migrations leave it, for readers: tables,
// indexes, constraints, sequences, functions and triggers in one place.
const liveFile = "live/schema.sql"

// TestLiveSchema keeps schema/live/schema.sql in step with the migrations:
// it migrates an empty database and describes what it holds from the
// catalogue, and the file must say exactly that. After a new migration,
// regenerate it with
//
//	go test ./schema -run TestLiveSchema -update
func TestLiveSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	got := describe(t, db.Pool)
	if *update {
		if err := os.WriteFile(liveFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(liveFile)
	if err != nil {
		t.Fatalf("%v; generate it: go test ./schema -run TestLiveSchema -update", err)
	}
	if string(want) != got {
		wl, gl := strings.Split(string(want), "\n"), strings.Split(got, "\n")
		for i := range max(len(wl), len(gl)) {
			var w, g string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(gl) {
				g = gl[i]
			}
			if w != g {
				t.Fatalf("schema/%s is not the schema the migrations make (first difference at line %d:\n  file: %q\n  live: %q);\n"+
					"regenerate it: go test ./schema -run TestLiveSchema -update", liveFile, i+1, w, g)
			}
		}
	}
}

// describe writes what the public schema holds, each kind of object in a
// section, in name order, as PostgreSQL itself prints its definitions.
func describe(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	b.WriteString("-- The schema as the migrations in schema/ leave it: generated, do not edit.\n" +
		"-- Regenerate after a migration: go test ./schema -run TestLiveSchema -update\n")
	section := func(title, query string) {
		rows, err := pool.Query(ctx, query)
		if err != nil {
			t.Fatalf("%s: %v", title, err)
		}
		defer rows.Close()
		fmt.Fprintf(&b, "\n-- %s\n", title)
		for rows.Next() {
			var def string
			if err := rows.Scan(&def); err != nil {
				t.Fatal(err)
			}
			b.WriteString("\n" + strings.TrimRight(def, " \n") + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	section("Tables", `
		SELECT 'CREATE TABLE ' || c.relname || ' (' || E'\n' ||
		       string_agg('    ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
		                  CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END ||
		                  coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), ''),
		                  ',' || E'\n' ORDER BY a.attnum) || E'\n);'
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
		WHERE c.relkind IN ('r', 'p')
		GROUP BY c.relname ORDER BY c.relname`)
	section("Constraints", `
		SELECT 'ALTER TABLE ' || c.conrelid::regclass::text || ' ADD CONSTRAINT ' || c.conname || ' ' || pg_get_constraintdef(c.oid) || ';'
		FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace AND n.nspname = 'public'
		WHERE c.contype IN ('p', 'u', 'f', 'c', 'x')
		ORDER BY c.conrelid::regclass::text, c.conname`)
	section("Indexes (besides those of the constraints above)", `
		SELECT pg_get_indexdef(i.indexrelid) || ';'
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		WHERE NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid)
		ORDER BY i.indrelid::regclass::text, c.relname`)
	section("Sequences", `
		SELECT 'CREATE SEQUENCE ' || c.relname || ';'
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		WHERE c.relkind = 'S' ORDER BY c.relname`)
	section("Functions", `
		SELECT pg_get_functiondef(p.oid)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'public'
		ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)`)
	section("Triggers", `
		SELECT pg_get_triggerdef(t.oid) || ';'
		FROM pg_trigger t
		JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		WHERE NOT t.tgisinternal
		ORDER BY c.relname, t.tgname`)
	return b.String()
}
