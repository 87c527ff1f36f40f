package leasehold

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/task"
)

// maxPauseReason bounds the reason of a pause, in bytes.
const maxPauseReason = 1000

// PauseQueue pauses queue across every process: its pending tasks are not
// claimed by any worker, embedded or remote, until ResumeQueue, or until
// until when it is not zero; its running tasks finish. Pausing a paused
// queue replaces its until and reason. A queue need not exist to be
// paused: tasks inserted into it wait.
func (c *Client) PauseQueue(ctx context.Context, queue string, until time.Time, reason string) (task.QueuePause, error) {
	if err := checkName("queue", queue); err != nil {
		return task.QueuePause{}, err
	}
	if len(reason) > maxPauseReason {
		return task.QueuePause{}, fmt.Errorf("%w: a pause's reason is %d bytes; at most %d", ErrInvalidArgument, len(reason), maxPauseReason)
	}
	if !until.IsZero() && (until.Year() < 1 || until.Year() > 9999) {
		return task.QueuePause{}, fmt.Errorf("%w: until %s is outside the years 1 to 9999", ErrInvalidArgument, until)
	}
	if c.store != nil {
		return c.store.PauseQueue(ctx, queue, until, reason)
	}
	return restclient.Tasks{C: c.rest}.PauseQueue(ctx, queue, until, reason)
}

// ResumeQueue lifts queue's pause: the workers waiting for its tasks are
// woken at once. False when it was not paused.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (bool, error) {
	if err := checkName("queue", queue); err != nil {
		return false, err
	}
	if c.store != nil {
		return c.store.ResumeQueue(ctx, queue)
	}
	return restclient.Tasks{C: c.rest}.ResumeQueue(ctx, queue)
}

// PausedQueues returns the queues paused now, in name order.
func (c *Client) PausedQueues(ctx context.Context) ([]task.QueuePause, error) {
	if c.store != nil {
		return c.store.PausedQueues(ctx)
	}
	return restclient.Tasks{C: c.rest}.PausedQueues(ctx)
}
