package leasehold

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors of the Client, for errors.Is. The errors of leases and tasks
// themselves are package lease's and package task's (lease.ErrNotHeld,
// *lease.HeldError, task.ErrNotFound, task.ErrLeaseLost, ...), the same for
// an embedded and a remote client; a remote client's other failures are a
// *StatusError or the *url.Error of net/http (see IsTransient).
var (
	// ErrInvalidConfig: a constructor's configuration (Config,
	// RemoteConfig, KindConfig, ElectorConfig, a nil pool) cannot work; the
	// error says what to fix. Nothing was started.
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrInvalidArgument: an argument of a call is not valid (a name empty,
	// too long or with a control character, a TTL or a priority out of
	// range, task args that do not encode as a JSON object); the error says
	// which. Nothing was done.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnknownKind: an insert named a kind the client's Workers do not
	// register (a typo, most often); Config.AllowUnknownKinds lets a client
	// insert tasks for other programs to run.
	ErrUnknownKind = errors.New("no worker registered for the kind")
	// ErrNoDatabase: InsertTx and InsertManyTx need a client on a pool
	// (NewClient); a remote client has no transaction to join.
	ErrNoDatabase = errors.New("the client has no database")
	// ErrStarted: Start was called on a client that runs already.
	ErrStarted = errors.New("the client is started already")
	// ErrStopped: the client was stopped; make a new one.
	ErrStopped = errors.New("the client is stopped")
	// ErrNotMigrated: the database lacks the tables or functions this
	// version of leasehold needs. Run Migrate on it (or `leasehold
	// migrate`), as the schema's owner, before starting clients.
	ErrNotMigrated = errors.New("the database is not migrated for this version of leasehold")
)

// asConfig is err, the refusal of a value as an argument (ErrInvalidArgument),
// as the refusal of a configuration: one sentence, "invalid configuration:
// ...", that wraps ErrInvalidConfig and what err wrapped besides.
func asConfig(err error) error {
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), ErrInvalidArgument.Error()+": ")
	return &configError{msg: ErrInvalidConfig.Error() + ": " + msg, err: err}
}

type configError struct {
	msg string
	err error
}

func (e *configError) Error() string   { return e.msg }
func (e *configError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }

// schemaHint words an error of the database that means its schema is
// older than leasehold's (a table or function missing) as ErrNotMigrated,
// saying what to run; other errors are returned as they are.
func schemaHint(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42883") { // undefined_table, undefined_function
		return fmt.Errorf("%w: run leasehold.Migrate(ctx, pool) or `leasehold migrate` first (%w)", ErrNotMigrated, err)
	}
	return err
}
