package server

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
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
// when a token is configured. The comparison takes the same time whatever
// the guess; the token itself is never logged.
func requireToken(next http.Handler, token string) http.Handler {
	if token == "" {
		return next
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") && r.URL.Path != "/ws" {
			next.ServeHTTP(w, r)
			return
		}
		// The scheme name is case-insensitive (RFC 9110 §11.1).
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		ok = ok && strings.EqualFold(scheme, "Bearer")
		gotSum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(gotSum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			encode(w, http.StatusUnauthorized, errorBody{Error: "missing or wrong API token; send the header Authorization: Bearer <token>"})
			return
		}
		next.ServeHTTP(w, r)
	})
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
