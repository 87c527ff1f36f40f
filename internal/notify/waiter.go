package notify

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/internal/db"
)

// Errors of Waiter.Register.
var (
	// ErrNotListening: the listener has no LISTEN session now (it is
	// connecting, reconnecting or stopped), so there is nothing to register.
	// Nothing is lost by waiting: once it is connected again every
	// subscriber gets a Resync and catches up.
	ErrNotListening = errors.New("the listener has no LISTEN session")
	// ErrInsertsInFlight: the waiter is registered, so inserts from now on
	// notify, but an insert that may have missed the registration had not
	// committed within BarrierWait (a transaction that inserted tasks and
	// is still open, or a very slow commit). Register again later; until it
	// returns nil the waiter must not rely on notifications alone.
	ErrInsertsInFlight = errors.New("an insert that may have missed the registration is still in flight")
)

// BarrierWait bounds how long Register waits for the inserts in flight to
// commit: an insert in flight normally needs one commit. Inserts made
// meanwhile do not wait for it; they notify without looking.
const BarrierWait = 100 * time.Millisecond

// Waiter is one subscriber's registration as waiting for inserted tasks:
// the insert trigger sends TasksInserted only while some waiter is
// registered (schema/0008). A waiter registers when it is about to sleep
// until tasks arrive and unregisters when it no longer needs to be told.
//
// The protocol that loses no wake-up: subscribe to ChannelTask, Register,
// then read the queue (the catch-up), then sleep until a notification or a
// Resync. Every task inserted after the catch-up's snapshot is notified.
// A registration names the LISTEN session that is up when it is made; when
// the listener reconnects, Registered turns false, and the subscriber
// registers again as part of the catch-up that the Resync asks for.
//
// A Waiter is safe for concurrent use, but each registration is meant to
// have one owner (a dispatcher, a feed): Register and Unregister of one
// Waiter from two goroutines at once undo each other.
type Waiter struct {
	l    *Listener
	name string
	// allChanges: claims and completions notify too (TasksFinished, and
	// "claimed:<ms>" for every claim), not only inserts.
	allChanges bool

	mu sync.Mutex
	// sess is the LISTEN session the waiter's row names; nil when it has
	// none (or it was removed).
	sess *session
	// proven: the barrier has passed since the row was written, so every
	// insert that did not see the row had committed.
	proven bool
}

// Waiter returns a waiter of this listener, not yet registered. name says
// who waits, e.g. "<instance>/workers"; one listener's waiters need
// distinct names.
func (l *Listener) Waiter(name string) *Waiter { return &Waiter{l: l, name: name} }

// ChangesWaiter returns a waiter that, registered, makes not only inserts
// notify but also claims ("claimed:<ms>" for each) and completions
// (TasksFinished), which otherwise notify only when the reaper needs them
// (schema/0009): what a dashboard that shows the queue waits for.
func (l *Listener) ChangesWaiter(name string) *Waiter {
	return &Waiter{l: l, name: name, allChanges: true}
}

// Name returns the waiter's name.
func (w *Waiter) Name() string { return w.name }

// Registered reports whether the waiter is registered for the LISTEN
// session that is up now, and every insert that may have missed the
// registration has committed.
func (w *Waiter) Registered() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.proven && w.sess != nil && w.sess == w.l.session.Load()
}

// Register makes inserts notify this listener from now on. It returns nil
// once the registration names the LISTEN session that is up now and every
// insert that may have missed it has committed: a query made after it
// returns sees every task whose insert does not notify. When the waiter is
// registered already it returns at once.
//
// ErrNotListening means there is no LISTEN session to register; a Resync
// follows the next connect. ErrInsertsInFlight means the registration is
// written but not yet proven; call Register again later.
func (w *Waiter) Register(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.l.session.Load()
	if s == nil {
		return ErrNotListening
	}
	if w.proven && w.sess == s {
		return nil
	}
	err := w.l.control(ctx, func(q *db.Queries) error {
		if w.sess != s {
			if err := q.WaiterRegister(ctx, db.WaiterRegisterParams{Waiter: w.name, ListenerPid: s.pid, AllChanges: w.allChanges}); err != nil {
				return fmt.Errorf("register waiter %q: %w", w.name, err)
			}
			w.sess, w.proven = s, false
		}
		if err := q.WaiterBarrier(ctx, int32(BarrierWait/time.Millisecond)); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
				return fmt.Errorf("waiter %q: %w (waited %s)", w.name, ErrInsertsInFlight, BarrierWait)
			}
			return fmt.Errorf("waiter %q: wait for the inserts in flight: %w", w.name, err)
		}
		w.proven = true
		return nil
	})
	if errors.Is(err, errNotRunning) {
		return ErrNotListening
	}
	return err
}

// UnregisterWithin is Unregister for a caller that only logs a failure:
// bounded by timeout, and not cut short by ctx's cancellation, so that a
// caller shutting down still removes its row. A failure is a debug line: it
// only costs notifications until the row goes with its session.
func (w *Waiter) UnregisterWithin(ctx context.Context, timeout time.Duration) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := w.Unregister(uctx); err != nil {
		w.l.log.Debug().Err(err).Msg("unregistering as a waiter for inserted tasks failed")
	}
}

// Unregister removes the waiter's registration, if any: inserts stop
// notifying on its account. Whatever it returns, the waiter counts as
// unregistered; a row it failed to remove only costs notifications until
// it is removed with its session.
func (w *Waiter) Unregister(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sess == nil {
		return nil
	}
	pid := w.sess.pid
	w.sess, w.proven = nil, false
	err := w.l.control(ctx, func(q *db.Queries) error {
		return q.WaiterUnregister(ctx, db.WaiterUnregisterParams{Waiter: &w.name, ListenerPid: pid})
	})
	if errors.Is(err, errNotRunning) {
		return nil // the listener removed its session's rows as it stopped
	}
	if err != nil {
		return fmt.Errorf("unregister waiter %q: %w", w.name, err)
	}
	return nil
}

// PruneWaiters deletes the registrations whose LISTEN session has ended
// (their process died) and returns how many: until then each only costs a
// notification per insert that nobody needs.
func (l *Listener) PruneWaiters(ctx context.Context) (int64, error) {
	var n int64
	err := l.control(ctx, func(q *db.Queries) error {
		var err error
		n, err = q.WaiterPrune(ctx)
		return err
	})
	if errors.Is(err, errNotRunning) {
		return 0, ErrNotListening
	}
	return n, err
}

// errNotRunning: the listener's Run has not started or has returned.
var errNotRunning = errors.New("the listener is not running")

// control is the session on which the waiters' statements run: the LISTEN
// session itself is busy waiting for notifications. It is opened with the
// listener's connect function when first needed, opened again after it
// broke, and closed when Run returns.
type control struct {
	// sem, a channel of capacity 1, is held by whoever uses the session:
	// unlike a mutex, a caller can give up waiting for it when its ctx ends
	// (a registration may hold it through a reconnect and a barrier).
	sem     chan struct{}
	running bool
	conn    *pgx.Conn
}

// control runs f on the control session. f must be safe to run again: when
// a session that had been idle turns out to be broken (the server
// restarted meanwhile, or cut it off), f runs once more on a new one.
func (l *Listener) control(ctx context.Context, f func(q *db.Queries) error) error {
	select {
	case l.ctl.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for the waiters' session: %w", ctx.Err())
	}
	defer func() { <-l.ctl.sem }()
	if !l.ctl.running {
		return errNotRunning
	}
	for retried := false; ; retried = true {
		fresh := l.ctl.conn == nil
		if fresh {
			conn, err := l.connect(ctx)
			if err != nil {
				return fmt.Errorf("open the waiters' session: %w", err)
			}
			l.ctl.conn = conn
		}
		err := f(db.New(l.ctl.conn))
		var pgErr *pgconn.PgError
		if err == nil || (errors.As(err, &pgErr) && !l.ctl.conn.IsClosed()) {
			return err // the server's answer
		}
		// The session may be broken: the next statement gets a new one.
		l.closeControlConn()
		if fresh || retried || ctx.Err() != nil {
			return err
		}
	}
}

// startControl lets the waiters' statements run: Run has started.
func (l *Listener) startControl() {
	l.ctl.sem <- struct{}{}
	defer func() { <-l.ctl.sem }()
	l.ctl.running = true
}

// stopControl is called as Run returns: it removes the registrations of
// the last LISTEN session, which has ended (inserts need not notify for
// it any more), and closes the control session.
func (l *Listener) stopControl(last *session) {
	l.ctl.sem <- struct{}{}
	defer func() { <-l.ctl.sem }()
	l.ctl.running = false
	if l.ctl.conn == nil {
		return // nothing was registered through this listener
	}
	if last != nil {
		// Briefly: a database that does not answer must not hold up the
		// shutdown, and the rows are pruned once their session has ended.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.New(l.ctl.conn).WaiterUnregister(ctx, db.WaiterUnregisterParams{ListenerPid: last.pid})
		cancel()
		if err != nil {
			// Pruned later, by the next registration or the reaper.
			l.log.Debug().Err(err).Msg("removing the waiters of the ended LISTEN session")
		}
	}
	l.closeControlConn()
}

func (l *Listener) closeControlConn() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.ctl.conn.Close(ctx)
	l.ctl.conn = nil
}
