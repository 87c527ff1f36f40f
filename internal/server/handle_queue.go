package server

import (
	"net/http"
	"time"

	"github.com/leasehold/leasehold/task"
)

// pauseRequest is the body of PUT /api/queues/{queue}/pause.
type pauseRequest struct {
	// Until, RFC 3339, ends the pause on its own; absent: when resumed.
	Until  *string `json:"until,omitempty"`
	Reason *string `json:"reason,omitempty"`
}

// maxReasonBytes bounds a pause's reason.
const maxReasonBytes = 1000

func (q pauseRequest) validate() error {
	if q.Until != nil {
		if _, err := time.Parse(time.RFC3339Nano, *q.Until); err != nil {
			return badRequestf(`"until" %q is not an RFC 3339 time; send e.g. "2030-01-02T15:04:05Z"`, *q.Until)
		}
	}
	if q.Reason != nil && len(*q.Reason) > maxReasonBytes {
		return badRequestf(`"reason" is %d bytes; at most %d`, len(*q.Reason), maxReasonBytes)
	}
	return nil
}

// pathQueue reads the {queue} of a queue route.
func pathQueue(r *http.Request) (string, error) {
	q := r.PathValue("queue")
	return q, checkName("queue", q)
}

// handleQueuePause serves PUT /api/queues/{queue}/pause: the queue's
// pending tasks are not claimed until it is resumed (or until "until").
func handleQueuePause(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queue, err := pathQueue(r)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		req, err := decode[pauseRequest](w, r)
		if err == nil {
			err = mayQueue(r, queue)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		var until time.Time
		if req.Until != nil {
			until, _ = time.Parse(time.RFC3339Nano, *req.Until)
		}
		var reason string
		if req.Reason != nil {
			reason = *req.Reason
		}
		p, err := d.Tasks.PauseQueue(r.Context(), queue, until, reason)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, p)
	})
}

// handleQueueResume serves DELETE /api/queues/{queue}/pause: 204, the
// claimers woken; 404 when the queue was not paused.
func handleQueueResume(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queue, err := pathQueue(r)
		if err == nil {
			err = discardBody(w, r)
		}
		if err == nil {
			err = mayQueue(r, queue)
		}
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		resumed, err := d.Tasks.ResumeQueue(r.Context(), queue)
		switch {
		case err != nil:
			writeError(w, r, d.Log, err)
		case !resumed:
			writeError(w, r, d.Log, notFoundf("the queue %q is not paused; list the paused queues with GET /api/queues/paused", queue))
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
}

// handleQueuePaused serves GET /api/queues/paused: the paused queues.
func handleQueuePaused(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps, err := d.Tasks.PausedQueues(r.Context())
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if ps == nil {
			ps = []task.QueuePause{}
		}
		encode(w, http.StatusOK, ps)
	})
}

// mayQueue refuses a pause or resume of a queue the request's token's
// queue prefixes do not allow.
func mayQueue(r *http.Request, queue string) error {
	if t := principal(r); t != nil && !within(t.Queues, queue) {
		return forbiddenf("the token %q may not pause or resume the queue %q: its queues begin with %q", t.Name, queue, t.Queues)
	}
	return nil
}
