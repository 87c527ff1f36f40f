package worker

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"
)

// A remote pool's heartbeats are held: each renews the task's lease as it
// arrives, and the service holds its answer up to the heartbeat interval
// (in whole seconds), answering at once, 409 with the task cancelled, when
// the task is cancelled meanwhile. The next is sent as the answer comes,
// so one always waits: a cancellation reaches the handler within a round
// trip, as a pool on the database hears it through LISTEN. The lease's
// deadline still counts from each heartbeat's sending.
const (
	// firstHeldHeartbeat is how long after the claim the first held
	// heartbeat goes: a task that ends sooner costs none (the claim's lease
	// is fresh), and a cancellation meanwhile is heard within this.
	firstHeldHeartbeat = 250 * time.Millisecond
	// HeldHeartbeatGap is the least time between the sends of two held
	// heartbeats: after a 202 that came early (a replica shutting down
	// answers at once until it is gone), the next waits the rest of it.
	HeldHeartbeatGap = 250 * time.Millisecond
)

// heldHeartbeats sends a remote pool's held heartbeats, and plain ones to a
// service that does not hold them (a release before held heartbeats, which
// refuses wait_seconds with a 400).
type heldHeartbeats struct {
	tasks  RemoteTasks
	log    zerolog.Logger
	unheld atomic.Bool
	once   sync.Once
}

// config is how a task of TTL ttl is kept with held heartbeats: one sent
// right after each answer, each held a third of the lease's window (in
// whole seconds), failed ones retried a quarter of that apart; hold is 0
// when that is under a second (a TTL too short to hold one), and then
// heartbeats are plain, every third of the window.
func (h *heldHeartbeats) config(keep lease.KeepConfig) (lease.KeepConfig, time.Duration, time.Duration) {
	interval := keep.Window() / 3
	hold := interval.Truncate(time.Second)
	if hold <= 0 {
		keep.RenewInterval = interval
		return keep, 0, interval
	}
	keep.RenewInterval, keep.RetryInterval = time.Millisecond, interval/4
	return keep, hold, interval
}

// heartbeat sends one heartbeat of t, held for wait (ctx's deadline is the
// lease's).
func (h *heldHeartbeats) heartbeat(ctx context.Context, t task.Task, processor string, wait time.Duration) error {
	if wait > 0 && h.unheld.Load() {
		// The service holds nothing: the wait here, then a heartbeat
		// answered at once. The deadline counts from before the wait,
		// earlier than the service's, as it must.
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		wait = 0
	}
	sent := time.Now()
	_, err := h.tasks.HeartbeatWait(ctx, t.ID, processor, t.Fence, wait)
	if early := HeldHeartbeatGap - time.Since(sent); wait > 0 && err == nil && early > 0 {
		timer := time.NewTimer(early)
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
	if wait > 0 && statusOf(err) == http.StatusBadRequest && strings.Contains(err.Error(), "wait_seconds") {
		h.once.Do(func() {
			h.log.Warn().Err(err).Msg("the service does not take wait_seconds on heartbeats (a release before held heartbeats); " +
				"heartbeating without it: a cancellation reaches a task at its next heartbeat, not at once")
		})
		h.unheld.Store(true)
		return h.heartbeat(ctx, t, processor, wait)
	}
	return err
}

// heldWait is the wait of a task's next held heartbeat: hold, but short
// enough that the answer leaves half an interval before the lease's
// deadline (ctx's), in whole seconds; 0, a heartbeat answered at once, when
// that is under a second (after failed heartbeats).
func heldWait(ctx context.Context, hold, interval time.Duration) time.Duration {
	if hold <= 0 {
		return 0
	}
	if d, ok := ctx.Deadline(); ok {
		hold = min(hold, time.Until(d)-interval/2)
	}
	return max(hold.Truncate(time.Second), 0)
}

// statusOf is the HTTP status an error carries (the library's
// *StatusError has StatusCode), 0 for none.
func statusOf(err error) int {
	var coded interface{ HTTPStatus() int }
	if errors.As(err, &coded) {
		return coded.HTTPStatus()
	}
	return 0
}
