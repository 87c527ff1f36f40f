package hub

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

const (
	// writeWait bounds every write, so a stuck peer cannot hold a write pump.
	writeWait = 10 * time.Second
	// pongWait is how long the peer may stay silent (no pong) before it is
	// taken for gone.
	pongWait = 60 * time.Second
	// pingPeriod is how often the write pump pings; under pongWait.
	pingPeriod = pongWait * 9 / 10
	// maxMessageSize is the read limit: browsers send nothing but control
	// frames, and the text frames they might send are ignored.
	maxMessageSize = 4 << 10
)

// client is one websocket connection.
type client struct {
	h    *Hub
	conn *websocket.Conn
	send chan *websocket.PreparedMessage
	// Set by the hub goroutine before it closes send; read by the write
	// pump after it sees send closed.
	closeCode int
	closeText string
}

// ServeWS upgrades GET /ws to a websocket and streams to it: a snapshot,
// then the changes. A cross-origin request (an Origin header whose host is
// not the request's Host) is refused with 403 unless Deps.AllowedOrigins
// lists its origin. Authentication is the server's job, before this.
func (h *Hub) ServeWS(w http.ResponseWriter, r *http.Request) {
	if !websocket.IsWebSocketUpgrade(r) {
		writeError(w, http.StatusBadRequest, "this is a websocket endpoint; connect with a websocket client")
		return
	}
	if !h.originAllowed(r) {
		writeError(w, http.StatusForbidden, "cross-origin websocket refused: origin "+r.Header.Get("Origin")+" is not allowed; open the dashboard from this server or add the origin to --allowed-origins")
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down; reconnect to another replica")
		return
	}
	h.pumps.Add(2)
	h.mu.Unlock()

	conn, err := h.upgrader.Upgrade(w, r, nil)
	if err != nil {
		// Upgrade has answered the request already.
		h.pumps.Add(-2)
		return
	}
	c := &client{h: h, conn: conn, send: make(chan *websocket.PreparedMessage, h.d.SendBuffer)}
	select {
	case h.register <- c:
	case <-h.done:
		_ = conn.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseGoingAway, "server shutting down"), time.Now().Add(writeWait))
		_ = conn.Close()
		h.pumps.Add(-2)
		return
	}
	go c.writePump()
	go c.readPump()
}

// readPump is the connection's only reader: it answers pings and close
// frames (in gorilla's handlers), keeps the read deadline moving with each
// pong, and discards anything else the browser sends. A message over
// maxMessageSize closes the connection (1009).
func (c *client) readPump() {
	defer c.h.pumps.Done()
	defer func() {
		select {
		case c.h.unregister <- c:
		case <-c.h.done:
		}
		_ = c.conn.Close()
	}()
	c.conn.SetReadLimit(maxMessageSize)
	_ = c.conn.SetReadDeadline(time.Now().Add(pongWait))
	c.conn.SetPongHandler(func(string) error { return c.conn.SetReadDeadline(time.Now().Add(pongWait)) })
	for {
		_, msg, err := c.conn.NextReader()
		if err != nil {
			return
		}
		// Read each message to its end: the read limit counts a message's
		// frames as they are read, and NextReader skips the rest unread,
		// so a message sent in small frames would pass whatever its size.
		if _, err := io.Copy(io.Discard, msg); err != nil {
			return
		}
	}
}

// writePump is the connection's only writer: the queued messages, a ping
// every pingPeriod, and the close frame when the hub lets the client go.
func (c *client) writePump() {
	defer c.h.pumps.Done()
	ticker := time.NewTicker(pingPeriod)
	defer func() {
		ticker.Stop()
		_ = c.conn.Close()
	}()
	for {
		select {
		case msg, ok := <-c.send:
			_ = c.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if !ok {
				data := []byte{}
				if c.closeCode != websocket.CloseNormalClosure || c.closeText != "" {
					data = websocket.FormatCloseMessage(c.closeCode, c.closeText)
				}
				_ = c.conn.WriteMessage(websocket.CloseMessage, data)
				return
			}
			if err := c.conn.WritePreparedMessage(msg); err != nil {
				return
			}
		case <-ticker.C:
			_ = c.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if err := c.conn.WriteMessage(websocket.PingMessage, nil); err != nil {
				return
			}
		}
	}
}

// originAllowed reports whether r may open a websocket: no Origin (not a
// browser), the server's own origin, or one listed in AllowedOrigins.
func (h *Hub) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	n, ok := normalizeOrigin(origin)
	return ok && h.allowed[n]
}

// normalizeOrigin returns scheme://host of origin in lower case.
func normalizeOrigin(origin string) (string, bool) {
	u, err := url.Parse(strings.TrimSpace(origin))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", false
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), true
}

// writeError answers a refused upgrade in the API's error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}
