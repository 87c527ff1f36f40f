package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/lab/testkit"
	"github.com/leasehold/leasehold/internal/scheduler"
)

// schedTerm is one holding of the scheduler lease, by the database clock.
type schedTerm struct {
	holder     string
	fence      int64
	start, end time.Time
}

// TestScheduleAcrossFailures: a schedule ticking every second on three
// replicas (processes of the binary), while the replica holding the
// scheduler lease is stopped (SIGSTOP) past its TTL and later resumed, and
// the next holder is killed (SIGKILL); it ends once the third holder has
// made a few ticks. Every tick is at most one task; the only ticks without
// a task are those that fell due while no scheduler ran or while the one
// that held the lease was more than a tick late (a loaded machine), each
// run of them made one task and counted in missed_ticks; every task was
// inserted by a live holder of the lease (none by the paused one after it
// woke); and the ticks made and missed add up to the ticks of the run.
func TestScheduleAcrossFailures(t *testing.T) {
	t.Parallel()
	bin := testkit.Leasehold(t)
	db := pgtest.New(t)
	procs := map[string]*rolloutProc{}
	for _, name := range []string{"sched-a", "sched-b", "sched-c"} {
		procs[name] = startRolloutProc(t, bin, db.URL, name)
	}
	status, body := sendJSON(t, procs["sched-a"], http.MethodPost, "/api/schedules", `{"name":"every-second","cron":"@every 1s","kind":"tick"}`)
	if status != http.StatusCreated {
		t.Fatalf("add the schedule: %d %s", status, body)
	}
	started := time.Now()

	first, _ := schedHolder(t, db, "")
	awaitTicks(t, db, 5)
	// The holder stops, its lease runs out, another takes over.
	paused := procs[first]
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second, _ := schedHolder(t, db, first)
	t.Logf("%s stopped; %s took over", first, second)
	awaitTicks(t, db, countTicks(t, db)+5)
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitTicks(t, db, countTicks(t, db)+3) // the paused one woke meanwhile: whatever it tried is in the history
	// The next holder is killed.
	killed := procs[second]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-killed.done //nolint:errcheck // killed: its exit status says only that
	killed.exited = true
	third, _ := schedHolder(t, db, second)
	t.Logf("%s killed; %s took over", second, third)
	awaitTicks(t, db, countTicks(t, db)+5)
	t.Logf("ran %v", time.Since(started).Round(time.Second))

	ctx := context.Background()
	var missed int64
	var firstTick time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT missed_ticks, created_at FROM schedules WHERE name = 'every-second'`).Scan(&missed, &firstTick); err != nil {
		t.Fatal(err)
	}
	var dups int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT schedule_tick FROM tasks WHERE schedule = 'every-second' GROUP BY schedule_tick HAVING count(*) > 1) AS d`).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	if dups != 0 {
		t.Errorf("%d ticks made more than one task", dups)
	}
	terms := schedTerms(t, db)
	rows, err := db.Pool.Query(ctx, `SELECT id, schedule_tick, scheduled_at, created_at FROM tasks WHERE schedule = 'every-second' ORDER BY schedule_tick`)
	if err != nil {
		t.Fatal(err)
	}
	type made struct {
		id                      int64
		tick, scheduled, create time.Time
		term                    int
	}
	var ticks []made
	for rows.Next() {
		var m made
		if err := rows.Scan(&m.id, &m.tick, &m.scheduled, &m.create); err != nil {
			t.Fatal(err)
		}
		m.term = -1
		for i, tm := range terms {
			if !m.create.Before(tm.start) && m.create.Before(tm.end) {
				m.term = i
			}
		}
		if m.term < 0 {
			t.Errorf("task %d (tick %s) inserted at %s, when no live holder had the scheduler lease", m.id, m.tick, m.create)
		}
		if !m.scheduled.Equal(m.tick) || m.tick.Truncate(time.Second) != m.tick {
			t.Errorf("task %d: tick %s, scheduled_at %s; want a whole second, and scheduled at it", m.id, m.tick, m.scheduled)
		}
		ticks = append(ticks, m)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(ticks) < 2 {
		t.Fatalf("%d ticks made", len(ticks))
	}
	var gaps []string
	var inGaps int64
	for i := 1; i < len(ticks); i++ {
		d := ticks[i].tick.Sub(ticks[i-1].tick)
		if d == time.Second {
			continue
		}
		n := int64(d/time.Second) - 1
		inGaps += n
		gaps = append(gaps, ticks[i-1].tick.Format(time.TimeOnly)+"…"+ticks[i].tick.Format(time.TimeOnly))
		// Within one term a scheduler skips a tick only when it ran more than
		// a tick late: then it makes the latest due and counts the others
		// missed. One on time never does.
		if late := ticks[i].create.Sub(ticks[i-1].tick.Add(time.Second)); ticks[i].term == ticks[i-1].term && late < time.Second {
			t.Errorf("%d ticks missing between %s and %s within one term of %s, made %v after the first of them fell due: a scheduler on time skipped them",
				n, ticks[i-1].tick, ticks[i].tick, terms[ticks[i].term].holder, late)
		}
	}
	if inGaps != missed {
		t.Errorf("%d ticks have no task, but missed_ticks is %d: a tick was lost", inGaps, missed)
	}
	span := int64(ticks[len(ticks)-1].tick.Sub(ticks[0].tick)/time.Second) + 1
	if int64(len(ticks))+missed != span {
		t.Errorf("%d ticks made and %d missed over %d seconds", len(ticks), missed, span)
	}
	var holders []string
	for _, tm := range terms {
		holders = append(holders, tm.holder)
	}
	t.Logf("%d ticks in %d s: %d tasks, %d missed (ticks due while no scheduler ran: %v), 0 duplicates; terms: %s",
		span, span, len(ticks), missed, gaps, strings.Join(holders, " → "))
}

// sendJSON sends body to p and returns the status and answer.
func sendJSON(t *testing.T, p *rolloutProc, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, p.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// schedHolder waits until a holder other than not holds the scheduler
// lease live, and returns it with its fence.
func schedHolder(t *testing.T, db pgtest.DB, not string) (string, int64) {
	t.Helper()
	deadline := time.Now().Add(rolloutLimit)
	for {
		var (
			holder string
			fence  int64
		)
		err := db.Pool.QueryRow(t.Context(), `SELECT holder, fence FROM leases WHERE resource = $1 AND released_at IS NULL AND expires_at > now()`, scheduler.Resource).Scan(&holder, &fence)
		if err == nil && holder != not {
			return holder, fence
		}
		if time.Now().After(deadline) {
			t.Fatalf("no holder of the scheduler lease but %q within %v", not, rolloutLimit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countTicks(t *testing.T, db pgtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM tasks WHERE schedule IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitTicks waits until n tasks of schedules exist.
func awaitTicks(t *testing.T, db pgtest.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(rolloutLimit)
	for countTicks(t, db) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d ticks made within %v", n, rolloutLimit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// schedTerms returns the holdings of the scheduler lease from its history:
// each from its acquisition to its release, or to the expiry its last
// renewal set.
func schedTerms(t *testing.T, db pgtest.DB) []schedTerm {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT holder, fence, kind, at, expires_at FROM lease_events WHERE resource = $1 ORDER BY id`, scheduler.Resource)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var terms []schedTerm
	for rows.Next() {
		var (
			holder, kind string
			fence        int64
			at, expires  time.Time
		)
		if err := rows.Scan(&holder, &fence, &kind, &at, &expires); err != nil {
			t.Fatal(err)
		}
		switch kind {
		case "acquired":
			terms = append(terms, schedTerm{holder: holder, fence: fence, start: at, end: expires})
		case "renewed", "released", "expired":
			for i := range terms {
				if terms[i].fence == fence {
					if kind == "renewed" {
						terms[i].end = expires
					} else if at.Before(terms[i].end) {
						terms[i].end = at
					}
				}
			}
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return terms
}
