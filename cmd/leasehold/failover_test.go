package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/localpg"
	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/schema"
)

// TestReplicaFollowsPrimary: a replica on a synchronous primary and
// standby, its DATABASE_URL naming both hosts with
// target_session_attrs=read-write, holding a lease and running tasks. The
// primary is stopped hard and the standby promoted: the replica follows
// the new primary by itself (its pool and its LISTEN session reconnect to
// it, nothing is restarted), /readyz says what it waits for and is ready
// again, the lease acknowledged before the failover is still held (a
// synchronous standby lost nothing), new leases get greater fences, and
// a task inserted after the failover is run.
func TestReplicaFollowsPrimary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPair(t, true)

	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "follower", "--workers", "2",
		"--roles", "api,worker,reaper", "--rate-limit", "0"}, env("DATABASE_URL", pair.URL())))
	held := call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"report:nightly","holder":"a","ttl_seconds":600}`, http.StatusCreated)
	before := call[cliTask](t, r, "POST", "/api/tasks", `{"task_data":{"sleep_duration_seconds":0}}`, http.StatusCreated)
	waitUntil(t, "the first task to be done", func() bool { return taskState(t, r, before.ID) == "done" }, r.logs)

	if err := pair.Primary().Crash(ctx); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(died)

	// The first lease the new primary grants, as the API's clients see it.
	var granted time.Duration
	var fresh leaseBody
	waitUntil(t, "a lease granted after the failover", func() bool {
		status, body := r.request(t, "POST", "/api/leases", `{"resource":"after-failover","holder":"b","ttl_seconds":30}`, "")
		if status != http.StatusCreated {
			return false
		}
		granted = time.Since(died)
		return json.Unmarshal(body, &fresh) == nil
	}, r.logs)
	if fresh.Fence <= held.Fence {
		t.Errorf("the lease granted after the failover has fence %d, not above %d", fresh.Fence, held.Fence)
	}
	waitUntil(t, "the replica to be ready again", func() bool {
		status, _ := r.get(t, "/readyz", "")
		return status == http.StatusOK
	}, r.logs)
	ready := time.Since(died)

	// Nothing acknowledged was lost: the lease is still held, renewable
	// under its fence.
	renewed := call[leaseBody](t, r, "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"report:nightly","holder":"a","fence":%d}`, held.Fence), http.StatusOK)
	if renewed.Fence != held.Fence {
		t.Errorf("renewed fence %d, want %d", renewed.Fence, held.Fence)
	}
	// The workers were woken through the new LISTEN session.
	after := call[cliTask](t, r, "POST", "/api/tasks", `{"task_data":{"sleep_duration_seconds":0}}`, http.StatusCreated)
	waitUntil(t, "the task inserted after the failover to be done", func() bool { return taskState(t, r, after.ID) == "done" }, r.logs)
	t.Logf("primary stopped hard; standby promoted %v later; first lease granted by the new primary %v after the stop; replica ready %v after it",
		promoted.Round(time.Millisecond), granted.Round(time.Millisecond), ready.Round(time.Millisecond))

	// The old primary comes back as the new standby, and the replica goes on.
	if _, err := pair.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"after-rebuild","holder":"c","ttl_seconds":30}`, http.StatusCreated)
}

// TestFencesNeverRepeatAfterLostFailover: an asynchronous standby that
// did not receive the last 100 acquisitions is promoted when the primary
// is stopped hard. Those acquisitions, acknowledged to their clients, are
// lost, as asynchronous replication loses them; the new primary's
// sequence had not seen their fences. The first session on its timeline
// moves the fences past anything the old primary could have handed out
// (schema/0013), so no fence is handed out twice: the first lease granted
// after the failover has a fence above every lost one, and a stale holder
// of a lost lease is refused downstream by fence.
func TestFencesNeverRepeatAfterLostFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPair(t, false)
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "lossy", "--roles", "api", "--rate-limit", "0"},
		env("DATABASE_URL", pair.URL())))
	kept := call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"kept","holder":"a","ttl_seconds":600}`, http.StatusCreated)
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	const lost = 100
	var highest int64
	for i := range lost {
		l := call[leaseBody](t, r, "POST", "/api/leases", fmt.Sprintf(`{"resource":"lost-%d","holder":"a","ttl_seconds":600}`, i), http.StatusCreated)
		highest = max(highest, l.Fence)
	}
	if err := pair.Primary().Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var after leaseBody
	waitUntil(t, "a lease granted after the failover", func() bool {
		status, body := r.request(t, "POST", "/api/leases", `{"resource":"lost-0","holder":"b","ttl_seconds":30}`, "")
		return status == http.StatusCreated && json.Unmarshal(body, &after) == nil
	}, r.logs)
	if after.Fence <= highest {
		t.Errorf("the first fence after the failover is %d, not above the %d lost acquisitions' highest, %d: a fence was handed out twice", after.Fence, lost, highest)
	}
	// What asynchronous replication lost, as docs/operations/postgresql-and-failover.md says: the
	// acquisitions of the last moments; what it had received stays.
	list := call[struct {
		Leases []leaseBody `json:"leases"`
	}](t, r, "GET", "/api/leases?prefix=lost-", "", http.StatusOK)
	survived := 0
	for _, l := range list.Leases {
		if l.Holder == "a" {
			survived++
		}
	}
	if survived != 0 {
		t.Errorf("%d of the %d acquisitions made while the standby received nothing survived the failover", survived, lost)
	}
	call[leaseBody](t, r, "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"kept","holder":"a","fence":%d}`, kept.Fence), http.StatusOK)
	t.Logf("%d acknowledged acquisitions lost (fences %d–%d); the first fence granted after the failover: %d", lost, kept.Fence+1, highest, after.Fence)
}

// TestReadyOnAStandby: a replica whose pool (serve's, poolConfig) reaches
// a standby of its database (a URL not limited to the primary) is not
// ready, and says so: nothing can be written there.
func TestReadyOnAStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPair(t, false)
	if _, err := schema.Migrate(ctx, openPool(t, pair.Primary().URL())); err != nil {
		t.Fatal(err)
	}
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := poolConfig(pair.Standby().URL(), "leasehold test")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	latest, err := schema.Latest()
	if err != nil {
		t.Fatal(err)
	}
	r := &readiness{pool: pool, connected: func() bool { return true }, latest: latest, log: zerolog.Nop()}
	var nr *server.NotReady
	if err := r.check(ctx); !errors.As(err, &nr) || nr.Reason != reasonStandby {
		t.Errorf("readiness on a standby: %v; want %q", err, reasonStandby)
	}
}

// newPair builds a primary and standby for a test, closed at its end.
func newPair(t *testing.T, synchronous bool) *localpg.Pair {
	t.Helper()
	pair, err := localpg.NewPair(context.Background(), localpg.PairConfig{Synchronous: synchronous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pair.Close(context.Background()) })
	return pair
}

type cliTask struct {
	ID    int64  `json:"id"`
	State string `json:"state"`
}

func taskState(t *testing.T, r *replica, id int64) string {
	t.Helper()
	status, body := r.get(t, fmt.Sprintf("/api/tasks/%d", id), "")
	if status != http.StatusOK {
		return ""
	}
	var tk cliTask
	if err := json.Unmarshal(body, &tk); err != nil {
		return ""
	}
	return tk.State
}

// TestFencesBehindATransactionPooler: a replica whose pool goes through
// PgBouncer in transaction mode (its listen URL straight to the pair), an
// asynchronous failover that loses acquisitions, and the pooler pointed at
// the new primary, as a failover tool moves a virtual IP. The replica's
// connections to the pooler may outlive the failover, and then the check
// leasehold runs on each new connection of its pool (fence_epoch_check)
// would not run on the new primary's sessions: PgBouncer's connect_query
// runs it on every server connection the pooler opens, before any client
// uses it, and no fence is handed out twice. PgBouncer's server_login_retry
// (15 s by default) is how long the database stays unreachable through it
// after the failed connection to the dead primary: 1 s here
// (docs/operations/postgresql-and-failover.md).
func TestFencesBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPair(t, false)
	pooler, err := pair.NewPooler(ctx, localpg.PoolerConfig{ConnectQuery: "SELECT fence_epoch_check()", LoginRetry: time.Second})
	if errors.Is(err, localpg.ErrNoPooler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pooler.Close() })
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "pooled", "--roles", "api", "--rate-limit", "0",
		"--statement-timeout", "0"}, env("DATABASE_URL", pooler.URL(), "LEASEHOLD_LISTEN_DATABASE_URL", pair.URL())))
	kept := call[leaseBody](t, r, "POST", "/api/leases", `{"resource":"kept","holder":"a","ttl_seconds":600}`, http.StatusCreated)
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	const lost = 20
	var highest int64
	for i := range lost {
		l := call[leaseBody](t, r, "POST", "/api/leases", fmt.Sprintf(`{"resource":"lost-%d","holder":"a","ttl_seconds":600}`, i), http.StatusCreated)
		highest = max(highest, l.Fence)
	}
	if err := pair.Primary().Kill(ctx); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pooler.Follow(ctx, pair.Primary()); err != nil {
		t.Fatal(err)
	}
	followed := time.Since(died)
	var after leaseBody
	waitUntil(t, "a lease granted after the failover", func() bool {
		status, body := r.request(t, "POST", "/api/leases", `{"resource":"lost-0","holder":"b","ttl_seconds":30}`, "")
		return status == http.StatusCreated && json.Unmarshal(body, &after) == nil
	}, r.logs)
	granted := time.Since(died)
	if after.Fence <= highest {
		t.Errorf("the first fence after the failover is %d, not above the lost acquisitions' highest, %d: a fence was handed out twice", after.Fence, highest)
	}
	call[leaseBody](t, r, "PUT", "/api/leases/renew", fmt.Sprintf(`{"resource":"kept","holder":"a","fence":%d}`, kept.Fence), http.StatusOK)
	t.Logf("through PgBouncer: primary killed; the pooler in front of the new primary %v later; the first lease granted %v after the kill, fence %d above the %d lost acquisitions' highest, %d",
		followed.Round(time.Millisecond), granted.Round(time.Millisecond), after.Fence, lost, highest)
}
