package server

import (
	"net/http"

	"github.com/leasehold/leasehold/web"
)

// addRoutes lists every route of the API, each with the scope a token
// needs for it (see Scope; a server without tokens asks for none).
func addRoutes(mux *http.ServeMux, d Deps, ts tokens) {
	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(d.Ready))
	mux.Handle("GET /metrics", d.Metrics.Handler())
	mux.Handle("GET /{$}", web.Handler())
	mux.Handle("GET /static/", web.Handler())
	if d.Hub != nil {
		mux.Handle("GET /ws", need(ScopeRead, http.HandlerFunc(d.Hub.ServeWS)))
	}
	mux.Handle("POST /api/session", handleSession(d, ts))
	mux.Handle("GET /api/session", need(ScopeRead, handleSessionGet()))
	mux.Handle("DELETE /api/session", handleSignOut(d))

	mux.Handle("POST /api/leases", need(ScopeLease, handleLeaseAcquire(d)))
	mux.Handle("GET /api/leases", need(ScopeRead, handleLeaseListAll(d)))
	mux.Handle("GET /api/leases/active", need(ScopeRead, handleLeaseList(d, "active")))
	mux.Handle("GET /api/leases/expired", need(ScopeRead, handleLeaseList(d, "expired")))
	mux.Handle("GET /api/leases/renewed", need(ScopeRead, handleLeaseList(d, "renewed")))
	mux.Handle("GET /api/leases/released", need(ScopeRead, handleLeaseList(d, "released")))
	mux.Handle("GET /api/leases/events", need(ScopeRead, handleLeaseEvents(d)))
	mux.Handle("PUT /api/leases/renew", need(ScopeLease, handleLeaseRenew(d)))
	mux.Handle("DELETE /api/leases/release", need(ScopeLease, handleLeaseRelease(d, false)))
	mux.Handle("GET /api/leases/{id}", need(ScopeRead, handleLeaseGet(d)))
	mux.Handle("DELETE /api/leases/{id}", need(ScopeLease, handleLeaseRelease(d, true)))

	mux.Handle("GET /api/limits", need(ScopeRead, handleLimitList(d)))
	mux.Handle("GET /api/limits/{key}", need(ScopeRead, handleLimitGet(d)))
	mux.Handle("PUT /api/limits/{key}", need(ScopeAdmin, handleLimitSet(d)))

	mux.Handle("GET /api/queues/paused", need(ScopeRead, handleQueuePaused(d)))
	mux.Handle("PUT /api/queues/{queue}/pause", need(ScopeAdmin, handleQueuePause(d)))
	mux.Handle("DELETE /api/queues/{queue}/pause", need(ScopeAdmin, handleQueueResume(d)))

	mux.Handle("POST /api/tasks", need(ScopeProduce, handleTaskCreate(d)))
	mux.Handle("GET /api/tasks", need(ScopeRead, handleTaskList(d, listAll)))
	mux.Handle("GET /api/tasks/processed", need(ScopeRead, handleTaskList(d, listProcessed)))
	mux.Handle("GET /api/tasks/started", need(ScopeRead, handleTaskList(d, listStarted)))
	mux.Handle("GET /api/tasks/stats", need(ScopeRead, handleTaskStats(d)))
	mux.Handle("POST /api/tasks/next", need(ScopeWork, handleTaskClaim(d)))
	mux.Handle("GET /api/tasks/{id}", need(ScopeRead, handleTaskGet(d)))
	mux.Handle("PUT /api/tasks/{id}/heartbeat", need(ScopeWork, handleTaskHeartbeat(d)))
	mux.Handle("PUT /api/tasks/{id}/complete", need(ScopeWork, handleTaskComplete(d)))
	mux.Handle("PUT /api/tasks/{id}/fail", need(ScopeWork, handleTaskFail(d)))
	mux.Handle("PUT /api/tasks/{id}/snooze", need(ScopeWork, handleTaskSnooze(d)))
	mux.Handle("PUT /api/tasks/{id}/requeue", need(ScopeWork, handleTaskRequeue(d)))
	// A cancel with a processor is a worker's own (work); without, an
	// operator's (produce): handleTaskCancel asks for the scope.
	mux.Handle("POST /api/tasks/{id}/cancel", handleTaskCancel(d))
	mux.Handle("POST /api/tasks/{id}/retry", need(ScopeProduce, handleTaskRetry(d)))

	if d.Schedules != nil {
		mux.Handle("POST /api/schedules", need(ScopeProduce, handleScheduleCreate(d)))
		mux.Handle("GET /api/schedules", need(ScopeRead, handleScheduleList(d)))
		mux.Handle("GET /api/schedules/{name}", need(ScopeRead, handleScheduleGet(d)))
		mux.Handle("PUT /api/schedules/{name}", need(ScopeProduce, handleScheduleReplace(d)))
		mux.Handle("DELETE /api/schedules/{name}", need(ScopeProduce, handleScheduleDelete(d)))
	}
	mux.Handle("GET /api/generator", need(ScopeRead, handleGeneratorGet(d)))
	mux.Handle("POST /api/generator/start", need(ScopeAdmin, handleGeneratorSet(d, true)))
	mux.Handle("POST /api/generator/stop", need(ScopeAdmin, handleGeneratorSet(d, false)))
	mux.Handle("GET /api/instances", need(ScopeRead, handleInstanceList(d)))
	mux.Handle("GET /api/openapi.json", need(ScopeRead, handleOpenAPI()))
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
