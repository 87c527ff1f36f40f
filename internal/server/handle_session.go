package server

import (
	"encoding/base64"
	"net/http"
)

// sessionPath is where the dashboard signs in.
const sessionPath = "/api/session"

// sessionCookie carries the API token (base64url, as a cookie value may
// not hold every byte a token can) for /ws, which a browser cannot send
// headers to. HttpOnly keeps it from scripts, SameSite=Strict from other
// sites' requests; it is never taken from the URL, where it would be logged.
const sessionCookie = "leasehold_token"

type sessionRequest struct {
	Token string `json:"token"`
}

func (sessionRequest) validate() error { return nil }

// handleSession checks the API token in the body and, when it is right,
// sets the session cookie (204); a wrong token is 401. Without a configured
// token there is nothing to sign in to: 204 and no cookie.
func handleSession(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[sessionRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if d.APIToken == "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if !tokenEqual(req.Token, d.APIToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			encode(w, http.StatusUnauthorized, errorBody{Error: "wrong API token; send the token the server was started with (--api-token)"})
			return
		}
		http.SetCookie(w, &http.Cookie{
			Name: sessionCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(req.Token)), Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		})
		w.WriteHeader(http.StatusNoContent)
	})
}
