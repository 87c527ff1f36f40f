package server

import (
	"net/http"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
)

// sessionPath is where the dashboard signs in and out.
const sessionPath = "/api/session"

// sessionCookie carries a session (see sessionValue) for /ws, which a
// browser cannot send headers to, and for the page's calls. HttpOnly keeps
// it from scripts, SameSite=Strict from other sites' requests, Secure (with
// --secure-cookie) from plain HTTP; it is never taken from the URL, where it
// would be logged.
const sessionCookie = "leasehold_session"

type sessionRequest struct {
	Token string `json:"token"`
}

func (sessionRequest) validate() error { return nil }

// sessionInfo is what GET and POST /api/session answer: the token the
// session signs in with and what it may do, for the page to show the
// controls it may use. Open: the server has no tokens, every request may
// do everything.
type sessionInfo struct {
	Name      string   `json:"name"`
	Scopes    []Scope  `json:"scopes"`
	Resources []string `json:"resources"`
	Queues    []string `json:"queues"`
	Kinds     []string `json:"kinds"`
	Holders   []string `json:"holders"`
	Open      bool     `json:"open"`
	ExpiresAt *string  `json:"expires_at"`
}

func infoOf(t *Token, expires *time.Time) sessionInfo {
	if t == nil {
		return sessionInfo{Scopes: []Scope{ScopeAdmin}, Open: true, Resources: []string{}, Queues: []string{}, Kinds: []string{}, Holders: []string{}}
	}
	orEmpty := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return sessionInfo{Name: t.Name, Scopes: t.Scopes, Resources: orEmpty(t.Resources), Queues: orEmpty(t.Queues),
		Kinds: orEmpty(t.Kinds), Holders: orEmpty(t.Holders), ExpiresAt: apitime.FormatPtr(expires)}
}

// handleSession signs the dashboard in: the token in the body, when it is
// one of the server's, gets a session cookie that lasts sessionTTL (200
// with what the token may do); a wrong one is 401. Without tokens there is
// nothing to sign in to: 200, open, and no cookie.
func handleSession(d Deps, ts tokens) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[sessionRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if len(ts) == 0 {
			encode(w, http.StatusOK, infoOf(nil, nil))
			return
		}
		t := ts.find(req.Token)
		if t == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			encode(w, http.StatusUnauthorized, errorBody{Error: "wrong API token; send one of the tokens the server was started with (--api-token, --tokens-file)"})
			return
		}
		expires := time.Now().Add(sessionTTL).Truncate(time.Second)
		http.SetCookie(w, &http.Cookie{
			Name: sessionCookie, Value: sessionValue(t, expires), Path: "/", Expires: expires,
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: d.SecureCookie || r.TLS != nil,
		})
		encode(w, http.StatusOK, infoOf(t, &expires))
	})
}

// handleSessionGet says who the request signed in as (or, without tokens,
// that the server is open).
func handleSessionGet() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		encode(w, http.StatusOK, infoOf(principal(r), nil))
	})
}

// handleSignOut drops the session cookie (204). The session itself ends at
// its expiry: to cut every session of a token at once, change the token.
func handleSignOut(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body says nothing, but is held to the 1 MiB of every body.
		if _, err := readBody(w, r); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		http.SetCookie(w, &http.Cookie{
			Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: d.SecureCookie || r.TLS != nil,
		})
		w.WriteHeader(http.StatusNoContent)
	})
}
