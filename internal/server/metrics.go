package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasehold/leasehold/internal/lease"
	"github.com/leasehold/leasehold/internal/task"
)

// Metrics are the replica's Prometheus metrics, on a registry of its own.
type Metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	leaseOps  *prometheus.CounterVec
	taskOps   *prometheus.CounterVec
	expiries  prometheus.Counter
	expiryLag prometheus.Histogram
}

// NewMetrics registers leasehold's metrics. listenerUp and reconnects read
// the LISTEN connection's state at scrape time.
func NewMetrics(listenerUp func() bool, reconnects func() int64) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leasehold_http_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		leaseOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_operations_total",
			Help: "Lease operations by op (acquire, renew, release) and outcome (ok, conflict, not_held, error).",
		}, []string{"op", "outcome"}),
		taskOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_task_operations_total",
			Help: "Task operations over the API by op (insert, claim, heartbeat, complete, fail) and outcome (ok, empty, lease_lost, not_found, error).",
		}, []string{"op", "outcome"}),
		expiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_lease_expiries_announced_total", Help: "Expired leases the reaper of this replica announced.",
		}),
		expiryLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_lease_expiry_announce_lag_seconds", Help: "Time from a lease's expires_at to the reaper announcing it.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
	}
	m.reg.MustRegister(m.requests, m.duration, m.leaseOps, m.taskOps, m.expiries, m.expiryLag,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_listener_connected", Help: "1 while the LISTEN connection is up.",
		}, func() float64 {
			if listenerUp() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leasehold_listener_reconnects_total", Help: "Times the LISTEN connection was re-established.",
		}, func() float64 { return float64(reconnects()) }),
	)
	return m
}

// WatchClients exports clients, read at scrape time, as the gauge of
// connected websocket clients.
func (m *Metrics) WatchClients(clients func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leasehold_ws_clients", Help: "Websocket clients connected to /ws.",
	}, func() float64 { return float64(clients()) }))
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ExpiryAnnounced records one expiry announced by the reaper.
func (m *Metrics) ExpiryAnnounced(_ lease.Lease, lag time.Duration) {
	m.expiries.Inc()
	m.expiryLag.Observe(lag.Seconds())
}

func (m *Metrics) observeRequest(route, method string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

func (m *Metrics) leaseOp(op string, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, lease.ErrHeld):
		outcome = "conflict"
	case errors.Is(err, lease.ErrNotHeld):
		outcome = "not_held"
	default:
		outcome = "error"
	}
	m.leaseOps.WithLabelValues(op, outcome).Inc()
}

// taskOp counts one task operation by its outcome; a claim that found
// nothing ready counts as "empty".
func (m *Metrics) taskOp(op string, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, errNothingReady):
		outcome = "empty"
	case errors.Is(err, task.ErrLeaseLost):
		outcome = "lease_lost"
	case errors.Is(err, task.ErrNotFound):
		outcome = "not_found"
	default:
		outcome = "error"
	}
	m.taskOps.WithLabelValues(op, outcome).Inc()
}
