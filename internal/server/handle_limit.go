package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// limitRequest is the body of PUT /api/limits/{key}: a new limit, a new
// rate (rate_starts 0: none), or both; neither changes nothing.
type limitRequest struct {
	Slots             *int64 `json:"slots,omitempty"`
	RateStarts        *int64 `json:"rate_starts,omitempty"`
	RatePeriodSeconds *int64 `json:"rate_period_seconds,omitempty"`
}

// maxRatePeriod bounds a rate's period.
const maxRatePeriod = 24 * time.Hour

func (q limitRequest) validate() error {
	switch {
	case q.Slots != nil && (*q.Slots < 1 || *q.Slots > lease.MaxSlots):
		return badRequestf(`"slots" is %d; it must be from 1 to %d`, *q.Slots, lease.MaxSlots)
	case (q.RateStarts == nil) != (q.RatePeriodSeconds == nil):
		return badRequestf(`give "rate_starts" and "rate_period_seconds" together, e.g. {"rate_starts": 50, "rate_period_seconds": 60} (rate_starts 0 removes the rate)`)
	case q.RateStarts != nil && (*q.RateStarts < 0 || *q.RateStarts > lease.MaxSlots):
		return badRequestf(`"rate_starts" is %d; it must be from 1 to %d (0: no rate)`, *q.RateStarts, lease.MaxSlots)
	case q.RatePeriodSeconds != nil && (*q.RatePeriodSeconds < 1 || *q.RatePeriodSeconds > int64(maxRatePeriod/time.Second)):
		return badRequestf(`"rate_period_seconds" is %d; it must be from 1 to %d`, *q.RatePeriodSeconds, int64(maxRatePeriod/time.Second))
	}
	return nil
}

// pathKey reads the {key} of a limits route: a name, which a limit to
// set must also have outside the reserved namespace.
func pathKey(r *http.Request, set bool) (string, error) {
	key := r.PathValue("key")
	if set {
		return key, checkResource("key", key)
	}
	return key, checkName("key", key)
}

// handleLimitSet serves PUT /api/limits/{key}: the key's limit, set.
func handleLimitSet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := pathKey(r, true)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		req, err := decode[limitRequest](w, r)
		if err == nil {
			err = checkSlots("slots", key, req.Slots)
		}
		if t := principal(r); err == nil && t != nil && !within(t.Resources, key) {
			err = forbiddenf("the token %q may not limit %q: its resources begin with %q", t.Name, key, t.Resources)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		var l lease.Limit
		if req.Slots != nil {
			l, err = d.Leases.SetLimit(r.Context(), key, int(*req.Slots))
		}
		if err == nil && req.RateStarts != nil {
			l, err = d.Leases.SetRate(r.Context(), key, int(*req.RateStarts), time.Duration(deref(req.RatePeriodSeconds))*time.Second)
		}
		if err == nil && req.Slots == nil && req.RateStarts == nil { // nothing to set: the limit as it is
			if l, err = d.Leases.Limit(r.Context(), key); errors.Is(err, lease.ErrNotFound) {
				err = notFoundf("the key %q has no limit; give slots or a rate to set one", key)
			}
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, l)
	})
}

// handleLimitGet serves GET /api/limits/{key}: 404 when the key has no
// limit.
func handleLimitGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := pathKey(r, false)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		l, err := d.Leases.Limit(r.Context(), key)
		if errors.Is(err, lease.ErrNotFound) {
			err = notFoundf("the key %q has no limit; set one with PUT /api/limits/{key}", key)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, l)
	})
}

// handleLimitList serves GET /api/limits?after=&limit=: the limited keys
// in name order.
func handleLimitList(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		after := q.Get("after")
		limit, err := queryInt(q, "limit", 100, 1, 1000)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		limits, err := d.Leases.Limits(r.Context(), after, int32(limit))
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if limits == nil {
			limits = []lease.Limit{}
		}
		encode(w, http.StatusOK, limits)
	})
}
