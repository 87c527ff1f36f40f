package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	dbq "github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/retention"
	"github.com/leasehold/leasehold/internal/scheduler"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/schema"
)

// grantsFile is the least-privilege grants, which docs/operations/security.md shows.
const grantsFile = "../../docs/operations/least-privilege.sql"

// newRuntimeRole creates a login role, applies grantsFile to it on db as
// the tables' owner (as psql would, its :"role" and :"DBNAME" filled in)
// and returns a database of that role: same name, its own pool.
func newRuntimeRole(t *testing.T, db pgtest.DB) pgtest.DB {
	t.Helper()
	ctx := t.Context()
	grants, err := os.ReadFile(grantsFile)
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	role, password := "leasehold_app_"+hex.EncodeToString(b[:4]), hex.EncodeToString(b[4:])
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+ident+` LOGIN PASSWORD '`+password+`'`); err != nil {
		t.Fatalf("create role: %v", err)
	}
	t.Cleanup(func() {
		// A role goes only once nothing is granted to it; DROP OWNED
		// revokes this database's grants (the database itself goes next).
		ctx := context.Background()
		if _, err := db.Pool.Exec(ctx, `DROP OWNED BY `+ident); err != nil {
			t.Errorf("drop owned by %s: %v", role, err)
		}
		if _, err := db.Pool.Exec(ctx, `DROP ROLE `+ident); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	sql := strings.NewReplacer(`:"role"`, ident, `:"DBNAME"`, pgx.Identifier{db.Name}.Sanitize()).Replace(string(grants))
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Conn().PgConn().Exec(ctx, sql).ReadAll()
	conn.Release()
	if err != nil {
		t.Fatalf("%s: %v", grantsFile, err)
	}

	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pgtest.DB{Name: db.Name, URL: u.String(), Pool: pool}
}

func TestSecurityDocShowsTheGrants(t *testing.T) {
	t.Parallel()
	grants, err := os.ReadFile(grantsFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/operations/security.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, grants) {
		t.Errorf("docs/operations/security.md does not show %s as it is; paste the file into its sql block", grantsFile)
	}
}

// TestLeastPrivilegeRole runs every part of leasehold that talks to the
// database as a role with exactly the grants of docs/operations/least-privilege.sql:
// the API (leases, tasks, generator, instances, readiness), instance
// registration, the reaper's marking, the generator's fenced insert, the
// workers' task operations, retention's pruning and LISTEN. Then it checks
// what the role must not be able to do.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.New(t)
	app := newRuntimeRole(t, db)
	owner := bundle{db: db} // test setup that stands in for waiting

	var user string
	var super bool
	if err := app.Pool.QueryRow(ctx, `SELECT current_user, usesuper FROM pg_user WHERE usename = current_user`).Scan(&user, &super); err != nil || super || !strings.HasPrefix(user, "leasehold_app_") {
		t.Fatalf("connected as %q (superuser %v, %v), want the runtime role", user, super, err)
	}

	// LISTEN, before anything changes.
	listen, err := pgx.Connect(ctx, app.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(context.Background())
	if _, err := listen.Exec(ctx, `LISTEN leasehold_lease`); err != nil {
		t.Fatalf("LISTEN: %v", err)
	}

	// The API, on the role's pool.
	srv := httptest.NewServer(server.NewServer(testDeps(app)))
	t.Cleanup(srv.Close)
	b := bundle{db: app, srv: srv}

	b.do(t, "GET", "/readyz", "").want(t, "readyz", http.StatusOK)
	if v, err := schema.Applied(ctx, app.Pool); err != nil {
		t.Errorf("applied migrations (readyz): %v", err)
	} else if latest, _ := schema.Latest(); v != latest {
		t.Errorf("applied migrations: %d, want %d", v, latest)
	}
	// serve migrates at start: with nothing pending, the role may.
	if applied, err := schema.Migrate(ctx, app.Pool); err != nil || len(applied) != 0 {
		t.Errorf("Migrate as the runtime role with nothing pending: applied %v, %v", applied, err)
	}

	l := b.acquire(t, "report:nightly", "replica-a", 30)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	n, err := listen.WaitForNotification(waitCtx)
	cancel()
	if err != nil || !strings.Contains(n.Payload, "report:nightly") {
		t.Fatalf("notification after an acquire: %v, %v", n, err)
	}
	b.renew(t, "report:nightly", "replica-a")
	b.do(t, "GET", fmt.Sprintf("/api/leases/%d", l.ID), "").want(t, "get lease", http.StatusOK)
	for _, path := range []string{"/api/leases", "/api/leases/active", "/api/leases/renewed", "/api/leases/events?resource=report:nightly"} {
		b.do(t, "GET", path, "").want(t, path, http.StatusOK)
	}
	b.release(t, "report:nightly", "replica-a")

	tk := b.createTask(t, `{"task_data":{"sleep_duration_seconds":0}}`)
	b.do(t, "POST", "/api/tasks", `[{"task_data":{"n":1}},{"task_data":{"n":2},"max_attempts":1}]`).want(t, "batch insert", http.StatusCreated)
	claimed := b.claimTask(t, "replica-a/w1")
	if claimed.ID != tk.ID {
		t.Fatalf("claimed task %d, want %d", claimed.ID, tk.ID)
	}
	b.taskOp(t, claimed.ID, "heartbeat", obj{"processor": "replica-a/w1"}).want(t, "heartbeat", http.StatusAccepted)
	b.taskOp(t, claimed.ID, "complete", obj{"processor": "replica-a/w1", "task_output": obj{"ok": true}}).want(t, "complete", http.StatusAccepted)
	failing := b.claimTask(t, "replica-a/w2")
	b.taskOp(t, failing.ID, "fail", obj{"processor": "replica-a/w2", "error": "boom"}).want(t, "fail", http.StatusAccepted)
	for _, path := range []string{"/api/tasks", "/api/tasks/processed", "/api/tasks/started", "/api/tasks/stats", fmt.Sprintf("/api/tasks/%d", tk.ID)} {
		b.do(t, "GET", path, "").want(t, path, http.StatusOK)
	}
	b.generator(t, "POST", "/api/generator/start", http.StatusAccepted)
	b.generator(t, "GET", "/api/generator", http.StatusOK)

	// Schedules: added, read, replaced, a tick enqueued under the
	// scheduler lease, removed.
	b.do(t, "POST", "/api/schedules", `{"name":"nightly","cron":"@every 1s","kind":"report"}`).want(t, "add a schedule", http.StatusCreated)
	b.do(t, "PUT", "/api/schedules/nightly", `{"cron":"@every 1s","kind":"report","lock":"report:nightly"}`).want(t, "replace a schedule", http.StatusOK)
	for _, path := range []string{"/api/schedules", "/api/schedules/nightly"} {
		b.do(t, "GET", path, "").want(t, path, http.StatusOK)
	}
	sched, err := leasestore.NewStore(app.Pool).Acquire(ctx, lease.AcquireParams{Resource: scheduler.Resource, Holder: "replica-a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var (
		schedID int64
		nextAt  time.Time
	)
	if err := app.Pool.QueryRow(ctx, `SELECT id, next_tick_at FROM schedules WHERE name = 'nightly'`).Scan(&schedID, &nextAt); err != nil {
		t.Fatal(err)
	}
	if made, err := dbq.New(app.Pool).ScheduleEnqueue(ctx, dbq.ScheduleEnqueueParams{
		Holder: "replica-a", Fence: sched.Lease.Fence, ID: schedID, ExpectTick: nextAt, Tick: nextAt, NextTick: nextAt.Add(time.Second),
	}); err != nil || made.TaskID == 0 {
		t.Errorf("enqueue a tick as the runtime role: %+v, %v", made, err)
	}
	// The tick's task is gated: its claim takes the lock's lease.
	owner.sqlExec(t, `UPDATE tasks SET scheduled_at = now() WHERE schedule = 'nightly'`) // its tick came
	gated, err := taskstore.NewStore(app.Pool).Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-a/w9"}, Kinds: []string{"report"}, TTL: 30 * time.Second})
	if err != nil || len(gated) != 1 || gated[0].Lock != "report:nightly" {
		t.Errorf("claim a gated task as the runtime role: %+v, %v", gated, err)
	}
	b.do(t, "DELETE", "/api/schedules/nightly", "").want(t, "remove a schedule", http.StatusOK)

	// The worker's path the API does not take: a lapsed lease claimed
	// again (the last attempt's task dies), and the hand-back at shutdown.
	tasks := taskstore.NewStore(app.Pool)
	last := b.claimTask(t, "replica-a/w3") // max_attempts 1
	owner.expireTaskLease(t, last.ID)
	if _, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-b/w1"}, TTL: 30 * time.Second, WithLapsed: true}); err != nil {
		t.Errorf("claim after a lapse: %v", err)
	}
	if got, err := tasks.Get(ctx, last.ID); err != nil || got.State != "dead" {
		t.Errorf("task %d after its last attempt lapsed: %+v, %v; want dead", last.ID, got, err)
	}
	owner.sqlExec(t, `UPDATE tasks SET scheduled_at = now() WHERE id = $1`, failing.ID) // its backoff passed
	again, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-b/w2"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(again) != 1 {
		t.Fatalf("claim a retry: %v, %v", again, err)
	}
	if _, err := tasks.Requeue(ctx, again[0].ID, "replica-b/w2", again[0].Fence, "shutting down"); err != nil {
		t.Errorf("requeue at shutdown: %v", err)
	}

	// Instance registration, and its lease.
	leases := leasestore.NewStore(app.Pool)
	if err := instance.NewStore(app.Pool).Register(ctx, instance.Instance{ID: "replica-a", Addr: "127.0.0.1:8080", Roles: []string{"api"}, Version: "test"}); err != nil {
		t.Errorf("register instance: %v", err)
	}
	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: instance.LeaseResource("replica-a"), Holder: "replica-a", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if live := b.do(t, "GET", "/api/instances", "").want(t, "instances", http.StatusOK); !strings.Contains(string(live.body), "replica-a") {
		t.Errorf("instances: %s, want replica-a", live.body)
	}

	// Waiting for inserted tasks (schema/0008): the role registers its
	// LISTEN session as a waiter, passes the barrier and prunes through
	// the functions granted to it; an insert then notifies (the trigger
	// reads task_waiters as the role); it unregisters.
	var listenPID int32
	if err := listen.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&listenPID); err != nil {
		t.Fatal(err)
	}
	if _, err := listen.Exec(ctx, `LISTEN leasehold_task`); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		sql  string
		args []any
	}{
		{`SELECT task_waiter_register('replica-a/workers', $1, false)`, []any{listenPID}},
		{`SELECT task_waiters_barrier(1000)`, nil},
		{`SELECT task_waiters_prune()`, nil},
	} {
		if _, err := app.Pool.Exec(ctx, w.sql, w.args...); err != nil {
			t.Errorf("%s as the runtime role: %v", w.sql, err)
		}
	}
	b.createTask(t, `{"task_data":{"sleep_duration_seconds":0}}`)
	insertCtx, cancelInsert := context.WithTimeout(ctx, 30*time.Second)
	for {
		n, err := listen.WaitForNotification(insertCtx)
		if err != nil {
			cancelInsert()
			t.Fatalf("waiting for the insert's notification while a waiter is registered: %v", err)
		}
		if n.Channel == "leasehold_task" && n.Payload == "inserted" {
			break
		}
	}
	cancelInsert()
	if _, err := app.Pool.Exec(ctx, `SELECT task_waiter_unregister('replica-a/workers', $1)`, listenPID); err != nil {
		t.Errorf("unregister a waiter as the runtime role: %v", err)
	}
	var waiting int
	if err := app.Pool.QueryRow(ctx, `SELECT count(*) FROM task_waiters`).Scan(&waiting); err != nil || waiting != 0 {
		t.Errorf("waiters after unregistering: %d, %v; want 0", waiting, err)
	}

	// The reaper marks an expired lease.
	b.acquire(t, "doomed", "replica-a", 30)
	owner.expire(t, "doomed")
	if _, _, err := leases.NextExpiry(ctx); err != nil {
		t.Errorf("next expiry: %v", err)
	}
	marked, err := leases.MarkExpired(ctx, 100)
	if err != nil || len(marked) == 0 {
		t.Errorf("mark expired: %v, %v", marked, err)
	}
	// ... and puts a task whose lease lapsed back to pending.
	lapsing, err := tasks.Claim(ctx, taskstore.ClaimParams{Processors: []string{"replica-b/w3"}, TTL: 30 * time.Second, WithLapsed: true})
	if err != nil || len(lapsing) != 1 {
		t.Fatalf("claim: %v, %v", lapsing, err)
	}
	owner.expireTaskLease(t, lapsing[0].ID)
	if _, err := tasks.NextLapse(ctx); err != nil {
		t.Errorf("next task lease lapse: %v", err)
	}
	if requeued, err := tasks.RequeueLapsed(ctx, 100); err != nil || len(requeued) != 1 || requeued[0].Task.State != task.StatePending {
		t.Errorf("requeue lapsed tasks: %+v, %v; want task %d back to pending", requeued, err, lapsing[0].ID)
	}

	// The generator's fenced insert, under its lease and with the switch on.
	gen, err := leases.Acquire(ctx, lease.AcquireParams{Resource: demo.Resource, Holder: "replica-a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := demo.NewState(app.Pool).Set(ctx, true, "replica-a"); err != nil {
		t.Errorf("generator switch: %v", err)
	}
	if got, err := tasks.InsertGenerated(ctx, "replica-a", gen.Lease.Fence, []json.RawMessage{json.RawMessage(`{"sleep_duration_seconds":1}`)}); err != nil || len(got) != 1 {
		t.Errorf("generator insert: %v, %v", got, err)
	}
	b.generator(t, "POST", "/api/generator/stop", http.StatusAccepted)

	// A database upgraded from before schema/0009 still has lease rows
	// task:<id>, which go with their tasks: one of a done task, one of a
	// task still pending.
	for _, id := range []int64{tk.ID, again[0].ID} {
		if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: taskstore.LeaseResource(id), Holder: "replica-a/w1", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Release(ctx, lease.ReleaseParams{Resource: taskstore.LeaseResource(id), Holder: "replica-a/w1"}); err != nil {
			t.Fatal(err)
		}
	}

	// Retention, through the functions granted to the role: old finished
	// tasks with their lease rows, lease events and ended leases go, and
	// nothing else (the owner ages the rows, standing in for a week
	// passing).
	for _, sql := range []string{
		`UPDATE tasks SET created_at = now() - interval '9 days'`,
		`UPDATE tasks SET processed_at = now() - interval '8 days' WHERE state IN ('done', 'dead')`,
		`UPDATE leases SET released_at = now() - interval '8 days', expires_at = now() - interval '8 days' WHERE resource LIKE 'task:%'`,
		// The lease first: its release is an event of now (the history is
		// written when things happen), which the next statement ages too.
		`UPDATE leases SET released_at = now() - interval '8 days', expires_at = now() - interval '8 days' WHERE resource = 'report:nightly'`,
		`UPDATE lease_events SET at = now() - interval '8 days' WHERE resource = 'report:nightly'`,
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	pruner := retention.NewStore(app.Pool)
	// walk calls a walking prune function from the first row to the end.
	walk := func(prune func(after int64) (retention.Step, error)) (int64, error) {
		var n, after int64
		for {
			s, err := prune(after)
			n += s.Pruned
			if err != nil || s.Done {
				return n, err
			}
			after = s.LastID
		}
	}
	for _, p := range []struct {
		what  string
		prune func() (int64, error)
		left  string
	}{
		{"tasks", func() (int64, error) {
			return walk(func(after int64) (retention.Step, error) {
				return pruner.PruneTasks(ctx, retention.DefaultAge, 100, after)
			})
		}, `SELECT count(*) FROM tasks WHERE state IN ('done', 'dead')`},
		{"lease events", func() (int64, error) {
			return walk(func(after int64) (retention.Step, error) {
				return pruner.PruneLeaseEvents(ctx, retention.DefaultAge, 100, after)
			})
		}, `SELECT count(*) FROM lease_events WHERE resource = 'report:nightly'`},
		{"leases", func() (int64, error) { return pruner.PruneLeases(ctx, retention.DefaultAge, 100) },
			`SELECT count(*) FROM leases WHERE resource = 'report:nightly'`},
	} {
		n, err := p.prune()
		var left int
		if qerr := db.Pool.QueryRow(ctx, p.left).Scan(&left); qerr != nil {
			t.Fatal(qerr)
		}
		if err != nil || n == 0 || left != 0 {
			t.Errorf("prune %s as the runtime role: %d pruned, %d old left, %v; want all of them pruned", p.what, n, left, err)
		}
	}
	var taskLeases []string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(resource ORDER BY resource), '{}') FROM leases WHERE resource LIKE 'task:%'`).Scan(&taskLeases); err != nil {
		t.Fatal(err)
	}
	if want := []string{taskstore.LeaseResource(again[0].ID)}; !slices.Equal(taskLeases, want) {
		t.Errorf("task lease rows after pruning: %q, want %q: the pending task's kept, the done task's gone with it", taskLeases, want)
	}
	if live, err := tasks.Get(ctx, again[0].ID); err != nil || live.State != "pending" {
		t.Errorf("the requeued task after pruning: %+v, %v; want it kept, pending", live, err)
	}

	// What the role must not do. Every statement is its own transaction.
	for _, sql := range []string{
		`DROP TABLE leases`,
		`ALTER TABLE leases ADD COLUMN note text`,
		`CREATE TABLE notes (note text)`,
		`CREATE TEMPORARY TABLE notes (note text)`,
		`CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`DELETE FROM leases`,
		`DELETE FROM lease_events`,
		`UPDATE lease_events SET holder = 'someone else'`,
		`TRUNCATE tasks`,
		`DELETE FROM tasks WHERE state = 'done'`,
		`CREATE OR REPLACE FUNCTION prune_tasks(age interval, batch integer, after_id bigint, ids bigint[],
			OUT pruned_tasks bigint, OUT pruned_leases bigint, OUT last_id bigint, OUT done boolean, OUT kept bigint[])
			LANGUAGE sql AS 'DELETE FROM tasks RETURNING 1::bigint, 0::bigint, 0::bigint, true, NULL::bigint[]'`,
		`ALTER FUNCTION prune_leases(interval, integer) RESET search_path`,
		`INSERT INTO leasehold_migrations (version, name) VALUES (9999, 'evil')`,
		`CREATE SCHEMA evil`,
		`CREATE ROLE evil`,
	} {
		wantRefused(t, app, sql)
	}

	// The retention functions run as their owner with a pinned search_path,
	// and only the runtime role (not PUBLIC) may execute them.
	wantOwnerFunctions(t, db, user, "retention", "prune_tasks", "prune_lease_events", "prune_leases")

	// task_waiters is changed only through its functions, which run as
	// their owner with a pinned search_path; only the role (not PUBLIC)
	// may execute them.
	for _, sql := range []string{
		`INSERT INTO task_waiters (pid, waiter) VALUES (1, 'evil')`,
		`UPDATE task_waiters SET waiter = 'evil'`,
		`DELETE FROM task_waiters`,
	} {
		wantRefused(t, app, sql)
	}
	wantOwnerFunctions(t, db, user, "waiter", "task_waiter_register", "task_waiter_unregister", "task_waiters_prune")
	wantOwnerFunctions(t, db, user, "schedule", "schedule_remove")
	wantOwnerFunctions(t, db, user, "fence epoch", "fence_epoch_check")
	wantRefused(t, app, `DELETE FROM schedules`)

	// Every table is readable by the role (a new migration's table must be
	// added to the grants), and none can be emptied.
	rows, err := db.Pool.Query(ctx, `
		SELECT c.relname, has_table_privilege($1, c.oid, 'SELECT'),
		       has_table_privilege($1, c.oid, 'DELETE') OR has_table_privilege($1, c.oid, 'TRUNCATE')
		FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind = 'r'`, user)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var (
			name              string
			canRead, canEmpty bool
		)
		err := r.Scan(&name, &canRead, &canEmpty)
		if !canRead {
			t.Errorf("table %s: the runtime role cannot read it; grant it in %s", name, grantsFile)
		}
		if canEmpty {
			t.Errorf("table %s: the runtime role may DELETE or TRUNCATE", name)
		}
		return name, err
	})
	if err != nil || len(tables) < 6 {
		t.Errorf("tables %v, %v; want leasehold's six", tables, err)
	}
}

// wantRefused runs sql as the runtime role (app's pool), which must be
// refused for lack of privilege.
func wantRefused(t *testing.T, app pgtest.DB, sql string) {
	t.Helper()
	_, err := app.Pool.Exec(t.Context(), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s as the runtime role: %v, want insufficient_privilege (42501)", sql, err)
	}
}

// wantOwnerFunctions checks, as the owner (db), that every function named
// exists, runs as its owner (SECURITY DEFINER) with a pinned search_path,
// and may be executed by role but not by PUBLIC.
func wantOwnerFunctions(t *testing.T, db pgtest.DB, role, what string, names ...string) {
	t.Helper()
	var fns, secure, granted, public int
	if err := db.Pool.QueryRow(t.Context(), `
		SELECT count(*),
		       count(*) FILTER (WHERE p.prosecdef AND EXISTS (SELECT 1 FROM unnest(p.proconfig) AS c WHERE c LIKE 'search_path=%')),
		       count(*) FILTER (WHERE has_function_privilege($1, p.oid, 'EXECUTE')),
		       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
		                                      WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
		FROM pg_proc AS p
		WHERE p.proname = ANY($2)`, role, names).Scan(&fns, &secure, &granted, &public); err != nil {
		t.Fatal(err)
	}
	n := len(names)
	if fns != n || secure != n || granted != n || public != 0 {
		t.Errorf("%s functions: %d, %d SECURITY DEFINER with search_path, %d executable by the role, %d by PUBLIC; want %d, %d, %d, 0",
			what, fns, secure, granted, public, n, n, n)
	}
}

// TestRuntimeRoleCannotForge: the least-privilege role, which runs every
// replica, cannot write the lease history itself, date a change in the
// past, set a fence back or beyond the sequence, prune younger than the
// floor the owner set, and a role of the cluster without a grant cannot
// connect at all (so it can neither LISTEN to the lease channel nor
// pg_notify a cancellation). Each was possible before the guards.
func TestRuntimeRoleCannotForge(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	app := newRuntimeRole(t, db)
	ctx := t.Context()
	leases := leasestore.NewStore(app.Pool)
	if _, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "first", Holder: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	acq, err := leases.Acquire(ctx, lease.AcquireParams{Resource: "report:nightly", Holder: "a", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what, sql string, args ...any) {
		t.Helper()
		if _, err := app.Pool.Exec(ctx, sql, args...); err == nil {
			t.Errorf("%s: the runtime role was let do it (%s)", what, sql)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
	refused("a backdated event of its own",
		`INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
		 VALUES (now() - interval '30 days', $1, 'report:nightly', 'mallory', 1, 'acquired', now())`, acq.Lease.ID)
	refused("a fence set back", `UPDATE leases SET fence = fence - 1 WHERE id = $1`, acq.Lease.ID)
	refused("a fence taken away", `UPDATE leases SET fence = NULL WHERE id = $1`, acq.Lease.ID)
	refused("a fence beyond the sequence", `UPDATE leases SET fence = fence + 1000000 WHERE id = $1`, acq.Lease.ID)
	refused("a lease inserted with a fence the sequence never gave",
		`INSERT INTO leases (resource, holder, fence, ttl_seconds, expires_at) VALUES ('forged', 'mallory', 999999999, 30, now() + interval '30 seconds')`)
	refused("the floor of retention changed", `UPDATE retention_floor SET min_age = interval '1 minute'`)
	refused("history pruned below the floor", `SELECT * FROM prune_lease_events(interval '1 minute', 100, 0)`)

	// A release dated in the past is recorded when it happened.
	if _, err := app.Pool.Exec(ctx, `UPDATE leases SET released_at = now() - interval '30 days', expires_at = now() - interval '30 days' WHERE id = $1`, acq.Lease.ID); err != nil {
		t.Fatal(err)
	}
	var late bool
	if err := db.Pool.QueryRow(ctx, `SELECT at > now() - interval '1 hour' FROM lease_events WHERE lease_id = $1 AND kind = 'released'`, acq.Lease.ID).Scan(&late); err != nil || !late {
		t.Errorf("a release the runtime role dated 30 days back: recorded in the past (%v, %v); want at the time it was made", late, err)
	}

	// A role of the cluster that was granted nothing cannot connect.
	var b [4]byte
	_, _ = rand.Read(b[:])
	other := "leasehold_other_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{other}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+ident+` LOGIN PASSWORD 'other-password'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+ident) })
	u, _ := url.Parse(db.URL)
	u.User = url.UserPassword(other, "other-password")
	conn, err := pgx.Connect(ctx, u.String())
	if err == nil {
		conn.Close(ctx)
		t.Errorf("a role granted nothing connected to leasehold's database; want CONNECT revoked from PUBLIC")
	} else if !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a role granted nothing: %v; want permission denied for the database", err)
	}
}
