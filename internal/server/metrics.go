package server

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/task"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasehold/leasehold/internal/db"
	"github.com/leasehold/leasehold/internal/worker"
)

// Metrics are the replica's Prometheus metrics, on a registry of its own.
// docs/reference/metrics.md is their catalogue, with what to alert on; a test keeps
// the two in step.
//
// Every label takes a few values fixed by the code (no ids, no names from
// requests), and the series of each known label value exist from the start
// at 0, so that rate() and increase() see the first event.
type Metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	leaseOps  *prometheus.CounterVec
	taskOps   *prometheus.CounterVec
	expiries  prometheus.Counter
	expiryLag prometheus.Histogram

	releaseAge    *prometheus.HistogramVec
	won           *prometheus.CounterVec
	renewFailures *prometheus.CounterVec
	lost          *prometheus.CounterVec
	claimed       prometheus.Counter
	finished      *prometheus.CounterVec
	claimWait     prometheus.Histogram
	notifyLag     prometheus.Histogram
	// taskLeases counts the task leases the workers failed to renew or
	// lost, as KeepObserver does for the other holders.
	taskLeases keepObserver
	// rateLimited counts the requests the per-client rate limit refused.
	rateLimited prometheus.Counter
	// scheduleTicks counts the ticks this replica's scheduler handled, by
	// outcome: made (a task), skipped (a unique schedule's last task still
	// ran), missed (ticks due while no scheduler ran, made one task).
	scheduleTicks *prometheus.CounterVec
}

// The kinds of lease holder in the metrics' holder label: the REST API's
// clients, this replica's electors, and its workers' task leases.
const (
	HolderAPI       = "api"
	HolderGenerator = "generator"
	HolderReaper    = "reaper"
	HolderScheduler = "scheduler"
	HolderInstance  = "instance"
	HolderTask      = "task"
)

// The values of the metrics' reason label for a lost lease.
const (
	lostRefused  = "refused"  // a renewal (heartbeat, completion) was refused: the lease had lapsed or been taken over
	lostDeadline = "deadline" // no renewal succeeded before the holder's local deadline
)

// The outcomes of leasehold_worker_tasks_finished_total.
var workerOutcomes = []string{"completed", "failed", "dead", "handed_back", "lease_lost", "crashed"}

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
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_http_rate_limited_total",
			Help: "HTTP requests to /api/* and /ws refused with 429 by the per-client rate limit (--rate-limit; off by default).",
		}),
		scheduleTicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_schedule_ticks_total",
			Help: "Ticks of schedules this replica's scheduler handled: made (a task), skipped (a unique schedule's last task was not finished), missed (due while no scheduler ran, made one task).",
		}, []string{"outcome"}),
		leaseOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_operations_total",
			Help: "Lease operations over the API by op (acquire, renew, release) and outcome (ok, conflict, not_held, error).",
		}, []string{"op", "outcome"}),
		taskOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_task_operations_total",
			Help: "Task operations over the API by op (insert, claim, heartbeat, complete, fail, snooze, requeue, cancel, retry) and outcome (ok, empty, lease_lost, not_found, conflict, error).",
		}, []string{"op", "outcome"}),
		expiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_lease_expiries_announced_total", Help: "Expired leases the reaper of this replica announced.",
		}),
		expiryLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_lease_expiry_announce_lag_seconds", Help: "Time from a lease's expires_at to the reaper announcing it.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		releaseAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasehold_lease_age_at_release_seconds",
			Help:    "Age of a lease (released_at − created_at, by the database clock) when its holder released it, by kind of holder (api, generator, reaper, instance).",
			Buckets: []float64{.01, .1, .5, 1, 5, 15, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600},
		}, []string{"holder"}),
		won: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_leases_won_total",
			Help: "Leases this replica's electors won, by kind of holder (generator, reaper, instance).",
		}, []string{"holder"}),
		renewFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_renew_failures_total",
			Help: "Renewals (task heartbeats included) of leases this replica holds that were refused or failed, by kind of holder (generator, reaper, instance, task).",
		}, []string{"holder"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_leases_lost_total",
			Help: "Leases this replica held and lost, by kind of holder (generator, reaper, instance, task) and reason (refused, deadline).",
		}, []string{"holder", "reason"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_worker_tasks_claimed_total", Help: "Tasks this replica's workers claimed.",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_worker_tasks_finished_total",
			Help: "Tasks this replica's workers were done with, by outcome (completed, failed, dead, handed_back, lease_lost, crashed).",
		}, []string{"outcome"}),
		claimWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_task_insert_to_claim_seconds",
			Help:    "Time from a task's insert, or its scheduled_at when later, to its first claim by this replica's workers, by the database clock.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		notifyLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_notify_lag_seconds",
			Help:    "Time from a lease change (its event's time, database clock) to the arrival of its NOTIFY in this process (this host's clock).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	m.initSeries()
	m.reg.MustRegister(m.requests, m.duration, m.rateLimited, m.scheduleTicks, m.leaseOps, m.taskOps, m.expiries, m.expiryLag,
		m.releaseAge, m.won, m.renewFailures, m.lost, m.claimed, m.finished, m.claimWait, m.notifyLag,
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
	m.taskLeases = keepObserver{
		renewFailures: m.renewFailures.WithLabelValues(HolderTask),
		lostRefused:   m.lost.WithLabelValues(HolderTask, lostRefused),
		lostDeadline:  m.lost.WithLabelValues(HolderTask, lostDeadline),
	}
	return m
}

// initSeries creates the series of every known label value at 0.
func (m *Metrics) initSeries() {
	for op, outcomes := range map[string][]string{
		"acquire": {"ok", "conflict", "error"},
		"renew":   {"ok", "not_held", "error"},
		"release": {"ok", "not_held", "error"},
	} {
		for _, o := range outcomes {
			m.leaseOps.WithLabelValues(op, o)
		}
	}
	for op, outcomes := range map[string][]string{
		"insert":    {"ok", "error"},
		"claim":     {"ok", "empty", "error"},
		"heartbeat": {"ok", "lease_lost", "not_found", "error"},
		"complete":  {"ok", "lease_lost", "not_found", "error"},
		"fail":      {"ok", "lease_lost", "not_found", "error"},
		"snooze":    {"ok", "lease_lost", "not_found", "error"},
		"requeue":   {"ok", "lease_lost", "not_found", "error"},
		"cancel":    {"ok", "conflict", "lease_lost", "not_found", "error"},
		"retry":     {"ok", "conflict", "not_found", "error"},
	} {
		for _, o := range outcomes {
			m.taskOps.WithLabelValues(op, o)
		}
	}
	for _, h := range []string{HolderAPI, HolderGenerator, HolderReaper, HolderScheduler, HolderInstance} {
		m.releaseAge.WithLabelValues(h)
	}
	for _, h := range []string{HolderGenerator, HolderReaper, HolderScheduler, HolderInstance} {
		m.won.WithLabelValues(h)
	}
	for _, h := range []string{HolderGenerator, HolderReaper, HolderScheduler, HolderInstance, HolderTask} {
		m.renewFailures.WithLabelValues(h)
		m.lost.WithLabelValues(h, lostRefused)
		m.lost.WithLabelValues(h, lostDeadline)
	}
	for _, o := range []string{"made", "skipped", "missed"} {
		m.scheduleTicks.WithLabelValues(o)
	}
	for _, o := range workerOutcomes {
		m.finished.WithLabelValues(o)
	}
}

// WatchClients exports clients, read at scrape time, as the gauge of
// connected websocket clients.
func (m *Metrics) WatchClients(clients func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leasehold_ws_clients", Help: "Websocket clients connected to /ws.",
	}, func() float64 { return float64(clients()) }))
}

// maxGaugeCount bounds each count of the database gauges: a count stops
// there, so that a scrape stays cheap whatever the backlog; a gauge at
// maxGaugeCount means "at least that many".
const maxGaugeCount = 100_000

// maxKindSeries bounds the (queue, kind) series of the pending-by-kind
// gauges in one scrape: their label values come from the data, and a
// Prometheus series costs memory for as long as it is retained. Past it,
// the (queue, kind)s that waited least share the series
// queue="other",kind="other" (foldKinds).
const maxKindSeries = 100

// otherLabel is the queue and the kind of the series that sums the
// (queue, kind)s past maxKindSeries.
const otherLabel = "other"

// WatchDatabase exports the state gauges read from the database at scrape
// time (leases and tasks by state, the oldest due task, the pending tasks
// and oldest wait of each (queue, kind), the oldest unannounced expiry,
// the tables' estimated sizes) and leasehold_db_up. Each scrape runs two
// cheap statements (queries/metrics.sql and the pending summary of
// queries/task.sql), both bounded by one timeout: when the database does
// not answer in time the scrape still answers, with leasehold_db_up 0 and
// without the state gauges.
//
// A reading serves every scrape for cacheFor after it (zero: each scrape
// reads afresh), and scrapes that arrive while one is read wait for it:
// however many scrapers there are, the gauges cost the database one query
// every cacheFor.
func (m *Metrics) WatchDatabase(conn db.DBTX, timeout, cacheFor time.Duration) {
	c := newDBCollector(db.New(conn), timeout)
	c.cacheFor = cacheFor
	m.reg.MustRegister(c)
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ExpiryAnnounced records one expiry announced by the reaper.
func (m *Metrics) ExpiryAnnounced(_ string, lag time.Duration) {
	m.expiries.Inc()
	m.expiryLag.Observe(lag.Seconds())
}

// NotifyLag records the delay from a lease change to the arrival of its
// notification (hub.Deps.NotifyLag).
func (m *Metrics) NotifyLag(lag time.Duration) { m.notifyLag.Observe(lag.Seconds()) }

// KeepObserver returns the observer of the leases one kind of in-process
// holder keeps (lease.KeepConfig.Observer): holder is HolderGenerator,
// HolderReaper or HolderInstance.
func (m *Metrics) KeepObserver(holder string) lease.KeepObserver {
	return keepObserver{
		won:           m.won.WithLabelValues(holder),
		renewFailures: m.renewFailures.WithLabelValues(holder),
		lostRefused:   m.lost.WithLabelValues(holder, lostRefused),
		lostDeadline:  m.lost.WithLabelValues(holder, lostDeadline),
		releaseAge:    m.releaseAge.WithLabelValues(holder),
	}
}

type keepObserver struct {
	won, renewFailures, lostRefused, lostDeadline prometheus.Counter
	releaseAge                                    prometheus.Observer
}

func (o keepObserver) Won(lease.Lease)        { o.won.Inc() }
func (o keepObserver) RenewFailed(error)      { o.renewFailures.Inc() }
func (o keepObserver) Released(l lease.Lease) { observeAge(o.releaseAge, l) }

func (o keepObserver) Lost(reason error) {
	if errors.Is(reason, lease.ErrDeadline) {
		o.lostDeadline.Inc()
		return
	}
	o.lostRefused.Inc()
}

// observeAge records a released lease's age by the database clock.
func observeAge(h prometheus.Observer, l lease.Lease) {
	if l.ReleasedAt != nil {
		h.Observe(max(l.ReleasedAt.Sub(l.CreatedAt), 0).Seconds())
	}
}

// WorkerEvent counts what a worker pool did (worker.Pool.OnEvent): claims,
// the insert→claim wait of first attempts (a task claimed again after its
// lease lapsed waited through its earlier attempt too), the outcome of each
// task, failed heartbeats and lost task leases.
func (m *Metrics) WorkerEvent(ev worker.Event) {
	switch ev.Kind {
	case worker.EventClaimed:
		m.claimed.Inc()
		if ev.Attempts == 1 {
			m.claimWait.Observe(ev.Waited.Seconds())
		}
	case worker.EventCompleted:
		m.finished.WithLabelValues("completed").Inc()
	case worker.EventFailed:
		if ev.State == task.StateDead {
			m.finished.WithLabelValues("dead").Inc()
		} else {
			m.finished.WithLabelValues("failed").Inc()
		}
	case worker.EventRequeued:
		m.finished.WithLabelValues("handed_back").Inc()
	case worker.EventCrashed:
		m.finished.WithLabelValues("crashed").Inc()
	case worker.EventLeaseLost:
		m.finished.WithLabelValues("lease_lost").Inc()
		m.taskLeases.Lost(ev.Err)
	case worker.EventHeartbeatFailed:
		m.taskLeases.RenewFailed(ev.Err)
	}
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

// leaseReleased counts a release over the API and, when it succeeded,
// records the age of the lease it released.
func (m *Metrics) leaseReleased(l lease.Lease, err error) {
	m.leaseOp("release", err)
	if err == nil {
		observeAge(m.releaseAge.WithLabelValues(HolderAPI), l)
	}
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
	case errors.Is(err, task.ErrNotCancellable), errors.Is(err, task.ErrNotRetryable), errors.Is(err, task.ErrUniqueKeyTaken):
		outcome = "conflict"
	default:
		outcome = "error"
	}
	m.taskOps.WithLabelValues(op, outcome).Inc()
}

// dbCollector reads the database gauges at scrape time, or gives the last
// reading when it is younger than cacheFor.
type dbCollector struct {
	q        *db.Queries
	timeout  time.Duration
	cacheFor time.Duration

	mu   sync.Mutex // held while a reading is made: the others wait for it
	last dbReading

	up, leases, oldestExpiry, tasks, oldestDue, rows *prometheus.Desc
	pendingByKind, oldestWait                        *prometheus.Desc
	limitSlots, limitHeld, limitWaiting              *prometheus.Desc
	rateStarts, rateSpent, queuePaused               *prometheus.Desc
}

// maxLimitSeries bounds the keys whose limits the gauges show.
const maxLimitSeries = 100

func newDBCollector(q *db.Queries, timeout time.Duration) *dbCollector {
	return &dbCollector{
		q: q, timeout: timeout,
		up: prometheus.NewDesc("leasehold_db_up",
			"1 when the database answered this scrape's gauge query in time, else 0 (and the database gauges are absent).", nil, nil),
		leases: prometheus.NewDesc("leasehold_leases",
			"Leases by state: active (held), expired_unannounced (expired, not yet announced by a reaper), counted up to 100000.",
			[]string{"state"}, nil),
		oldestExpiry: prometheus.NewDesc("leasehold_lease_oldest_unannounced_expiry_seconds",
			"How long ago the oldest expired lease that no reaper announced yet expired (0 when none), by the database clock.", nil, nil),
		tasks: prometheus.NewDesc("leasehold_tasks",
			"Tasks by state (pending, running, dead), exact.", []string{"state"}, nil),
		oldestDue: prometheus.NewDesc("leasehold_task_oldest_due_seconds",
			"How long the oldest due pending task has been due (0 when none), by the database clock.", nil, nil),
		pendingByKind: prometheus.NewDesc("leasehold_tasks_pending_by_kind",
			"Pending tasks by queue and kind, counted up to 100000; at most 100 series, the (queue, kind)s that waited least summed into queue=\"other\",kind=\"other\".",
			[]string{"queue", "kind"}, nil),
		oldestWait: prometheus.NewDesc("leasehold_task_oldest_wait_seconds",
			"How long the longest-waiting due pending task of a queue and kind has waited (0 when none is due), by the database clock; the same series as leasehold_tasks_pending_by_kind.",
			[]string{"queue", "kind"}, nil),
		limitSlots: prometheus.NewDesc("leasehold_limit_slots",
			"A limited key's limit: how many may hold its slots at once (the first 100 keys by name).", []string{"key"}, nil),
		limitHeld: prometheus.NewDesc("leasehold_limit_held",
			"A limited key's slots held now: its running tasks and other holders.", []string{"key"}, nil),
		limitWaiting: prometheus.NewDesc("leasehold_limit_waiting",
			"A limited key's pending tasks, counted up to 10000.", []string{"key"}, nil),
		rateStarts: prometheus.NewDesc("leasehold_limit_rate_starts",
			"A key's rate: the task starts allowed in any period of period_seconds (keys with a rate only).", []string{"key", "period_seconds"}, nil),
		rateSpent: prometheus.NewDesc("leasehold_limit_rate_spent",
			"A key's task starts within the last period of its rate.", []string{"key"}, nil),
		queuePaused: prometheus.NewDesc("leasehold_queue_paused",
			"1 for each queue paused now.", []string{"queue"}, nil),
		rows: prometheus.NewDesc("leasehold_table_rows_estimate",
			"The planner's estimate of a table's rows (pg_class.reltuples, refreshed by VACUUM and ANALYZE; absent before the first).",
			[]string{"table"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.leases, c.oldestExpiry, c.tasks, c.oldestDue, c.pendingByKind, c.oldestWait, c.rows,
		c.limitSlots, c.limitHeld, c.limitWaiting, c.rateStarts, c.rateSpent, c.queuePaused} {
		ch <- d
	}
}

// dbReading is one reading of the database gauges, or why there is none.
type dbReading struct {
	at     time.Time
	g      db.MetricsGaugesRow
	byKind []db.TaskPendingSummaryRow
	limits []db.LeaseLimitStatus
	paused []db.QueuePause
	err    error
}

// read returns a reading no older than cacheFor. The scrape's own context
// does not reach a collector: the statement is bounded by the timeout.
func (c *dbCollector) read() dbReading {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.at.IsZero() && time.Since(c.last.at) < c.cacheFor {
		return c.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	r := dbReading{}
	r.g, r.err = c.q.MetricsGauges(ctx, maxGaugeCount)
	if r.err == nil {
		r.byKind, r.err = c.q.TaskPendingSummary(ctx, maxGaugeCount)
	}
	if r.err == nil {
		r.limits, r.err = c.q.LimitList(ctx, db.LimitListParams{After: "", RowLimit: maxLimitSeries})
	}
	if r.err == nil {
		r.paused, r.err = c.q.QueuePauses(ctx)
	}
	r.at = time.Now()
	c.last = r
	return r
}

// Collect implements prometheus.Collector.
func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.read()
	g, byKind, err := r.g, r.byKind, r.err
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.up, 1)
	gauge(c.leases, float64(g.LeasesActive), "active")
	gauge(c.leases, float64(g.LeasesExpiredUnannounced), "expired_unannounced")
	gauge(c.oldestExpiry, g.OldestUnannouncedExpirySeconds)
	gauge(c.tasks, float64(g.TasksPending), task.StatePending)
	gauge(c.tasks, float64(g.TasksRunning), task.StateRunning)
	gauge(c.tasks, float64(g.TasksDead), task.StateDead)
	gauge(c.oldestDue, g.OldestDueTaskSeconds)
	for _, k := range foldKinds(byKind, maxKindSeries) {
		gauge(c.pendingByKind, float64(k.Pending), k.Queue, k.Kind)
		gauge(c.oldestWait, k.OldestWaitSeconds, k.Queue, k.Kind)
	}
	for _, l := range r.limits {
		gauge(c.limitSlots, float64(l.Slots), l.Resource)
		gauge(c.limitHeld, float64(l.Held), l.Resource)
		gauge(c.limitWaiting, float64(l.Waiting), l.Resource)
		if l.RateStarts > 0 {
			gauge(c.rateStarts, float64(l.RateStarts), l.Resource, strconv.Itoa(int(l.RatePeriodSeconds)))
			gauge(c.rateSpent, float64(l.RateSpent), l.Resource)
		}
	}
	for _, p := range r.paused {
		gauge(c.queuePaused, 1, p.Queue)
	}
	for table, n := range map[string]float64{
		"leases": g.LeasesRowsEstimate, "lease_events": g.LeaseEventsRowsEstimate, "tasks": g.TasksRowsEstimate,
	} {
		if n >= 0 {
			gauge(c.rows, n, table)
		}
	}
}

// foldKinds bounds the pending summary to at most limit rows (limit ≥ 2).
// When there are more, the limit−1 (queue, kind)s whose oldest due task
// waited longest keep their own rows (ties: the most pending tasks, then
// queue and kind by name, so that the choice is the same on every replica
// and every scrape of the same data), and the rest are folded into one row
// of queue and kind otherLabel: their counts summed (up to maxGaugeCount,
// like every count), their longest wait. A (queue, kind) that is really
// named ("other", "other") is folded into it too, so no series is reported
// twice. The longest waits keep their names because they are what the
// alerts look for; the row folded in still carries the longest of the
// rest, so an alert on max() misses nothing.
func foldKinds(rows []db.TaskPendingSummaryRow, limit int) []db.TaskPendingSummaryRow {
	if len(rows) <= limit {
		return rows
	}
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b db.TaskPendingSummaryRow) int {
		return cmp.Or(cmp.Compare(b.OldestWaitSeconds, a.OldestWaitSeconds), cmp.Compare(b.Pending, a.Pending),
			cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Kind, b.Kind))
	})
	kept := make([]db.TaskPendingSummaryRow, 0, limit)
	other := db.TaskPendingSummaryRow{Queue: otherLabel, Kind: otherLabel}
	for i, r := range rows {
		if i < limit-1 && (r.Queue != otherLabel || r.Kind != otherLabel) {
			kept = append(kept, r)
			continue
		}
		other.Pending = min(other.Pending+r.Pending, maxGaugeCount)
		other.OldestWaitSeconds = max(other.OldestWaitSeconds, r.OldestWaitSeconds)
	}
	return append(kept, other)
}

// ScheduleTicked counts a tick the scheduler handled (scheduler.Scheduler's
// Enqueued): a task made, or none (skipped or made already), standing for
// missed ticks before it.
func (m *Metrics) ScheduleTicked(_ string, _ time.Time, taskID, missed int64) {
	if taskID != 0 {
		m.scheduleTicks.WithLabelValues("made").Inc()
	} else {
		m.scheduleTicks.WithLabelValues("skipped").Inc()
	}
	if missed > 0 {
		m.scheduleTicks.WithLabelValues("missed").Add(float64(missed))
	}
}
