package taskstore

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/task"
)

// PauseQueue pauses queue: its pending tasks are not claimed until it is
// resumed, or until until when it is not zero. Its running tasks finish.
// Pausing a paused queue replaces its until and reason.
func (s *Store) PauseQueue(ctx context.Context, queue string, until time.Time, reason string) (task.QueuePause, error) {
	p := db.QueuePauseParams{Queue: queue, Reason: reason}
	if !until.IsZero() {
		p.Until = &until
	}
	r, err := s.q.QueuePause(ctx, p)
	if err != nil {
		return task.QueuePause{}, fmt.Errorf("pause the queue %s: %w", queue, err)
	}
	return task.QueuePause(r), nil
}

// ResumeQueue lifts queue's pause and wakes the claimers at once; false
// when it was not paused.
func (s *Store) ResumeQueue(ctx context.Context, queue string) (bool, error) {
	resumed, err := s.q.QueueResume(ctx, queue)
	if err != nil {
		return false, fmt.Errorf("resume the queue %s: %w", queue, err)
	}
	return resumed, nil
}

// PausedQueues returns the queues paused now, in name order.
func (s *Store) PausedQueues(ctx context.Context) ([]task.QueuePause, error) {
	rows, err := s.q.QueuePauses(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the paused queues: %w", err)
	}
	out := make([]task.QueuePause, len(rows))
	for i, r := range rows {
		out[i] = task.QueuePause(r)
	}
	return out, nil
}
