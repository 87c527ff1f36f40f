package leasehold

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/leasehold/leasehold/internal/restclient"
)

// RemoteConfig says where a leasehold service is and how to reach it, for
// NewRemoteClient.
type RemoteConfig struct {
	// URL is the service's base URL, such as "http://localhost:8080" (what
	// the CLI's --url and LEASEHOLD_URL name). A path is kept as a prefix
	// of the API's paths, for a service behind a reverse proxy.
	URL string
	// Token, when set, is sent as "Authorization: Bearer <token>" on every
	// request: what a service started with --api-token requires.
	Token string
	// HTTPClient sends the requests (nil: a client of its own, which uses
	// http.DefaultTransport and gives up on a request after 30 s). Set its
	// Timeout, if any, well above the renew interval of the leases you
	// hold; a request that waits (an acquisition or a claim with a wait)
	// gets its wait added to it.
	HTTPClient *http.Client
}

// defaultRequestTimeout bounds a request of the default http.Client, so that
// a call with a context that never ends does not wait forever on a service
// that does not answer.
const defaultRequestTimeout = 30 * time.Second

// newREST is the REST client of rc, checked.
func newREST(rc RemoteConfig) (*restclient.Client, error) {
	if rc.URL == "" {
		return nil, fmt.Errorf("%w: RemoteConfig.URL is empty; name the service, e.g. http://localhost:8080", ErrInvalidConfig)
	}
	u, err := restclient.ParseBase(rc.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	hc := rc.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: defaultRequestTimeout}
	}
	return restclient.New(u, rc.Token, hc, newStatusError), nil
}

// StatusError is an answer of a leasehold service that is neither a success
// nor a refusal with an error of its own (lease.ErrNotHeld, a
// *lease.HeldError, task.ErrLeaseLost, ...): bad input (400), a missing or
// wrong token (401), the database unavailable (503), and so on.
type StatusError struct {
	Method     string
	Path       string
	StatusCode int
	// Message is the service's one sentence on what is wrong and how to fix
	// it, or the start of the body when the answer was not leasehold's JSON
	// error (a proxy's error page, say).
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// HTTPStatus is the status the service answered.
func (e *StatusError) HTTPStatus() int { return e.StatusCode }

// Transient reports whether the status says to try again later: 429, 502,
// 503 or 504 (a replica or its database briefly unavailable, a front door
// with no replica behind it).
func (e *StatusError) Transient() bool {
	switch e.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// IsTransient reports whether err is a failure of a remote client's call
// that may pass if it is made again: the request did not reach the service
// or its answer did not come back (a network error or a timeout), or the
// service answered 429, 502, 503 or 504. Refusals (lease.ErrNotHeld, a
// *lease.HeldError, task.ErrLeaseLost, ...), other statuses and the
// caller's context being cancelled are not transient.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return restclient.Transient(err)
}

// newStatusError is the error of an answer the client has no other for.
func newStatusError(method, path string, status int, message string) error {
	return &StatusError{Method: method, Path: path, StatusCode: status, Message: message}
}
