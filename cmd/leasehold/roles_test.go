package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

// servingLine is the replica's "serving" log line: its roles and the
// background components it started.
func servingLine(t *testing.T, r *replica) (roles, components []string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(r.logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			Message    string   `json:"message"`
			Roles      []string `json:"roles"`
			Components []string `json:"components"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "serving" {
			return l.Roles, l.Components
		}
	}
	t.Fatalf("no serving line in the replica's log:\n%s", r.logs)
	return nil, nil
}

// TestServeDefaultRoles: a replica started with serve's defaults plays a
// production replica's roles, the API, the reaper and the scheduler, and
// starts their components only: no demo generator, no sleep workers.
func TestServeDefaultRoles(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := replicaConfig(t, productionReplica, []string{"--addr", "127.0.0.1:0", "--instance", "default-roles"}, env("DATABASE_URL", db.URL))
	r := startReplica(t, c)
	roles, comps := servingLine(t, r)
	if !slices.Equal(roles, []string{"api", "reaper", "scheduler"}) {
		t.Errorf("roles: %q, want api, reaper and scheduler", roles)
	}
	if !slices.Equal(comps, []string{"listener", "hub", "instance lease", "reaper", "scheduler"}) {
		t.Errorf("components: %q, want the listener, the hub, the instance lease, the reaper and the scheduler (no generator, no workers)", comps)
	}
	var instances []struct {
		ID    string   `json:"id"`
		Roles []string `json:"roles"`
	}
	// Listed once its instance lease is held.
	waitFor(t, r, "the replica listed in /api/instances", func() bool {
		status, body := r.get(t, "/api/instances", "")
		return status == http.StatusOK && json.Unmarshal(body, &instances) == nil && len(instances) > 0
	})
	if len(instances) != 1 || !slices.Equal(instances[0].Roles, []string{"api", "reaper", "scheduler"}) {
		t.Errorf("GET /api/instances: %+v, want the one replica with its three roles", instances)
	}
}

// TestReplicaWithoutTheAPI: a replica without the api role answers its
// probes and /metrics, and every other path 404 saying why.
func TestReplicaWithoutTheAPI(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := replicaConfig(t, productionReplica, []string{"--addr", "127.0.0.1:0", "--instance", "no-api", "--roles", "reaper"}, env("DATABASE_URL", db.URL))
	r := startReplica(t, c)
	for _, path := range []string{"/api/leases", "/ws", "/", "/api/openapi.json"} {
		status, body := r.get(t, path, "")
		if status != http.StatusNotFound || !strings.Contains(string(body), "does not serve the API") || !strings.Contains(string(body), "reaper") {
			t.Errorf("GET %s: %d %s, want 404 saying the replica serves no API, with its roles", path, status, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if status, body := r.get(t, path, ""); status != http.StatusOK {
			t.Errorf("GET %s: %d %s, want 200", path, status, body)
		}
	}
	if _, comps := servingLine(t, r); !slices.Equal(comps, []string{"listener", "hub", "instance lease", "reaper"}) {
		t.Errorf("components: %q, want the listener, the hub, the instance lease and the reaper", comps)
	}
}

// TestComponentStopStopsTheReplica: a background component that returns
// while the replica runs, with an error or without, is its failure: Failed
// is closed, Err names the component, and the readiness check answers not
// ready, naming it; components that end as the replica shuts down are no
// failure.
func TestComponentStopStopsTheReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
	}{{"reaper", errors.New("the reaper's lease store is gone")}, {"scheduler", nil}} {
		ctx, stop := context.WithCancel(t.Context())
		comps := newComponents(ctx, zerolog.Nop())
		comps.Go("listener", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
		comps.Go(tc.name, func(context.Context) error { return tc.err })
		<-comps.Failed()
		err := comps.Err()
		if !strings.Contains(err.Error(), "the "+tc.name+" stopped") || (tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("%s: Err() = %v, want it to name the %s and wrap its error", tc.name, err, tc.name)
		}
		ready := &readiness{failed: comps.Err, log: zerolog.Nop()}
		var nr *server.NotReady
		if rerr := ready.probe(t.Context()); !errors.As(rerr, &nr) || !strings.Contains(nr.Reason, "the "+tc.name+" stopped") {
			t.Errorf("%s: readiness: %v, want not ready, naming the %s", tc.name, rerr, tc.name)
		}
		stop()
		comps.Wait()
	}

	// Ended by the shutdown: no failure.
	ctx, stop := context.WithCancel(t.Context())
	comps := newComponents(ctx, zerolog.Nop())
	comps.Go("listener", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	stop()
	comps.Wait()
	if err := comps.Err(); err != nil {
		t.Errorf("after a shutdown: Err() = %v, want nil", err)
	}
}
