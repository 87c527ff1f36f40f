package server

import "net/http"

// handleInstanceList serves GET /api/instances: the replicas holding their
// instance lease, by id.
func handleInstanceList(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		live, err := d.Instances.Live(r.Context())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, live)
	})
}
