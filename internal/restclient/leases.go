package restclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// Leases is the lease service over the REST API.
type Leases struct{ C *Client }

// MaxWait is the longest wait one acquisition asks the service for
// (wait_seconds' bound); a longer Wait is asked for again.
const MaxWait = 300 * time.Second

// Bounds of the backoff between the requests of a waiting Acquire after a
// transient failure.
const (
	minWaitRetry = 100 * time.Millisecond
	maxWaitRetry = 5 * time.Second
)

// Acquire sends acquisitions, the service holding each up to p.Wait (at
// most MaxWait, in whole seconds) while another holder holds the resource;
// failures that IsTransient (a replica restarting, the network) are retried
// with backoff until p.Wait runs out.
func (r Leases) Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	if p.Wait <= 0 {
		return r.acquire(ctx, p, 0)
	}
	deadline := time.Now().Add(p.Wait)
	backoff := minWaitRetry
	for {
		// Whole seconds on the wire: round up, so as not to give up early.
		wait := min((time.Until(deadline)+time.Second-1)/time.Second*time.Second, MaxWait)
		acq, err := r.acquire(ctx, p, max(wait, time.Second))
		transient := Transient(err) && ctx.Err() == nil
		if err == nil || !(transient || errors.Is(err, lease.ErrHeld)) || !time.Now().Before(deadline) {
			return acq, err
		}
		if !transient {
			backoff = minWaitRetry
			continue
		}
		timer := time.NewTimer(min(backoff, time.Until(deadline)))
		select {
		case <-ctx.Done():
			timer.Stop()
			return lease.Acquisition{}, context.Cause(ctx)
		case <-timer.C:
		}
		backoff = min(2*backoff, maxWaitRetry)
	}
}

func (r Leases) acquire(ctx context.Context, p lease.AcquireParams, wait time.Duration) (lease.Acquisition, error) {
	body := struct {
		Resource    string `json:"resource"`
		Holder      string `json:"holder"`
		TTLSeconds  int64  `json:"ttl_seconds,omitempty"`
		WaitSeconds int64  `json:"wait_seconds,omitempty"`
		Slots       int    `json:"slots,omitempty"`
	}{p.Resource, p.Holder, int64(p.TTL / time.Second), int64(wait / time.Second), p.Slots}
	var l lease.Lease
	status, err := r.C.Waiting(wait).Do(ctx, http.MethodPost, "/api/leases", nil, body, &l, leaseRefusals(http.StatusConflict))
	if err != nil {
		return lease.Acquisition{}, err
	}
	return lease.Acquisition{Lease: l, New: status == http.StatusCreated}, nil
}

// Renew extends a held lease (lease.Store.Renew over REST).
func (r Leases) Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error) {
	body := struct {
		Resource   string `json:"resource"`
		Holder     string `json:"holder"`
		TTLSeconds int64  `json:"ttl_seconds,omitempty"`
		Fence      int64  `json:"fence,omitempty"`
	}{p.Resource, p.Holder, int64(p.TTL / time.Second), p.Fence}
	var l lease.Lease
	_, err := r.C.Do(ctx, http.MethodPut, "/api/leases/renew", nil, body, &l, leaseRefusals(http.StatusNotFound))
	return l, err
}

// Release gives a held lease up (lease.Store.Release over REST).
func (r Leases) Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error) {
	path := "/api/leases/release"
	if p.ID != 0 {
		path = "/api/leases/" + strconv.FormatInt(p.ID, 10)
	}
	body := struct {
		Resource string `json:"resource"`
		Holder   string `json:"holder"`
		Fence    int64  `json:"fence,omitempty"`
	}{p.Resource, p.Holder, p.Fence}
	var l lease.Lease
	_, err := r.C.Do(ctx, http.MethodDelete, path, nil, body, &l, leaseRefusals(http.StatusNotFound))
	return l, err
}

// Get reads one lease by resource.
func (r Leases) Get(ctx context.Context, id int64) (lease.Lease, error) {
	var l lease.Lease
	_, err := r.C.Do(ctx, http.MethodGet, "/api/leases/"+strconv.FormatInt(id, 10), nil, nil, &l, func(status int, _ ErrorBody) error {
		if status == http.StatusNotFound {
			return lease.ErrNotFound
		}
		return nil
	})
	return l, err
}

// List reads the leases, optionally those whose resource has a prefix.
func (r Leases) List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error) {
	path := "/api/leases"
	if p.Filter != "" && p.Filter != lease.FilterAll {
		path += "/" + p.Filter
	}
	q := url.Values{}
	if p.Prefix != "" {
		q.Set("prefix", p.Prefix)
	}
	if p.AfterID != 0 {
		q.Set("after_id", strconv.FormatInt(p.AfterID, 10))
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.FormatInt(int64(p.Limit), 10))
	}
	if path == "/api/leases" {
		var all struct {
			Leases []lease.Lease `json:"leases"`
		}
		_, err := r.C.Do(ctx, http.MethodGet, path, q, nil, &all, nil)
		return all.Leases, err
	}
	var leases []lease.Lease
	_, err := r.C.Do(ctx, http.MethodGet, path, q, nil, &leases, nil)
	return leases, err
}

// Events reads a resource's lease history, newest first.
func (r Leases) Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error) {
	q := url.Values{}
	if p.Resource != "" {
		q.Set("resource", p.Resource)
	}
	if p.AfterID != 0 {
		q.Set("after", strconv.FormatInt(p.AfterID, 10))
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.FormatInt(int64(p.Limit), 10))
	}
	var events []lease.Event
	_, err := r.C.Do(ctx, http.MethodGet, "/api/leases/events", q, nil, &events, nil)
	return events, err
}

// SetLimit sets a key's limit (PUT /api/limits/{key}).
func (r Leases) SetLimit(ctx context.Context, key string, slots int) (lease.Limit, error) {
	body := struct {
		Slots int `json:"slots"`
	}{slots}
	var l lease.Limit
	_, err := r.C.Do(ctx, http.MethodPut, "/api/limits/"+url.PathEscape(key), nil, body, &l, nil)
	return l, err
}

// SetRate sets a key's rate (PUT /api/limits/{key}); starts 0 removes it.
func (r Leases) SetRate(ctx context.Context, key string, starts int, period time.Duration) (lease.Limit, error) {
	body := struct {
		Starts int   `json:"rate_starts"`
		Period int64 `json:"rate_period_seconds"`
	}{starts, int64(period / time.Second)}
	if starts == 0 {
		body.Period = 1 // given with rate_starts always; ignored when it is 0
	}
	var l lease.Limit
	_, err := r.C.Do(ctx, http.MethodPut, "/api/limits/"+url.PathEscape(key), nil, body, &l, nil)
	return l, err
}

// Limit reads a key's limit (GET /api/limits/{key}); lease.ErrNotFound
// when it has none.
func (r Leases) Limit(ctx context.Context, key string) (lease.Limit, error) {
	var l lease.Limit
	_, err := r.C.Do(ctx, http.MethodGet, "/api/limits/"+url.PathEscape(key), nil, nil, &l, func(status int, _ ErrorBody) error {
		if status == http.StatusNotFound {
			return lease.ErrNotFound
		}
		return nil
	})
	return l, err
}

// Limits reads a page of the limited keys (GET /api/limits).
func (r Leases) Limits(ctx context.Context, after string, limit int32) ([]lease.Limit, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit != 0 {
		q.Set("limit", strconv.FormatInt(int64(limit), 10))
	}
	var limits []lease.Limit
	_, err := r.C.Do(ctx, http.MethodGet, "/api/limits", q, nil, &limits, nil)
	return limits, err
}

// leaseRefusals maps the refusals of the lease routes: 409 with the
// holder's lease to *lease.HeldError, 404 to lease.ErrNotHeld, for the
// statuses given.
func leaseRefusals(statuses ...int) Refusal {
	return func(status int, body ErrorBody) error {
		for _, s := range statuses {
			if s != status {
				continue
			}
			switch status {
			case http.StatusConflict:
				var l lease.Lease
				if len(body.Lease) > 0 && json.Unmarshal(body.Lease, &l) == nil {
					return &lease.HeldError{Lease: l}
				}
			case http.StatusNotFound:
				return lease.ErrNotHeld
			}
		}
		return nil
	}
}
