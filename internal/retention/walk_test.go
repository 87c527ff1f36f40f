package retention

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// TestWalkFromTheFirstRowNowAndThen: a walk goes on after where the last
// one stopped, so a row it went past before the row's insert committed is
// found only by a walk from the first row, which is due every
// fullWalkEvery.
func TestWalkFromTheFirstRowNowAndThen(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tdb := pgtest.New(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := tdb.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	old := `'{}', 'done', now() - interval '30 days', now() - interval '8 days'`
	exec(`INSERT INTO tasks (id, task_data, state, created_at, processed_at) OVERRIDING SYSTEM VALUE
		VALUES (1, ` + old + `), (3, ` + old + `)`)
	p := &Pruner{Store: NewStore(tdb.Pool), Config: Config{TaskAge: DefaultAge, Pause: time.Millisecond}}
	round := func(want int64) {
		t.Helper()
		c, err := p.Round(ctx)
		if err != nil || c.Tasks != want {
			t.Fatalf("round: %+v, %v; want %d tasks", c, err, want)
		}
	}
	round(2)

	// Task 2 commits only now, long after it was given its id.
	exec(`INSERT INTO tasks (id, task_data, state, created_at, processed_at) OVERRIDING SYSTEM VALUE VALUES (2, ` + old + `)`)
	round(0) // on after task 3
	p.tasks.full = p.tasks.full.Add(-fullWalkEvery)
	round(1) // from the first row
}
