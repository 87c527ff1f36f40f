package server

import (
	"net/http"

	"github.com/leasehold/leasehold/web"
)

// addRoutes lists every route of the API.
func addRoutes(mux *http.ServeMux, d Deps) {
	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(d.Ready))
	mux.Handle("GET /metrics", d.Metrics.Handler())
	mux.Handle("GET /{$}", web.Handler())

	mux.Handle("POST /api/leases", handleLeaseAcquire(d))
	mux.Handle("GET /api/leases", handleLeaseListAll(d))
	mux.Handle("GET /api/leases/active", handleLeaseList(d, "active"))
	mux.Handle("GET /api/leases/expired", handleLeaseList(d, "expired"))
	mux.Handle("GET /api/leases/renewed", handleLeaseList(d, "renewed"))
	mux.Handle("GET /api/leases/released", handleLeaseList(d, "released"))
	mux.Handle("GET /api/leases/events", handleLeaseEvents(d))
	mux.Handle("PUT /api/leases/renew", handleLeaseRenew(d))
	mux.Handle("DELETE /api/leases/release", handleLeaseRelease(d, false))
	mux.Handle("GET /api/leases/{id}", handleLeaseGet(d))
	mux.Handle("DELETE /api/leases/{id}", handleLeaseRelease(d, true))
}

// leaseSubpaths are the fixed paths under /api/leases/ with their methods.
// "GET /api/leases/{id}" would otherwise take "GET /api/leases/renew" as the
// id "renew"; the right answer is 405 with the methods the path allows.
var leaseSubpaths = map[string]string{
	"active": "GET", "expired": "GET", "renewed": "GET", "released": "GET",
	"events": "GET", "renew": "PUT", "release": "DELETE",
}
