package server

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
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
// status, duration) and feeds the HTTP metrics.
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
		log.Info().
			Str("request_id", id).
			Str("method", r.Method).
			Str("path", r.URL.Path).
			Str("route", route).
			Int("status", rec.status).
			Dur("duration", elapsed).
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

// requireToken demands "Authorization: Bearer <token>" on /api/* and /ws
// when a token is configured, or the sessionCookie (see credential). POST /api/session,
// which checks the token itself to set that cookie, is let through. The
// comparison takes the same time whatever the guess; the token itself is
// never logged.
func requireToken(next http.Handler, token string) http.Handler {
	if token == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws := r.URL.Path == "/ws"
		if (!strings.HasPrefix(r.URL.Path, "/api/") && !ws) || r.URL.Path == sessionPath {
			next.ServeHTTP(w, r)
			return
		}
		got, byCookie, ok := credential(r)
		if !ok || !tokenEqual(got, token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			msg := "missing or wrong API token; send the header Authorization: Bearer <token>"
			if ws {
				msg = "missing or wrong API token; sign in with POST /api/session {\"token\": ...} or send the header Authorization: Bearer <token>"
			}
			encode(w, http.StatusUnauthorized, errorBody{Error: msg})
			return
		}
		// A cookie rides along on requests other sites make; SameSite=Strict
		// stops that in browsers, and a changing request must also come
		// from this origin. (The websocket's origin is checked at upgrade.)
		if byCookie && !ws && !safeMethod(r.Method) && !sameOrigin(r) {
			encode(w, http.StatusForbidden, errorBody{Error: "cross-origin request refused; call the API with the header Authorization: Bearer <token>"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// credential returns the API token a request presents: the Bearer token of
// its Authorization header or, when it has none, the one in the dashboard's
// sign-in cookie (byCookie: browsers cannot set headers on a websocket, and
// the page's buttons call the API). ok is false when it presents neither.
func credential(r *http.Request) (token string, byCookie, ok bool) {
	// The scheme name is case-insensitive (RFC 9110 §11.1).
	if scheme, t, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
		return t, false, true
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		if b, err := base64.RawURLEncoding.DecodeString(c.Value); err == nil {
			return string(b), true, true
		}
	}
	return "", false, false
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether the request's Origin, when it has one, is the
// host it was sent to.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// tokenEqual compares in constant time: hashing first makes the time
// independent of the lengths too.
func tokenEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
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
			encode(w, http.StatusNotFound, errorBody{Error: "no route " + r.URL.Path + "; the README lists the API"})
		}
	})
}
