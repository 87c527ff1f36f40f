// Package restclient is leasehold's one client of its REST API: the Go
// library's remote client (its leases, tasks, schedules and remote workers)
// and the command line's lease, task, schedule and work commands all speak
// to a service through it.
package restclient

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

// Client is the REST API's client: one base URL, one token, one
// http.Client. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
	// statusError makes the error of an answer that is neither a success
	// nor a refusal of its own: the library's *StatusError.
	statusError func(method, path string, status int, message string) error
	// keep, when set, gets the body of a 2xx answer as it came (Keeping).
	keep *json.RawMessage
}

// Keeping returns the client for requests whose answer's body is kept in
// raw as well, as it came: for a caller that prints the API's own JSON.
func (c *Client) Keeping(raw *json.RawMessage) *Client {
	k := *c
	k.keep = raw
	return &k
}

// New returns a client of the service at base (its path a prefix of the
// API's), sending token (when not empty) on every request through hc, and
// making the errors of unexpected statuses with statusError.
func New(base *url.URL, token string, hc *http.Client, statusError func(method, path string, status int, message string) error) *Client {
	return &Client{base: base, token: token, http: hc, statusError: statusError}
}

// Waiting returns the client for a request that the service may hold for
// wait: its time limit counts from when the service stops waiting.
func (c *Client) Waiting(wait time.Duration) *Client {
	if wait <= 0 || c.http.Timeout <= 0 {
		return c
	}
	hc := *c.http
	hc.Timeout += wait
	w := *c
	w.http = &hc
	return &w
}

// ErrorBody is the service's answer to a request it refused.
type ErrorBody struct {
	Error     string          `json:"error"`
	Lease     json.RawMessage `json:"lease"`
	Schedule  json.RawMessage `json:"schedule"`
	TaskState string          `json:"task_state"`
}

// Refusal maps a status with a meaning of its own to its error; nil leaves
// it a *StatusError.
type Refusal func(status int, body ErrorBody) error

// Bounds on what the client reads of an answer: a full page of 10000 leases
// fits; an error is one sentence.
const (
	maxAnswerBytes = 64 << 20
	maxErrorBytes  = 64 << 10
)

// Do sends one request and decodes a 2xx answer into out (nothing for a
// 204), returning the status. A refused request becomes refused's error or
// the error of statusError.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, in, out any, refused Refusal) (int, error) {
	u := c.base.JoinPath(path)
	u.RawQuery = query.Encode()
	// The path as errors name it: JoinPath on a base without a path leaves
	// it without its leading slash (the request's URL has it all the same).
	shown := u.Path
	if !strings.HasPrefix(shown, "/") {
		shown = "/" + shown
	}
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
		if c.keep != nil {
			*c.keep = raw
		}
		return resp.StatusCode, nil
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	if err != nil {
		return 0, &url.Error{Op: method, URL: u.String(), Err: fmt.Errorf("reading the answer (%d): %w", resp.StatusCode, err)}
	}
	var eb ErrorBody
	if json.Unmarshal(raw, &eb) != nil || eb.Error == "" {
		eb = ErrorBody{Error: strings.TrimSpace(string(raw[:min(len(raw), 200)]))}
	}
	if refused != nil {
		if err := refused(resp.StatusCode, eb); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, c.statusError(method, shown, resp.StatusCode, eb.Error)
}

// Transient reports whether err is a failure that may pass if the request
// is made again: the request did not reach the service or its answer did
// not come back, or the service answered a status that says so (the
// library's StatusError.Transient).
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var status interface{ Transient() bool }
	if errors.As(err, &status) {
		return status.Transient()
	}
	var transport *url.Error
	return errors.As(err, &transport)
}

// ParseBase checks the base URL of a service (an http or https URL with a
// host, and neither user, query nor fragment) and returns it with no
// trailing slash, ready for New. Its error says what is wrong with raw.
func ParseBase(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("leasehold URL %q: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("leasehold URL %q must start with http:// or https://", raw)
	case u.Host == "":
		return nil, fmt.Errorf("leasehold URL %q names no host; use e.g. http://localhost:8080", raw)
	case u.User != nil, u.RawQuery != "", u.Fragment != "":
		return nil, fmt.Errorf("leasehold URL %q must not carry a user, a query or a fragment; pass a token apart from the URL", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}
