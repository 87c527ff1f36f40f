package server

import (
	"context"
	"net/http"
	"time"
)

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
			encode(w, http.StatusServiceUnavailable, errorBody{Error: "not ready: " + err.Error()})
			return
		}
		encode(w, http.StatusOK, map[string]string{"status": "ready"})
	})
}
