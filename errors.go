package leasehold

import "errors"

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
)
