// Package notify keeps the one LISTEN connection of a leasehold process and
// fans its notifications out to in-process subscribers.
//
// NOTIFY is a hint, never the data: a subscriber that is woken reads the
// truth from the database. Notifications sent while the connection was down
// are lost, so after every (re)connect each subscriber gets a Resync signal
// and runs its catch-up query; a subscriber too slow to take a notification
// gets the same signal instead of blocking the listener.
//
// Inserted tasks are announced only while someone waits for them
// (schema/0008): a subscriber that is about to sleep until tasks arrive
// registers a Waiter first, and catches up once it is registered.
package notify

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/db"
)

// The channels leasehold's triggers notify on.
const (
	ChannelLease     = "leasehold_lease"     // every lease change: lease.Change JSON
	ChannelTask      = "leasehold_task"      // what statements did to tasks: TasksInserted, TasksRequeued, TasksFinished, "claimed:<ms>", "cancelled:<id>"
	ChannelGenerator = "leasehold_generator" // the generator switch: "STARTED" or "STOPPED"
	ChannelSchedule  = "leasehold_schedule"  // schedules: "changed:<name>" (added, replaced, removed), "ticked:<name>"
)

// Notification is one notification as received.
type Notification struct {
	Channel string
	Payload string
	// Received is when the notification arrived from the server, by this
	// process's clock: a subscriber that reads when the change happened
	// (by the database clock) measures the delivery lag from it.
	Received time.Time
}

// The payloads of ChannelTask, each sent at most once per statement
// (schema/0002, 0006, 0008, 0009, 0011 and 0012). TasksInserted is sent only while some
// Waiter is registered; TasksFinished only while a ChangesWaiter is. A
// claim sends "claimed:<ms>", <ms> the earliest expiry of the new task
// leases in epoch milliseconds (see ParseClaimed), while a ChangesWaiter is
// registered, or when no running task's lease runs out sooner (the
// reaper's wake-up). TasksRequeued is always sent.
const (
	TasksInserted = "inserted" // tasks were inserted, and someone waits for them
	TasksRequeued = "requeued" // tasks went back to pending (failed, handed back, or their lease lapsed): claimable now or after a backoff
	TasksFinished = "finished" // tasks ended done, dead or cancelled, and a ChangesWaiter waits for that
	FlowChanged   = "flow"     // a queue was paused or resumed, a key's limit or rate set: for the dashboards
)

// ParseCancelled returns the id of the running task a "cancelled:<id>"
// payload says was cancelled (schema/0011); ok is false for any other
// payload.
func ParseCancelled(payload string) (id int64, ok bool) {
	v, found := strings.CutPrefix(payload, "cancelled:")
	if !found {
		return 0, false
	}
	id, err := strconv.ParseInt(v, 10, 64)
	return id, err == nil
}

// ParseClaimed returns the earliest expiry of the task leases a claim took,
// from a "claimed:<ms>" payload; ok is false for any other payload.
func ParseClaimed(payload string) (earliest time.Time, ok bool) {
	ms, found := strings.CutPrefix(payload, "claimed:")
	if !found {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// Subscription receives the notifications of one channel.
type Subscription struct {
	channel string
	c       chan Notification
	resync  chan struct{}
	l       *Listener
}

// C delivers the channel's notifications.
func (s *Subscription) C() <-chan Notification { return s.c }

// Resync is signalled (coalesced, capacity 1) after the listener connected
// or reconnected, and whenever a notification had to be dropped because C
// was full: the subscriber may have missed something and must catch up from
// the database.
func (s *Subscription) Resync() <-chan struct{} { return s.resync }

// Close ends the subscription.
func (s *Subscription) Close() {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	delete(s.l.subs[s.channel], s)
}

// Listener owns the process's LISTEN connection.
type Listener struct {
	connect  func(ctx context.Context) (*pgx.Conn, error)
	channels []string
	log      zerolog.Logger

	mu   sync.Mutex
	subs map[string]map[*Subscription]struct{}

	connected  atomic.Bool
	reconnects atomic.Int64
	// session is the LISTEN session now up, nil while there is none: a new
	// value for every connection, so that a Waiter knows whether its
	// registration names the session that listens now.
	session atomic.Pointer[session]
	ctl     control
}

// session is one LISTEN session of the listener.
type session struct {
	pid int32 // its backend pid, as the server reports it
}

// Backoff bounds between reconnect attempts: pgxlisten waits a fixed minute
// by default; leasehold starts at MinReconnectDelay and doubles up to
// MaxReconnectDelay while the database stays unreachable.
const (
	MinReconnectDelay = 100 * time.Millisecond
	MaxReconnectDelay = 5 * time.Second
)

// New returns a listener for the given channels. connect opens a dedicated
// session (not one borrowed from a pool, and not through a transaction-mode
// pooler, where LISTEN does not work): the LISTEN session, and, once a
// Waiter registers, a second one for the waiters' statements. It may be
// called from more than one goroutine.
func New(connect func(ctx context.Context) (*pgx.Conn, error), log zerolog.Logger, channels ...string) *Listener {
	return &Listener{
		connect:  connect,
		channels: channels,
		log:      log.With().Str("component", "listener").Logger(),
		subs:     make(map[string]map[*Subscription]struct{}),
		ctl:      control{sem: make(chan struct{}, 1)},
	}
}

// Subscribe returns a subscription to channel with room for buffer
// notifications. The channel must be one the listener was created with.
func (l *Listener) Subscribe(channel string, buffer int) *Subscription {
	s := &Subscription{channel: channel, c: make(chan Notification, buffer), resync: make(chan struct{}, 1), l: l}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[channel] == nil {
		l.subs[channel] = make(map[*Subscription]struct{})
	}
	l.subs[channel][s] = struct{}{}
	return s
}

// Connected reports whether the LISTEN connection is up.
func (l *Listener) Connected() bool { return l.connected.Load() }

// Reconnects counts the connections made after the first.
func (l *Listener) Reconnects() int64 { return l.reconnects.Load() }

// Run listens until ctx ends, reconnecting with backoff. The loss of the
// connection is logged once as a warning, each failed attempt to get it
// back at debug level, and its return at info level.
func (l *Listener) Run(ctx context.Context) error {
	var failures, unlistened int
	var everConnected, down bool
	var last, next *session // the newest LISTEN session, for the waiters' cleanup; the one connecting
	l.startControl()
	defer func() { l.stopControl(last) }()
	pl := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			l.connected.Store(false)
			l.session.Store(nil)
			if failures > 0 {
				delay := min(MinReconnectDelay<<min(failures-1, 16), MaxReconnectDelay)
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(delay):
				}
			}
			failures++
			unlistened = len(l.channels)
			conn, err := l.connect(ctx)
			if err != nil {
				return nil, err
			}
			// The session's pid, from the server itself (a pooler in
			// session mode reports a key of its own at connect), is what
			// names it in task_waiters.
			pid, err := db.New(conn).WaiterSessionPID(ctx)
			if err != nil {
				_ = conn.Close(ctx)
				return nil, fmt.Errorf("read the session's pid: %w", err)
			}
			next = &session{pid: pid}
			return conn, nil
		},
		LogError: func(ctx context.Context, err error) {
			l.connected.Store(false)
			l.session.Store(nil)
			if ctx.Err() != nil {
				return
			}
			if down {
				l.log.Debug().Err(err).Int("attempts", failures).Msg("listen connection still down; reconnecting with backoff")
				return
			}
			down = true
			l.log.Warn().Err(err).Msg("listen connection lost; reconnecting with backoff")
		},
		// The backoff lives in Connect; pgxlisten's own delay stays out of it.
		ReconnectDelay: -1,
	}
	for _, ch := range l.channels {
		pl.Handle(ch, handler{l: l, onBacklog: func() {
			// pgxlisten calls this once per channel, right after its LISTEN.
			if unlistened--; unlistened > 0 {
				return
			}
			// Every channel is LISTENed now: from here nothing is missed,
			// and waiters may register under this session.
			last = next
			l.session.Store(last)
			if everConnected {
				l.reconnects.Add(1)
			}
			if down {
				l.log.Info().Int("attempts", failures).Msg("listen connection restored")
			}
			failures, down, everConnected = 0, false, true
			l.connected.Store(true)
			l.resyncAll()
		}})
	}
	err := pl.Listen(ctx)
	l.connected.Store(false)
	l.session.Store(nil)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

func (l *Listener) resyncAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, subs := range l.subs {
		for s := range subs {
			signal(s.resync)
		}
	}
}

func (l *Listener) dispatch(n Notification) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[n.Channel] {
		select {
		case s.c <- n:
		default:
			signal(s.resync)
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

type handler struct {
	l         *Listener
	onBacklog func()
}

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.l.dispatch(Notification{Channel: n.Channel, Payload: n.Payload, Received: time.Now()})
	return nil
}

func (h handler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.onBacklog()
	return nil
}
