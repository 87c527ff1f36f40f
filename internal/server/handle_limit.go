package server

import (
	"net/http"

	"github.com/leasehold/leasehold/lease"
)

// limitRequest is the body of PUT /api/limits/{key}.
type limitRequest struct {
	Slots int64 `json:"slots"`
}

func (q limitRequest) validate() error {
	if q.Slots < 1 || q.Slots > lease.MaxSlots {
		return badRequestf(`"slots" is %d; it must be from 1 to %d`, q.Slots, lease.MaxSlots)
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
			err = checkSlots("slots", key, &req.Slots)
		}
		if t := principal(r); err == nil && t != nil && !within(t.Resources, key) {
			err = forbiddenf("the token %q may not limit %q: its resources begin with %q", t.Name, key, t.Resources)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		l, err := d.Leases.SetLimit(r.Context(), key, int(req.Slots))
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
