// Package frontdoor is the demo's front door: one address that spreads requests round-robin
// over the replicas, as a hosting platform's load balancer would.
//
// It is net/http/httputil.ReverseProxy with a transport that picks the replica. A replica that
// refuses the connection (it crashed, or is being restarted) is skipped and the request goes to
// the next one; that is safe for any request, because nothing of it was sent. A replica that
// fails after the request reached it (killed while it read it) may have acted on it, so the
// request goes to the next replica only when repeating it changes nothing: GET, HEAD or
// OPTIONS without a body, as nginx's proxy_next_upstream does; anything else is answered
// with 502. Websocket upgrades pass through (ReverseProxy handles 101 Switching Protocols), and
// every response says which replica answered in the X-Leasehold-Replica header.
package frontdoor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ReplicaHeader is the response header naming the replica that answered.
const ReplicaHeader = "X-Leasehold-Replica"

// Backend is one replica behind the front door. Its address may change (a restarted replica
// may listen on a new port); it is empty while the replica is known to be down, and the
// front door then skips it without trying.
type Backend struct {
	name string
	addr atomic.Pointer[string]
}

// NewBackend returns the replica called name at addr (host:port; empty while it is down).
func NewBackend(name, addr string) *Backend {
	b := &Backend{name: name}
	b.SetAddr(addr)
	return b
}

// Name returns the replica's name, the value of ReplicaHeader on its answers.
func (b *Backend) Name() string { return b.name }

// Addr returns the replica's address, or "" while it is down.
func (b *Backend) Addr() string { return *b.addr.Load() }

// SetAddr sets the replica's address; "" marks it down.
func (b *Backend) SetAddr(addr string) { b.addr.Store(&addr) }

// ErrNoReplica is returned (wrapped) by the transport when no replica accepted the
// connection: the front door answers 502.
var ErrNoReplica = errors.New("no replica is up")

// Proxy is the front door, an http.Handler. Its zero value is not usable: call New.
type Proxy struct {
	backends  []*Backend
	next      atomic.Uint64
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	log       zerolog.Logger
	// quietUntil (unix nanoseconds) ends the span in which a further "no replica is up"
	// is logged at debug: while the replicas start, every request fails alike, and one
	// warning per noReplicaQuiet says so; quieted counts those not warned of.
	quietUntil atomic.Int64
	quieted    atomic.Int64
}

// noReplicaQuiet is how long one "no replica is up" warning stands for the next ones.
const noReplicaQuiet = 5 * time.Second

// New returns a front door over backends, tried in round-robin order. log receives the
// requests that failed.
func New(backends []*Backend, log zerolog.Logger) *Proxy {
	p := &Proxy{
		backends: backends,
		log:      log,
		transport: &http.Transport{
			Proxy: nil, // the replicas are local: never an HTTP_PROXY from the environment
			DialContext: (&net.Dialer{
				// Connecting to a local replica is immediate or refused; a replica that does
				// not accept within this time is skipped like a refusing one.
				Timeout:   2 * time.Second,
				KeepAlive: 30 * time.Second,
			}).DialContext,
			MaxIdleConns:        100,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	p.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The transport puts the replica's address in; the Host header stays the one
			// the client sent, so that a replica's same-origin check of a websocket
			// upgrade sees the origin the browser saw.
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "replica"
			pr.SetXForwarded()
		},
		Transport:    roundRobin{p},
		ErrorHandler: p.writeError,
		ErrorLog:     stdlog.New(logWriter{log}, "", 0),
	}
	return p
}

// ServeHTTP passes the request to the next replica that takes it.
//
// Full duplex: the replica's answer is written back while the transport
// may still be reading the request's body (after the declared length, it
// reads once more to check there is nothing beyond). Without it, writing
// the answer's header closes the inbound body, that last read fails, and
// the transport cuts the connection to the replica in the middle of the
// answer (golang/go#40747); the client then gets a truncated body.
//
// The transport's last read (the one that finds the body's end) may come
// after the answer has been copied, as the handler returns, or not at all
// when the replica answered without reading. Were the server itself to
// find that end after the handler returned (closing the body reads it to
// its end), it would start reading the connection for the next request
// beside its own read, and panic ("invalid concurrent Body.Read call",
// golang/go#68560), losing the kept-alive connection. So before it returns
// the handler waits for a read under way, reads the body to its end, and
// refuses later reads.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_ = http.NewResponseController(w).EnableFullDuplex() // an HTTP/2 writer has it already, and says so
	if r.Body != nil && r.Body != http.NoBody {
		body := &inbound{rc: r.Body}
		defer body.finish(w)
		r.Body = body
	}
	p.proxy.ServeHTTP(w, r)
}

// drainLimit bounds what the handler reads of a body the replica left
// unread; beyond it the connection is closed after the answer.
const drainLimit = 256 << 10

// inbound is a request's body while its handler runs: finish waits for a
// read under way, reads what is left to the end, and makes every later
// read fail, so that the server never meets the body's end once the
// handler has returned. Close does nothing: the server closes the body
// after the handler (see ServeHTTP).
type inbound struct {
	mu       sync.Mutex
	rc       io.ReadCloser
	finished bool
}

func (b *inbound) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.finished {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.rc.Read(p)
}

func (b *inbound) Close() error { return nil }

// finish reads the rest of the body, at most drainLimit bytes: past it,
// http.MaxBytesReader tells the server to close the connection after the
// answer, so it does not look for the next request either.
func (b *inbound) finish(w http.ResponseWriter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finished = true
	_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, b.rc, drainLimit))
}

// CloseIdleConnections closes the kept-alive connections to the replicas.
func (p *Proxy) CloseIdleConnections() { p.transport.CloseIdleConnections() }

// roundRobin is the proxy's transport: it sends each request to the next replica in turn,
// moving on to the one after while replicas refuse the connection.
type roundRobin struct{ p *Proxy }

func (rr roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	p := rr.p
	n := uint64(len(p.backends))
	if n == 0 {
		return nil, fmt.Errorf("%w: the front door has no replicas", ErrNoReplica)
	}
	body := &retryBody{}
	if req.Body != nil {
		body.rc = req.Body
	}
	start := p.next.Add(1) - 1
	var tried []string
	for i := range n {
		b := p.backends[(start+i)%n]
		addr := b.Addr()
		if addr == "" {
			tried = append(tried, b.name+": down")
			continue
		}
		out := req.Clone(req.Context())
		out.URL.Host = addr
		if req.Body != nil {
			out.Body = body
		}
		res, err := p.transport.RoundTrip(out)
		if err == nil {
			res.Header.Set(ReplicaHeader, b.name)
			return res, nil
		}
		resend := (notSent(err) && !body.read.Load()) || (safe(req) && req.Body == nil)
		if !resend || req.Context().Err() != nil {
			return nil, fmt.Errorf("%s at %s: %w", b.name, addr, err)
		}
		tried = append(tried, fmt.Sprintf("%s at %s: %v", b.name, addr, err))
	}
	return nil, fmt.Errorf("%w (%s)", ErrNoReplica, strings.Join(tried, "; "))
}

// notSent reports whether err says that the connection was never made, so that nothing of
// the request reached the replica.
func notSent(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}

// safe reports whether req's method is one that asks for nothing to change, so that it may be
// repeated.
func safe(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

// retryBody lets one request body be offered to several replicas in turn. The transport
// closes a request's body when the connection fails, which would leave nothing for the next
// replica: so Close does nothing (the server closes the inbound body once the handler has
// returned, and a close before would cut the transport's last read of it: see ServeHTTP),
// and read records whether any of the body was consumed, after which the request is never
// sent again.
type retryBody struct {
	rc   io.ReadCloser
	read atomic.Bool
}

func (b *retryBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.rc.Read(p)
}

func (b *retryBody) Close() error { return nil }

// writeError answers a request no replica answered: 502 with the API's error body.
func (p *Proxy) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went away; nobody reads the answer.
		p.log.Debug().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("front door: client gone")
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	var msg string
	if errors.Is(err, ErrNoReplica) {
		msg = "no replica is up to answer (they are starting or restarting); try again in a few seconds"
	} else {
		msg = "the replica failed before it answered; the request may or may not have taken effect, " +
			"check and retry"
	}
	level := zerolog.WarnLevel
	if errors.Is(err, ErrNoReplica) {
		now := time.Now().UnixNano()
		if until := p.quietUntil.Load(); now < until || !p.quietUntil.CompareAndSwap(until, now+int64(noReplicaQuiet)) {
			level = zerolog.DebugLevel
			p.quieted.Add(1)
		}
	}
	ev := p.log.WithLevel(level).Err(err).Str("method", r.Method).Str("path", r.URL.Path)
	if level == zerolog.WarnLevel {
		if n := p.quieted.Swap(0); n > 0 {
			ev = ev.Int64("alike_since_last_warning", n)
		}
	}
	ev.Msg("front door: " + msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// logWriter sends ReverseProxy's own log lines (a failed copy of a response) to the logger.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn().Msg("front door: " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
