package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/internal/schedulestore"
	"github.com/leasehold/leasehold/internal/taskstore"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is one test's server on its own fresh database.
type bundle struct {
	db  pgtest.DB
	srv *httptest.Server
}

// option adjusts the Deps of a test server.
type option func(*server.Deps)

func withToken(token string) option { return func(d *server.Deps) { d.APIToken = token } }

// withTokens gives the server the tokens of a tokens file.
func withTokens(t testing.TB, spec string) option {
	ts, err := server.ParseTokens([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	return func(d *server.Deps) { d.Tokens = ts }
}

func withAllowedHosts(hosts ...string) option { return func(d *server.Deps) { d.AllowedHosts = hosts } }

func withReady(ready func(context.Context) error) option {
	return func(d *server.Deps) { d.Ready = ready }
}

func withLog(log zerolog.Logger) option { return func(d *server.Deps) { d.Log = log } }

// testDeps returns the Deps of a server on db, as the brief of the tests
// describes it, adjusted by opts.
func testDeps(db pgtest.DB, opts ...option) server.Deps {
	d := server.Deps{
		Leases:     leasestore.NewStore(db.Pool),
		DefaultTTL: 30 * time.Second,
		Tasks:      taskstore.NewStore(db.Pool),
		Generator:  demo.NewState(db.Pool),
		Instances:  instance.NewStore(db.Pool),
		Schedules:  schedulestore.NewStore(db.Pool),
		Log:        zerolog.Nop(),
		Metrics:    server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready:      func(ctx context.Context) error { return db.Pool.Ping(ctx) },
		Instance: server.Instance{
			ID: "test", StartedAt: time.Now().UTC(), Roles: []string{"api"}, Version: "test",
		},
	}
	for _, o := range opts {
		o(&d)
	}
	return d
}

// newBundle starts a server on a fresh, migrated database.
func newBundle(t *testing.T, opts ...option) bundle {
	t.Helper()
	db := pgtest.New(t)
	srv := httptest.NewServer(server.NewServer(testDeps(db, opts...)))
	t.Cleanup(srv.Close)
	return bundle{db: db, srv: srv}
}

// response is what a request got back, read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// do sends one request; header holds key, value pairs.
func (b bundle) do(t *testing.T, method, path, body string, header ...string) response {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, b.srv.URL+path, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: got}
}

// want fails the test unless r has the given status.
func (r response) want(t *testing.T, what string, status int) response {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: got %s, want status %d", what, r, status)
	}
	return r
}

// decodeStrict decodes r's JSON body into a T, refusing fields T does not
// have: the tests then notice a response that grew or lost a field.
func decodeStrict[T any](t *testing.T, what string, r response) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: decode %s as %T: %v", what, r, v, err)
	}
	return v
}

// leaseJSON is the REST API's lease object, with its timestamps as sent.
type leaseJSON struct {
	ID         int64   `json:"id"`
	Resource   string  `json:"resource"`
	Holder     string  `json:"holder"`
	Fence      int64   `json:"fence"`
	State      string  `json:"state"`
	TTLSeconds int     `json:"ttl_seconds"`
	CreatedAt  string  `json:"created_at"`
	RenewedAt  *string `json:"renewed_at"`
	ReleasedAt *string `json:"released_at"`
	ExpiresAt  string  `json:"expires_at"`
}

func (l leaseJSON) String() string {
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	return fmt.Sprintf("{id %d %s held by %s, fence %d, %s, ttl %ds, created %s, renewed %s, released %s, expires %s}",
		l.ID, l.Resource, l.Holder, l.Fence, l.State, l.TTLSeconds, l.CreatedAt, str(l.RenewedAt), str(l.ReleasedAt), l.ExpiresAt)
}

// eventJSON is one entry of GET /api/leases/events.
type eventJSON struct {
	ID        int64  `json:"id"`
	At        string `json:"at"`
	LeaseID   int64  `json:"lease_id"`
	Resource  string `json:"resource"`
	Holder    string `json:"holder"`
	Fence     int64  `json:"fence"`
	Kind      string `json:"kind"`
	ExpiresAt string `json:"expires_at"`
}

// apiTime is the REST API's timestamp: RFC 3339, UTC, milliseconds.
var apiTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)

// parseTime checks s against the API's timestamp format and parses it.
func parseTime(t *testing.T, field, s string) time.Time {
	t.Helper()
	if !apiTime.MatchString(s) {
		t.Errorf("%s = %q: want RFC 3339 UTC with exactly 3 fractional digits, like 2006-01-02T15:04:05.000Z", field, s)
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s = %q: %v", field, s, err)
	}
	return ts
}

// checkLease checks the lease's timestamps and that its fields hang together.
func checkLease(t *testing.T, l leaseJSON) {
	t.Helper()
	created := parseTime(t, "created_at", l.CreatedAt)
	expires := parseTime(t, "expires_at", l.ExpiresAt)
	if l.RenewedAt != nil {
		parseTime(t, "renewed_at", *l.RenewedAt)
	}
	if l.ReleasedAt != nil {
		parseTime(t, "released_at", *l.ReleasedAt)
		if l.State != "released" {
			t.Errorf("lease %d has released_at %s but state %q, want released", l.ID, *l.ReleasedAt, l.State)
		}
	}
	if expires.Before(created) {
		t.Errorf("lease %d expires_at %s is before created_at %s", l.ID, l.ExpiresAt, l.CreatedAt)
	}
	if l.ID < 1 || l.Fence < 1 || l.TTLSeconds < 1 || l.TTLSeconds > 3600 {
		t.Errorf("lease %v: want positive id and fence, ttl_seconds in 1..3600", l)
	}
	if !slices.Contains([]string{"active", "expired", "released"}, l.State) {
		t.Errorf("lease %d state %q: want active, expired or released", l.ID, l.State)
	}
}

// lease decodes r as a lease and checks it.
func (r response) lease(t *testing.T, what string) leaseJSON {
	t.Helper()
	l := decodeStrict[leaseJSON](t, what, r)
	checkLease(t, l)
	return l
}

// leases decodes r as a list of leases and checks each.
func (r response) leases(t *testing.T, what string) []leaseJSON {
	t.Helper()
	ls := decodeStrict[[]leaseJSON](t, what, r)
	if ls == nil {
		t.Errorf("%s: got %s, want a JSON array (not null)", what, r)
	}
	for _, l := range ls {
		checkLease(t, l)
	}
	return ls
}

// checkError checks that r is an error in the API's one shape.
func checkError(t *testing.T, what string, r response) map[string]json.RawMessage {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Errorf("%s: body %q is not a JSON object: %v", what, r.body, err)
		return nil
	}
	var msg string
	if err := json.Unmarshal(body["error"], &msg); err != nil || strings.TrimSpace(msg) == "" {
		t.Errorf("%s: body %s: want a non-empty string in \"error\"", what, r.body)
	}
	for k := range body {
		if k != "error" && !((k == "lease" || k == "task_state") && r.status == http.StatusConflict) {
			t.Errorf("%s: body %s has the field %q; an error has only \"error\" (and \"lease\" or \"task_state\" on a 409)", what, r.body, k)
		}
	}
	return body
}

// jsonBody marshals v for a request body.
func jsonBody(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type obj = map[string]any

// acquire takes resource for holder through the API and wants a 201.
func (b bundle) acquire(t *testing.T, resource, holder string, ttl int) leaseJSON {
	t.Helper()
	body := obj{"resource": resource, "holder": holder}
	if ttl != 0 {
		body["ttl_seconds"] = ttl
	}
	what := "acquire " + resource
	return b.do(t, "POST", "/api/leases", jsonBody(t, body)).want(t, what, http.StatusCreated).lease(t, what)
}

func (b bundle) renew(t *testing.T, resource, holder string) leaseJSON {
	t.Helper()
	what := "renew " + resource
	return b.do(t, "PUT", "/api/leases/renew", jsonBody(t, obj{"resource": resource, "holder": holder})).
		want(t, what, http.StatusOK).lease(t, what)
}

func (b bundle) release(t *testing.T, resource, holder string) leaseJSON {
	t.Helper()
	what := "release " + resource
	return b.do(t, "DELETE", "/api/leases/release", jsonBody(t, obj{"resource": resource, "holder": holder})).
		want(t, what, http.StatusOK).lease(t, what)
}

// expire moves a lease's expiry into the past: test setup, standing in for
// waiting out its TTL.
func (b bundle) expire(t *testing.T, resource string) {
	t.Helper()
	tag, err := b.db.Pool.Exec(t.Context(),
		`UPDATE leases SET expires_at = now() - interval '1 second', created_at = now() - interval '2 seconds' WHERE resource = $1`, resource)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expire %s: %v (%d rows)", resource, err, tag.RowsAffected())
	}
}

func resources(ls []leaseJSON) []string {
	var rs []string
	for _, l := range ls {
		rs = append(rs, l.Resource)
	}
	return rs
}

func TestAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// A new resource: 201 with the default TTL, active, a fence.
	first := b.acquire(t, "report:nightly", "replica-a", 0)
	if first.Resource != "report:nightly" || first.Holder != "replica-a" || first.State != "active" {
		t.Errorf("acquire: got %v, want report:nightly held by replica-a, active", first)
	}
	if first.TTLSeconds != 30 {
		t.Errorf("acquire without ttl_seconds: got ttl_seconds %d, want the default 30", first.TTLSeconds)
	}
	if got := parseTime(t, "expires_at", first.ExpiresAt).Sub(parseTime(t, "created_at", first.CreatedAt)); got != 30*time.Second {
		t.Errorf("acquire: expires_at - created_at = %v, want 30s", got)
	}
	if first.RenewedAt != nil || first.ReleasedAt != nil {
		t.Errorf("acquire: got renewed_at %v, released_at %v, want both null", first.RenewedAt, first.ReleasedAt)
	}

	// The same holder again: 200 and the lease unchanged (same fence).
	retry := b.do(t, "POST", "/api/leases", `{"resource":"report:nightly","holder":"replica-a","ttl_seconds":120}`).
		want(t, "acquire again by the holder", http.StatusOK).lease(t, "acquire again by the holder")
	if retry.String() != first.String() {
		t.Errorf("acquire again by the holder: got %v, want the unchanged lease %v", retry, first)
	}

	// Another holder: 409 with the holder's lease.
	conflict := b.do(t, "POST", "/api/leases", `{"resource":"report:nightly","holder":"replica-b"}`).
		want(t, "acquire by another holder", http.StatusConflict)
	body := checkError(t, "acquire by another holder", conflict)
	var held leaseJSON
	if err := json.Unmarshal(body["lease"], &held); err != nil {
		t.Fatalf("409 body %s: want the current lease in \"lease\": %v", conflict.body, err)
	}
	if held.String() != first.String() {
		t.Errorf("409 lease: got %v, want the holder's lease %v", held, first)
	}

	// Renew with a fence and a new TTL: expires_at moves to renewed_at + TTL.
	renewed := b.do(t, "PUT", "/api/leases/renew",
		jsonBody(t, obj{"resource": "report:nightly", "holder": "replica-a", "fence": first.Fence, "ttl_seconds": 90})).
		want(t, "renew", http.StatusOK).lease(t, "renew")
	if renewed.ID != first.ID || renewed.Fence != first.Fence || renewed.State != "active" || renewed.TTLSeconds != 90 {
		t.Errorf("renew: got %v, want lease %d, fence %d, active, ttl_seconds 90", renewed, first.ID, first.Fence)
	}
	if renewed.RenewedAt == nil {
		t.Fatalf("renew: renewed_at is null")
	}
	renewedAt := parseTime(t, "renewed_at", *renewed.RenewedAt)
	expiresAt := parseTime(t, "expires_at", renewed.ExpiresAt)
	if got := expiresAt.Sub(renewedAt); got != 90*time.Second {
		t.Errorf("renew: expires_at - renewed_at = %v, want 90s", got)
	}
	if !expiresAt.After(parseTime(t, "expires_at", first.ExpiresAt)) {
		t.Errorf("renew: expires_at %s did not move past %s", renewed.ExpiresAt, first.ExpiresAt)
	}

	// Renew without a TTL keeps the lease's TTL.
	again := b.renew(t, "report:nightly", "replica-a")
	if again.TTLSeconds != 90 {
		t.Errorf("renew without ttl_seconds: got ttl_seconds %d, want the lease's 90", again.TTLSeconds)
	}

	// Release: released_at == expires_at, state released; GET agrees.
	released := b.do(t, "DELETE", "/api/leases/release",
		jsonBody(t, obj{"resource": "report:nightly", "holder": "replica-a", "fence": first.Fence})).
		want(t, "release", http.StatusOK).lease(t, "release")
	if released.State != "released" || released.ReleasedAt == nil || *released.ReleasedAt != released.ExpiresAt {
		t.Errorf("release: got %v, want state released with released_at == expires_at", released)
	}
	got := b.do(t, "GET", fmt.Sprintf("/api/leases/%d", first.ID), "").want(t, "get", http.StatusOK).lease(t, "get")
	if got.String() != released.String() {
		t.Errorf("GET after release: got %v, want %v", got, released)
	}

	// A released resource is free: another holder gets a greater fence.
	next := b.acquire(t, "report:nightly", "replica-b", 5)
	if next.Fence <= first.Fence || next.Holder != "replica-b" || next.TTLSeconds != 5 {
		t.Errorf("acquire after release: got %v, want replica-b, ttl_seconds 5, fence > %d", next, first.Fence)
	}
	if next.RenewedAt != nil || next.ReleasedAt != nil {
		t.Errorf("acquire after release: got renewed_at %v, released_at %v, want both null", next.RenewedAt, next.ReleasedAt)
	}
	// The old holder and the old fence are refused now.
	for _, body := range []string{
		`{"resource":"report:nightly","holder":"replica-a"}`,
		fmt.Sprintf(`{"resource":"report:nightly","holder":"replica-b","fence":%d}`, first.Fence),
	} {
		r := b.do(t, "PUT", "/api/leases/renew", body).want(t, "stale renew "+body, http.StatusNotFound)
		checkError(t, "stale renew", r)
	}

	// An expired lease is free too.
	b.expire(t, "report:nightly")
	expired := b.do(t, "GET", fmt.Sprintf("/api/leases/%d", first.ID), "").want(t, "get expired", http.StatusOK).lease(t, "get expired")
	if expired.State != "expired" {
		t.Errorf("GET after expiry: state %q, want expired", expired.State)
	}
	r := b.do(t, "PUT", "/api/leases/renew", `{"resource":"report:nightly","holder":"replica-b"}`).
		want(t, "renew expired", http.StatusNotFound)
	checkError(t, "renew expired", r)
	third := b.acquire(t, "report:nightly", "replica-c", 0)
	if third.Fence <= next.Fence {
		t.Errorf("acquire after expiry: fence %d, want > %d", third.Fence, next.Fence)
	}
}

func TestReleaseByID(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	mine := b.acquire(t, "byid:a", "h", 60)
	other := b.acquire(t, "byid:b", "h", 60)

	body := jsonBody(t, obj{"resource": "byid:a", "holder": "h"})
	for _, id := range []int64{other.ID, 999999} {
		r := b.do(t, "DELETE", fmt.Sprintf("/api/leases/%d", id), body).
			want(t, fmt.Sprintf("DELETE /api/leases/%d for byid:a", id), http.StatusNotFound)
		checkError(t, "release by a wrong id", r)
	}
	if got := b.do(t, "GET", fmt.Sprintf("/api/leases/%d", mine.ID), "").want(t, "get", http.StatusOK).lease(t, "get"); got.String() != mine.String() {
		t.Errorf("after release by a wrong id: got %v, want the lease unchanged %v", got, mine)
	}

	released := b.do(t, "DELETE", fmt.Sprintf("/api/leases/%d", mine.ID), body).
		want(t, "DELETE /api/leases/{id}", http.StatusOK).lease(t, "DELETE /api/leases/{id}")
	if released.ID != mine.ID || released.State != "released" || released.ReleasedAt == nil || *released.ReleasedAt != released.ExpiresAt {
		t.Errorf("release by id: got %v, want lease %d released with released_at == expires_at", released, mine.ID)
	}
	r := b.do(t, "DELETE", fmt.Sprintf("/api/leases/%d", mine.ID), body).want(t, "release by id twice", http.StatusNotFound)
	checkError(t, "release by id twice", r)
}

func TestLeaseLists(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	b.acquire(t, "list:active", "h", 600)
	b.acquire(t, "list:renewed", "h", 600)
	b.renew(t, "list:renewed", "h")
	b.acquire(t, "list:released", "h", 600)
	b.release(t, "list:released", "h")
	b.acquire(t, "list:expired", "h", 600)
	b.expire(t, "list:expired")
	b.acquire(t, "elsewhere", "h", 600)

	type listAll struct {
		Instance struct {
			ID        string   `json:"id"`
			StartedAt string   `json:"started_at"`
			Roles     []string `json:"roles"`
			Version   string   `json:"version"`
		} `json:"instance"`
		Leases []leaseJSON `json:"leases"`
	}
	r := b.do(t, "GET", "/api/leases", "").want(t, "GET /api/leases", http.StatusOK)
	all := decodeStrict[listAll](t, "GET /api/leases", r)
	if all.Instance.ID != "test" || !slices.Equal(all.Instance.Roles, []string{"api"}) || all.Instance.Version != "test" {
		t.Errorf("GET /api/leases instance: got %v, want id test, roles [api], version test", all.Instance)
	}
	parseTime(t, "instance.started_at", all.Instance.StartedAt)
	for _, l := range all.Leases {
		checkLease(t, l)
	}
	if got, want := resources(all.Leases), []string{"list:active", "list:renewed", "list:released", "list:expired", "elsewhere"}; !slices.Equal(got, want) {
		t.Errorf("GET /api/leases: got %q, want %q", got, want)
	}

	for _, tc := range []struct {
		path  string
		want  []string
		state string // of every lease listed, "" for any
	}{
		{"/api/leases/active?prefix=list:", []string{"list:active", "list:renewed"}, "active"},
		{"/api/leases/expired?prefix=list:", []string{"list:expired"}, "expired"},
		{"/api/leases/renewed?prefix=list:", []string{"list:renewed"}, ""},
		{"/api/leases/released?prefix=list:", []string{"list:released"}, "released"},
		{"/api/leases/active", []string{"list:active", "list:renewed", "elsewhere"}, "active"},
		{"/api/leases/active?prefix=else", []string{"elsewhere"}, "active"},
		{"/api/leases/active?prefix=nothing", nil, ""},
		{"/api/leases/released?prefix=list:active", nil, ""},
	} {
		ls := b.do(t, "GET", tc.path, "").want(t, tc.path, http.StatusOK).leases(t, tc.path)
		if got := resources(ls); !slices.Equal(got, tc.want) {
			t.Errorf("GET %s: got %q, want %q", tc.path, got, tc.want)
		}
		for _, l := range ls {
			if tc.state != "" && l.State != tc.state {
				t.Errorf("GET %s: %s has state %q, want %q", tc.path, l.Resource, l.State, tc.state)
			}
			if strings.HasPrefix(tc.path, "/api/leases/renewed") && l.RenewedAt == nil {
				t.Errorf("GET %s: %s has renewed_at null", tc.path, l.Resource)
			}
		}
	}

	// The lease object of a list is the one GET /api/leases/{id} shows.
	for _, l := range all.Leases {
		path := fmt.Sprintf("/api/leases/%d", l.ID)
		if got := b.do(t, "GET", path, "").want(t, path, http.StatusOK).lease(t, path); got.String() != l.String() {
			t.Errorf("GET %s: got %v, want %v as listed", path, got, l)
		}
	}
}

func TestLeaseListPaging(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	var want []int64
	for i := range 7 {
		want = append(want, b.acquire(t, fmt.Sprintf("page:%d", i), "h", 600).ID)
		b.acquire(t, fmt.Sprintf("other:%d", i), "h", 600)
	}

	for _, list := range []string{"/api/leases/active", "/api/leases"} {
		var got []int64
		after := int64(0)
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatalf("%s: paging does not end; got %v so far", list, got)
			}
			path := fmt.Sprintf("%s?prefix=page:&limit=3&after_id=%d", list, after)
			r := b.do(t, "GET", path, "").want(t, path, http.StatusOK)
			var page []leaseJSON
			if list == "/api/leases" {
				page = decodeStrict[struct {
					Instance json.RawMessage `json:"instance"`
					Leases   []leaseJSON     `json:"leases"`
				}](t, path, r).Leases
				if page == nil {
					t.Errorf("%s: \"leases\" is %s, want an array (not null)", path, r.body)
				}
			} else {
				page = r.leases(t, path)
			}
			if len(page) > 3 {
				t.Errorf("%s: got %d leases, want at most 3", path, len(page))
			}
			if len(page) == 0 {
				break
			}
			for _, l := range page {
				if l.ID <= after {
					t.Errorf("%s: lease %d is not after %d", path, l.ID, after)
				}
				after = l.ID
				got = append(got, l.ID)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s pages: got ids %v, want %v", list, got, want)
		}
	}

	// The bounds of ?limit= are accepted.
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/api/leases/active?limit=1", 1},
		{"/api/leases/active?limit=10000", 14},
	} {
		if ls := b.do(t, "GET", tc.path, "").want(t, tc.path, http.StatusOK).leases(t, tc.path); len(ls) != tc.want {
			t.Errorf("GET %s: got %d leases, want %d", tc.path, len(ls), tc.want)
		}
	}
}

func TestLeaseEvents(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	l := b.acquire(t, "ev:1", "h1", 60)
	b.acquire(t, "ev:2", "h2", 60)
	b.renew(t, "ev:1", "h1")
	b.release(t, "ev:1", "h1")

	events := func(path string) []eventJSON {
		t.Helper()
		r := b.do(t, "GET", path, "").want(t, path, http.StatusOK)
		var es []eventJSON
		if err := json.Unmarshal(r.body, &es); err != nil || es == nil {
			t.Fatalf("GET %s: got %s, want a JSON array of events (%v)", path, r, err)
		}
		for i, e := range es {
			parseTime(t, "at", e.At)
			parseTime(t, "expires_at", e.ExpiresAt)
			if i > 0 && e.ID <= es[i-1].ID {
				t.Errorf("GET %s: event ids not ascending: %d after %d", path, e.ID, es[i-1].ID)
			}
		}
		return es
	}
	kinds := func(es []eventJSON) []string {
		var ks []string
		for _, e := range es {
			ks = append(ks, e.Resource+" "+e.Kind)
		}
		return ks
	}

	mine := events("/api/leases/events?resource=ev:1")
	if got, want := kinds(mine), []string{"ev:1 acquired", "ev:1 renewed", "ev:1 released"}; !slices.Equal(got, want) {
		t.Fatalf("events of ev:1: got %q, want %q", got, want)
	}
	for _, e := range mine {
		if e.Holder != "h1" || e.Fence != l.Fence || e.LeaseID != l.ID {
			t.Errorf("event %v: want holder h1, fence %d, lease_id %d", e, l.Fence, l.ID)
		}
	}
	if released := mine[2]; released.At != released.ExpiresAt {
		t.Errorf("released event: at %s, expires_at %s, want equal", released.At, released.ExpiresAt)
	}

	for _, tc := range []struct {
		path string
		want []string
	}{
		{fmt.Sprintf("/api/leases/events?resource=ev:1&after=%d", mine[0].ID), []string{"ev:1 renewed", "ev:1 released"}},
		{"/api/leases/events?resource=ev:1&limit=1", []string{"ev:1 acquired"}},
		{fmt.Sprintf("/api/leases/events?resource=ev:1&after=%d&limit=1", mine[0].ID), []string{"ev:1 renewed"}},
		{fmt.Sprintf("/api/leases/events?resource=ev:1&after=%d", mine[2].ID), nil},
		{"/api/leases/events?resource=ev:3", nil},
		{"/api/leases/events?resource=ev:2", []string{"ev:2 acquired"}},
		{"/api/leases/events", []string{"ev:1 acquired", "ev:2 acquired", "ev:1 renewed", "ev:1 released"}},
		{"/api/leases/events?limit=2", []string{"ev:1 acquired", "ev:2 acquired"}},
	} {
		if got := kinds(events(tc.path)); !slices.Equal(got, tc.want) {
			t.Errorf("GET %s: got %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestNamesAtTheLimit(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	// 255 bytes is allowed, in any script; printable non-ASCII is fine.
	for _, name := range []string{
		strings.Repeat("r", 255),
		strings.Repeat("é", 127) + "x",
		"ressource/été/日本語 with spaces",
	} {
		l := b.acquire(t, name, name, 0)
		if l.Resource != name || l.Holder != name {
			t.Errorf("acquire %q: got resource %q, holder %q", name, l.Resource, l.Holder)
		}
		b.renew(t, name, name)
		b.release(t, name, name)
	}
}
