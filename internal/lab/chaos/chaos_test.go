package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/checker"
	"github.com/leasehold/leasehold/internal/lab/testkit"
)

func TestMain(m *testing.M) {
	// As the leasehold command logs: faults are read off the log to the millisecond.
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	testkit.Main(m)
}

// TestChaosShort is the soak in small: three replicas under load for 45 s, every kind of
// fault forced once in order (then more at random), the queue drained, and the history
// found to keep every guarantee.
// runSoak runs the soak of o with the test's binary, its log and the
// replicas' logs, and logs its report.
func runSoak(t *testing.T, o Options) (*Report, *lockedBuffer) {
	t.Helper()
	var replicaLogs lockedBuffer
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	o.Binary, o.AppBinary = testkit.Leasehold(t), testkit.Soak(t)
	o.Log = zerolog.New(zerolog.ConsoleWriter{Out: t.Output(), NoColor: true, TimeFormat: "15:04:05.000"}).
		Level(zerolog.InfoLevel).With().Timestamp().Logger()
	o.Output = &replicaLogs
	// A failed soak keeps every process's log whole, for go test -artifacts.
	artifacts := t.ArtifactDir()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		name := filepath.Join(artifacts, "processes.log")
		if err := os.WriteFile(name, replicaLogs.bytes(), 0o644); err != nil {
			t.Logf("keeping the processes' log: %v", err)
			return
		}
		t.Logf("the processes' log: %s", name)
	})
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v\nreplica logs (the end):\n%s", err, replicaLogs.tail(100))
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", text.String())
	return rep, &replicaLogs
}

func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak of about a minute and a half")
	}
	t.Parallel()
	rep, replicaLogs := runSoak(t, Options{
		Duration:      45 * time.Second,
		Replicas:      3,
		FaultInterval: 2 * time.Second,
		Forced:        AllKinds,
		Seed:          1,
		Cluster:       "chaos-test", // not the cluster of a soak (go tool task chaos) running beside
	})

	if !rep.OK() {
		soakFailed(t, rep, replicaLogs)
	}
	counts := rep.FaultCounts()
	for _, k := range AllKinds {
		if counts[k] == 0 {
			t.Errorf("faults: no %s among %v", k, counts)
		}
	}
	if rep.DBRestarts != counts[KindDBRestart] || len(rep.Outages) < rep.DBRestarts {
		t.Errorf("%d restart(s) of PostgreSQL, %d outage window(s); want one restart and at least one window per db-restart (%d)",
			rep.DBRestarts, len(rep.Outages), counts[KindDBRestart])
	}
	for name, n := range map[string]int{
		"tasks done": rep.TasksDone, "tasks generated": rep.TasksGenerated, "tasks created over the API": rep.TasksCreated,
		"leases acquired by the clients": rep.LeaseGrants, "SIGTERMs measured": rep.Release.Samples,
	} {
		if n <= 0 {
			t.Errorf("%s: got %d, want some", name, n)
		}
	}
	if rep.TasksUnfinished != 0 || !rep.Drained {
		t.Errorf("%d task(s) unfinished (drained %v), want none", rep.TasksUnfinished, rep.Drained)
	}
	if c := rep.Check; c != nil {
		if c.TasksDone != rep.TasksDone || c.TasksDead != rep.TasksDead || c.Generated != rep.TasksGenerated {
			t.Errorf("checker: done %d, dead %d, generated %d; the soak counted %d, %d, %d",
				c.TasksDone, c.TasksDead, c.Generated, rep.TasksDone, rep.TasksDead, rep.TasksGenerated)
		}
		if c.Acquisitions < rep.LeaseGrants+rep.TasksDone {
			t.Errorf("checker: %d acquisitions, want at least the clients' %d and one per task done (%d)",
				c.Acquisitions, rep.LeaseGrants, rep.TasksDone)
		}
		if c.GatedTasks != rep.Gated.Tasks || c.GatedAttempts < rep.Gated.Done || rep.Gated.Done == 0 || rep.Gated.Scheduled == 0 {
			t.Errorf("checker: %d gated tasks, %d attempts; the soak counted %+v; want some done, some of schedules",
				c.GatedTasks, c.GatedAttempts, rep.Gated)
		}
		if len(c.Schedules) != len(schedules) {
			t.Errorf("checker: ticks of %d schedule(s), want the soak's %d", len(c.Schedules), len(schedules))
		}
		made := 0
		for _, st := range c.Schedules {
			made += st.Made
			// The one of five fields ticks once a minute, maybe not at all in 45 s.
			if st.Cron != "* * * * *" && (st.Expected == 0 || st.Made == 0) {
				t.Errorf("schedule %s: %d tick(s) expected, %d made; want some", st.Name, st.Expected, st.Made)
			}
		}
		if made != rep.Gated.ScheduleTasks {
			t.Errorf("checker: %d tasks of the soak's schedules, the soak counted %d", made, rep.Gated.ScheduleTasks)
		}
		if len(rep.Slots) != len(slotKeys) {
			t.Errorf("figures of %d key(s) of k slots, want the soak's %d: %+v", len(rep.Slots), len(slotKeys), rep.Slots)
		}
		for _, st := range rep.Slots {
			i := slices.IndexFunc(c.SlotKeys, func(k checker.SlotKey) bool { return k.Key == st.Key })
			if i < 0 {
				t.Errorf("checker: no figures of %s, a key of %d slot(s): it judged %+v", st.Key, st.Limit, c.SlotKeys)
				continue
			}
			// Each task done held a slot, and each grant to a slot client was one.
			if k := c.SlotKeys[i]; st.Done == 0 || st.Grants == 0 || k.Limit != st.Limit ||
				k.Holdings < st.Done+st.Grants || k.Attempts < st.Done || k.MostAtOnce < 1 {
				t.Errorf("%s: the soak counted %+v, the checker %+v; want tasks done and slots granted, each a holding of the checker's",
					st.Key, st, k)
			}
		}
		checkFlow(t, rep)
	}

	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Chaos soak: ", "## Violations", "## Faults", "| kill |", "| db-restart | PostgreSQL |",
		"| schedule chaos-every-1s: ticks expected / made / missed / skipped | ", "| lease-gated tasks | ",
		"| key chaos:limit-3 of 3 slot(s) | ", "| key chaos:rate, 5 start(s) per 2s | ", "| queue chaos-paused | "} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown report: no %q in\n%s", want, md.String())
		}
	}
}

// TestChaosFailover is the soak on a primary and a synchronous standby, on one multi-host
// URL: three replicas under load for 25 s, two failovers forced (the second fails back to
// the first primary, rebuilt as the standby by the first), with a kill and a disconnect
// between them, the queue drained, and the new primary's history found to keep every
// guarantee: a synchronous standby loses nothing acknowledged.
func TestChaosFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak of about a minute")
	}
	t.Parallel()
	rep, replicaLogs := runSoak(t, Options{
		Duration:      25 * time.Second,
		Replicas:      3,
		FaultInterval: 2 * time.Second,
		Standby:       StandbySync,
		Forced:        []Kind{KindFailover, KindKill, KindDisconnect, KindFailover},
		Seed:          1,
	})
	if !rep.OK() {
		soakFailed(t, rep, replicaLogs)
	}
	counts := rep.FaultCounts()
	if counts[KindFailover] < 2 || rep.Failovers != counts[KindFailover] || counts[KindDBRestart] != 0 {
		t.Errorf("faults %v, %d failover(s) recorded; want at least 2 failovers, one recorded each, and no db-restart", counts, rep.Failovers)
	}
	if rep.FailoverGrant.Samples != rep.Failovers {
		t.Errorf("the wait for the first lease after a failover measured %d time(s), want once per failover (%d)",
			rep.FailoverGrant.Samples, rep.Failovers)
	}
	if rep.TasksDone == 0 || rep.TasksUnfinished != 0 || !rep.Drained {
		t.Errorf("%d task(s) done, %d unfinished (drained %v); want some done, none unfinished", rep.TasksDone, rep.TasksUnfinished, rep.Drained)
	}
	if c := rep.Check; c != nil && (c.TasksDone != rep.TasksDone || c.TasksDead != rep.TasksDead) {
		t.Errorf("checker: done %d, dead %d; the soak counted %d, %d", c.TasksDone, c.TasksDead, rep.TasksDone, rep.TasksDead)
	}
	if rep.Check != nil {
		checkFlow(t, rep)
	}
	t.Logf("%d failovers of a synchronous pair; primary death → first lease granted by the new primary: %v; %d violations; tasks: %d done, %d dead, %d unfinished",
		rep.Failovers, rep.FailoverGrant, len(rep.AllViolations()), rep.TasksDone, rep.TasksDead, rep.TasksUnfinished)
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| failover | primary node0 | ", "| failover | primary node1 | ", "| failovers | "} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown report: no %q in\n%s", want, md.String())
		}
	}
}

// checkFlow checks the soak's figures of its key with a rate and its paused queue against
// the checker's: the rate bound (some window of its period held as many starts as it
// allows), the queue was paused both ways, judged, and its tasks all done.
func checkFlow(t *testing.T, rep *Report) {
	t.Helper()
	c := rep.Check
	if i := slices.IndexFunc(c.RateKeys, func(k checker.RateKey) bool { return k.Key == rateKey }); i < 0 {
		t.Errorf("checker: no figures of %s, a key of %d starts per %v: it judged %+v", rateKey, rateStarts, ratePeriod, c.RateKeys)
	} else if k := c.RateKeys[i]; rep.Rate.Done == 0 || k.Rate != rep.Rate.Rate || k.Starts < rep.Rate.Done || k.MostInWindow != rateStarts {
		t.Errorf("%s: the soak counted %+v, the checker %+v; want tasks done, each a start, and a window of %v holding %d starts",
			rateKey, rep.Rate, k, ratePeriod, rateStarts)
	}
	p := rep.PausedQueue
	if p.Pauses < 2 || p.Timed == 0 || p.Timed == p.Pauses || p.Tasks == 0 || p.Done != p.Tasks {
		t.Errorf("%s: %+v; want pauses ended both by their until and by a resume, and every task done", pausedQueue, p)
	}
	if i := slices.IndexFunc(c.PausedQueues, func(q checker.PausedQueue) bool { return q.Queue == pausedQueue }); i < 0 {
		t.Errorf("checker: no figures of %s: it judged %+v", pausedQueue, c.PausedQueues)
	} else if q := c.PausedQueues[i]; q.Pauses != p.Pauses || q.Judged == 0 || q.Starts < p.Done || q.Outside == 0 || q.HeldBack == 0 {
		t.Errorf("%s: the soak counted %+v, the checker %+v; want every pause given to it, some judged, a start per task done, "+
			"some tasks held back by a pause", pausedQueue, p, q)
	}
}

func TestParseKinds(t *testing.T) {
	t.Parallel()
	got, err := ParseKinds(" kill, term,kill,")
	if err != nil || len(got) != 2 || got[0] != KindKill || got[1] != KindTerm {
		t.Errorf("ParseKinds: got %v, %v; want [kill term]", got, err)
	}
	for _, bad := range []string{"", ",", "kill,explode"} {
		if _, err := ParseKinds(bad); err == nil {
			t.Errorf("ParseKinds(%q): nil error, want one", bad)
		}
	}
}

// TestOverlaps checks the lease clients' view of mutual exclusion: a grant that arrives
// while an earlier holder could still believe it holds the resource is a violation.
func TestOverlaps(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	grants := []grant{
		{resource: "r", holder: "a", fence: 1, granted: at(0), until: at(2000)},
		{resource: "r", holder: "b", fence: 3, granted: at(2500), until: at(3000)}, // after a's end: fine
		{resource: "r", holder: "c", fence: 5, granted: at(2900), until: at(4000)}, // b could still hold it
		{resource: "s", holder: "a", fence: 2, granted: at(100), until: at(9000)},
		{resource: "s", holder: "b", fence: 4, granted: at(200), until: at(300)},   // a holds it till 9000
		{resource: "s", holder: "c", fence: 4, granted: at(9500), until: at(9600)}, // a fence granted twice
	}
	vs := overlaps(grants)
	var rules []string
	for _, v := range vs {
		rules = append(rules, v.Rule)
	}
	if got, want := strings.Join(rules, " "), "client-overlap client-overlap client-fence-reuse"; got != want {
		t.Errorf("rules: got %q, want %q\n%v", got, want, vs)
	}
	if len(vs) == 3 && !strings.Contains(vs[0].Detail, "c was granted fence 5") {
		t.Errorf("first violation: %q, want it to name c's fence 5", vs[0].Detail)
	}
}

// lockedBuffer is a buffer the replicas' output goroutines and the test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// bytes returns a copy of all that was written.
func (b *lockedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// soakFailed fails t with the end of the processes' log and then, last so that a
// shortened output keeps them, the soak's violations and problems.
func soakFailed(t *testing.T, rep *Report, replicaLogs *lockedBuffer) {
	t.Helper()
	var why strings.Builder
	for _, v := range rep.AllViolations() {
		fmt.Fprintf(&why, "VIOLATION %s: %s\n", v.Rule, v.Detail)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(&why, "PROBLEM %s\n", p)
	}
	t.Errorf("replica logs (the end):\n%s\nthe soak failed: %d violation(s), %d problem(s), interrupted %v\n%s",
		replicaLogs.tail(40), len(rep.AllViolations()), len(rep.Problems), rep.Interrupted, why.String())
}

// tail returns the last n lines written.
func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.SplitAfter(b.buf.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "")
}
