package leasehold

import (
	"context"
	"fmt"
	"sync"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/internal/restclient"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/taskwait"
	"github.com/leasehold/leasehold/task"
)

// ListTasksParams narrows ListTasks: a state, a kind, a queue (empty:
// any), and where the page starts.
type ListTasksParams struct {
	State task.State
	Kind  string
	Queue string
	// AfterID starts the page after that id: pass the last id of a page
	// for the next.
	AfterID int64
	// Limit is the most tasks of the page: 1 to 1000, zero for 100.
	Limit int
}

// ListTasks returns a page of tasks in id order, those p selects. A page
// may hold fewer than p.Limit tasks while more follow (a remote client's
// page is bounded in bytes too): page on until an empty page.
func (c *Client) ListTasks(ctx context.Context, p ListTasksParams) ([]*task.Task, error) {
	if p.Limit == 0 {
		p.Limit = 100
	}
	switch {
	case p.Limit < 1 || p.Limit > 1000:
		return nil, fmt.Errorf("%w: Limit %d must be 1 to 1000 (0: 100)", ErrInvalidArgument, p.Limit)
	case p.AfterID < 0:
		return nil, fmt.Errorf("%w: AfterID %d must not be negative", ErrInvalidArgument, p.AfterID)
	case p.State != "" && !validState(p.State):
		return nil, fmt.Errorf("%w: State %q is not a task state; use pending, running, done, dead or cancelled", ErrInvalidArgument, p.State)
	}
	for field, v := range map[string]string{"Kind": p.Kind, "Queue": p.Queue} {
		if v != "" {
			if err := checkName(field, v); err != nil {
				return nil, err
			}
		}
	}
	var (
		ts  []task.Task
		err error
	)
	if c.store != nil {
		lp := taskstore.ListParams{AfterID: p.AfterID, Limit: int32(p.Limit)}
		if p.State != "" {
			lp.States = []string{p.State}
		}
		if p.Kind != "" {
			lp.Kinds = []string{p.Kind}
		}
		if p.Queue != "" {
			lp.Queues = []string{p.Queue}
		}
		ts, err = c.store.List(ctx, lp)
	} else {
		ts, _, err = restclient.Tasks{C: c.rest}.Page(ctx, restclient.ListFilter{
			State: p.State, Kind: p.Kind, Queue: p.Queue, AfterID: p.AfterID, Limit: p.Limit,
		})
	}
	if err != nil {
		return nil, schemaHint(err)
	}
	out := make([]*task.Task, len(ts))
	for i := range ts {
		out[i] = &ts[i]
	}
	return out, nil
}

func validState(s task.State) bool {
	switch s {
	case task.StatePending, task.StateRunning, task.StateDone, task.StateDead, task.StateCancelled:
		return true
	}
	return false
}

// WaitTask returns the task once it is done, dead or cancelled, or ctx's
// error when ctx ends first (bound it with a deadline). It does not poll:
// a client on a pool is woken by NOTIFY (any number of waits of one client
// share one subscription; while some wait, the database notifies every
// completion); a remote client long-polls the service, which waits the same
// way. task.ErrNotFound when there is no such task.
func (c *Client) WaitTask(ctx context.Context, id int64) (*task.Task, error) {
	if id < 1 {
		return nil, fmt.Errorf("%w: task id %d is not positive", ErrInvalidArgument, id)
	}
	var (
		t   task.Task
		err error
	)
	if c.store == nil {
		t, err = restclient.Tasks{C: c.rest}.Wait(ctx, id)
	} else {
		l, done := c.listen()
		defer done()
		t, err = c.waiter(l).Wait(ctx, func(ctx context.Context) (task.Task, error) { return c.store.Get(ctx, id) })
	}
	if err != nil {
		return nil, c.aboutTask(id, err)
	}
	return &t, nil
}

// waits is the client's task watcher, on its current listener.
type waits struct {
	mu sync.Mutex
	w  *taskwait.Watcher
}

// waiter is the client's watcher of finished tasks on l (made anew when
// the listener is: it ends with its last user).
func (c *Client) waiter(l *notify.Listener) *taskwait.Watcher {
	c.waits.mu.Lock()
	defer c.waits.mu.Unlock()
	if c.waits.w == nil || c.waits.w.Listener != l {
		c.waits.w = &taskwait.Watcher{Listener: l, Name: c.cfg.ID + "/task-waits", Log: c.log}
	}
	return c.waits.w
}
