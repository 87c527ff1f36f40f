package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// TestAsyncFailoverUnderLoad fails over an asynchronous pair under lease
// and task load, with a forced lag: lease clients acquire, renew and
// release contended leases, and tasks are inserted and run, through two
// replicas on the pair's multi-host URL. Once the standby has caught up,
// its stream is cut; the load goes on against the primary alone, which is
// then killed (SIGKILL) and the standby promoted. The replicas follow by
// themselves and the load goes on against the new primary.
//
// Then the old primary is reopened read-only to read all it had, and the
// two histories are judged together:
//   - no fence was handed out twice (the checker's fence rule over the
//     union of both histories), and every acquisition on the new primary
//     has a fence above every one of the old primary's;
//   - what was lost is what asynchronous replication loses, as
//     docs/operations/postgresql-and-failover.md says: acknowledged operations of the lag, each
//     committed on the old primary (it is in the old history); none
//     acknowledged before the standby caught up, or sent after the kill;
//     and every one sent after the cut and answered before the kill;
//   - every task on the new primary ends done or dead.
func TestAsyncFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPair(t, false)
	var replicas []*replica
	for i := range 2 {
		replicas = append(replicas, startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0",
			"--instance", fmt.Sprintf("async-%d", i), "--workers", "4", "--lease-ttl", "3s",
			"--roles", "api,worker,reaper", "--rate-limit", "0"}, env("DATABASE_URL", pair.URL()))))
	}
	logs := func() []fmt.Stringer {
		var ls []fmt.Stringer
		for _, r := range replicas {
			ls = append(ls, r.logs)
		}
		return ls
	}
	ld := &asyncLoad{}
	for _, r := range replicas {
		ld.urls = append(ld.urls, r.url)
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	const clients, resources = 6, 3
	for c := range clients {
		wg.Go(func() { ld.holdLeases(loadCtx, fmt.Sprintf("client-%d", c), fmt.Sprintf("async:%d", c%resources)) })
	}
	wg.Go(func() { ld.insertTasks(loadCtx) })
	atLeast := func(what string, more int) {
		t.Helper()
		n := ld.count()
		waitUntil(t, fmt.Sprintf("%d more operations acknowledged (%s)", more, what), func() bool { return ld.count() >= n+more }, logs()...)
	}

	atLeast("before the lag", 100)
	caughtUp := time.Now() // everything acknowledged before it reached the standby
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pair.PauseStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	cut := time.Now() // nothing sent after it reaches the standby
	atLeast("by the primary alone", 150)
	old := pair.Primary()
	if err := old.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(died)
	waitUntil(t, "a lease granted by the new primary", func() bool { return !ld.firstAcquiredAfter(died).IsZero() }, logs()...)
	granted := ld.firstAcquiredAfter(died).Sub(died)
	atLeast("by the new primary", 100)
	stopLoad()
	wg.Wait()
	if errs := ld.unexpected(); len(errs) > 0 {
		t.Errorf("answers no client should get: %v", errs)
	}

	newPool := openPool(t, pair.Primary().URL())
	waitUntil(t, "every task on the new primary done or dead", func() bool {
		var left int
		if err := newPool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state NOT IN ('done', 'dead')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, logs()...)
	newH, err := checker.Read(ctx, newPool)
	if err != nil {
		t.Fatal(err)
	}
	if err := pair.ReopenOld(ctx); err != nil {
		t.Fatal(err)
	}
	oldH, err := checker.Read(ctx, openPool(t, old.URL()))
	if err != nil {
		t.Fatal(err)
	}

	// No fence handed out twice, over both histories.
	rep := checker.VerifyFences(oldH, newH)
	for _, v := range rep.Violations {
		t.Errorf("%s: %s", v.Rule, v.Detail)
	}
	oldHighest := highestFence(oldH, time.Time{})
	if first := lowestFence(newH, died); first <= oldHighest {
		t.Errorf("the lowest fence handed out by the new primary is %d, not above the old primary's highest, %d", first, oldHighest)
	}

	// What was lost: the acknowledged operations of the lag, and only those.
	lost := map[string]int{}
	acked := map[string]int{}
	var kept, lostLate int
	for _, op := range ld.acked() {
		acked[op.kind]++
		if op.in(newH) {
			kept++
			if op.sent.After(cut) && op.acked.Before(died) {
				t.Errorf("%s, sent %v after the stream was cut and answered before the kill, is on the new primary: the standby received it",
					op, op.sent.Sub(cut).Round(time.Millisecond))
			}
			continue
		}
		lost[op.kind]++
		if !op.in(oldH) {
			t.Errorf("%s was acknowledged but is in neither primary's history", op)
		}
		if op.acked.Before(caughtUp) {
			t.Errorf("%s, acknowledged before the standby caught up, was lost", op)
		}
		if op.sent.After(died) {
			t.Errorf("%s, sent after the kill (to the new primary), was lost", op)
		}
		if op.sent.After(cut) {
			lostLate++
		}
	}
	total := 0
	for _, n := range lost {
		total += n
	}
	if total == 0 {
		t.Errorf("no acknowledged operation was lost: the forced lag did not happen")
	}
	// Completions are not acknowledged to a client, but to the worker, which
	// then takes the next task: a task done on the old primary alone runs
	// again on the new one.
	rerun := 0
	newTasks := map[string]checker.Task{}
	for _, tk := range newH.Tasks {
		newTasks[taskKey(tk)] = tk
	}
	for _, tk := range oldH.Tasks {
		if tk.State != task.StateDone {
			continue
		}
		if n, ok := newTasks[taskKey(tk)]; ok && (n.State != task.StateDone || n.Fence != tk.Fence) {
			rerun++
		}
	}
	t.Logf("primary killed; Promote returned %v later (it ends with a checkpoint); the first lease granted by the new primary %v after the kill",
		promoted.Round(time.Millisecond), granted.Round(time.Millisecond))
	t.Logf("acknowledged: %s; lost: %s (%d of them sent after the cut, %d kept in all); tasks done on the old primary alone and run again: %d",
		counts(acked), counts(lost), lostLate, kept, rerun)
	t.Logf("fences: %d distinct acquisitions over both histories, none repeated; the old primary's highest %d, the new primary's lowest after the failover %d",
		rep.Acquisitions, oldHighest, lowestFence(newH, died))
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// highestFence is the highest fence of h's acquisitions from since on (leases'
// and task attempts').
func highestFence(h checker.History, since time.Time) int64 {
	var f int64
	eachFence(h, since, func(fence int64) { f = max(f, fence) })
	return f
}

// lowestFence is the lowest fence of h's acquisitions from since on.
func lowestFence(h checker.History, since time.Time) int64 {
	var f int64
	eachFence(h, since, func(fence int64) {
		if f == 0 || fence < f {
			f = fence
		}
	})
	return f
}

func eachFence(h checker.History, since time.Time, each func(int64)) {
	for _, e := range h.Events {
		if e.Kind == "acquired" && !e.At.Before(since) {
			each(e.Fence)
		}
	}
	for _, tk := range h.Tasks {
		for _, a := range tk.Attempts {
			if !a.StartedAt.Before(since) {
				each(a.Fence)
			}
		}
		if tk.Fence != 0 && !tk.StartedAt.Before(since) {
			each(tk.Fence)
		}
	}
}

func taskKey(tk checker.Task) string {
	return fmt.Sprintf("%d@%s", tk.ID, tk.CreatedAt.UTC().Format(time.RFC3339Nano))
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range []string{"acquire", "renew", "release", "insert"} {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// asyncLoad is the load of TestAsyncFailoverUnderLoad: the operations it had
// acknowledged, with when each was sent and answered.
type asyncLoad struct {
	urls []string

	mu    sync.Mutex
	next  int
	ops   []ackedOp
	wrong []string // answers the protocol does not allow
}

// ackedOp is one acknowledged operation: a lease's acquisition, renewal or
// release, or a task's insert.
type ackedOp struct {
	kind        string // acquire, renew, release, insert
	resource    string // the lease's
	holder      string
	fence       int64
	expires     time.Time // a renewal's new expiry
	task        int64
	created     time.Time // the task's
	sent, acked time.Time
}

func (op ackedOp) String() string {
	if op.kind == "insert" {
		return fmt.Sprintf("the insert of task %d", op.task)
	}
	return fmt.Sprintf("the %s of %s by %s under fence %d", op.kind, op.resource, op.holder, op.fence)
}

// in reports whether h recorded op.
func (op ackedOp) in(h checker.History) bool {
	// The API's timestamps are to the millisecond, the database's to the
	// microsecond.
	ms := func(t time.Time) time.Time { return t.Truncate(time.Millisecond) }
	if op.kind == "insert" {
		return slices.ContainsFunc(h.Tasks, func(tk checker.Task) bool { return tk.ID == op.task && ms(tk.CreatedAt).Equal(op.created) })
	}
	kind := map[string]string{"acquire": "acquired", "renew": "renewed", "release": "released"}[op.kind]
	return slices.ContainsFunc(h.Events, func(e lease.Event) bool {
		// Made while the request was under way (one machine, one clock): a
		// holder may repeat an operation later, e.g. release a lease
		// whose release the failover lost.
		return e.Kind == kind && e.Resource == op.resource && e.Holder == op.holder && e.Fence == op.fence &&
			(op.kind != "renew" || ms(e.ExpiresAt).Equal(op.expires)) &&
			!e.At.Before(op.sent.Add(-time.Millisecond)) && !e.At.After(op.acked.Add(time.Millisecond))
	})
}

func (ld *asyncLoad) record(op ackedOp) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.ops = append(ld.ops, op)
}

func (ld *asyncLoad) unexpectedAnswer(format string, args ...any) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.wrong = append(ld.wrong, fmt.Sprintf(format, args...))
}

func (ld *asyncLoad) count() int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return len(ld.ops)
}

func (ld *asyncLoad) acked() []ackedOp {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.ops)
}

func (ld *asyncLoad) unexpected() []string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.wrong)
}

// firstAcquiredAfter is when the first acquisition sent after at was
// acknowledged; zero when none was yet.
func (ld *asyncLoad) firstAcquiredAfter(at time.Time) time.Time {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var first time.Time
	for _, op := range ld.ops {
		if op.kind == "acquire" && op.sent.After(at) && (first.IsZero() || op.acked.Before(first)) {
			first = op.acked
		}
	}
	return first
}

// send sends a request to the next replica, round robin. A transport error
// or a 5xx (the database is down, or the pool is finding the new primary) is
// an answer of status 0 or 5xx, which the callers retry.
func (ld *asyncLoad) send(ctx context.Context, method, path string, body any) (status int, raw []byte, sent time.Time) {
	ld.mu.Lock()
	url := ld.urls[ld.next%len(ld.urls)]
	ld.next++
	ld.mu.Unlock()
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // the bodies here always marshal
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, url+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, time.Now()
	}
	req.Header.Set("Content-Type", "application/json")
	sent = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, sent
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, sent
	}
	return resp.StatusCode, raw, sent
}

// pause waits d, or until ctx ends: the pace of the load.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// holdLeases acquires resource for holder, renews it three times and
// releases it, over and over, until ctx ends. A lease it finds lost (404)
// is acquired again.
func (ld *asyncLoad) holdLeases(ctx context.Context, holder, resource string) {
	type body struct {
		Resource string `json:"resource"`
		Holder   string `json:"holder"`
		Fence    int64  `json:"fence,omitempty"`
		TTL      int    `json:"ttl_seconds,omitempty"`
	}
	for ctx.Err() == nil {
		status, raw, sent := ld.send(ctx, "POST", "/api/leases", body{Resource: resource, Holder: holder, TTL: 2})
		var l leaseBody
		switch {
		case status == http.StatusCreated && json.Unmarshal(raw, &l) == nil:
			ld.record(ackedOp{kind: "acquire", resource: resource, holder: holder, fence: l.Fence, sent: sent, acked: time.Now()})
		case status == http.StatusOK:
			// It holds the lease already: an acquisition whose answer
			// was lost. Release it, and start again.
			_ = json.Unmarshal(raw, &l)
			ld.send(ctx, "DELETE", "/api/leases/release", body{Resource: resource, Holder: holder, Fence: l.Fence})
			continue
		case status == http.StatusConflict, status == 0, status >= 500:
			pause(ctx, 20*time.Millisecond)
			continue
		default:
			ld.unexpectedAnswer("acquire %s by %s: %d %s", resource, holder, status, raw)
			pause(ctx, 20*time.Millisecond)
			continue
		}
		held := true
		for range 3 {
			if !pause(ctx, 100*time.Millisecond) {
				return
			}
			status, raw, sent := ld.send(ctx, "PUT", "/api/leases/renew", body{Resource: resource, Holder: holder, Fence: l.Fence, TTL: 2})
			var r leaseBody
			switch {
			case status == http.StatusOK && json.Unmarshal(raw, &r) == nil:
				expires, err := time.Parse(time.RFC3339Nano, r.ExpiresAt)
				if err != nil {
					ld.unexpectedAnswer("renew %s by %s: expires_at %q: %v", resource, holder, r.ExpiresAt, err)
					continue
				}
				ld.record(ackedOp{kind: "renew", resource: resource, holder: holder, fence: l.Fence, expires: expires, sent: sent, acked: time.Now()})
			case status == http.StatusNotFound:
				held = false // lost with the old primary, or expired during the outage
			case status == 0, status >= 500:
			default:
				ld.unexpectedAnswer("renew %s by %s: %d %s", resource, holder, status, raw)
			}
			if !held {
				break
			}
		}
		if !held {
			continue
		}
		status, raw, sent = ld.send(ctx, "DELETE", "/api/leases/release", body{Resource: resource, Holder: holder, Fence: l.Fence})
		switch {
		case status == http.StatusOK:
			ld.record(ackedOp{kind: "release", resource: resource, holder: holder, fence: l.Fence, sent: sent, acked: time.Now()})
		case status == http.StatusNotFound, status == 0, status >= 500:
			// Lost, expired, or unanswered: it expires in any case.
		default:
			ld.unexpectedAnswer("release %s by %s: %d %s", resource, holder, status, raw)
		}
	}
}

// insertTasks inserts two short tasks every 50 ms until ctx ends.
func (ld *asyncLoad) insertTasks(ctx context.Context) {
	type sleep struct {
		Seconds float64 `json:"sleep_duration_seconds"`
	}
	type body struct {
		TaskData sleep `json:"task_data"`
	}
	for pause(ctx, 50*time.Millisecond) {
		status, raw, sent := ld.send(ctx, "POST", "/api/tasks", []body{{sleep{0.05}}, {sleep{0.02}}})
		switch {
		case status == http.StatusCreated:
			var ts []struct {
				ID        int64     `json:"id"`
				CreatedAt time.Time `json:"created_at"`
			}
			if err := json.Unmarshal(raw, &ts); err != nil {
				ld.unexpectedAnswer("insert: %s: %v", raw, err)
				continue
			}
			for _, tk := range ts {
				ld.record(ackedOp{kind: "insert", task: tk.ID, created: tk.CreatedAt, sent: sent, acked: time.Now()})
			}
		case status == 0, status >= 500:
		default:
			ld.unexpectedAnswer("insert: %d %s", status, raw)
		}
	}
}
