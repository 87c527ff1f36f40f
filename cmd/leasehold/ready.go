package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/server"
	"github.com/leasehold/leasehold/schema"
)

// The reasons GET /readyz gives, to anyone: they name the trouble and
// nothing of the database's address, user or name.
const (
	reasonDatabaseDown = "the database cannot be reached"
	reasonDatabaseSlow = "the database did not answer in time"
	reasonMigrations   = "migrations pending"
	reasonListener     = "the listener is not connected"
	reasonWorkers      = "the workers are starting"
	reasonStandby      = "the database is a standby (read-only); waiting for the primary"
)

// readiness is a replica's readiness check: the database answers, the
// migrations this binary needs are applied, and the LISTEN connection is
// up. Each failure is a server.NotReady, whose details go to the log: a
// warning when the replica stops being ready, a line when the reason
// changes and when it is ready again; the probes, every few seconds, log
// nothing else above debug level.
type readiness struct {
	pool      *pgxpool.Pool
	connected func() bool  // the listener's
	workers   func() bool  // the worker pool's first claim round is over; nil without workers
	latest    int64        // the migration version this binary needs
	failed    func() error // why a background component stopped, nil while none did
	log       zerolog.Logger

	mu       sync.Mutex
	checked  bool   // a check has been noted
	last     string // the reason of the last check; "" when it passed
	wasReady bool   // a check has passed
}

// check is server.Deps.Ready.
func (r *readiness) check(ctx context.Context) error {
	err := r.probe(ctx)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err // the prober went away; it learnt nothing
	}
	r.note(err)
	return err
}

func (r *readiness) probe(ctx context.Context) error {
	if r.failed != nil {
		if err := r.failed(); err != nil {
			reason := "a background component stopped"
			if c, ok := errors.AsType[*componentError](err); ok {
				reason = "the " + c.Name + " stopped"
			}
			return &server.NotReady{Reason: reason + "; the replica is shutting down (its log says why)", Err: err}
		}
	}
	if err := r.pool.Ping(ctx); err != nil {
		// A URL that is not limited to the primary (target_session_attrs)
		// may reach a standby, where nothing can be written: the pool's
		// sessions refuse it as they connect (schema.PrepareSession).
		if errors.Is(err, schema.ErrStandby) {
			return &server.NotReady{Reason: reasonStandby, Err: err}
		}
		return databaseDown(err)
	}
	v, err := schema.Applied(ctx, r.pool)
	if err != nil {
		return databaseDown(err)
	}
	if v < r.latest {
		return &server.NotReady{Reason: reasonMigrations,
			Err: fmt.Errorf("the database is at migration %d, this binary needs %d; run leasehold migrate", v, r.latest)}
	}
	if !r.connected() {
		return &server.NotReady{Reason: reasonListener, Err: errors.New("the LISTEN connection is down; it reconnects by itself (see the listener's log lines)")}
	}
	if r.workers != nil && !r.workers() {
		return &server.NotReady{Reason: reasonWorkers, Err: errors.New("the workers' first claim round is not over: an insert would not wake them yet")}
	}
	return nil
}

// note logs a change of readiness. Until the first check passes the
// replica is starting (its listener connects on its own), and that is no
// reason for a warning.
func (r *readiness) note(err error) {
	reason := ""
	var nr *server.NotReady
	if errors.As(err, &nr) {
		reason = nr.Reason
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.checked && reason == r.last:
		if err != nil {
			r.log.Debug().Err(err).Msg("not ready")
		}
	case err == nil && !r.wasReady:
		r.log.Info().Msg("ready")
	case err == nil:
		r.log.Info().Str("was", r.last).Msg("ready again")
	case !r.wasReady:
		r.log.Info().Err(err).Msg("not ready yet")
	case r.last == "":
		r.log.Warn().Err(err).Msg("not ready")
	default:
		// One trouble led to another (the listener went, then the
		// database): worth a line, not another warning.
		r.log.Info().Err(err).Msg("still not ready")
	}
	r.checked, r.last = true, reason
	r.wasReady = r.wasReady || err == nil
}

// databaseDown words a failed readiness check of the database.
func databaseDown(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &server.NotReady{Reason: reasonDatabaseSlow, Err: err}
	}
	return &server.NotReady{Reason: reasonDatabaseDown, Err: err}
}
