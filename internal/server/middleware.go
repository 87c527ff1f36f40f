package server

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (websockets).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Hijack hands the connection over, as gorilla/websocket's upgrader needs
// (it asserts http.Hijacker rather than unwrapping); the request is logged
// as 101 Switching Protocols.
func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil && s.status == 0 {
		s.status = http.StatusSwitchingProtocols
	}
	return conn, rw, err
}

// logRequests logs one line per request (request id, method, path, route,
// status, duration), at info level but for the probes and the metrics'
// scrapes (debug), and feeds the HTTP metrics.
func logRequests(next http.Handler, log zerolog.Logger, m *Metrics, mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if id == "" || len(id) > 64 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
			id = newRequestID()
		}
		w.Header().Set("X-Request-Id", id)
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		_, route := mux.Handler(r)
		if route == "" {
			route = "unmatched"
		}
		elapsed := time.Since(start)
		m.observeRequest(route, r.Method, rec.status, elapsed)
		ev := log.Info()
		if probeOrScrape(r.URL.Path) {
			// Every few seconds from every load balancer and scraper: the
			// metrics count them; the log says so at debug level only.
			ev = log.Debug()
		}
		ev.
			Str("request_id", id).
			Str("method", r.Method).
			Str("path", r.URL.Path).
			Str("route", route).
			Int("status", rec.status).
			Float64("duration_ms", float64(elapsed.Microseconds())/1000).
			Msg("request")
	})
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recoverPanics answers 500 instead of dropping the connection.
func recoverPanics(next http.Handler, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				log.Error().Interface("panic", v).Str("path", r.URL.Path).Msg("handler panicked")
				encode(w, http.StatusInternalServerError, errorBody{Error: "internal error; the server log has the details"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// requireToken demands a token on /api/* and /ws when the server has
// tokens: "Authorization: Bearer <token>", or the dashboard's session
// cookie (see sessionValue). The token found is the request's principal,
// which the routes check their scopes and prefixes against. Signing in
// (POST /api/session), which checks the token itself, and out are let
// through. The comparison takes the same time whatever the guess; no token
// is ever logged.
func requireToken(next http.Handler, ts tokens) http.Handler {
	if len(ts) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws := r.URL.Path == "/ws"
		if (!strings.HasPrefix(r.URL.Path, "/api/") && !ws) || (r.URL.Path == sessionPath && r.Method != http.MethodGet) {
			next.ServeHTTP(w, r)
			return
		}
		var t *Token
		if scheme, secret, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
			// The scheme name is case-insensitive (RFC 9110 §11.1).
			t = ts.find(secret)
		} else if c, err := r.Cookie(sessionCookie); err == nil {
			t = ts.sessionToken(c.Value, time.Now())
		}
		if t == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			msg := "missing or wrong API token; send the header Authorization: Bearer <token>"
			if ws {
				msg = "missing or wrong API token, or a session that expired; sign in with POST /api/session {\"token\": ...} or send the header Authorization: Bearer <token>"
			}
			encode(w, http.StatusUnauthorized, errorBody{Error: msg})
			return
		}
		next.ServeHTTP(w, withPrincipal(r, t))
	})
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// discardWriter keeps the headers and status a handler wrote and drops its body.
type discardWriter struct {
	header http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(code int)        { d.status = code }

// jsonFallbacks answers the mux's own 404 and 405 in the API's JSON error
// shape, keeping the Allow header of a 405.
func jsonFallbacks(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		probe := &discardWriter{header: http.Header{}}
		h.ServeHTTP(probe, r)
		switch probe.status {
		case http.StatusMethodNotAllowed:
			allow := probe.header.Get("Allow")
			w.Header().Set("Allow", allow)
			encode(w, http.StatusMethodNotAllowed, errorBody{Error: "method " + r.Method + " is not allowed on " + r.URL.Path + "; use " + allow})
		default:
			encode(w, http.StatusNotFound, errorBody{Error: "no route " + r.URL.Path + "; GET /api/openapi.json lists the API (docs/reference/rest.md)"})
		}
	})
}

// guardBrowsers refuses what a page of another site can make a browser
// send to this server. It checks
//   - the Host header against hosts, when hosts is not nil (every route but
//     the probes and /metrics): a page that rebinds its own name to this
//     server's address sends its own name as the Host, and would otherwise
//     read and drive an API that has no token;
//   - on /api/*, the body's media type: one that is not application/json
//     is 415, since a page may post text/plain, a form or multipart to any
//     site without asking (a "simple" cross-site request). A request that
//     names none is taken as JSON: a browser's cross-site request without
//     one still carries its Origin, which the next check refuses;
//   - on a changing /api/* request, its Origin: one that is not this
//     server's own (its Host) nor among origins is refused. Browsers send
//     Origin on every cross-origin POST, PUT and DELETE; other clients send
//     none.
func guardBrowsers(next http.Handler, hosts []string, origins []string) http.Handler {
	var allowedHosts map[string]bool
	if hosts != nil {
		allowedHosts = map[string]bool{}
		for _, h := range hosts {
			allowedHosts[normalHost(h)] = true
		}
	}
	allowedOrigins := map[string]bool{}
	for _, o := range origins {
		allowedOrigins[strings.ToLower(strings.TrimRight(strings.TrimSpace(o), "/"))] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if allowedHosts != nil && !probeOrScrape(r.URL.Path) && !allowedHosts[normalHost(r.Host)] {
			encode(w, http.StatusMisdirectedRequest, errorBody{Error: "this server does not answer to the host " + strconv.Quote(r.Host) +
				"; it answers to the names in --allowed-hosts (by default, without an API token, localhost and its listen address only, so that a page of another site cannot reach it by rebinding its own name): open it by one of those, or add the name to --allowed-hosts"})
			return
		}
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "" {
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				encode(w, http.StatusUnsupportedMediaType, errorBody{Error: "the request body must be JSON sent with the header Content-Type: application/json (got " + strconv.Quote(ct) + ")"})
				return
			}
		}
		if !safeMethod(r.Method) {
			if origin := r.Header.Get("Origin"); origin != "" && !ownOrigin(r, origin) && !allowedOrigins[strings.ToLower(origin)] {
				encode(w, http.StatusForbidden, errorBody{Error: "cross-site request refused: origin " + strconv.Quote(origin) +
					" is not this server's; call the API from this server's page, from a program (which sends no Origin), or add the origin to --allowed-origins"})
				return
			}
			if r.Header.Get("Sec-Fetch-Site") == "cross-site" && r.Header.Get("Origin") == "" {
				encode(w, http.StatusForbidden, errorBody{Error: "cross-site request refused; call the API from this server's page or from a program"})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// ownOrigin reports whether origin is the server's own: its host is the
// request's Host (which guardBrowsers has checked, when it checks hosts).
func ownOrigin(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// normalHost is a Host header's name, without its port or brackets, in
// lower case.
func normalHost(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(strings.Trim(host, "[]"))
}

// probeOrScrape reports whether path is a health probe's or the metrics'.
func probeOrScrape(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}
