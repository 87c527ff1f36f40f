package server

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/name"
	"github.com/leasehold/leasehold/lease"
)

// acquireRequest is the body of POST /api/leases. Like every request body,
// its optional fields are left out when it is encoded (omitempty), so that
// it encodes back to a body the API accepts: a null is refused
// (checkMembers).
type acquireRequest struct {
	Resource    string `json:"resource"`
	Holder      string `json:"holder"`
	TTLSeconds  *int64 `json:"ttl_seconds,omitempty"`
	WaitSeconds *int64 `json:"wait_seconds,omitempty"`
	// Slots makes resource a key of that many slots: the lease is a free
	// slot's (lease.AcquireParams.Slots).
	Slots *int64 `json:"slots,omitempty"`
}

func (q acquireRequest) validate() error {
	return firstError(checkResource("resource", q.Resource), checkName("holder", q.Holder),
		checkTTL(q.TTLSeconds), checkWait(q.WaitSeconds), checkSlots("slots", q.Resource, q.Slots))
}

// checkSlots validates an optional number of slots of key: 1 to
// lease.MaxSlots, and a key short enough for its slots' names.
func checkSlots(field, key string, slots *int64) error {
	if slots == nil {
		return nil
	}
	if *slots < 1 || *slots > lease.MaxSlots {
		return badRequestf("%q is %d; it must be from 1 to %d", field, *slots, lease.MaxSlots)
	}
	if n := len(lease.SlotName(key, lease.MaxSlots)); n > name.MaxBytes {
		return badRequestf("the key %q is %d bytes too long for its slots' names (KEY#N, at most %d bytes); shorten it", key, n-name.MaxBytes, name.MaxBytes)
	}
	return nil
}

// maxWaitSeconds bounds the wait_seconds of one acquisition: a client that
// means to wait longer asks again, as the Go client does.
const maxWaitSeconds = int64(lease.MaxWait / time.Second)

// checkWait validates an optional wait_seconds.
func checkWait(wait *int64) error {
	if wait != nil && (*wait < 0 || *wait > maxWaitSeconds) {
		return badRequestf(`"wait_seconds" is %d; it must be between 0 and %d (to wait longer, ask again when it runs out)`, *wait, maxWaitSeconds)
	}
	return nil
}

func handleLeaseAcquire(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[acquireRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if err := mayLease(r, req.Resource, req.Holder); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		ttl := d.DefaultTTL
		if req.TTLSeconds != nil {
			ttl = time.Duration(*req.TTLSeconds) * time.Second
		}
		p := lease.AcquireParams{Resource: req.Resource, Holder: req.Holder, TTL: ttl, Slots: int(deref(req.Slots))}
		var acq lease.Acquisition
		if wait := deref(req.WaitSeconds); wait > 0 {
			acq, err = acquireWaiting(w, r, d, p, time.Duration(wait)*time.Second)
		} else {
			acq, err = d.Leases.Acquire(r.Context(), p)
		}
		d.Metrics.leaseOp("acquire", err)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if !acq.New {
			encode(w, http.StatusOK, acq.Lease)
			return
		}
		// A holding this request made, whose client is gone or whose answer cannot be sent,
		// is one its holder never learns of: release it rather than leave it to expire. (A
		// lease it already held is left alone: the holder knows its fence.)
		if clientGone(r) || encodeFlushed(w, http.StatusCreated, acq.Lease) != nil {
			releaseAbandoned(d, acq.Lease)
		}
	})
}

// releaseAbandoned releases, under its fence, a lease acquired for a client that went away
// before it could hear so.
func releaseAbandoned(d Deps, l lease.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.Leases.Release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence}); err != nil &&
		!errors.Is(err, lease.ErrNotHeld) {
		d.Log.Warn().Err(err).Str("resource", l.Resource).Int64("fence", l.Fence).
			Msg("could not release a lease acquired for a client that went away; it expires at its TTL")
	}
}

// errStopping ends a waiting acquisition or claim when the replica shuts
// down.
var errStopping = leasestore.ErrStopping

// answerMargin is the time a waiting request leaves itself, past its
// wait, for its last statement and for writing the answer.
const answerMargin = 5 * time.Second

// holdOpen moves the connection's deadlines (the server's ReadTimeout and
// WriteTimeout) past deadline and answerMargin, for a request whose answer
// may come a whole wait after it: a waiting acquisition, claim or
// heartbeat. A connection that cannot (in a test recorder) keeps its own.
func holdOpen(w http.ResponseWriter, deadline time.Time) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(deadline.Add(answerMargin))
	_ = rc.SetWriteDeadline(deadline.Add(answerMargin))
}

// acquireWaiting acquires p for a request with wait_seconds: while another
// holder holds the resource it waits, up to wait, for the lease to be
// released or to expire (leasestore.Store.AcquireWaiting), woken by the
// release's NOTIFY through Deps.Listener or at the holder's expires_at.
// Waiters are not queued: whichever acquisition lands first wins, and the
// others wait on.
//
// When the wait runs out the answer is the current holder's lease (409), as
// without wait_seconds. The wait ends early when the client goes away or
// the replica shuts down (Deps.Stopping). The wait itself is not bounded by
// the API's database budget (see BoundRequest); each statement is.
func acquireWaiting(w http.ResponseWriter, r *http.Request, d Deps, p lease.AcquireParams, wait time.Duration) (lease.Acquisition, error) {
	ctx, budget, stop := unbounded(r)
	defer stop()
	deadline := time.Now().Add(wait)
	holdOpen(w, deadline)
	p.Wait = wait
	return d.Leases.AcquireWaiting(ctx, p, leasestore.WaitParams{
		Listener: d.Listener, Stopping: d.Stopping, Statement: budget,
		Waiting: func(held lease.Lease) {
			d.Log.Debug().Str("resource", p.Resource).Str("holder", p.Holder).Str("held_by", held.Holder).
				Stringer("wait", wait).Msg("acquisition waits for the lease")
		},
	})
}

// budgetKey is the context key of the request context that BoundRequest
// bounded.
type budgetKey struct{}

type budgeted struct {
	parent context.Context // before the budget: ends when the client goes away
	budget time.Duration
}

// BoundRequest returns r with a context that ends budget from now: how
// long an API request may wait on the database, so that none hangs on a
// database that does not answer. An acquisition with wait_seconds, which
// waits on purpose, goes on past that deadline (until its wait runs out or
// the client goes away) with each of its statements bounded by budget.
func BoundRequest(r *http.Request, budget time.Duration) (*http.Request, context.CancelFunc) {
	parent := r.Context()
	ctx, cancel := context.WithTimeout(context.WithValue(parent, budgetKey{}, budgeted{parent: parent, budget: budget}), budget)
	return r.WithContext(ctx), cancel
}

// clientGone reports whether r's client went away (its connection closed), whatever
// BoundRequest's budget says: a waiting request outlives the budget on purpose.
func clientGone(r *http.Request) bool {
	if b, ok := r.Context().Value(budgetKey{}).(budgeted); ok {
		return b.parent.Err() != nil
	}
	return r.Context().Err() != nil
}

// unbounded returns a context of r that ends when the client goes away but
// not with the API budget of BoundRequest, and that budget (zero when r was
// not bounded: its context is then returned as it is).
func unbounded(r *http.Request) (context.Context, time.Duration, context.CancelFunc) {
	b, ok := r.Context().Value(budgetKey{}).(budgeted)
	if !ok {
		return r.Context(), 0, func() {}
	}
	// Keep the request's values; end with the parent, not the budget.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(b.parent, func() { cancel(context.Cause(b.parent)) })
	return ctx, b.budget, func() {
		stop()
		cancel(nil)
	}
}

type renewRequest struct {
	Resource   string `json:"resource"`
	Holder     string `json:"holder"`
	TTLSeconds *int64 `json:"ttl_seconds,omitempty"`
	Fence      *int64 `json:"fence,omitempty"`
}

func (q renewRequest) validate() error {
	return firstError(checkResource("resource", q.Resource), checkName("holder", q.Holder),
		checkTTL(q.TTLSeconds), checkFence(q.Fence))
}

func handleLeaseRenew(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := decode[renewRequest](w, r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if err := mayLease(r, req.Resource, req.Holder); err != nil {
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
	Fence    *int64 `json:"fence,omitempty"`
}

func (q releaseRequest) validate() error {
	return firstError(checkResource("resource", q.Resource), checkName("holder", q.Holder), checkFence(q.Fence))
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
		if err := mayLease(r, req.Resource, req.Holder); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		l, err := d.Leases.Release(r.Context(), lease.ReleaseParams{
			Resource: req.Resource, Holder: req.Holder, Fence: deref(req.Fence), ID: id,
		})
		d.Metrics.leaseReleased(l, err)
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
