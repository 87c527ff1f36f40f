package worker_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/task"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/worker"
)

// TestClaimFailuresBackOff: while claims fail (the tasks table is out of
// reach) the dispatcher retries with a doubling wait, warns once and logs
// the retries at debug level; when claims work again it says so and picks
// up the work.
func TestClaimFailuresBackOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	logs := &lockedBuffer{}
	p := e.startPool("p", 1, 5*time.Second, func(p *worker.Pool, _ *replica) {
		p.Log = zerolog.New(logs).Level(zerolog.DebugLevel)
	})
	exec := func(sql string) {
		t.Helper()
		if _, err := e.db.Pool.Exec(e.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}

	exec(`ALTER TABLE tasks RENAME TO tasks_away`)
	from := p.events.len()
	exec(`SELECT pg_notify('leasehold_task', 'inserted')`) // wakes the dispatcher, whose claim fails
	const retries = 3
	for range retries {
		_, i := p.events.waitFor(t, "a round woken to retry", from, func(ev worker.Event) bool {
			return ev.Kind == worker.EventAsleep && ev.Wake&worker.WakeRetry != 0
		})
		from = i + 1
	}
	exec(`ALTER TABLE tasks_away RENAME TO tasks`)
	tk := e.insert(0, sleepTask(0))[0]
	p.events.waitFor(t, "the completion", 0, isTask(worker.EventCompleted, tk.ID))
	p.stop(t)
	if got := e.get(tk.ID); got.State != task.StateDone {
		t.Fatalf("task after the failures: %+v, want done", got)
	}

	var waits []time.Duration
	var warnings, recovered int
	for _, l := range logs.lines(t) {
		switch l.Message {
		case "claim failed; retrying with backoff":
			d, err := time.ParseDuration(l.RetryIn)
			if err != nil {
				t.Fatalf("retry_in %q is not a duration with its unit: %v", l.RetryIn, err)
			}
			waits = append(waits, d)
			if l.Level == "warn" {
				warnings++
			} else if l.Level != "debug" {
				t.Errorf("a retry logged at level %s, want debug", l.Level)
			}
		case "the database answers again; claiming tasks":
			recovered++
		}
	}
	if len(waits) < retries+1 {
		t.Fatalf("logged %d failed claims, want at least %d", len(waits), retries+1)
	}
	for i, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond} {
		if waits[i] != want {
			t.Errorf("retry %d waited %v, want %v: a doubling backoff from 100ms (got %v)", i+1, waits[i], want, waits)
		}
	}
	if warnings != 1 || recovered != 1 {
		t.Errorf("%d warnings and %d recoveries logged for one run of failures, want 1 and 1", warnings, recovered)
	}
}

// lockedBuffer collects a logger's JSON lines for a test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

type logLine struct {
	Level   string `json:"level"`
	Message string `json:"message"`
	RetryIn string `json:"retry_in"` // a duration, with its unit
}

func (b *lockedBuffer) lines(t *testing.T) []logLine {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out
}
