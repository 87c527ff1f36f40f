package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// components runs a replica's background components (the listener, the
// reaper, the scheduler, the elections...) until the replica shuts down.
// One that stops before then, with an error or without, stops the replica:
// a replica that serves on without its reaper or its listener looks
// healthy while it is not, whereas one that exits is started again by
// whatever supervises it (systemd, Kubernetes), which also says so. Until
// it is gone, /readyz answers 503 naming the component.
type components struct {
	ctx    context.Context
	log    zerolog.Logger
	wg     sync.WaitGroup
	once   sync.Once
	failed chan struct{} // closed when one stopped before ctx ended
	err    error         // why; set before failed is closed
	names  []string      // of the components started, in order
}

func newComponents(ctx context.Context, log zerolog.Logger) *components {
	return &components{ctx: ctx, log: log, failed: make(chan struct{})}
}

// Go runs the component name until the components' context ends.
func (c *components) Go(name string, run func(ctx context.Context) error) {
	c.names = append(c.names, name)
	c.wg.Go(func() {
		err := run(c.ctx)
		if c.ctx.Err() != nil { // the replica is shutting down: the component's end is due
			if err != nil && !errors.Is(err, context.Canceled) {
				c.log.Warn().Err(err).Msgf("%s stopped with an error as the replica shut down", name)
			}
			return
		}
		if err == nil {
			err = errors.New("it returned while the replica was running")
		}
		c.once.Do(func() {
			c.err = &componentError{Name: name, Err: err}
			close(c.failed)
		})
	})
}

// componentError is a component's stop while the replica ran.
type componentError struct {
	Name string
	Err  error
}

func (e *componentError) Error() string { return fmt.Sprintf("the %s stopped: %v", e.Name, e.Err) }
func (e *componentError) Unwrap() error { return e.Err }

// Failed is closed when a component stopped while the replica ran.
func (c *components) Failed() <-chan struct{} { return c.failed }

// Err is why a component stopped, nil while none did.
func (c *components) Err() error {
	select {
	case <-c.failed:
		return c.err
	default:
		return nil
	}
}

// Names are the components started, in the order they were.
func (c *components) Names() []string { return c.names }

// Wait waits for every component to return.
func (c *components) Wait() { c.wg.Wait() }

// servedRoutes is the replica's handler as its roles have it: everything
// with the api role; without it, the probes and /metrics only, and every
// other path 404 saying why.
func servedRoutes(h http.Handler, roles []string) http.Handler {
	for _, r := range roles {
		if r == "api" {
			return h
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "{\"error\": %q}\n", "this replica does not serve the API, the websocket or the dashboard: its roles are "+
			orNone(strings.Join(roles, ","))+"; add api to --roles, or send the request to a replica that has it")
	})
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
