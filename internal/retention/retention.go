// Package retention keeps leasehold's tables small under months of load.
// Tasks that ended (done or dead) longer ago than the task retention, each
// with its lease row, and lease history older than the lease history
// retention (the events, and the rows of other leases released or
// announced expired that long ago), are deleted a small batch at a time,
// with a pause between batches, by the elected reaper (internal/reaper runs
// a Pruner while it holds its lease).
//
// What may be deleted is decided in the database, by the functions of
// schema/0007_retention.sql, which run as the tables' owner: the runtime
// role has no DELETE. They never delete a live lease, an expiry not yet
// announced or an unfinished task, nor anything younger than MinAge. A
// deleted lease row never lets a fence go backwards: every fence comes from
// one sequence. They need no index that a task's claim, heartbeat,
// completion or lease events would have to keep up: tasks and lease events
// are walked through by id (see walk).
package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/db"
)

// Defaults and bounds of a Config.
const (
	// DefaultAge is how long finished tasks and lease history are kept by
	// default: a week.
	DefaultAge = 7 * 24 * time.Hour
	// MinAge is the shortest retention the database accepts (0 aside,
	// which keeps rows forever): see schema/0007_retention.sql.
	MinAge = time.Minute
	// DefaultBatch is the rows deleted per statement by default.
	DefaultBatch = 1000
	// MaxBatch is the most rows one statement may delete.
	MaxBatch = 10000
	// DefaultPause is the wait between two batches by default, so that
	// pruning a backlog takes turns with the hot path instead of competing.
	DefaultPause = 100 * time.Millisecond
	// DefaultInterval is the wait between two rounds by default.
	DefaultInterval = time.Minute
)

// maxBatchesPerRound bounds a round, so that a backlog is logged as it
// goes: a round that stopped there starts the next one at once.
const maxBatchesPerRound = 100

// Store deletes old rows through the database's retention functions.
type Store struct {
	q *db.Queries
}

// NewStore returns a store on the pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{q: db.New(pool)} }

// Step is what one call of a walk through tasks or lease events did.
type Step struct {
	// Pruned is the rows deleted: tasks, or lease events.
	Pruned int64
	// Leases is the lease rows deleted with their tasks.
	Leases int64
	// LastID is where the walk stands: the next call goes on after it.
	LastID int64
	// Done says the walk is over: it reached the table's end, or rows too
	// young to prune, just after LastID.
	Done bool
	// Kept is the ids of the tasks looked at and kept (unfinished, ended
	// too recently, or their lease not over), in order: the next walk
	// looks at them again. None from LastID on.
	Kept []int64
}

// PruneTasks looks at the next batch tasks after afterID, in id order, and
// deletes those that ended (done or dead) more than age ago, each with its
// lease row. A task whose lease row is live, or whose expiry is not
// announced yet, is kept.
func (s *Store) PruneTasks(ctx context.Context, age time.Duration, batch int32, afterID int64) (Step, error) {
	return s.pruneTasks(ctx, db.RetentionPruneTasksParams{AgeSeconds: age.Seconds(), BatchSize: batch, AfterID: afterID})
}

// PruneTaskIDs is PruneTasks for the tasks of ids (at most MaxBatch), the
// ones an earlier walk kept. LastID and Done say nothing.
func (s *Store) PruneTaskIDs(ctx context.Context, age time.Duration, ids []int64) (Step, error) {
	if len(ids) > MaxBatch {
		return Step{}, fmt.Errorf("prune tasks: %d ids are more than %d: pass at most %d at a time", len(ids), MaxBatch, MaxBatch)
	}
	if ids == nil {
		ids = []int64{} // not NULL, which means "walk on after the cursor"
	}
	return s.pruneTasks(ctx, db.RetentionPruneTasksParams{AgeSeconds: age.Seconds(), BatchSize: int32(max(len(ids), 1)), Ids: ids})
}

func (s *Store) pruneTasks(ctx context.Context, arg db.RetentionPruneTasksParams) (Step, error) {
	r, err := s.q.RetentionPruneTasks(ctx, arg)
	if err != nil {
		return Step{}, fmt.Errorf("prune tasks: %w", err)
	}
	return Step{Pruned: r.PrunedTasks, Leases: r.PrunedLeases, LastID: r.LastID, Done: r.Done, Kept: r.Kept}, nil
}

// PruneLeaseEvents looks at the next batch lease events after afterID, in
// id order, and deletes those recorded more than age ago.
func (s *Store) PruneLeaseEvents(ctx context.Context, age time.Duration, batch int32, afterID int64) (Step, error) {
	r, err := s.q.RetentionPruneLeaseEvents(ctx, db.RetentionPruneLeaseEventsParams{AgeSeconds: age.Seconds(), BatchSize: batch, AfterID: afterID})
	if err != nil {
		return Step{}, fmt.Errorf("prune lease events: %w", err)
	}
	return Step{Pruned: r.Pruned, LastID: r.LastID, Done: r.Done}, nil
}

// PruneLeases deletes up to batch rows of leases other than tasks'
// released, or announced expired, more than age ago, oldest first, and
// returns how many it deleted. A live lease is never deleted, however old;
// a task's lease row goes with its task (PruneTasks).
func (s *Store) PruneLeases(ctx context.Context, age time.Duration, batch int32) (int64, error) {
	n, err := s.q.RetentionPruneLeases(ctx, db.RetentionPruneLeasesParams{AgeSeconds: age.Seconds(), BatchSize: batch})
	if err != nil {
		return 0, fmt.Errorf("prune leases: %w", err)
	}
	return n, nil
}

// Config says what to keep and how fast to prune. Zero values of Batch,
// Pause and Interval mean their defaults.
type Config struct {
	// TaskAge is how long a finished task is kept; 0 keeps it forever.
	TaskAge time.Duration
	// LeaseHistoryAge is how long lease events, and the rows of ended
	// leases, are kept; 0 keeps them forever. A task's lease row is the
	// task's: it goes with the task, under TaskAge.
	LeaseHistoryAge time.Duration
	Batch           int32         // rows per statement, 1..MaxBatch
	Pause           time.Duration // between two batches
	Interval        time.Duration // between two rounds
}

// Validate says what is wrong with c, if anything, and how to fix it.
func (c Config) Validate() error {
	for _, a := range []struct {
		name string
		age  time.Duration
	}{{"task retention", c.TaskAge}, {"lease history retention", c.LeaseHistoryAge}} {
		if err := ValidateAge(a.age); err != nil {
			return fmt.Errorf("%s: %w", a.name, err)
		}
	}
	switch {
	case c.Batch < 0 || c.Batch > MaxBatch:
		return fmt.Errorf("retention batch %d must be between 1 and %d rows (0 for %d)", c.Batch, MaxBatch, DefaultBatch)
	case c.Pause < 0:
		return fmt.Errorf("retention pause %s must not be negative", c.Pause)
	case c.Interval < 0:
		return fmt.Errorf("retention interval %s must not be negative", c.Interval)
	}
	return nil
}

// ValidateAge accepts 0 (keep forever) and ages of at least MinAge.
func ValidateAge(age time.Duration) error {
	if age != 0 && age < MinAge {
		return fmt.Errorf("%s must be 0 (keep forever) or at least %s", age, MinAge)
	}
	return nil
}

// Enabled reports whether c prunes anything at all.
func (c Config) Enabled() bool { return c.TaskAge > 0 || c.LeaseHistoryAge > 0 }

func (c Config) withDefaults() Config {
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Pause == 0 {
		c.Pause = DefaultPause
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	return c
}

// Counts is what one round deleted.
type Counts struct {
	Tasks int64
	// Leases is the lease rows deleted: those of the tasks deleted, and
	// those of other leases that ended.
	Leases      int64
	LeaseEvents int64
	// Batches is the statements the round ran.
	Batches int
	// More is true when the round stopped at its bound before it was
	// through: there is more to look at, and the next round goes on from
	// there at once.
	More bool
}

// Total is the rows deleted.
func (c Counts) Total() int64 { return c.Tasks + c.Leases + c.LeaseEvents }

// Pruner deletes what its Config no longer keeps, a round every Interval.
// Run it only where one replica at a time should: the reaper does, while it
// holds the reaper lease. (Two at once would be harmless, only wasteful.)
// A Pruner runs one round at a time: Run and Round must not be called
// concurrently.
type Pruner struct {
	Store  *Store
	Config Config
	Log    zerolog.Logger
	// Pruned, if set, is called after each round that did not fail.
	Pruned func(Counts)

	// Where the walks through tasks and lease events stand, between rounds.
	tasks, events walk
}

// Run prunes at once, then every Interval (at once again while a round
// ended with more to do), until ctx ends. It logs one line per round that
// deleted something. It returns an error only for an invalid Config.
func (p *Pruner) Run(ctx context.Context) error {
	if err := p.Config.Validate(); err != nil {
		return err
	}
	c := p.Config.withDefaults()
	if !c.Enabled() {
		return nil
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	failing := false // the last round failed: say so once, not every round
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		started := time.Now()
		counts, err := p.Round(ctx)
		wait := c.Interval
		switch {
		case err == nil:
			if failing {
				p.Log.Info().Msg("pruning again")
			}
			failing = false
			ev := p.Log.Debug()
			if counts.Total() > 0 {
				ev = p.Log.Info()
			}
			ev.Int64("tasks", counts.Tasks).Int64("leases", counts.Leases).Int64("lease_events", counts.LeaseEvents).
				Int("batches", counts.Batches).Bool("more", counts.More).Stringer("took", time.Since(started)).
				Msg("pruned old tasks and lease history")
			if p.Pruned != nil {
				p.Pruned(counts)
			}
			if counts.More {
				wait = c.Pause
			}
		case ctx.Err() != nil:
			return nil
		default:
			ev := p.Log.Debug()
			if !failing {
				ev = p.Log.Warn()
			}
			failing = true
			ev.Err(err).Int64("tasks", counts.Tasks).Int64("leases", counts.Leases).Int64("lease_events", counts.LeaseEvents).
				Stringer("retry_in", wait).Msg("pruning failed; retrying")
		}
		timer.Reset(wait)
	}
}

// Round deletes, a batch at a time with a pause between batches, the
// finished tasks (with their lease rows), the other lease rows and the
// lease events that the Config no longer keeps, until it is through with
// each or reaches its bound. Tasks and lease events are walked through in
// id order (see walk); a round goes on with the walk the last one left
// unfinished. It returns what it deleted, also when it fails part way.
func (p *Pruner) Round(ctx context.Context) (Counts, error) {
	if err := p.Config.Validate(); err != nil {
		return Counts{}, err
	}
	c := p.Config.withDefaults()
	var counts Counts
	kinds := []struct {
		age time.Duration
		// step makes one call and says whether this kind is through.
		step func(context.Context) (bool, error)
	}{
		{c.TaskAge, func(ctx context.Context) (bool, error) {
			s, done, err := p.tasks.step(ctx, c.Batch,
				func(ctx context.Context, after int64) (Step, error) {
					return p.Store.PruneTasks(ctx, c.TaskAge, c.Batch, after)
				},
				func(ctx context.Context, ids []int64) (Step, error) {
					return p.Store.PruneTaskIDs(ctx, c.TaskAge, ids)
				})
			counts.Tasks += s.Pruned
			counts.Leases += s.Leases
			return done, err
		}},
		{c.LeaseHistoryAge, func(ctx context.Context) (bool, error) {
			n, err := p.Store.PruneLeases(ctx, c.LeaseHistoryAge, c.Batch)
			counts.Leases += n
			return n < int64(c.Batch), err
		}},
		{c.LeaseHistoryAge, func(ctx context.Context) (bool, error) {
			s, done, err := p.events.step(ctx, c.Batch,
				func(ctx context.Context, after int64) (Step, error) {
					return p.Store.PruneLeaseEvents(ctx, c.LeaseHistoryAge, c.Batch, after)
				}, nil)
			counts.LeaseEvents += s.Pruned
			return done, err
		}},
	}
	for _, k := range kinds {
		if k.age == 0 {
			continue
		}
		for i := 0; ; i++ {
			if counts.Batches > 0 {
				if err := pause(ctx, c.Pause); err != nil {
					return counts, err
				}
			}
			done, err := k.step(ctx)
			counts.Batches++
			if err != nil {
				return counts, err
			}
			if done {
				break
			}
			if i+1 == maxBatchesPerRound {
				counts.More = true
				break
			}
		}
	}
	return counts, nil
}

// A walk goes through tasks or lease events in id order, a batch per
// call, and deletes what is old enough, up to the rows too young to prune
// (see schema/0007_retention.sql). It may span rounds. It first looks
// again, by id, at the tasks the last walk kept (old tasks still pending
// or running, say), then goes on after where the last walk stopped: the
// rows it deleted are not read again, so a walk costs what it keeps and
// what it deletes, however many deleted rows' index entries wait for
// VACUUM. Now and then (fullWalkEvery) a walk starts from the first row
// instead, to find rows whose insert had not committed when a walk went
// past them.
type walk struct {
	running bool
	after   int64     // the cursor: the walk goes on after this id
	recheck []int64   // ids the last walk kept, still to look at again
	kept    []int64   // ids this walk kept so far
	last    []int64   // ids the last walk kept
	spilled bool      // this walk kept more than maxKept ids: the next starts from the first row
	full    time.Time // when the last walk from the first row began
}

// fullWalkEvery is how often a walk starts from the first row.
const fullWalkEvery = time.Hour

// maxKept bounds the ids a walk remembers (8 bytes each). A walk that
// keeps more, such as one over millions of tasks scheduled far ahead,
// remembers none, and the next walk starts from the first row.
const maxKept = 1 << 20

// step makes one call of the walk: on a batch of the ids the last walk
// kept (again, nil where nothing is ever kept but for its age), or else
// on the next batch after the cursor (next). It says whether the walk is
// over.
func (w *walk) step(ctx context.Context, batch int32,
	next func(context.Context, int64) (Step, error), again func(context.Context, []int64) (Step, error),
) (Step, bool, error) {
	if !w.running {
		w.begin(time.Now())
	}
	if len(w.recheck) > 0 && again != nil {
		ids := w.recheck[:min(len(w.recheck), int(batch))]
		s, err := again(ctx, ids)
		if err != nil {
			return s, false, err
		}
		w.recheck = w.recheck[len(ids):]
		w.keep(s.Kept)
		return s, false, nil
	}
	s, err := next(ctx, w.after)
	if err != nil {
		return s, false, err
	}
	w.after = s.LastID
	w.keep(s.Kept)
	if s.Done {
		w.running, w.last, w.kept = false, w.kept, nil
	}
	return s, s.Done, nil
}

// begin starts a walk: from the first row when one is due, or else with
// the ids the last walk kept, then on after where it stopped.
func (w *walk) begin(now time.Time) {
	w.running, w.kept = true, nil
	if w.full.IsZero() || now.Sub(w.full) >= fullWalkEvery || w.spilled {
		w.after, w.recheck, w.last, w.spilled, w.full = 0, nil, nil, false, now
		return
	}
	w.recheck = w.last
}

func (w *walk) keep(ids []int64) {
	if w.spilled {
		return
	}
	if len(w.kept)+len(ids) > maxKept {
		w.spilled, w.kept = true, nil
		return
	}
	w.kept = append(w.kept, ids...)
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
