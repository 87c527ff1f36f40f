// Package hub streams leasehold's state to browsers over websockets
// (the /ws protocol, docs/reference/websocket.md): a snapshot on connect, then one message
// per change.
//
// The changes come from PostgreSQL's NOTIFY through the process's single
// LISTEN connection, never from this process's memory, so every replica
// streams the same truth. The shape is gorilla/websocket's chat example:
//
//	listener ──▶ feed goroutine ──frames──▶ hub goroutine ──send chan──▶ write pump ──▶ browser
//	             (debounce, DB reads,        (owns the client set;       (only writer)
//	              encode once)                never waits on a client)   read pump (only reader)
//
// The feed reads the database and encodes each message once; the hub hands
// the same prepared frame to every client without blocking: a client whose
// send buffer is full is dropped (closed with 1008) and reconnects for a
// fresh snapshot. When Run's context ends every client gets a close frame
// (1001) and Run returns once all their goroutines have exited.
package hub

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/notify"
)

// DefaultSendBuffer is the messages a client may fall behind by before it is
// dropped, when Deps.SendBuffer is zero.
const DefaultSendBuffer = 256

// Deps is what the hub needs.
type Deps struct {
	Leases    *leasestore.Store
	Tasks     *taskstore.Store
	Generator *demo.State
	Instances *instance.Store
	// Listener is the process's LISTEN connection, listening on
	// notify.ChannelLease, ChannelTask, ChannelGenerator and
	// ChannelSchedule.
	Listener *notify.Listener
	// Instance is this replica's id, sent as the snapshot's this_instance.
	Instance string
	// AllowedOrigins are the origins ("https://dash.example.com") allowed to
	// open /ws besides the server's own; any other cross-origin upgrade is
	// refused with 403.
	AllowedOrigins []string
	// SendBuffer bounds each client's queue of messages; zero means
	// DefaultSendBuffer.
	SendBuffer int
	Log        zerolog.Logger
	// NotifyLag, if set, is called with the delay from each lease change
	// the feed was notified of to the notification's arrival: the change's
	// time as its event records it (the database clock) to the arrival (this
	// process's clock), so a skew between the two clocks shifts it. Called
	// from the feed's goroutine; it must be quick.
	NotifyLag func(lag time.Duration)
}

// Hub keeps the websocket clients of one replica and feeds them.
type Hub struct {
	d        Deps
	upgrader websocket.Upgrader
	allowed  map[string]bool // normalized AllowedOrigins

	register   chan *client
	unregister chan *client
	frames     chan frame    // from the feed to the hub goroutine
	snapshotMe chan struct{} // capacity 1: clients are waiting for a snapshot
	done       chan struct{} // closed when the hub goroutine has exited

	mu      sync.Mutex // guards closed and the Add side of pumps
	closed  bool
	pumps   sync.WaitGroup // every client's read and write pump
	clients atomic.Int64
	running atomic.Bool
}

// frame is one encoded message on its way to the clients.
type frame struct {
	msg *websocket.PreparedMessage
	// snapshot frames go to the clients still waiting for their first
	// message, all other frames to the rest. A snapshot frame with a nil msg
	// means the snapshot failed: the waiting clients are closed.
	snapshot bool
}

// New returns a hub; Run feeds it.
func New(d Deps) *Hub {
	if d.SendBuffer <= 0 {
		d.SendBuffer = DefaultSendBuffer
	}
	d.Log = d.Log.With().Str("component", "hub").Logger()
	h := &Hub{
		d:          d,
		allowed:    make(map[string]bool, len(d.AllowedOrigins)),
		register:   make(chan *client),
		unregister: make(chan *client),
		frames:     make(chan frame),
		snapshotMe: make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	for _, o := range d.AllowedOrigins {
		if n, ok := normalizeOrigin(o); ok {
			h.allowed[n] = true
		}
	}
	h.upgrader = websocket.Upgrader{
		ReadBufferSize:  1024,
		WriteBufferSize: 4096,
		// ServeWS checks the origin itself, before upgrading, so that a
		// refusal is a JSON 403 like every other error of the API.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	return h
}

// Clients returns the number of connected clients.
func (h *Hub) Clients() int { return int(h.clients.Load()) }

// Run feeds the clients until ctx ends, then closes every client with a
// close frame (1001, going away) and returns once all the hub's goroutines
// have exited. It returns an error only when called twice.
func (h *Hub) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errors.New("hub: Run called twice")
	}
	var feedDone sync.WaitGroup
	f := newFeed(h)
	feedDone.Go(func() { f.run(ctx) })

	h.loop(ctx)

	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	close(h.done)
	feedDone.Wait()
	h.pumps.Wait()
	return nil
}

// loop is the hub goroutine: the only one to touch the client set.
func (h *Hub) loop(ctx context.Context) {
	clients := make(map[*client]bool) // client → has had its snapshot
	drop := func(c *client, code int, text string) {
		if _, ok := clients[c]; !ok {
			return
		}
		delete(clients, c)
		h.clients.Add(-1)
		c.closeCode, c.closeText = code, text
		close(c.send)
	}
	for {
		select {
		case <-ctx.Done():
			for c := range clients {
				drop(c, websocket.CloseGoingAway, "server shutting down")
			}
			return
		case c := <-h.register:
			clients[c] = false
			h.clients.Add(1)
			select {
			case h.snapshotMe <- struct{}{}:
			default:
			}
		case c := <-h.unregister:
			drop(c, websocket.CloseNormalClosure, "")
		case f := <-h.frames:
			for c, ready := range clients {
				if ready == f.snapshot {
					continue
				}
				if f.msg == nil {
					drop(c, websocket.CloseInternalServerErr, "snapshot failed; reconnect")
					continue
				}
				select {
				case c.send <- f.msg:
					clients[c] = true
				default:
					// Never wait on a client: one that cannot keep up
					// reconnects and starts again from a snapshot.
					drop(c, websocket.ClosePolicyViolation, "too slow; reconnect")
				}
			}
		}
	}
}

// broadcast hands f to the hub goroutine; false when the hub has stopped.
func (h *Hub) broadcast(ctx context.Context, f frame) bool {
	select {
	case h.frames <- f:
		return true
	case <-ctx.Done():
		return false
	}
}
