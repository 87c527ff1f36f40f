// Package server is leasehold's HTTP face: the REST API,
// health, readiness and metrics. NewServer wires the routes (all listed in
// routes.go); handlers decode and validate in encode.go, and every error
// becomes a status in one place, writeError in errors.go.
package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/internal/taskwait"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/hub"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/notify"
)

// Instance describes the replica serving the request.
type Instance struct {
	ID        string    `json:"id"`
	StartedAt time.Time `json:"started_at"`
	Roles     []string  `json:"roles"`
	Version   string    `json:"version"`
}

// MarshalJSON writes started_at as every API timestamp: RFC 3339 UTC with
// milliseconds.
func (i Instance) MarshalJSON() ([]byte, error) {
	type plain Instance
	return json.Marshal(struct {
		plain
		StartedAt string `json:"started_at"`
	}{plain: plain(i), StartedAt: apitime.Format(i.StartedAt)})
}

// Deps is what the server needs.
type Deps struct {
	Leases    *leasestore.Store
	Tasks     *taskstore.Store
	Generator *demo.State
	Instances *instance.Store
	// Schedules serves /api/schedules; nil leaves those routes out.
	Schedules *schedulestore.Store
	Instance  Instance
	// DefaultTTL applies to acquisitions that name no ttl_seconds.
	DefaultTTL time.Duration
	// TaskTTL is the lease TTL of a task claimed with POST /api/tasks/next
	// (whole seconds); zero means DefaultTTL.
	TaskTTL time.Duration
	// APIToken, when not empty, is a token of every scope: with it (or
	// Tokens) a token is required as a Bearer token on /api/* and /ws,
	// which also take the session cookie POST /api/session sets.
	APIToken string
	// Tokens are tokens of their own scopes and prefixes (ParseTokens).
	Tokens []Token
	// SecureCookie marks the session cookie Secure: the page is served over
	// HTTPS by a proxy in front (the server itself never sees TLS).
	SecureCookie bool
	// AllowedHosts, when not nil, are the names (Host headers, without the
	// port) the server answers to; any other is 421. Nil answers to any.
	AllowedHosts []string
	// AllowedOrigins are origins besides the server's own whose pages may
	// make changing requests (and open /ws, which the hub checks).
	AllowedOrigins []string
	// RateLimit is the requests a second one client (an IPv4 address, or an
	// IPv6 /64) may make to /api/* and /ws once its burst is spent; 429
	// with Retry-After beyond it, counted in leasehold_http_rate_limited_total.
	// Zero, the default, turns the limit off. /healthz, /readyz, /metrics
	// and the page are never limited.
	RateLimit float64
	// RateBurst is the requests a client may make at once; zero means
	// RateLimit rounded up.
	RateBurst int
	// TrustedProxies are the peers whose X-Forwarded-For is believed when
	// the rate limit picks the client; any other peer is the client.
	TrustedProxies []netip.Prefix
	// Hub serves GET /ws; nil leaves the route out.
	Hub *hub.Hub
	// Listener is the process's LISTEN connection: an acquisition with
	// wait_seconds subscribes to it to hear of a release. Without it such
	// an acquisition wakes only at the holder's expires_at.
	Listener *notify.Listener
	// Stopping, when closed, ends the waits of acquisitions and claims with
	// wait_seconds (503, to be sent again): the replica is shutting down.
	Stopping <-chan struct{}
	// claimWaiters is set by NewServer: the registration that makes inserts
	// notify while claims wait.
	claimWaiters *claimWaiters
	// taskWaits holds GET /api/tasks/{id}?wait_seconds until the task finishes.
	taskWaits *taskwait.Watcher
	// Ready reports why the replica cannot serve (nil when it can).
	Ready   func(ctx context.Context) error
	Log     zerolog.Logger
	Metrics *Metrics
}

// NewServer returns the handler of every route.
func NewServer(d Deps) http.Handler {
	if d.TaskTTL == 0 {
		d.TaskTTL = d.DefaultTTL
	}
	d.claimWaiters = newClaimWaiters(d.Listener, d.Instance.ID)
	if d.Listener != nil {
		d.taskWaits = &taskwait.Watcher{Listener: d.Listener, Name: d.Instance.ID + "/task-waits", Log: d.Log}
	}
	ts := tokens(slices.Clone(d.Tokens))
	if d.APIToken != "" {
		ts = append(ts, FullToken(d.APIToken))
	}
	mux := http.NewServeMux()
	addRoutes(mux, d, ts)
	h := jsonFallbacks(mux)
	h = refuseWrongMethodOnSubpaths(h)
	h = requireToken(h, ts)
	h = guardBrowsers(h, d.AllowedHosts, d.AllowedOrigins)
	h = limitRate(h, newRateLimiter(d.RateLimit, d.RateBurst, d.TrustedProxies, time.Now), d.Metrics)
	h = recoverPanics(h, d.Log)
	h = logRequests(h, d.Log, d.Metrics, mux)
	return h
}
