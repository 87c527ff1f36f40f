// Package retention keeps leasehold's tables small under months of load.
// Tasks that ended (done or dead) longer ago than the task retention, and
// lease history older than the lease history retention (the events, and the
// rows of leases released or announced expired that long ago), are deleted
// a small batch at a time, with a pause between batches, by the elected
// reaper (internal/reaper runs a Pruner while it holds its lease).
//
// What may be deleted is decided in the database, by the functions of
// schema/0007_retention.sql, which run as the tables' owner: the runtime
// role has no DELETE. They never delete a live lease or an unfinished task,
// nor anything younger than MinAge. A deleted lease row never lets a fence
// go backwards: every fence comes from one sequence.
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

// PruneTasks deletes up to batch tasks that ended (done or dead) more than
// age ago, oldest first, and returns how many it deleted.
func (s *Store) PruneTasks(ctx context.Context, age time.Duration, batch int32) (int64, error) {
	n, err := s.q.RetentionPruneTasks(ctx, db.RetentionPruneTasksParams{AgeSeconds: age.Seconds(), BatchSize: batch})
	if err != nil {
		return 0, fmt.Errorf("prune tasks: %w", err)
	}
	return n, nil
}

// PruneLeaseEvents deletes up to batch lease events recorded more than age
// ago, oldest first, and returns how many it deleted.
func (s *Store) PruneLeaseEvents(ctx context.Context, age time.Duration, batch int32) (int64, error) {
	n, err := s.q.RetentionPruneLeaseEvents(ctx, db.RetentionPruneLeaseEventsParams{AgeSeconds: age.Seconds(), BatchSize: batch})
	if err != nil {
		return 0, fmt.Errorf("prune lease events: %w", err)
	}
	return n, nil
}

// PruneLeases deletes up to batch rows of leases released, or announced
// expired, more than age ago, oldest first, and returns how many it
// deleted. A live lease is never deleted, however old.
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
	// leases, are kept; 0 keeps them forever.
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
	Tasks       int64
	Leases      int64
	LeaseEvents int64
	// Batches is the statements the round ran.
	Batches int
	// More is true when the round stopped at its bound with a batch that
	// came back full: there is more to delete, and the next round starts
	// at once.
	More bool
}

// Total is the rows deleted.
func (c Counts) Total() int64 { return c.Tasks + c.Leases + c.LeaseEvents }

// Pruner deletes what its Config no longer keeps, a round every Interval.
// Run it only where one replica at a time should: the reaper does, while it
// holds the reaper lease. (Two at once would be harmless, only wasteful.)
type Pruner struct {
	Store  *Store
	Config Config
	Log    zerolog.Logger
	// Pruned, if set, is called after each round that did not fail.
	Pruned func(Counts)
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
				Int("batches", counts.Batches).Bool("more", counts.More).Dur("took", time.Since(started)).
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
				Dur("retry_in", wait).Msg("pruning failed; retrying")
		}
		timer.Reset(wait)
	}
}

// Round deletes, a batch at a time with a pause between batches, the
// finished tasks and then the lease rows and events that the Config no
// longer keeps, until a batch comes back short or the round reaches its
// bound. It returns what it deleted, also when it fails part way.
func (p *Pruner) Round(ctx context.Context) (Counts, error) {
	if err := p.Config.Validate(); err != nil {
		return Counts{}, err
	}
	c := p.Config.withDefaults()
	var counts Counts
	kinds := []struct {
		age   time.Duration
		prune func(context.Context, time.Duration, int32) (int64, error)
		n     *int64
	}{
		{c.TaskAge, p.Store.PruneTasks, &counts.Tasks},
		{c.LeaseHistoryAge, p.Store.PruneLeases, &counts.Leases},
		{c.LeaseHistoryAge, p.Store.PruneLeaseEvents, &counts.LeaseEvents},
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
			n, err := k.prune(ctx, k.age, c.Batch)
			counts.Batches++
			*k.n += n
			if err != nil {
				return counts, err
			}
			if n < int64(c.Batch) {
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
