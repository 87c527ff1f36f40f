package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/server"
)

// runLeases measures acquire+release cycles and renewals at each concurrency, through the
// store in-process and through the REST API. Every client works on a resource of its own, so
// the figures are the commit path's, not contention's. Each acquire, release or renew is one
// commit, counted as one operation.
func runLeases(ctx context.Context, c Config, earlier []Result) ([]Result, error) {
	maxClients := 0
	for _, n := range c.Clients {
		maxClients = max(maxClients, n)
	}
	d, err := newDB(ctx, c.DatabaseURL, int32(maxClients+4))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	store := leasestore.NewStore(d.Pool)
	api, err := startAPI(server.Deps{Leases: store, DefaultTTL: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	defer api.Close()

	type mode struct {
		name string
		ops  leaseOps
	}
	modes := []mode{{"in-process", storeOps{store}}, {"REST", restOps{api}}}
	var results []Result
	for _, m := range modes {
		for _, n := range c.Clients {
			ops, elapsed, err := timed(ctx, n, c.Duration, func(ctx context.Context, client int, more func() bool) (int, error) {
				res := fmt.Sprintf("bench:%s:cycle:%d:%d", m.name, n, client)
				count := 0
				for more() {
					fence, err := m.ops.acquire(ctx, res)
					if err != nil {
						return count, err
					}
					if err := m.ops.release(ctx, res, fence); err != nil {
						return count + 1, err
					}
					count += 2
				}
				return count, nil
			})
			if err != nil {
				return nil, err
			}
			results = append(results, commitRate("acquire+release, "+m.name, n, ops, elapsed, earlier))

			ops, elapsed, err = timed(ctx, n, c.Duration, func(ctx context.Context, client int, more func() bool) (int, error) {
				res := fmt.Sprintf("bench:%s:renew:%d:%d", m.name, n, client)
				fence, err := m.ops.acquire(ctx, res)
				if err != nil {
					return 0, err
				}
				count := 0
				for more() {
					if err := m.ops.renew(ctx, res, fence); err != nil {
						return count, err
					}
					count++
				}
				return count, m.ops.release(ctx, res, fence)
			})
			if err != nil {
				return nil, err
			}
			results = append(results, commitRate("renew, "+m.name, n, ops, elapsed, earlier))
		}
	}
	hot, err := renewalsHOT(ctx, c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	results = append(results, hot)
	return results, nil
}

func commitRate(name string, clients, ops int, elapsed time.Duration, earlier []Result) Result {
	r := Result{Scenario: "leases", Case: name, Clients: clients, Value: float64(ops) / elapsed.Seconds(), Unit: "ops/s"}
	if b := baselineAt(earlier, clients); b > 0 {
		r.VsBaseline = r.Value / b
	}
	return r
}

// renewalsHOT renews leases a thousand times on connections of its own and reports the
// share of those updates PostgreSQL made heap-only (HOT: no index touched). The counters come
// from pg_stat_user_tables, which a backend publishes when it exits at the latest, so the
// connections are closed before the counters are read. The database is one of its own, so
// that no other statistics arrive meanwhile.
func renewalsHOT(ctx context.Context, base string) (Result, error) {
	const leases, renewals = 8, 125
	d, err := newDB(ctx, base, 2)
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	counters := func() (upd, hot int64, err error) {
		err = d.Pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'leases'`).Scan(&upd, &hot)
		return upd, hot, err
	}
	upd0, hot0, err := counters()
	if err != nil {
		return Result{}, err
	}
	pool, err := pgxpool.New(ctx, d.URL)
	if err != nil {
		return Result{}, err
	}
	store := storeOps{leasestore.NewStore(pool)}
	for i := range leases {
		res := fmt.Sprintf("bench:hot:%d", i)
		fence, err := store.acquire(ctx, res)
		if err != nil {
			pool.Close()
			return Result{}, err
		}
		for range renewals {
			if err := store.renew(ctx, res, fence); err != nil {
				pool.Close()
				return Result{}, err
			}
		}
	}
	pool.Close()
	var upd, hot int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		u, h, err := counters()
		if err != nil {
			return Result{}, err
		}
		upd, hot = u-upd0, h-hot0
		if upd >= leases*renewals || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the exited backends' statistics are on their way
	}
	r := Result{Scenario: "leases", Case: "renewals that were heap-only (HOT) updates", Unit: "%",
		Note: fmt.Sprintf("%d of %d updates (pg_stat_user_tables)", hot, upd)}
	if upd > 0 {
		r.Value = 100 * float64(hot) / float64(upd)
	}
	return r, nil
}

// leaseOps is one way to reach the lease service.
type leaseOps interface {
	acquire(ctx context.Context, resource string) (fence int64, err error)
	renew(ctx context.Context, resource string, fence int64) error
	release(ctx context.Context, resource string, fence int64) error
}

type storeOps struct{ s *leasestore.Store }

func (o storeOps) acquire(ctx context.Context, res string) (int64, error) {
	a, err := o.s.Acquire(ctx, lease.AcquireParams{Resource: res, Holder: "bench", TTL: 30 * time.Second})
	return a.Lease.Fence, err
}

func (o storeOps) renew(ctx context.Context, res string, fence int64) error {
	_, err := o.s.Renew(ctx, lease.RenewParams{Resource: res, Holder: "bench", Fence: fence})
	return err
}

func (o storeOps) release(ctx context.Context, res string, fence int64) error {
	_, err := o.s.Release(ctx, lease.ReleaseParams{Resource: res, Holder: "bench", Fence: fence})
	return err
}

type restOps struct{ api *apiServer }

func (o restOps) acquire(ctx context.Context, res string) (int64, error) {
	var l struct {
		Fence int64 `json:"fence"`
	}
	err := o.api.call(ctx, http.MethodPost, "/api/leases", fmt.Sprintf(`{"resource":%q,"holder":"bench"}`, res), http.StatusCreated, &l)
	return l.Fence, err
}

func (o restOps) renew(ctx context.Context, res string, fence int64) error {
	return o.api.call(ctx, http.MethodPut, "/api/leases/renew", fmt.Sprintf(`{"resource":%q,"holder":"bench","fence":%d}`, res, fence), http.StatusOK, nil)
}

func (o restOps) release(ctx context.Context, res string, fence int64) error {
	return o.api.call(ctx, http.MethodDelete, "/api/leases/release", fmt.Sprintf(`{"resource":%q,"holder":"bench","fence":%d}`, res, fence), http.StatusOK, nil)
}

// apiServer is the REST API on a loopback port, served as `serve` serves it.
type apiServer struct {
	srv    *http.Server
	base   string
	client *http.Client
}

func startAPI(d server.Deps) (*apiServer, error) {
	d.Log = zerolog.Nop()
	if d.Metrics == nil {
		d.Metrics = server.NewMetrics(func() bool { return true }, func() int64 { return 0 })
	}
	if d.Ready == nil {
		d.Ready = func(context.Context) error { return nil }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &apiServer{
		srv:    &http.Server{Handler: server.NewServer(d), ReadHeaderTimeout: 5 * time.Second},
		base:   "http://" + ln.Addr().String(),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}},
	}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

func (a *apiServer) Close() {
	_ = a.srv.Close()
	a.client.CloseIdleConnections()
}

// call sends body and fails unless the status is want; out, when not nil, receives the
// JSON answer.
func (a *apiServer) call(ctx context.Context, method, path, body string, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return statusError{what: method + " " + path, got: resp.StatusCode, want: want, body: string(b)}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// statusError is an answer with another status than the one wanted.
type statusError struct {
	what      string
	got, want int
	body      string
}

func (e statusError) Error() string {
	return fmt.Sprintf("%s: status %d, want %d: %s", e.what, e.got, e.want, e.body)
}
