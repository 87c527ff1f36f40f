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
	mux.Handle("GET /static/", web.Handler())
	if d.Hub != nil {
		mux.Handle("GET /ws", http.HandlerFunc(d.Hub.ServeWS))
	}
	mux.Handle("POST /api/session", handleSession(d))

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

	mux.Handle("POST /api/tasks", handleTaskCreate(d))
	mux.Handle("GET /api/tasks", handleTaskList(d, listAll))
	mux.Handle("GET /api/tasks/processed", handleTaskList(d, listProcessed))
	mux.Handle("GET /api/tasks/started", handleTaskList(d, listStarted))
	mux.Handle("GET /api/tasks/stats", handleTaskStats(d))
	mux.Handle("POST /api/tasks/next", handleTaskClaim(d))
	mux.Handle("GET /api/tasks/{id}", handleTaskGet(d))
	mux.Handle("PUT /api/tasks/{id}/heartbeat", handleTaskHeartbeat(d))
	mux.Handle("PUT /api/tasks/{id}/complete", handleTaskComplete(d))
	mux.Handle("PUT /api/tasks/{id}/fail", handleTaskFail(d))
	mux.Handle("PUT /api/tasks/{id}/snooze", handleTaskSnooze(d))
	mux.Handle("PUT /api/tasks/{id}/requeue", handleTaskRequeue(d))
	mux.Handle("POST /api/tasks/{id}/cancel", handleTaskCancel(d))
	mux.Handle("POST /api/tasks/{id}/retry", handleTaskRetry(d))

	if d.Schedules != nil {
		mux.Handle("POST /api/schedules", handleScheduleCreate(d))
		mux.Handle("GET /api/schedules", handleScheduleList(d))
		mux.Handle("GET /api/schedules/{name}", handleScheduleGet(d))
		mux.Handle("PUT /api/schedules/{name}", handleScheduleReplace(d))
		mux.Handle("DELETE /api/schedules/{name}", handleScheduleDelete(d))
	}
	mux.Handle("GET /api/generator", handleGeneratorGet(d))
	mux.Handle("POST /api/generator/start", handleGeneratorSet(d, true))
	mux.Handle("POST /api/generator/stop", handleGeneratorSet(d, false))
	mux.Handle("GET /api/instances", handleInstanceList(d))
	mux.Handle("GET /api/openapi.json", handleOpenAPI())
}

// fixedSubpaths are the fixed paths beside an {id} pattern, with the one
// method each allows. Without them the mux would take GET /api/leases/renew
// as the id "renew" (a 400), and answer DELETE /api/tasks/next with an
// Allow header naming GET; the right answer is 405 with the path's method.
var fixedSubpaths = map[string]string{
	"/api/leases/active": "GET", "/api/leases/expired": "GET", "/api/leases/renewed": "GET",
	"/api/leases/released": "GET", "/api/leases/events": "GET",
	"/api/leases/renew": "PUT", "/api/leases/release": "DELETE",
	"/api/tasks/next": "POST", "/api/tasks/stats": "GET",
	"/api/tasks/processed": "GET", "/api/tasks/started": "GET",
}

// refuseWrongMethodOnSubpaths answers 405, with the method the path
// allows, a request for one of fixedSubpaths made with another method. It
// runs before the mux, which counts the {id} patterns as matching them too.
func refuseWrongMethodOnSubpaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allow, fixed := fixedSubpaths[r.URL.Path]
		if !fixed || r.Method == allow || (allow == "GET" && r.Method == "HEAD") {
			next.ServeHTTP(w, r)
			return
		}
		if allow == "GET" {
			allow = "GET, HEAD" // as the mux says of every GET route
		}
		w.Header().Set("Allow", allow)
		encode(w, http.StatusMethodNotAllowed, errorBody{Error: "method " + r.Method + " is not allowed on " + r.URL.Path + "; use " + allow})
	})
}
