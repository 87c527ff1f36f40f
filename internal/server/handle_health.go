package server

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// NotReady is a reason why the replica cannot serve, as Deps.Ready returns
// it. GET /readyz needs no token, so its answer says only Reason, a phrase
// that names the trouble without details, such as "the database cannot be
// reached"; Err, the details (a connect error names the server, the user
// and the database), is for the server's log. Any other error Ready
// returns is answered as it is.
type NotReady struct {
	Reason string
	Err    error
}

// Error is the reason and its details.
func (e *NotReady) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

// Unwrap returns the details.
func (e *NotReady) Unwrap() error { return e.Err }

func handleHealthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		encode(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

func handleReadyz(ready func(ctx context.Context) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			reason := err.Error()
			var nr *NotReady
			if errors.As(err, &nr) {
				reason = nr.Reason
			}
			encode(w, http.StatusServiceUnavailable, errorBody{Error: "not ready: " + reason})
			return
		}
		encode(w, http.StatusOK, map[string]string{"status": "ready"})
	})
}
