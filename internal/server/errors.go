package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/schedule"
	"github.com/leasehold/leasehold/task"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
)

// errorBody is every error response: one sentence saying what is wrong and
// how to fix it; Lease is the current holder's lease on a 409.
type errorBody struct {
	Error string       `json:"error"`
	Lease *lease.Lease `json:"lease,omitempty"`
	// Schedule is the schedule that holds the name on a 409 of POST
	// /api/schedules.
	Schedule *schedule.Schedule `json:"schedule,omitempty"`
	// TaskState is the task's state on a 409 of its holder's routes, when
	// known: "cancelled" tells its worker the task was cancelled.
	TaskState string `json:"task_state,omitempty"`
}

// writeError is the one place where errors become statuses. Only errors the
// client cannot fix are logged.
func writeError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	var (
		denied *forbidden
		bad    *badRequest
		tooBig *http.MaxBytesError
		large  *payloadTooLarge
		absent *notFound
		held   *lease.HeldError
		exists *schedule.ExistsError
	)
	switch {
	case errors.As(err, &bad):
		encode(w, http.StatusBadRequest, errorBody{Error: bad.msg})
	case errors.As(err, &denied):
		encode(w, http.StatusForbidden, errorBody{Error: denied.msg})
	case errors.As(err, &absent):
		encode(w, http.StatusNotFound, errorBody{Error: absent.msg})
	case errors.As(err, &large):
		encode(w, http.StatusRequestEntityTooLarge, errorBody{Error: large.msg})
	case errors.As(err, &tooBig):
		encode(w, http.StatusRequestEntityTooLarge, errorBody{Error: "request body is over 1 MiB; send a smaller body"})
	case errors.As(err, &held):
		encode(w, http.StatusConflict, errorBody{
			Error: held.Lease.Resource + " is held by " + held.Lease.Holder + "; wait for its release or expiry and try again",
			Lease: &held.Lease,
		})
	case errors.As(err, &exists):
		encode(w, http.StatusConflict, errorBody{Error: exists.Error(), Schedule: &exists.Schedule})
	case errors.Is(err, schedule.ErrNotFound):
		encode(w, http.StatusNotFound, errorBody{Error: "no schedule has this name; list schedules with GET /api/schedules"})
	case errors.Is(err, lease.ErrNotHeld):
		encode(w, http.StatusNotFound, errorBody{Error: "the holder holds no active lease on this resource with that fence (expired, released, someone else's, or never acquired); acquire it again"})
	case errors.Is(err, lease.ErrNotFound):
		encode(w, http.StatusNotFound, errorBody{Error: "no lease has this id; list leases with GET /api/leases"})
	case errors.Is(err, task.ErrCancelled) && errors.Is(err, task.ErrLeaseLost):
		encode(w, http.StatusConflict, errorBody{TaskState: task.StateCancelled,
			Error: "the task was cancelled: its lease is revoked and nothing its worker reports is accepted; stop working on it"})
	case errors.Is(err, task.ErrLeaseLost):
		var lost *task.LeaseLostError
		state := ""
		if errors.As(err, &lost) {
			state = lost.State
		}
		encode(w, http.StatusConflict, errorBody{TaskState: state, Error: "this processor does not hold the task with a live lease (another processor or fence claimed it, it is already completed or failed, or its lease expired); claim a task again with POST /api/tasks/next"})
	case errors.Is(err, task.ErrNotCancellable):
		encode(w, http.StatusConflict, errorBody{Error: "the task is done, dead or cancelled already; only pending and running tasks can be cancelled (retry a dead or cancelled one with POST /api/tasks/{id}/retry)"})
	case errors.Is(err, task.ErrNotRetryable):
		encode(w, http.StatusConflict, errorBody{Error: "the task is pending, running or done; only dead and cancelled tasks can be retried"})
	case errors.Is(err, task.ErrUniqueKeyTaken):
		encode(w, http.StatusConflict, errorBody{Error: "another task of this kind now holds the task's unique key, so it cannot go back to the queue; cancel that task first, or insert a new one"})
	case errors.Is(err, task.ErrNotFound):
		encode(w, http.StatusNotFound, errorBody{Error: "no task has this id; list tasks with GET /api/tasks"})
	case errors.Is(err, errStopping):
		w.Header().Set("Retry-After", "1")
		encode(w, http.StatusServiceUnavailable, errorBody{Error: "this replica is shutting down; send the request again (another replica will answer it)"})
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
		w.WriteHeader(499)
	case unavailable(err):
		log.Warn().Err(err).Str("path", r.URL.Path).Msg("database unavailable")
		msg := "the database cannot be reached; retry shortly"
		if timedOut(err) {
			msg = "the database did not answer in time; retry shortly"
		}
		w.Header().Set("Retry-After", "1")
		encode(w, http.StatusServiceUnavailable, errorBody{Error: msg})
	default:
		log.Error().Err(err).Str("path", r.URL.Path).Msg("internal error")
		encode(w, http.StatusInternalServerError, errorBody{Error: "internal error; the server log has the details"})
	}
}

// forbidden is a request the caller may not make, whatever its body: a
// lease in the reserved namespace, or beyond what its token allows (403).
type forbidden struct{ msg string }

func (e *forbidden) Error() string { return e.msg }

func forbiddenf(format string, args ...any) error {
	return &forbidden{msg: fmt.Sprintf(format, args...)}
}

// notFound is a 404 that says what was not found and what to do.
type notFound struct{ msg string }

func (e *notFound) Error() string { return e.msg }

func notFoundf(format string, args ...any) error {
	return &notFound{msg: fmt.Sprintf(format, args...)}
}

// unavailable reports errors that mean the database cannot serve now but
// may soon: it cannot be reached, a connection broke, it is shutting down
// or starting up, it is out of connections or resources, or it did not
// answer in time (the request's deadline or statement_timeout).
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection_exception
			return true
		case strings.HasPrefix(pgErr.Code, "53"): // insufficient_resources: too many connections, disk full
			return true
		}
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
		return timedOut(err)
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || timedOut(err) ||
		// A connection the server closed under a statement.
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		pgconn.SafeToRetry(err)
}

// timedOut reports errors that mean the database did not answer in time.
func timedOut(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57014" // query_canceled: statement_timeout
	}
	return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)
}
