package server

import (
	"net/http"
	"net/url"
	"time"

	"github.com/leasehold/leasehold/internal/lease"
)

type acquireRequest struct {
	Resource   string `json:"resource"`
	Holder     string `json:"holder"`
	TTLSeconds *int64 `json:"ttl_seconds"`
}

func (q acquireRequest) validate() error {
	return firstError(checkName("resource", q.Resource), checkName("holder", q.Holder), checkTTL(q.TTLSeconds))
}

func handleLeaseAcquire(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[acquireRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		ttl := d.DefaultTTL
		if req.TTLSeconds != nil {
			ttl = time.Duration(*req.TTLSeconds) * time.Second
		}
		acq, err := d.Leases.Acquire(r.Context(), lease.AcquireParams{Resource: req.Resource, Holder: req.Holder, TTL: ttl})
		d.Metrics.leaseOp("acquire", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		status := http.StatusOK
		if acq.New {
			status = http.StatusCreated
		}
		encode(w, status, acq.Lease)
	})
}

type renewRequest struct {
	Resource   string `json:"resource"`
	Holder     string `json:"holder"`
	TTLSeconds *int64 `json:"ttl_seconds"`
	Fence      *int64 `json:"fence"`
}

func (q renewRequest) validate() error {
	return firstError(checkName("resource", q.Resource), checkName("holder", q.Holder),
		checkTTL(q.TTLSeconds), checkFence(q.Fence))
}

func handleLeaseRenew(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[renewRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		p := lease.RenewParams{Resource: req.Resource, Holder: req.Holder, Fence: deref(req.Fence)}
		if req.TTLSeconds != nil {
			p.TTL = time.Duration(*req.TTLSeconds) * time.Second
		}
		l, err := d.Leases.Renew(r.Context(), p)
		d.Metrics.leaseOp("renew", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, l)
	})
}

type releaseRequest struct {
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	Fence    *int64 `json:"fence"`
}

func (q releaseRequest) validate() error {
	return firstError(checkName("resource", q.Resource), checkName("holder", q.Holder), checkFence(q.Fence))
}

// handleLeaseRelease serves DELETE /api/leases/release and, withID, DELETE
// /api/leases/{id}, which must match the id too.
func handleLeaseRelease(d Deps, withID bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int64
		if withID {
			var err error
			if id, err = pathID(r); err != nil {
				writeError(w, r, d.Log, err)
				return
			}
		}
		req, err := decode[releaseRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		l, err := d.Leases.Release(r.Context(), lease.ReleaseParams{
			Resource: req.Resource, Holder: req.Holder, Fence: deref(req.Fence), ID: id,
		})
		d.Metrics.leaseOp("release", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, l)
	})
}

func handleLeaseGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		l, err := d.Leases.Get(r.Context(), id)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, l)
	})
}

// listParams reads ?prefix=, ?limit= and ?after_id= of a lease list.
func listParams(q url.Values, filter string) (lease.ListParams, error) {
	prefix, err := queryName(q, "prefix")
	if err != nil {
		return lease.ListParams{}, err
	}
	limit, err := queryInt(q, "limit", 1000, 1, 10000)
	if err != nil {
		return lease.ListParams{}, err
	}
	after, err := queryInt(q, "after_id", 0, 0, 1<<62)
	if err != nil {
		return lease.ListParams{}, err
	}
	return lease.ListParams{Filter: filter, Prefix: prefix, AfterID: after, Limit: int32(limit)}, nil
}

func handleLeaseList(d Deps, filter string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := listParams(r.URL.Query(), filter)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		leases, err := d.Leases.List(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, leases)
	})
}

func handleLeaseListAll(d Deps) http.Handler {
	type response struct {
		Instance Instance      `json:"instance"`
		Leases   []lease.Lease `json:"leases"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := listParams(r.URL.Query(), lease.FilterAll)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		leases, err := d.Leases.List(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, response{Instance: d.Instance, Leases: leases})
	})
}

// eventsParams reads ?resource=, ?after= and ?limit= of the audit history.
func eventsParams(q url.Values) (lease.EventsParams, error) {
	resource, err := queryName(q, "resource")
	if err != nil {
		return lease.EventsParams{}, err
	}
	after, err := queryInt(q, "after", 0, 0, 1<<62)
	if err != nil {
		return lease.EventsParams{}, err
	}
	limit, err := queryInt(q, "limit", 1000, 1, 10000)
	if err != nil {
		return lease.EventsParams{}, err
	}
	return lease.EventsParams{Resource: resource, AfterID: after, Limit: int32(limit)}, nil
}

func handleLeaseEvents(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := eventsParams(r.URL.Query())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		events, err := d.Leases.Events(r.Context(), p)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, events)
	})
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
