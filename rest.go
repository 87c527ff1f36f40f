package leasehold

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
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

// rest is the REST API's client: one base URL, one token, one http.Client.
// It is safe for concurrent use.
type rest struct {
	base  *url.URL
	token string
	http  *http.Client
}

func newREST(rc RemoteConfig) (*rest, error) {
	u, err := url.Parse(rc.URL)
	switch {
	case rc.URL == "":
		return nil, fmt.Errorf("%w: RemoteConfig.URL is empty; name the service, e.g. http://localhost:8080", ErrInvalidConfig)
	case err != nil:
		return nil, fmt.Errorf("%w: leasehold URL %q: %w", ErrInvalidConfig, rc.URL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: leasehold URL %q must start with http:// or https://", ErrInvalidConfig, rc.URL)
	case u.Host == "":
		return nil, fmt.Errorf("%w: leasehold URL %q names no host; use e.g. http://localhost:8080", ErrInvalidConfig, rc.URL)
	case u.User != nil, u.RawQuery != "", u.Fragment != "":
		return nil, fmt.Errorf("%w: leasehold URL %q must not carry a user, a query or a fragment; pass the token in RemoteConfig.Token", ErrInvalidConfig, rc.URL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	hc := rc.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: defaultRequestTimeout}
	}
	return &rest{base: u, token: rc.Token, http: hc}, nil
}

// waiting returns the client for a request that the service may hold for
// wait: its time limit counts from when the service stops waiting.
func (c *rest) waiting(wait time.Duration) *rest {
	if wait <= 0 || c.http.Timeout <= 0 {
		return c
	}
	hc := *c.http
	hc.Timeout += wait
	w := *c
	w.http = &hc
	return &w
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
	var status *StatusError
	if errors.As(err, &status) {
		return status.Transient()
	}
	var transport *url.Error
	return errors.As(err, &transport)
}

// errorBody is the service's answer to a request it refused.
type errorBody struct {
	Error     string          `json:"error"`
	Lease     json.RawMessage `json:"lease"`
	Schedule  json.RawMessage `json:"schedule"`
	TaskState string          `json:"task_state"`
}

// refusal maps a status with a meaning of its own to its error; nil leaves
// it a *StatusError.
type refusal func(status int, body errorBody) error

// Bounds on what the client reads of an answer: a full page of 10000 leases
// fits; an error is one sentence.
const (
	maxAnswerBytes = 64 << 20
	maxErrorBytes  = 64 << 10
)

// do sends one request and decodes a 2xx answer into out (nothing for a
// 204), returning the status. A refused request becomes refused's error or
// a *StatusError.
func (c *rest) do(ctx context.Context, method, path string, query url.Values, in, out any, refused refusal) (int, error) {
	u := c.base.JoinPath(path)
	u.RawQuery = query.Encode()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("%s %s: encode request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err // a *url.Error: transient unless ctx ended
	}
	defer func() {
		// Drain a little so that the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if resp.StatusCode == http.StatusNoContent || out == nil {
			return resp.StatusCode, nil
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		if err != nil {
			return 0, &url.Error{Op: method, URL: u.String(), Err: fmt.Errorf("reading the answer: %w", err)}
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return 0, fmt.Errorf("%s %s: the answer (%d) is not what leasehold sends: %w", method, path, resp.StatusCode, err)
		}
		return resp.StatusCode, nil
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	if err != nil {
		return 0, &url.Error{Op: method, URL: u.String(), Err: fmt.Errorf("reading the answer (%d): %w", resp.StatusCode, err)}
	}
	var eb errorBody
	if json.Unmarshal(raw, &eb) != nil || eb.Error == "" {
		eb = errorBody{Error: strings.TrimSpace(string(raw[:min(len(raw), 200)]))}
	}
	if refused != nil {
		if err := refused(resp.StatusCode, eb); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, &StatusError{Method: method, Path: u.Path, StatusCode: resp.StatusCode, Message: eb.Error}
}
