package leasehold

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/restclient"

	"github.com/jackc/pgx/v5"

	"github.com/leasehold/leasehold/internal/taskstore"
	"github.com/leasehold/leasehold/task"
)

// InsertOpts are the options of one insert. Zero fields take the args'
// defaults (InsertOptsProvider), then the kind's (KindConfig), then
// leasehold's: the default queue, priority 0, no unique key, due now, five
// attempts, the claiming worker's TTL.
type InsertOpts struct {
	// Queue is the task's queue: 1 to 255 bytes, no control characters.
	Queue string
	// Priority orders the due tasks of a claim: lower runs first
	// (−32768 to 32767).
	Priority int16
	// UniqueKey, when set, makes the insert a no-op while another task of
	// the kind, in any state but cancelled, holds the key: the result is
	// then that task, with Duplicate set. An insert that is safe to retry.
	UniqueKey string
	// Lock, when set, gates the task on the lease of that resource: the
	// task is claimed only while nobody holds the lease (another task, a
	// leasehold exec, any Leases holder), its claim acquires the lease with
	// the task's fence, heartbeats renew it, and the task's end releases
	// it. Tasks with the same Lock never run at the same time.
	Lock string
	// LockLimit, with Lock, lets that many tasks (and other holders) of the
	// lock run at once: Lock becomes a key of LockLimit slots, each claim
	// takes a free slot's lease with its fence, and the task's end frees it
	// (Leases.HoldSlot). It is the key's limit if it has none yet; once
	// set, a key's limit changes only by Leases.SetLimit. 1 to
	// lease.MaxSlots; zero with Lock: one at a time, on the lease of Lock
	// itself.
	LockLimit int
	// ScheduledAt is when the task falls due (zero: now).
	ScheduledAt time.Time
	// MaxAttempts is how many attempts the task gets before it is dead:
	// 1 to 100.
	MaxAttempts int
	// TTL is the TTL of the task's leases: whole seconds, 1s to 1h.
	TTL time.Duration
	// Metadata are string pairs that travel with the task to each
	// attempt's worker (task.Task.Metadata): a trace context, a tenant.
	// Middleware may add to them. At most task.MaxMetadataPairs pairs and
	// task.MaxMetadataBytes of JSON.
	Metadata map[string]string
}

// InsertParams is one task of InsertMany: its args and, optionally, its
// options.
type InsertParams struct {
	Args TaskArgs
	Opts *InsertOpts
}

// InsertResult is what became of one insert.
type InsertResult struct {
	// Task is the task inserted or, with Duplicate, the one that holds its
	// unique key.
	Task *task.Task
	// Duplicate: nothing was inserted, another task holds the unique key.
	Duplicate bool
}

// Insert adds one task with args as its task_data. It is claimable at once
// (or at ScheduledAt): idle workers are woken by NOTIFY when it commits.
func (c *Client) Insert(ctx context.Context, args TaskArgs, opts *InsertOpts) (*InsertResult, error) {
	res, err := c.InsertMany(ctx, []InsertParams{{Args: args, Opts: opts}})
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// InsertMany adds tasks in one statement (one NOTIFY), all or none, on a
// client on a pool. A remote client sends the tasks with a unique key one
// request each, and the others in batches of at most one request's body
// (1 MiB): each request is all or none, the whole may not be.
func (c *Client) InsertMany(ctx context.Context, params []InsertParams) ([]*InsertResult, error) {
	nts, err := c.newTasks(params)
	if err != nil {
		return nil, err
	}
	var ins []taskstore.Inserted
	err = c.inserting(ctx, params, nts, func(ctx context.Context) error {
		var err error
		if c.store != nil {
			ins, err = c.store.Insert(ctx, nts)
		} else {
			ins, err = restclient.Tasks{C: c.rest}.Insert(ctx, nts)
		}
		return err
	})
	if err != nil {
		return nil, schemaHint(err)
	}
	return results(ins), nil
}

// InsertTx is Insert inside the caller's transaction tx, on the client's
// database: the task exists if and when tx commits, and is claimable then
// (NOTIFY on commit); if tx rolls back, it never existed. This is how a
// task and the data it is about are written together: no task without its
// data, no data without its task. A remote client has no database: the
// error is ErrNoDatabase.
func (c *Client) InsertTx(ctx context.Context, tx pgx.Tx, args TaskArgs, opts *InsertOpts) (*InsertResult, error) {
	res, err := c.InsertManyTx(ctx, tx, []InsertParams{{Args: args, Opts: opts}})
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// InsertManyTx is InsertMany inside the caller's transaction tx (see
// InsertTx).
func (c *Client) InsertManyTx(ctx context.Context, tx pgx.Tx, params []InsertParams) ([]*InsertResult, error) {
	if c.store == nil {
		return nil, fmt.Errorf("%w: InsertTx needs a client made with NewClient on the database's pool", ErrNoDatabase)
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: InsertTx needs a transaction, not nil", ErrInvalidArgument)
	}
	nts, err := c.newTasks(params)
	if err != nil {
		return nil, err
	}
	var ins []taskstore.Inserted
	err = c.inserting(ctx, params, nts, func(ctx context.Context) error {
		var err error
		ins, err = c.store.InsertTx(ctx, tx, nts)
		return err
	})
	if err != nil {
		return nil, schemaHint(err)
	}
	return results(ins), nil
}

func results(ins []taskstore.Inserted) []*InsertResult {
	out := make([]*InsertResult, len(ins))
	for i := range ins {
		out[i] = &InsertResult{Task: &ins[i].Task, Duplicate: ins[i].Duplicate}
	}
	return out
}

// maxInsert bounds one InsertMany, as the REST API does.
const maxInsert = 10000

// newTasks checks params and turns them into the store's NewTasks, the
// options merged: the insert's, the args', the kind's.
func (c *Client) newTasks(params []InsertParams) ([]taskstore.NewTask, error) {
	if len(params) == 0 || len(params) > maxInsert {
		return nil, fmt.Errorf("%w: %d tasks; insert 1 to %d at a time", ErrInvalidArgument, len(params), maxInsert)
	}
	nts := make([]taskstore.NewTask, len(params))
	for i, p := range params {
		nt, err := c.newTask(p)
		if err != nil {
			if len(params) > 1 {
				return nil, fmt.Errorf("task %d (counting from 0): %w", i, err)
			}
			return nil, err
		}
		nts[i] = nt
	}
	return nts, nil
}

func (c *Client) newTask(p InsertParams) (taskstore.NewTask, error) {
	if p.Args == nil {
		return taskstore.NewTask{}, fmt.Errorf("%w: no task args (nil)", ErrInvalidArgument)
	}
	kind, err := safeKind(p.Args)
	if err != nil {
		return taskstore.NewTask{}, err
	}
	if err := c.knownKind(kind); err != nil {
		return taskstore.NewTask{}, err
	}
	kw := c.funcs[kind]
	data, err := json.Marshal(p.Args)
	if err != nil {
		return taskstore.NewTask{}, fmt.Errorf("%w: encode the args of kind %q: %w", ErrInvalidArgument, kind, err)
	}
	if len(data) > task.MaxPayloadBytes {
		return taskstore.NewTask{}, fmt.Errorf("%w: the args of kind %q encode as %d bytes of JSON; task_data holds at most %d (task.MaxPayloadBytes): store large data elsewhere and pass its key",
			ErrInvalidArgument, kind, len(data), task.MaxPayloadBytes)
	}
	if d := bytes.TrimSpace(data); len(d) == 0 || d[0] != '{' {
		return taskstore.NewTask{}, fmt.Errorf("%w: the args of kind %q encode as %.40s, not a JSON object; use a struct (or a map)", ErrInvalidArgument, kind, data)
	}
	var o InsertOpts
	if dp, ok := p.Args.(InsertOptsProvider); ok {
		o = dp.InsertOpts()
	}
	if p.Opts != nil {
		o = merged(o, *p.Opts)
	}
	if o.MaxAttempts == 0 && kw != nil {
		o.MaxAttempts = kw.cfg.MaxAttempts
	}
	if o.Queue != "" {
		if err := checkName("queue", o.Queue); err != nil {
			return taskstore.NewTask{}, err
		}
	}
	c.warnQueue(kind, o.Queue)
	if o.UniqueKey != "" {
		if err := checkName("unique key", o.UniqueKey); err != nil {
			return taskstore.NewTask{}, err
		}
	}
	if o.Lock != "" {
		if err := checkResource("lock", o.Lock); err != nil {
			return taskstore.NewTask{}, err
		}
	}
	if o.LockLimit != 0 && o.Lock == "" {
		return taskstore.NewTask{}, fmt.Errorf("%w: LockLimit %d without a Lock; name the key it limits in Lock", ErrInvalidArgument, o.LockLimit)
	}
	if err := checkSlots("LockLimit", o.Lock, o.LockLimit, false); err != nil {
		return taskstore.NewTask{}, err
	}
	if err := checkTTL("task TTL", o.TTL); err != nil {
		return taskstore.NewTask{}, err
	}
	if o.MaxAttempts < 0 || o.MaxAttempts > 100 {
		return taskstore.NewTask{}, fmt.Errorf("%w: MaxAttempts %d must be 1 to 100 (0: the default)", ErrInvalidArgument, o.MaxAttempts)
	}
	if !o.ScheduledAt.IsZero() && (o.ScheduledAt.Year() < 1 || o.ScheduledAt.Year() > 9999) {
		return taskstore.NewTask{}, fmt.Errorf("%w: ScheduledAt %s is outside the years 1 to 9999", ErrInvalidArgument, o.ScheduledAt)
	}
	if err := task.CheckMetadata(o.Metadata); err != nil {
		return taskstore.NewTask{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return taskstore.NewTask{
		TaskData: data, Kind: kind, Queue: o.Queue, Priority: o.Priority, UniqueKey: o.UniqueKey,
		TTL: o.TTL, ScheduledAt: o.ScheduledAt, MaxAttempts: int32(o.MaxAttempts), Lock: o.Lock,
		LockLimit: o.LockLimit,
		Metadata:  maps.Clone(o.Metadata),
	}, nil
}

// warnQueue says, once per queue, that a task of the client's own kinds
// went to a queue its workers do not take: it waits for another process's
// workers, and if there is none, for ever (the service's metrics
// leasehold_tasks_pending_by_kind and leasehold_task_oldest_wait_seconds
// show it, by queue and kind). It cannot be an error: another process may
// serve the queue.
func (c *Client) warnQueue(kind, queue string) {
	if queue == "" {
		queue = task.DefaultQueue
	}
	if c.funcs[kind] == nil || len(c.cfg.Queues) == 0 {
		return
	}
	if _, ok := c.cfg.Queues[queue]; ok {
		return
	}
	if _, said := c.warnedQueues.LoadOrStore(queue, true); !said {
		queues := make([]string, 0, len(c.cfg.Queues))
		for q := range c.cfg.Queues {
			queues = append(queues, q)
		}
		slices.Sort(queues)
		c.log.Warn().Str("queue", queue).Str("kind", kind).Strs("client_queues", queues).
			Msg("a task went to a queue this client's workers do not take: it waits for another process's workers (said once per queue)")
	}
}

// knownKind refuses a kind the client's Workers do not run, unless
// Config.AllowUnknownKinds: most often a typo.
func (c *Client) knownKind(kind string) error {
	if c.funcs[kind] == nil && len(c.kinds) > 0 && !c.cfg.AllowUnknownKinds {
		return fmt.Errorf("%w: %q (this client runs %v; set Config.AllowUnknownKinds to insert tasks for other programs)", ErrUnknownKind, kind, c.kinds)
	}
	return nil
}

// merged is base with the non-zero fields of over.
func merged(base, over InsertOpts) InsertOpts {
	if over.Queue != "" {
		base.Queue = over.Queue
	}
	if over.Priority != 0 {
		base.Priority = over.Priority
	}
	if over.UniqueKey != "" {
		base.UniqueKey = over.UniqueKey
	}
	if over.Lock != "" {
		base.Lock = over.Lock
	}
	if over.LockLimit != 0 {
		base.LockLimit = over.LockLimit
	}
	if !over.ScheduledAt.IsZero() {
		base.ScheduledAt = over.ScheduledAt
	}
	if over.MaxAttempts != 0 {
		base.MaxAttempts = over.MaxAttempts
	}
	if over.TTL != 0 {
		base.TTL = over.TTL
	}
	if len(over.Metadata) > 0 {
		m := maps.Clone(base.Metadata)
		if m == nil {
			m = map[string]string{}
		}
		maps.Copy(m, over.Metadata)
		base.Metadata = m
	}
	return base
}

// safeKind is args' Kind, checked as a name; a Kind that panics (a nil
// pointer) is an error.
func safeKind(args TaskArgs) (kind string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %T's Kind panicked (%v)", ErrInvalidArgument, args, v)
		}
	}()
	kind = args.Kind()
	if err := checkName("kind", kind); err != nil {
		return "", fmt.Errorf("%w (of %T)", err, args)
	}
	return kind, nil
}

// Get returns the task, task.ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, id int64) (*task.Task, error) {
	return c.onTask(id,
		func(s *taskstore.Store) (task.Task, error) { return s.Get(ctx, id) },
		func(r restclient.Tasks) (task.Task, error) { return r.Get(ctx, id) })
}

// Cancel cancels a pending or running task, with reason as its last error
// ("" for a default). A running task's lease is revoked at once: its
// worker's handler sees its context cancelled (task.ErrCancelled) within
// moments, embedded or remote, and nothing its worker reports is accepted.
// task.ErrNotCancellable when the task is done, dead or cancelled already;
// task.ErrNotFound when there is none.
func (c *Client) Cancel(ctx context.Context, id int64, reason string) (*task.Task, error) {
	if reason == "" {
		reason = "cancelled"
	}
	return c.onTask(id,
		func(s *taskstore.Store) (task.Task, error) { return s.Cancel(ctx, id, reason) },
		func(r restclient.Tasks) (task.Task, error) { return r.Cancel(ctx, id, reason) })
}

// Retry puts a dead or cancelled task back in the queue, due now, with a
// fresh budget of attempts (its earlier attempts stay in its history).
// task.ErrNotRetryable when it is neither; task.ErrUniqueKeyTaken when
// another task of its kind now holds its unique key; task.ErrNotFound.
func (c *Client) Retry(ctx context.Context, id int64) (*task.Task, error) {
	return c.onTask(id,
		func(s *taskstore.Store) (task.Task, error) { return s.Retry(ctx, id) },
		func(r restclient.Tasks) (task.Task, error) { return r.Retry(ctx, id) })
}

// onTask makes a call about task id: on the store when the client has a
// pool, over REST otherwise.
func (c *Client) onTask(id int64, onStore func(*taskstore.Store) (task.Task, error), onREST func(restclient.Tasks) (task.Task, error)) (*task.Task, error) {
	if id < 1 {
		return nil, fmt.Errorf("%w: task id %d is not positive", ErrInvalidArgument, id)
	}
	var (
		t   task.Task
		err error
	)
	if c.store != nil {
		t, err = onStore(c.store)
	} else {
		t, err = onREST(restclient.Tasks{C: c.rest})
	}
	if err != nil {
		return nil, c.aboutTask(id, err)
	}
	return &t, nil
}

// aboutTask words a refusal about task id with the task: its id, and, for
// a refusal because of its state, that state.
func (c *Client) aboutTask(id int64, err error) error {
	switch {
	case errors.Is(err, task.ErrNotFound):
		return fmt.Errorf("task %d: %w", id, err)
	case errors.Is(err, task.ErrNotCancellable), errors.Is(err, task.ErrNotRetryable), errors.Is(err, task.ErrUniqueKeyTaken):
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var cur task.Task
		var gerr error
		if c.store != nil {
			cur, gerr = c.store.Get(ctx, id)
		} else {
			cur, gerr = restclient.Tasks{C: c.rest}.Get(ctx, id)
		}
		if gerr == nil {
			return fmt.Errorf("task %d is %s: %w", id, cur.State, err)
		}
		return fmt.Errorf("task %d: %w", id, err)
	}
	return schemaHint(err)
}

// InsertManyFast adds tasks with PostgreSQL's COPY: the fastest way in for
// a large batch (thousands of tasks), all or none. The tasks are checked as
// InsertMany's are, and may not have a UniqueKey (COPY cannot skip a
// duplicate): that is an ErrInvalidArgument. It returns how many it
// inserted, not the tasks. Idle workers are woken once, as for InsertMany.
// It takes up to 1,000,000 tasks a call, and needs a client on a pool
// (ErrNoDatabase otherwise); the Insert middleware runs as for any insert.
func (c *Client) InsertManyFast(ctx context.Context, params []InsertParams) (int, error) {
	if c.pool == nil {
		return 0, fmt.Errorf("%w: InsertManyFast needs a client made with NewClient on the database's pool (it uses COPY)", ErrNoDatabase)
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, schemaHint(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op once committed
	n, err := c.InsertManyFastTx(ctx, tx, params)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return n, nil
}

// InsertManyFastTx is InsertManyFast inside the caller's transaction tx.
func (c *Client) InsertManyFastTx(ctx context.Context, tx pgx.Tx, params []InsertParams) (int, error) {
	if c.store == nil {
		return 0, fmt.Errorf("%w: InsertManyFastTx needs a client made with NewClient on the database's pool", ErrNoDatabase)
	}
	if tx == nil {
		return 0, fmt.Errorf("%w: InsertManyFastTx needs a transaction, not nil", ErrInvalidArgument)
	}
	nts, err := c.newTasksFast(params)
	if err != nil {
		return 0, err
	}
	var n int64
	err = c.inserting(ctx, params, nts, func(ctx context.Context) error {
		var err error
		n, err = taskstore.CopyInsert(ctx, tx, nts)
		return err
	})
	if err != nil {
		return 0, schemaHint(err)
	}
	return int(n), nil
}

// maxInsertFast bounds one InsertManyFast.
const maxInsertFast = 1_000_000

// newTasksFast are the tasks of params checked as newTasks does, none with
// a unique key; any number up to maxInsertFast.
func (c *Client) newTasksFast(params []InsertParams) ([]taskstore.NewTask, error) {
	if len(params) == 0 || len(params) > maxInsertFast {
		return nil, fmt.Errorf("%w: InsertManyFast takes 1 to %d tasks, not %d", ErrInvalidArgument, maxInsertFast, len(params))
	}
	nts := make([]taskstore.NewTask, len(params))
	for i, p := range params {
		nt, err := c.newTask(p)
		if err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
		if nt.UniqueKey != "" {
			return nil, fmt.Errorf("%w: task %d has a unique key; InsertManyFast (COPY) cannot skip a duplicate: use InsertMany", ErrInvalidArgument, i)
		}
		nts[i] = nt
	}
	return nts, nil
}
