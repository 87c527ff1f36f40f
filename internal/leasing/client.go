package leasing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/lease"
)

// Client is the Go client of leasehold's REST API (contract §3). Its methods
// mirror Store's and answer with the same errors, so code written against one
// reads the same against the other:
//
//   - Acquire: a *HeldError (errors.Is ErrHeld) carrying the current holder's
//     lease when another holder holds the resource (409);
//   - Renew, Release: ErrNotHeld when the holder holds no active lease on the
//     resource (404): it expired, was released, is someone else's, or the
//     fence does not match;
//   - Get: ErrNotFound (404);
//   - any other answer that is not a success: a *StatusError with the status
//     and the server's message;
//   - the request not getting through or its answer not coming back: the
//     *url.Error of net/http.
//
// IsTransient tells the failures worth retrying from the others. Hold
// acquires a lease and keeps it alive in the background.
//
// A Client is safe for concurrent use; make one per base URL and share it.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// ClientOption configures a Client made by NewClient.
type ClientOption func(*Client)

// WithToken makes the client send "Authorization: Bearer <token>" on every
// request: what a server started with --api-token requires. An empty token
// sends no header.
func WithToken(token string) ClientOption {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient makes the client send its requests with hc instead of its
// own http.Client (which uses http.DefaultTransport and gives up on a request
// after 30 s). Set hc's Timeout, if any, well above the renew interval of the
// leases you Hold: a renewal is bounded by the holder's deadline anyway. An
// Acquire with a Wait adds the time the server may wait to the Timeout.
func WithHTTPClient(hc *http.Client) ClientOption {
	return func(c *Client) { c.http = hc }
}

// defaultRequestTimeout bounds a request of the default http.Client, so that
// a call with a context that never ends does not wait forever on a server
// that does not answer.
const defaultRequestTimeout = 30 * time.Second

// NewClient returns a client of the leasehold server at baseURL, such as
// "http://localhost:8080" (what --url and LEASEHOLD_URL name). A path in
// baseURL is kept as a prefix of the API's paths, for a server behind a
// reverse proxy. It only checks baseURL; it does not contact the server.
func NewClient(baseURL string, opts ...ClientOption) (*Client, error) {
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("leasehold URL %q: %w", baseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("leasehold URL %q must start with http:// or https://", baseURL)
	case u.Host == "":
		return nil, fmt.Errorf("leasehold URL %q names no host; use e.g. http://localhost:8080", baseURL)
	case u.User != nil, u.RawQuery != "", u.Fragment != "":
		return nil, fmt.Errorf("leasehold URL %q must not carry a user, a query or a fragment; pass the token with WithToken", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	c := &Client{base: u, http: &http.Client{Timeout: defaultRequestTimeout}}
	for _, opt := range opts {
		opt(c)
	}
	if c.http == nil {
		return nil, errors.New("WithHTTPClient needs an *http.Client, not nil")
	}
	return c, nil
}

// URL returns the base URL the client talks to.
func (c *Client) URL() string { return c.base.String() }

// StatusError is an answer of the server that is neither a success nor a
// refusal with an error of its own (see Client): bad input (400), a missing
// or wrong token (401), the database unavailable (503), and so on.
type StatusError struct {
	Method     string
	Path       string
	StatusCode int
	// Message is the server's one sentence on what is wrong and how to fix
	// it, or the start of the body when the answer was not leasehold's JSON
	// error (a proxy's error page, say).
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

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

// IsTransient reports whether err is a failure that may pass if the request
// is sent again: it did not reach the server or its answer did not come back
// (a network error or a timeout), or the server answered 429, 502, 503 or
// 504. Refusals (ErrNotHeld, *HeldError, ErrNotFound), other statuses and
// the caller's context being cancelled are not transient.
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

// Acquire takes the resource for p.Holder, with p.TTL (zero: the server's
// default TTL). Acquisition.New is true when the lease is new (201) and false
// when the holder already held it (200, an idempotent retry: the lease
// unchanged, same fence). Acquisition.DBNow is zero: the API does not report
// the database clock. When another holder holds the resource the error is a
// *HeldError carrying that holder's lease.
//
// With p.Wait, a resource held by another holder is waited for, up to
// p.Wait: the server waits (woken by the release or expiry) and answers as
// soon as it took the lease, in requests of at most MaxWaitPerRequest each.
// Failures that IsTransient (a replica restarting or shutting down, the
// network) are retried with backoff meanwhile. When p.Wait runs out the
// error is the last answer's: a *HeldError, or the transient failure. Each
// request's time limit (30 s, or the Timeout of WithHTTPClient's client)
// counts on top of the time it waits.
func (c *Client) Acquire(ctx context.Context, p lease.AcquireParams) (lease.Acquisition, error) {
	ttl, err := ttlField(p.TTL)
	if err != nil {
		return lease.Acquisition{}, err
	}
	if p.Wait < 0 {
		return lease.Acquisition{}, fmt.Errorf("lease wait %s must not be negative", p.Wait)
	}
	if p.Wait == 0 {
		return c.acquire(ctx, p, ttl, 0)
	}
	deadline := time.Now().Add(p.Wait)
	backoff := minWaitRetry
	for {
		// Whole seconds on the wire: round up, so as not to give up early.
		wait := min((time.Until(deadline)+time.Second-1)/time.Second*time.Second, MaxWaitPerRequest)
		acq, err := c.acquire(ctx, p, ttl, max(wait, time.Second))
		transient := IsTransient(err) && ctx.Err() == nil
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

// MaxWaitPerRequest is the longest wait the server takes in one acquisition
// (its wait_seconds bound); Acquire waits longer by asking again.
const MaxWaitPerRequest = 300 * time.Second

// Bounds of the backoff between the tries of a waiting Acquire after a
// transient failure.
const (
	minWaitRetry = 100 * time.Millisecond
	maxWaitRetry = 5 * time.Second
)

// acquire sends one acquisition, which the server holds up to wait (whole
// seconds) while another holder holds the resource.
func (c *Client) acquire(ctx context.Context, p lease.AcquireParams, ttl *int64, wait time.Duration) (lease.Acquisition, error) {
	body := struct {
		Resource    string `json:"resource"`
		Holder      string `json:"holder"`
		TTLSeconds  *int64 `json:"ttl_seconds,omitempty"`
		WaitSeconds int64  `json:"wait_seconds,omitempty"`
	}{p.Resource, p.Holder, ttl, int64(wait / time.Second)}
	sender := c
	if wait > 0 && c.http.Timeout > 0 {
		// The request's time limit counts from when the server stops
		// waiting, not from when it starts.
		hc := *c.http
		hc.Timeout += wait
		waiting := *c
		waiting.http = &hc
		sender = &waiting
	}
	var l lease.Lease
	status, err := sender.do(ctx, http.MethodPost, "/api/leases", nil, body, &l, errorsOf(http.StatusConflict))
	if err != nil {
		return lease.Acquisition{}, err
	}
	return lease.Acquisition{Lease: l, New: status == http.StatusCreated}, nil
}

// Renew extends the holder's active lease to now + TTL by the database
// clock; p.TTL, when not zero, replaces the lease's TTL, and p.Fence, when
// not zero, must match. ErrNotHeld when the holder holds no active lease on
// the resource (with that fence).
func (c *Client) Renew(ctx context.Context, p lease.RenewParams) (lease.Lease, error) {
	ttl, err := ttlField(p.TTL)
	if err != nil {
		return lease.Lease{}, err
	}
	body := struct {
		Resource   string `json:"resource"`
		Holder     string `json:"holder"`
		TTLSeconds *int64 `json:"ttl_seconds,omitempty"`
		Fence      int64  `json:"fence,omitempty"`
	}{p.Resource, p.Holder, ttl, p.Fence}
	var l lease.Lease
	_, err = c.do(ctx, http.MethodPut, "/api/leases/renew", nil, body, &l, errorsOf(http.StatusNotFound))
	return l, err
}

// Release ends the holder's active lease now and returns it released.
// p.Fence and p.ID, when not zero, must match too. ErrNotHeld when the holder
// holds no active lease on the resource: a second release included.
func (c *Client) Release(ctx context.Context, p lease.ReleaseParams) (lease.Lease, error) {
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
	_, err := c.do(ctx, http.MethodDelete, path, nil, body, &l, errorsOf(http.StatusNotFound))
	return l, err
}

// Get returns the lease with the given id, ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, id int64) (lease.Lease, error) {
	var l lease.Lease
	_, err := c.do(ctx, http.MethodGet, "/api/leases/"+strconv.FormatInt(id, 10), nil, nil, &l, func(status int, _ errorBody) error {
		if status == http.StatusNotFound {
			return lease.ErrNotFound
		}
		return nil
	})
	return l, err
}

// List returns a page of leases in id order. p.Filter is FilterAll (or
// empty), FilterRenewed or a State; p.Limit zero means the server's default
// (1000). For the next page, call again with AfterID set to the last id.
func (c *Client) List(ctx context.Context, p lease.ListParams) ([]lease.Lease, error) {
	path := "/api/leases"
	switch p.Filter {
	case "", lease.FilterAll:
	case string(lease.StateActive), string(lease.StateExpired), string(lease.StateReleased), lease.FilterRenewed:
		path += "/" + p.Filter
	default:
		return nil, fmt.Errorf("unknown lease filter %q; use all, active, expired, released or renewed", p.Filter)
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
		_, err := c.do(ctx, http.MethodGet, path, q, nil, &all, nil)
		return all.Leases, err
	}
	var leases []lease.Lease
	_, err := c.do(ctx, http.MethodGet, path, q, nil, &leases, nil)
	return leases, err
}

// Events returns a page of the audit history in id order: of p.Resource, or
// of every resource when it is empty. p.Limit zero means the server's
// default (1000).
func (c *Client) Events(ctx context.Context, p lease.EventsParams) ([]lease.Event, error) {
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
	_, err := c.do(ctx, http.MethodGet, "/api/leases/events", q, nil, &events, nil)
	return events, err
}

// ttlField checks a TTL before it goes on the wire: the API counts whole
// seconds, 1 to 3600, and a TTL it would round is a bug of the caller.
func ttlField(ttl time.Duration) (*int64, error) {
	if ttl == 0 {
		return nil, nil
	}
	if ttl < time.Second || ttl > time.Hour || ttl%time.Second != 0 {
		return nil, fmt.Errorf("lease TTL %s must be a whole number of seconds between 1s and 1h", ttl)
	}
	s := int64(ttl / time.Second)
	return &s, nil
}

// errorBody is the server's answer to a request it refused.
type errorBody struct {
	Error string       `json:"error"`
	Lease *lease.Lease `json:"lease"`
}

// refusal maps a status with a meaning of its own to its error; nil leaves
// it a *StatusError.
type refusal func(status int, body errorBody) error

// errorsOf maps the refusals of the lease routes: 409 with the holder's
// lease to *HeldError, 404 to ErrNotHeld, for the statuses given.
func errorsOf(statuses ...int) refusal {
	return func(status int, body errorBody) error {
		for _, s := range statuses {
			if s != status {
				continue
			}
			switch {
			case status == http.StatusConflict && body.Lease != nil:
				return &lease.HeldError{Lease: *body.Lease}
			case status == http.StatusNotFound:
				return lease.ErrNotHeld
			}
		}
		return nil
	}
}

// Bounds on what the client reads of an answer: a full page of 10000 leases
// fits; an error is one sentence.
const (
	maxAnswerBytes = 64 << 20
	maxErrorBytes  = 64 << 10
)

// do sends one request and decodes a 2xx answer into out, returning the
// status. A refused request becomes refused's error or a *StatusError.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any, refused refusal) (int, error) {
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

// releaseTimeout bounds the release a Holding sends on its own when the
// context given to Hold ends.
const releaseTimeout = 5 * time.Second

// Hold acquires the lease on resource for holder with cfg.TTL and keeps it
// alive in the background until Release is called, ctx ends, or the lease is
// lost. It checks cfg (KeepConfig.Validate) before anything goes on the
// wire, and does not wait for a resource held by another holder: that is a
// *HeldError, whose lease says until when it is held.
//
// The holding renews about every cfg.RenewInterval (default TTL/3, with
// jitter) and retries a failed renewal every cfg.RetryInterval. It counts
// the lease lost, and cancels its Context, as soon as
//
//   - a renewal is refused: the cause is ErrNotHeld (the lease expired, was
//     released, or was taken over);
//   - its deadline passes without a successful renewal: the cause is
//     ErrDeadline, wrapped with the last renewal's error. The deadline is the
//     time the last successful renewal (or the acquisition) was sent + TTL −
//     cfg.Margin on this process's monotonic clock, so the holding gives up
//     before the server can hand the lease to anyone else, however late the
//     answers came.
//
// Every failure other than a refusal is retried until the deadline, whatever
// its status: behind a front door another replica may answer the next try.
//
// When ctx ends the holding stops renewing and releases the lease (bounded
// by a few seconds); Release then reports how that went. ctx also bounds the
// acquisition.
//
// When holder already holds the lease (a retry after an answer that got
// lost), Hold takes it over, fence unchanged, and renews it at once so that
// its deadline counts from a request it sent.
func (c *Client) Hold(ctx context.Context, resource, holder string, cfg lease.KeepConfig) (*Holding, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sent := time.Now()
	acq, err := c.Acquire(ctx, lease.AcquireParams{Resource: resource, Holder: holder, TTL: cfg.TTL})
	if err != nil {
		return nil, err
	}
	l := acq.Lease
	if !acq.New {
		sent = time.Now()
		l, err = c.Renew(ctx, lease.RenewParams{Resource: resource, Holder: holder, Fence: l.Fence, TTL: cfg.TTL})
		if err != nil {
			return nil, fmt.Errorf("renew the lease %s already held by %s: %w", resource, holder, err)
		}
	}
	return c.Keep(ctx, l, sent, cfg), nil
}

// Keep is Hold of a lease the caller has just acquired or renewed itself:
// l as that answer gave it, and sent when its request was sent, from
// which the holding's first deadline counts (so an acquisition that waited
// for the lease should be renewed first: its request was sent before the
// wait). cfg must be valid (KeepConfig.Validate), its TTL the lease's.
func (c *Client) Keep(ctx context.Context, l lease.Lease, sent time.Time, cfg lease.KeepConfig) *Holding {
	hctx, cancel := context.WithCancelCause(ctx)
	h := &Holding{client: c, ctx: hctx, cancel: cancel, done: make(chan struct{}), lease: l}
	go h.run(ctx, cfg, sent)
	return h
}

// Holding is a lease kept alive in the background, made by Client.Hold.
// Pass Lease().Fence to whatever the lease protects, and stop using it when
// Context() is done. Its methods are safe for concurrent use.
//
// Its one goroutine exits when Release is called, the context given to Hold
// ends (after releasing the lease), or the lease is lost; Release waits for
// it.
type Holding struct {
	client *Client
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the goroutine exited

	mu       sync.Mutex
	lease    lease.Lease
	stopping bool  // Release was called, or the goroutine releases on its own
	autoDone bool  // the goroutine released and Release has not reported it yet
	autoErr  error // how the goroutine's release went
}

// Lease returns the lease as last acquired, renewed or released.
func (h *Holding) Lease() lease.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Context returns a context that is cancelled as soon as the lease can no
// longer be counted on: it was lost, Release was called, or the context
// given to Hold ended. context.Cause (or Err) says which.
func (h *Holding) Context() context.Context { return h.ctx }

// Err returns nil while the lease is held; then why it is not: ErrNotHeld
// (a renewal was refused), ErrDeadline (no renewal succeeded in time; wrapped
// with the last renewal's error), ErrReleased (Release was called), or the
// cause of the context given to Hold ending.
func (h *Holding) Err() error { return context.Cause(h.ctx) }

// Release stops renewing, waits for the background goroutine to exit, and
// releases the lease. It returns ErrNotHeld when the lease was no longer held
// (lost, or released before: a second Release included), and an error that
// IsTransient when the server could not be reached, in which case calling it
// again tries again. When the holding already released the lease because the
// context given to Hold ended, the first Release returns how that went.
func (h *Holding) Release(ctx context.Context) error {
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	h.cancel(lease.ErrReleased)
	select {
	case <-h.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	h.mu.Lock()
	if h.autoDone {
		h.autoDone = false
		err := h.autoErr
		h.mu.Unlock()
		return err
	}
	l := h.lease
	h.mu.Unlock()
	return h.release(ctx, l)
}

func (h *Holding) release(ctx context.Context, l lease.Lease) error {
	released, err := h.client.Release(ctx, lease.ReleaseParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.lease = released
	h.mu.Unlock()
	return nil
}

// run renews the lease until the holding's context ends or the lease is
// lost; parent is the context given to Hold.
func (h *Holding) run(parent context.Context, cfg lease.KeepConfig, sent time.Time) {
	defer close(h.done)
	l := h.Lease()
	reason := keep(h.ctx, cfg, sent, func(rctx context.Context) error {
		renewed, err := h.client.Renew(rctx, lease.RenewParams{Resource: l.Resource, Holder: l.Holder, Fence: l.Fence, TTL: cfg.TTL})
		if err != nil {
			return err
		}
		h.mu.Lock()
		h.lease = renewed
		h.mu.Unlock()
		return nil
	})
	if reason != nil {
		h.cancel(reason)
		return
	}
	// The holding's context ended: Release was called, or parent ended
	// and nobody will call Release in time to free the resource.
	h.mu.Lock()
	auto := !h.stopping
	h.stopping = true
	h.mu.Unlock()
	if !auto {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(parent), min(releaseTimeout, cfg.TTL))
	err := h.release(rctx, l)
	cancel()
	h.mu.Lock()
	h.autoDone, h.autoErr = true, err
	h.mu.Unlock()
}
