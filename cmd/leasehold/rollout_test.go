package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

// rolloutLimit bounds each wait of TestRollingRestart, only so that a
// broken test fails instead of hanging; none asserts how fast anything is.
const rolloutLimit = time.Minute

// rolloutRate is the generator's rate in TestRollingRestart, in tasks a
// second.
const rolloutRate = "20"

// TestRollingRestart restarts 3 replicas (processes of the binary) one at a
// time, as a Kubernetes rollout with maxUnavailable 1 and no surge does:
// SIGTERM to one, wait for it to exit, start its replacement (a new name,
// as a new pod has), wait until it is ready, then the next; for two
// rounds, with the generator started. From the history of the generator
// lease it measures how long the cluster was left without a generator
// after each handoff, and checks what a rollout must keep: every replica
// exits cleanly; every holder stopped released the lease (no successor
// waited for an expiry); every release was followed by an acquisition; the
// holding intervals never overlap; and after every handoff the generator
// generated again, under the new holder's fence.
func TestRollingRestart(t *testing.T) {
	t.Parallel()
	bin := testkit.Leasehold(t)
	db := pgtest.New(t)
	const replicas, rounds = 3, 2

	procs := make([]*rolloutProc, replicas)
	for i := range procs {
		procs[i] = startRolloutProc(t, bin, db.URL, fmt.Sprintf("leasehold-0-%d", i))
	}
	if status, body := procs[0].post(t, "/api/generator/start"); status != http.StatusAccepted {
		t.Fatalf("start the generator: %d %s", status, body)
	}
	holder, fence := waitGenerating(t, db, 0, procs)
	t.Logf("generating under %s, fence %d", holder, fence)

	var (
		terminated   = map[string]bool{} // replicas sent SIGTERM
		exits        []time.Duration     // from SIGTERM to exit
		handoffs     int                 // restarts of the generator's holder
		restartStart = time.Now()
	)
	for round := 1; round <= rounds; round++ {
		for i, old := range procs {
			holder, fence := generatorHolder(t, db)
			sent := time.Now()
			old.terminate(t)
			exits = append(exits, time.Since(sent))
			terminated[old.name] = true
			procs[i] = startRolloutProc(t, bin, db.URL, fmt.Sprintf("leasehold-%d-%d", round, i))
			if holder == old.name {
				handoffs++
				// The generator must generate again, under a new holder.
				waitGenerating(t, db, fence, procs)
			}
		}
	}
	elapsed := time.Since(restartStart)

	// The history of the generator lease, by the database clock.
	terms := generatorTerms(t, db)
	if len(terms) != handoffs+1 {
		// A term that began or ended otherwise than by a restart of its
		// holder: a lease lost (a renewal missed) or a spurious step-down.
		t.Errorf("%d terms of the generator lease for %d restarts of its holder, want %d: %+v", len(terms), handoffs, handoffs+1, terms)
	}
	var gaps, idle []time.Duration // without a holder; without a generated task
	for i, term := range terms {
		last := i == len(terms)-1
		switch {
		case last && term.end != "":
			t.Errorf("the last term (%s, fence %d) ended (%s) after the rollout: the generator has no holder", term.holder, term.fence, term.end)
		case last:
		case term.end != "released":
			t.Errorf("term %d (%s, fence %d) ended by %q, want released: its successor waited for it to expire", i, term.holder, term.fence, term.end)
		case !terminated[term.holder]:
			t.Errorf("term %d (%s, fence %d) was released, but its replica was not stopped", i, term.holder, term.fence)
		}
		if last {
			break
		}
		next := terms[i+1]
		gap := next.start.Sub(term.endAt)
		if gap < 0 {
			t.Errorf("term %d (%s, fence %d) began %v before term %d (%s, fence %d) ended: two holders at once",
				i+1, next.holder, next.fence, -gap, i, term.holder, term.fence)
		}
		if next.fence <= term.fence {
			t.Errorf("term %d has fence %d after fence %d: fences must increase", i+1, next.fence, term.fence)
		}
		gaps = append(gaps, gap)
		idle = append(idle, generationGap(t, db, term.fence, next.fence))
	}
	var tasks int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM tasks WHERE generator_fence IS NOT NULL`).Scan(&tasks); err != nil {
		t.Fatal(err)
	}
	slices.Sort(gaps)
	slices.Sort(idle)
	slices.Sort(exits)
	t.Logf("rolling restart: %d rounds of %d replicas (%d restarts) in %v; %d handoffs of the generator; %d tasks generated",
		rounds, replicas, rounds*replicas, elapsed.Round(time.Millisecond), len(gaps), tasks)
	if len(gaps) > 0 {
		t.Logf("generator without a holder (release to next acquisition, by the database clock): %d gaps, median %v, max %v, total %v; all: %v",
			len(gaps), medianDuration(gaps), gaps[len(gaps)-1], sumDurations(gaps), gaps)
		t.Logf("generator without generating (last task of a holder to the first of the next, at %s tasks/s): median %v, max %v",
			rolloutRate, medianDuration(idle), idle[len(idle)-1])
	}
	t.Logf("SIGTERM to exit of a replica: median %v, max %v", medianDuration(exits).Round(time.Millisecond), exits[len(exits)-1].Round(time.Millisecond))
}

// generationGap returns the time from the last task generated under fence
// to the first generated under next, by the database clock.
func generationGap(t *testing.T, db pgtest.DB, fence, next int64) time.Duration {
	t.Helper()
	var gap time.Duration
	err := db.Pool.QueryRow(t.Context(), `
		SELECT coalesce((SELECT min(created_at) FROM tasks WHERE generator_fence = $2)
		              - (SELECT max(created_at) FROM tasks WHERE generator_fence = $1), '0')`, fence, next).Scan(&gap)
	if err != nil {
		t.Fatal(err)
	}
	return gap
}

// rolloutTerm is one holder's term of the generator lease.
type rolloutTerm struct {
	holder string
	fence  int64
	start  time.Time // acquired
	end    string    // "released", "expired", "lapsed" (its expiry passed unmarked, or taken over without either), "" while held
	endAt  time.Time // released at, or the lease's expiry
}

// generatorTerms reads the terms of the generator lease from lease_events.
func generatorTerms(t *testing.T, db pgtest.DB) []rolloutTerm {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `
		SELECT holder, fence, kind, at, expires_at, expires_at <= clock_timestamp()
		FROM lease_events WHERE resource = $1 ORDER BY id`, demo.Resource)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var terms []rolloutTerm
	for rows.Next() {
		var (
			holder, kind  string
			fence         int64
			at, expiresAt time.Time
			past          bool
		)
		if err := rows.Scan(&holder, &fence, &kind, &at, &expiresAt, &past); err != nil {
			t.Fatal(err)
		}
		if kind == "acquired" {
			if n := len(terms); n > 0 && terms[n-1].end == "" {
				terms[n-1].end = "lapsed"
			}
			terms = append(terms, rolloutTerm{holder: holder, fence: fence, start: at, endAt: expiresAt})
			if past {
				terms[len(terms)-1].end = "lapsed" // unless it was renewed, below
			}
			continue
		}
		if len(terms) == 0 || terms[len(terms)-1].fence != fence {
			t.Fatalf("lease_events: %s of fence %d without its acquisition", kind, fence)
		}
		cur := &terms[len(terms)-1]
		switch kind {
		case "renewed":
			// Only the last renewal's expiry says whether the term has
			// lapsed: an earlier one has passed by now in a term longer
			// than the TTL, but a renewal needs a live lease, so the
			// renewal after it came in time.
			cur.endAt, cur.end = expiresAt, ""
			if past {
				cur.end = "lapsed"
			}
		case "released":
			cur.end, cur.endAt = "released", at
		case "expired":
			cur.end, cur.endAt = "expired", expiresAt
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return terms
}

// generatorHolder returns the live holder of the generator lease and its
// fence.
func generatorHolder(t *testing.T, db pgtest.DB) (string, int64) {
	t.Helper()
	var holder string
	var fence int64
	err := db.Pool.QueryRow(t.Context(), `
		SELECT holder, fence FROM leases
		WHERE resource = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`, demo.Resource).Scan(&holder, &fence)
	if err != nil {
		t.Fatalf("the generator lease: %v", err)
	}
	return holder, fence
}

// waitGenerating waits until a task has been generated under a fence
// above after, and returns its holder and fence.
func waitGenerating(t *testing.T, db pgtest.DB, after int64, procs []*rolloutProc) (string, int64) {
	t.Helper()
	deadline := time.Now().Add(rolloutLimit)
	for {
		var fence int64
		err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(max(generator_fence), 0) FROM tasks`).Scan(&fence)
		if err != nil {
			t.Fatal(err)
		}
		if fence > after {
			var holder string
			err := db.Pool.QueryRow(t.Context(), `SELECT holder FROM lease_events WHERE resource = $1 AND fence = $2 AND kind = 'acquired'`,
				demo.Resource, fence).Scan(&holder)
			if err != nil {
				t.Fatal(err)
			}
			return holder, fence
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, p := range procs {
				fmt.Fprintf(&logs, "--- %s\n%s", p.name, p.logs)
			}
			t.Fatalf("no task generated under a fence above %d within %v\n%s", after, rolloutLimit, &logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rolloutProc is one "leasehold serve" process of the rollout.
type rolloutProc struct {
	name   string
	url    string
	cmd    *exec.Cmd
	logs   *syncBuffer
	done   chan error
	exited bool
	client *http.Client
}

// startRolloutProc starts a replica called name on a free port of
// 127.0.0.1 and returns once /readyz answers 200.
func startRolloutProc(t *testing.T, bin, dbURL, name string) *rolloutProc {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := &rolloutProc{
		name: name,
		url:  "http://" + addr,
		cmd: exec.Command(bin, "serve", "--addr", addr, "--instance", name, "--workers", "2", "--roles", "api,worker,generator,reaper,scheduler",
			"--generator-rate", rolloutRate, "--generator-sleep", "0s-50ms", "--shutdown-grace", "2s"),
		logs:   &syncBuffer{},
		done:   make(chan error, 1),
		client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second},
	}
	// The configuration is the above, not whatever the test runs under.
	p.cmd.Env = append(withoutEnvPrefix(os.Environ(), "LEASEHOLD_", "DATABASE_URL"), "DATABASE_URL="+dbURL)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.client.CloseIdleConnections()
		if p.exited {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			t.Logf("%s stopped at the end of the test: %v", p.name, err)
		case <-time.After(rolloutLimit):
			_ = p.cmd.Process.Kill()
			t.Errorf("%s still running %v after SIGTERM; killed: %v", p.name, rolloutLimit, <-p.done)
		}
	})

	deadline := time.Now().Add(rolloutLimit)
	for {
		if status, _ := p.get("/readyz"); status == http.StatusOK {
			return p
		}
		select {
		case err := <-p.done:
			p.exited = true
			t.Fatalf("%s exited before it was ready: %v\n%s", name, err, p.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %v\n%s", name, rolloutLimit, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get returns the status and body of GET path; 0 when there is no answer.
func (p *rolloutProc) get(path string) (int, string) {
	return p.do("GET", path)
}

func (p *rolloutProc) post(t *testing.T, path string) (int, string) {
	t.Helper()
	status, body := p.do("POST", path)
	if status == 0 {
		t.Fatalf("POST %s to %s: %s", path, p.name, body)
	}
	return status, body
}

func (p *rolloutProc) do(method, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, p.url+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	res, err := p.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err.Error()
	}
	return res.StatusCode, string(body)
}

// terminate sends SIGTERM, as Kubernetes does to a pod it stops, and waits
// for a clean exit.
func (p *rolloutProc) terminate(t *testing.T) {
	t.Helper()
	p.client.CloseIdleConnections()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.exited = true
		if err != nil {
			t.Errorf("%s after SIGTERM: %v, want exit status 0\n%s", p.name, err, p.logs)
		}
	case <-time.After(rolloutLimit):
		t.Fatalf("%s still running %v after SIGTERM\n%s", p.name, rolloutLimit, p.logs)
	}
}

// withoutEnvPrefix returns env without the variables whose names start
// with one of prefixes.
func withoutEnvPrefix(env []string, prefixes ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			out = append(out, kv)
		}
	}
	return out
}

// medianDuration is the median of ds, which is not empty.
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sumDurations is the sum of ds.
func sumDurations(ds []time.Duration) time.Duration {
	var total time.Duration
	for _, d := range ds {
		total += d
	}
	return total
}
