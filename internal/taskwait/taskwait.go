// Package taskwait waits for tasks to finish without polling: any number of
// callers of one process share one subscription to the task channel and
// one registration as a waiter for task changes (notify.ChangesWaiter:
// while it is registered, completions notify), which exists only while
// someone waits. Each caller reads its task again at every change of any
// task, and returns once it is done, dead or cancelled.
package taskwait

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/notify"
	"github.com/leasehold/leasehold/task"
)

// Finished reports whether a task in state s is over: done, dead or
// cancelled.
func Finished(s task.State) bool {
	return s == task.StateDone || s == task.StateDead || s == task.StateCancelled
}

// registerRetry is the pause before a registration that failed is tried
// again (the listener between sessions, inserts in flight).
const registerRetry = 100 * time.Millisecond

// Watcher is the process's wait for finished tasks. Its zero value is not
// usable: set Listener and Name.
type Watcher struct {
	Listener *notify.Listener
	// Name names the registration among the listener's waiters (a number
	// is added: one watch may end while the next starts).
	Name string
	Log  zerolog.Logger

	mu      sync.Mutex
	waiting int
	cur     *watch // while anyone waits
	gen     int
}

// watch is one run of the subscription and the registration, from the
// first waiter to the last.
type watch struct {
	stop  context.CancelFunc
	ready chan struct{} // closed once the registration is proven

	mu      sync.Mutex
	changed chan struct{} // closed at the next change, then replaced
}

// Wait returns get's task once it is finished (Finished), reading it again
// at every change of a task; or ctx's error, with the task as last read.
// get's error ends the wait.
func (w *Watcher) Wait(ctx context.Context, get func(context.Context) (task.Task, error)) (task.Task, error) {
	wt := w.join()
	defer w.leave(wt)
	// Until the registration is proven a completion may not notify: the
	// first read comes after it, so that nothing between is missed.
	select {
	case <-wt.ready:
	case <-ctx.Done():
		return task.Task{}, context.Cause(ctx)
	}
	for {
		changed := wt.next()
		t, err := get(ctx)
		if err != nil || Finished(t.State) {
			return t, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return t, context.Cause(ctx)
		}
	}
}

// join counts a waiter in, starting a watch for the first.
func (w *Watcher) join() *watch {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting++
	if w.cur == nil {
		ctx, stop := context.WithCancel(context.Background())
		w.gen++
		w.cur = &watch{stop: stop, ready: make(chan struct{}), changed: make(chan struct{})}
		go w.cur.run(ctx, w.Listener, fmt.Sprintf("%s/%d", w.Name, w.gen), w.Log)
	}
	return w.cur
}

// leave counts a waiter out, ending the watch after the last.
func (w *Watcher) leave(wt *watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting--
	if w.waiting == 0 && w.cur == wt {
		wt.stop()
		w.cur = nil
	}
}

// next is the channel closed at the next change.
func (wt *watch) next() <-chan struct{} {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	return wt.changed
}

// broadcast wakes every waiter to read its task again.
func (wt *watch) broadcast() {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	close(wt.changed)
	wt.changed = make(chan struct{})
}

// run keeps the registration while ctx lives, and broadcasts every
// notification of a finished or cancelled task and every resync (the
// listener reconnected: notifications may have been lost, so every waiter
// reads again once registered anew).
func (wt *watch) run(ctx context.Context, l *notify.Listener, name string, log zerolog.Logger) {
	sub := l.Subscribe(notify.ChannelTask, 256)
	defer sub.Close()
	reg := l.ChangesWaiter(name)
	defer reg.UnregisterWithin(ctx, 5*time.Second)
	proven := false
	for {
		if !reg.Registered() {
			err := reg.Register(ctx)
			switch {
			case err == nil:
				if !proven {
					proven = true
					close(wt.ready)
				} else {
					wt.broadcast()
				}
			case ctx.Err() != nil:
				return
			case !errors.Is(err, notify.ErrNotListening) && !errors.Is(err, notify.ErrInsertsInFlight):
				log.Warn().Err(err).Msg("task waits: could not register for task changes; trying again")
			}
		}
		var (
			retry <-chan time.Time
			timer *time.Timer
		)
		if !reg.Registered() {
			timer = time.NewTimer(registerRetry)
			retry = timer.C
		}
		select {
		case <-ctx.Done():
		case n := <-sub.C():
			if _, cancelled := notify.ParseCancelled(n.Payload); proven && (n.Payload == notify.TasksFinished || cancelled) {
				wt.broadcast()
			}
		case <-sub.Resync():
			if proven {
				wt.broadcast()
			}
		case <-retry:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}
