package scheduler

import (
	"context"
	"time"
)

// Enqueue is the scheduler's fenced enqueue of one tick, for the tests:
// ok reports whether the compare-and-set held.
func Enqueue(ctx context.Context, s *Store, holder string, fence int64, name string, expect, tick, next time.Time) (bool, error) {
	cur, err := s.Get(ctx, name)
	if err != nil {
		return false, err
	}
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT id FROM schedules WHERE name = $1`, cur.Name).Scan(&id); err != nil {
		return false, err
	}
	res, err := s.enqueue(ctx, holder, fence, id, expect, tick, next, 0)
	return res.ok, err
}
