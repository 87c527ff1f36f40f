package server_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/apitime"
	"github.com/leasehold/leasehold/internal/leasestore"
	"github.com/leasehold/leasehold/lease"

	"github.com/leasehold/leasehold/internal/demo"
	"github.com/leasehold/leasehold/internal/instance"
)

// generatorJSON is GET /api/generator as the REST API answers it.
type generatorJSON struct {
	Status       string  `json:"status"`
	Holder       *string `json:"holder"`
	Fence        *int64  `json:"fence"`
	ThisInstance string  `json:"this_instance"`
}

func (b bundle) generator(t *testing.T, method, path string, status int) generatorJSON {
	t.Helper()
	what := method + " " + path
	return decodeStrict[generatorJSON](t, what, b.do(t, method, path, "").want(t, what, status))
}

func TestGenerator(t *testing.T) {
	t.Parallel()
	b := newBundle(t)

	// Stopped by default, held by nobody.
	if got := b.generator(t, "GET", "/api/generator", http.StatusOK); got.Status != "STOPPED" || got.Holder != nil || got.Fence != nil || got.ThisInstance != "test" {
		t.Errorf("GET /api/generator at first: got %+v, want STOPPED, holder and fence null, this_instance test", got)
	}

	// Start: 202, and every read after says STARTED, changed by this instance.
	if got := b.generator(t, "POST", "/api/generator/start", http.StatusAccepted); got.Status != "STARTED" {
		t.Errorf("POST /api/generator/start: got %+v, want STARTED", got)
	}
	if got := b.generator(t, "GET", "/api/generator", http.StatusOK); got.Status != "STARTED" || got.Holder != nil {
		t.Errorf("GET /api/generator after start: got %+v, want STARTED with no holder yet", got)
	}
	var by string
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT changed_by FROM generator_state`).Scan(&by); err != nil || by != "test" {
		t.Errorf("generator switch changed_by %q (%v), want this instance, test", by, err)
	}
	// Starting again is harmless; the body is ignored.
	b.do(t, "POST", "/api/generator/start", `{"whatever": [1, 2]} not even JSON`).want(t, "start again with a body", http.StatusAccepted)

	// A replica holding the generator lease shows as the holder, with its fence.
	leases := leasestore.NewStore(b.db.Pool)
	acq, err := leases.Acquire(t.Context(), lease.AcquireParams{Resource: demo.Resource, Holder: "replica-b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := b.generator(t, "GET", "/api/generator", http.StatusOK)
	if got.Status != "STARTED" || got.Holder == nil || *got.Holder != "replica-b" || got.Fence == nil || *got.Fence != acq.Lease.Fence {
		t.Errorf("GET /api/generator with replica-b holding: got %+v, want STARTED, holder replica-b, fence %d", got, acq.Lease.Fence)
	}

	// Stop: 202 and STOPPED, whoever holds the lease.
	if got := b.generator(t, "POST", "/api/generator/stop", http.StatusAccepted); got.Status != "STOPPED" {
		t.Errorf("POST /api/generator/stop: got %+v, want STOPPED", got)
	}
	if got := b.generator(t, "GET", "/api/generator", http.StatusOK); got.Status != "STOPPED" || got.Holder == nil || *got.Holder != "replica-b" {
		t.Errorf("GET /api/generator after stop: got %+v, want STOPPED, holder still replica-b", got)
	}

	// Released, or expired: no holder.
	if _, err := leases.Release(t.Context(), lease.ReleaseParams{Resource: demo.Resource, Holder: "replica-b"}); err != nil {
		t.Fatal(err)
	}
	if got := b.generator(t, "GET", "/api/generator", http.StatusOK); got.Holder != nil || got.Fence != nil {
		t.Errorf("GET /api/generator after release: got %+v, want holder and fence null", got)
	}
	if _, err := leases.Acquire(t.Context(), lease.AcquireParams{Resource: demo.Resource, Holder: "replica-c", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	b.expire(t, demo.Resource)
	if got := b.generator(t, "GET", "/api/generator", http.StatusOK); got.Holder != nil || got.Fence != nil {
		t.Errorf("GET /api/generator after expiry: got %+v, want holder and fence null", got)
	}
}

// instanceJSON is one entry of GET /api/instances.
type instanceJSON struct {
	ID         string   `json:"id"`
	Addr       string   `json:"addr"`
	StartedAt  string   `json:"started_at"`
	LastSeenAt string   `json:"last_seen_at"`
	Roles      []string `json:"roles"`
	Version    string   `json:"version"`
}

func TestInstances(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	list := func(what string) []instanceJSON {
		t.Helper()
		is := decodeStrict[[]instanceJSON](t, what, b.do(t, "GET", "/api/instances", "").want(t, what, http.StatusOK))
		if is == nil {
			t.Errorf("%s: got null, want a JSON array", what)
		}
		for _, i := range is {
			parseTime(t, "started_at", i.StartedAt)
			parseTime(t, "last_seen_at", i.LastSeenAt)
		}
		return is
	}
	if got := list("no instances"); len(got) != 0 {
		t.Errorf("GET /api/instances with none registered: got %+v, want []", got)
	}

	// Registered but without its lease: not live.
	instances := instance.NewStore(b.db.Pool)
	leases := leasestore.NewStore(b.db.Pool)
	for _, id := range []string{"replica-a", "replica-b"} {
		if err := instances.Register(t.Context(), instance.Instance{ID: id, Addr: "10.0.0.1:8080", Roles: []string{"api", "worker"}, Version: "v1.2.3"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := list("registered, no lease"); len(got) != 0 {
		t.Errorf("GET /api/instances without instance leases: got %+v, want []", got)
	}

	// With its lease: listed, as registered.
	acq, err := leases.Acquire(t.Context(), lease.AcquireParams{Resource: instance.LeaseResource("replica-a"), Holder: "replica-a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := list("replica-a live")
	if len(got) != 1 || got[0].ID != "replica-a" || got[0].Addr != "10.0.0.1:8080" || !slices.Equal(got[0].Roles, []string{"api", "worker"}) || got[0].Version != "v1.2.3" {
		t.Fatalf("GET /api/instances with replica-a live: got %+v, want replica-a as registered", got)
	}
	if got[0].LastSeenAt != apitime.Format(acq.Lease.CreatedAt) {
		t.Errorf("last_seen_at %s, want the lease's acquisition %s", got[0].LastSeenAt, apitime.Format(acq.Lease.CreatedAt))
	}
	renewed, err := leases.Renew(t.Context(), lease.RenewParams{Resource: instance.LeaseResource("replica-a"), Holder: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := list("replica-a renewed"); len(got) != 1 || got[0].LastSeenAt != apitime.Format(*renewed.RenewedAt) {
		t.Errorf("after renewal: got %+v, want last_seen_at %s", got, apitime.Format(*renewed.RenewedAt))
	}
	if _, err := leases.Acquire(t.Context(), lease.AcquireParams{Resource: instance.LeaseResource("replica-b"), Holder: "replica-b", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := list("both live"); len(got) != 2 || got[0].ID != "replica-a" || got[1].ID != "replica-b" {
		t.Errorf("GET /api/instances with both live: got %+v, want replica-a, replica-b", got)
	}

	// Released or expired: gone.
	if _, err := leases.Release(t.Context(), lease.ReleaseParams{Resource: instance.LeaseResource("replica-a"), Holder: "replica-a"}); err != nil {
		t.Fatal(err)
	}
	if got := list("replica-a released"); len(got) != 1 || got[0].ID != "replica-b" {
		t.Errorf("GET /api/instances after replica-a released: got %+v, want only replica-b", got)
	}
	b.expire(t, instance.LeaseResource("replica-b"))
	if got := list("replica-b expired"); len(got) != 0 {
		t.Errorf("GET /api/instances after replica-b expired: got %+v, want []", got)
	}
}
