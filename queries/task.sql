-- name: TaskInsert :many
-- TaskInsert adds tasks in one statement (one NOTIFY): the i-th task gets
-- the i-th element of each array (scheduled_at: an RFC 3339 time, or ''
-- for now; unique_key '', ttl_seconds 0, locks '' and metadata null for
-- none). A task whose (kind,
-- unique_key) another task not cancelled holds is not inserted (nor the
-- second of two in the batch with the same key): what comes back is the
-- tasks inserted, in the order given. TaskGetByUniqueKeys then reads the
-- holders of the others.
INSERT INTO tasks (task_data, kind, queue, priority, unique_key, ttl_seconds, scheduled_at, max_attempts, lock_resource, metadata)
SELECT d.v, k.v, q.v, p.v, nullif(u.v, ''), nullif(l.v, 0), coalesce(nullif(s.v, '')::timestamptz, now()), m.v, nullif(g.v, ''),
       nullif(md.v, 'null'::jsonb)
FROM unnest(@task_data::jsonb[]) WITH ORDINALITY AS d (v, i)
JOIN unnest(@kinds::text[]) WITH ORDINALITY AS k (v, i) ON k.i = d.i
JOIN unnest(@queues::text[]) WITH ORDINALITY AS q (v, i) ON q.i = d.i
JOIN unnest(@priorities::smallint[]) WITH ORDINALITY AS p (v, i) ON p.i = d.i
JOIN unnest(@unique_keys::text[]) WITH ORDINALITY AS u (v, i) ON u.i = d.i
JOIN unnest(@ttl_seconds::integer[]) WITH ORDINALITY AS l (v, i) ON l.i = d.i
JOIN unnest(@scheduled_at::text[]) WITH ORDINALITY AS s (v, i) ON s.i = d.i
JOIN unnest(@max_attempts::integer[]) WITH ORDINALITY AS m (v, i) ON m.i = d.i
JOIN unnest(@locks::text[]) WITH ORDINALITY AS g (v, i) ON g.i = d.i
JOIN unnest(@metadata::jsonb[]) WITH ORDINALITY AS md (v, i) ON md.i = d.i
ORDER BY d.i
ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL AND state <> 'cancelled' DO NOTHING
RETURNING *;

-- name: TaskGetByUniqueKeys :many
-- TaskGetByUniqueKeys returns the tasks not cancelled that hold the unique
-- keys (kinds[i], unique_keys[i]): the tasks that kept TaskInsert from
-- inserting, read by a statement of their own so that its snapshot sees
-- a holder whose transaction committed while the insert waited for it.
SELECT t.* FROM tasks AS t
WHERE t.unique_key IS NOT NULL AND t.state <> 'cancelled'
  AND (t.kind, t.unique_key) IN (SELECT k.v, u.v
                                 FROM unnest(@kinds::text[]) WITH ORDINALITY AS k (v, i)
                                 JOIN unnest(@unique_keys::text[]) WITH ORDINALITY AS u (v, i) ON u.i = k.i);

-- name: TaskInsertGenerated :many
-- TaskInsertGenerated is the generator's fenced insert of demo tasks (kind
-- sleep, queue default): it adds the tasks only while the generator is
-- started and the holder's generator lease with this fence is live,
-- holding that lease row locked against a takeover until the insert
-- commits. No rows back: not (or no longer) allowed.
WITH live AS (
    SELECT l.fence FROM leases AS l
    WHERE l.resource = 'leasehold:generator'
      AND l.holder = @holder
      AND l.fence = @fence
      AND coalesce(l.released_at, l.expired_at) IS NULL -- not the reaper's index (LeaseRenew)
      AND l.expires_at > now()
    FOR SHARE
)
INSERT INTO tasks (task_data, generator_fence)
SELECT d.v, live.fence
FROM unnest(@task_data::jsonb[]) AS d (v)
CROSS JOIN live
JOIN generator_state AS g ON g.started
RETURNING *;

-- name: TaskClaim :many
-- TaskClaim claims up to one task for each processor named, of the queues
-- and kinds given (NULL: all), lowest (priority, scheduled_at, id) first,
-- each under a new lease held in the task's row (a new fence from
-- lease_fence_seq, drawn under the row lock; the task's TTL, or
-- ttl_seconds when it has none): due pending tasks of queues not paused (tasks_claim_pick: tasks_claimable,
-- schema/0011, with the claimer's hints) and, with with_lapsed, running
-- tasks whose lease lapsed before a reaper put them back (the claim counts
-- an attempt either way, and records the lapsed one in earlier_attempts);
-- lapsed tasks that have used all their attempts are then declared dead
-- instead. Without with_lapsed the claim reads no running task: their
-- index holds an entry for every task run since the last VACUUM, too many
-- to walk on every claim of a busy queue, where the reaper puts lapsed
-- tasks back anyway.
WITH buried AS (
    UPDATE tasks AS b
    SET state = 'dead',
        processed_at = now(),
        last_error = coalesce(b.last_error, 'the lease lapsed on every attempt (the worker crashed or stalled)'),
        earlier_attempts = b.earlier_attempts || task_attempt(b, 'expired', NULL),
        must_heartbeat_before = NULL
    WHERE b.id IN (
            SELECT x.id FROM tasks AS x
            WHERE sqlc.arg(with_lapsed)::boolean
              AND x.state = 'running'
              AND x.must_heartbeat_before <= now()
              AND x.attempts >= x.max_attempts
              AND (sqlc.narg(want_queues)::text[] IS NULL OR x.queue = ANY (sqlc.narg(want_queues)::text[]))
              AND (sqlc.narg(want_kinds)::text[] IS NULL OR x.kind = ANY (sqlc.narg(want_kinds)::text[]))
            FOR UPDATE SKIP LOCKED)
    RETURNING b.id
),
-- Two picks (an OR of the two would scan every claimable row): due
-- pending tasks, and lapsed running ones. Every due row picked is used
-- (tasks_claimable must not leave a row it locked: see there); lapsed rows
-- not used stay locked only until this statement commits.
-- Gated tasks whose lock is free first, at most one per lock (they are
-- few, and would otherwise wait behind every ungated task), claimed by
-- tasks_gated (schema/0014) for the first processors, each with its
-- lock's lease acquired: the task's attempt is that holding of the lock.
-- The function assigns them itself, since it reads with snapshots later
-- than this statement's, which may not see a task it claims. Looked for
-- only while a gated task is pending: a one-time filter, one probe of an
-- index that is empty but for them (tasks_gated_waiting, schema/0014).
gated AS (
    SELECT g.*
    FROM tasks_gated(sqlc.narg(want_queues)::text[], sqlc.narg(want_kinds)::text[], @processors::text[], @ttl_seconds::integer) AS g
    WHERE tasks_gated_waiting()
),
due AS (
    SELECT d.id, d.priority, d.scheduled_at
    FROM tasks_claim_pick(sqlc.narg(want_queues)::text[], sqlc.narg(want_kinds)::text[],
                         cardinality(@processors::text[]) - (SELECT count(*)::integer FROM gated),
                         @hint_queues::text[], @hint_kinds::text[], @hint_priorities::smallint[],
                         @hint_at::timestamptz[], @hint_ids::bigint[], @discover::boolean) AS d (id, priority, scheduled_at)
),
lapsed AS (
    SELECT r.id, r.priority, r.scheduled_at FROM tasks AS r
    WHERE sqlc.arg(with_lapsed)::boolean
      AND r.state = 'running' AND r.must_heartbeat_before <= now() AND r.attempts < r.max_attempts
      -- A gated task goes back through the reaper, and its lock with it.
      AND r.lock_resource IS NULL
      AND r.queue <> ALL (queues_paused())
      AND (sqlc.narg(want_queues)::text[] IS NULL OR r.queue = ANY (sqlc.narg(want_queues)::text[]))
      AND (sqlc.narg(want_kinds)::text[] IS NULL OR r.kind = ANY (sqlc.narg(want_kinds)::text[]))
    LIMIT cardinality(@processors::text[]) - (SELECT count(*) FROM due) - (SELECT count(*) FROM gated)
    FOR UPDATE SKIP LOCKED
),
-- The gated tasks have the first processors; the others follow in order.
picked AS (
    SELECT p.id, (SELECT count(*) FROM gated) + row_number() OVER (ORDER BY p.priority, p.scheduled_at, p.id) AS n
    FROM (SELECT due.id, due.priority, due.scheduled_at FROM due
          UNION ALL
          SELECT lapsed.id, lapsed.priority, lapsed.scheduled_at FROM lapsed) AS p
),
assigned AS (
    SELECT picked.id, w.processor, clock_timestamp() AS acquired_at
    FROM picked
    JOIN unnest(@processors::text[]) WITH ORDINALITY AS w (processor, n) ON w.n = picked.n
),
claimed AS (
UPDATE tasks AS t
SET state = 'running',
    earlier_attempts = CASE WHEN t.state = 'running' THEN t.earlier_attempts || task_attempt(t, 'expired', NULL)
                            ELSE t.earlier_attempts END,
    processor = a.processor,
    -- Drawn now, under the row lock: the fence of every earlier attempt
    -- was drawn before it.
    fence = nextval('lease_fence_seq'),
    ttl_seconds = coalesce(t.ttl_seconds, @ttl_seconds::integer),
    attempts = t.attempts + 1,
    -- The attempt begins as the row is claimed (acquired_at: the clock
    -- when assigned was built), not when the statement began: the pick of due tasks (tasks_claimable) reads with
    -- a snapshot of its own, taken later, which may see a task the reaper
    -- put back after the statement began, when the previous attempt's
    -- lease ran out. A start read from now() would then lie before that
    -- end.
    started_at = a.acquired_at,
    last_heartbeat_at = a.acquired_at,
    must_heartbeat_before = a.acquired_at + make_interval(secs => coalesce(t.ttl_seconds, @ttl_seconds::integer))
FROM assigned AS a
WHERE t.id = a.id
RETURNING t.*
)
SELECT c.* FROM claimed AS c
UNION ALL
SELECT g.* FROM gated AS g;

-- name: TaskHeartbeat :one
-- TaskHeartbeat renews the task's lease for its processor: a
-- compare-and-set on (processor, fence when given, lease live). No row:
-- the task is not this processor's, is finished or cancelled, or its lease
-- lapsed. It writes no indexed column, so it is a heap-only update.
UPDATE tasks AS t
SET last_heartbeat_at = now(),
    must_heartbeat_before = now() + make_interval(secs => t.ttl_seconds)
WHERE t.id = @id::bigint
  AND t.state = 'running'
  AND t.processor = @processor::text
  AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
  AND t.must_heartbeat_before > now()
RETURNING t.*;

-- name: TaskComplete :one
-- TaskComplete finishes the task with its output, which ends its lease,
-- under the same compare-and-set as TaskHeartbeat: at most once. The
-- error of an earlier attempt goes from last_error (its history keeps it):
-- a done task's own fields describe its outcome.
-- must_heartbeat_before keeps the expiry the lease had when it ended.
UPDATE tasks AS t
SET state = 'done',
    processed_at = now(),
    task_output = @task_output::jsonb,
    last_error = NULL
WHERE t.id = @id::bigint
  AND t.state = 'running'
  AND t.processor = @processor::text
  AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
  AND t.must_heartbeat_before > now()
RETURNING t.*;

-- name: TaskCompleteMany :many
-- TaskCompleteMany is TaskComplete for many tasks in one statement (one
-- commit), each under its own compare-and-set: the ids it returns were
-- completed, the others were not (lease lost, or already processed). Only
-- the ids come back: the rows are the workers' own, and a batch of whole
-- rows (task data, output, history) cost the replica more to decode than
-- anything else about a completion.
UPDATE tasks AS t
SET state = 'done',
    processed_at = now(),
    task_output = input.output,
    last_error = NULL
FROM (
    -- Set-returning functions side by side in a select list advance together.
    SELECT unnest(@ids::bigint[]) AS id, unnest(@processors::text[]) AS processor,
           unnest(@fences::bigint[]) AS fence, unnest(@outputs::jsonb[]) AS output
) AS input
WHERE t.id = input.id
  AND t.state = 'running'
  AND t.processor = input.processor
  AND t.fence = input.fence
  AND t.must_heartbeat_before > now()
RETURNING t.id;

-- name: TaskFail :one
-- TaskFail records a failed attempt, which ends its lease, under the same
-- compare-and-set: back to pending after retry_in_seconds (the kind's
-- backoff, when the worker has one) or else an exponential backoff with
-- jitter (base_seconds × 2^(attempts−1), at most max_backoff_seconds,
-- times 0.5–1.0); dead when the attempts are used up. The attempt goes to
-- earlier_attempts with its error.
UPDATE tasks AS t
SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
    scheduled_at = now() + make_interval(secs => coalesce(
        sqlc.narg(retry_in_seconds)::float8,
        least(sqlc.arg(base_seconds)::float8 * power(2, t.attempts - 1), sqlc.arg(max_backoff_seconds)::float8)
            * (0.5 + random() / 2))),
    processed_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END,
    last_error = sqlc.arg(error)::text,
    earlier_attempts = t.earlier_attempts || task_attempt(t, 'failed', sqlc.arg(error)::text),
    must_heartbeat_before = NULL
WHERE t.id = @id::bigint
  AND t.state = 'running'
  AND t.processor = @processor::text
  AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
  AND t.must_heartbeat_before > now()
RETURNING t.*;

-- name: TaskPutBack :one
-- TaskPutBack ends the running attempt without counting it, under the same
-- compare-and-set: the task goes back to pending, due after
-- delay_seconds. Outcome 'requeued' is a worker shutting down handing the
-- task back (delay 0: another worker may claim it at once); 'snoozed' is a
-- handler asking to run again later. The attempt goes to earlier_attempts
-- with the reason.
UPDATE tasks AS t
SET state = 'pending',
    attempts = t.attempts - 1,
    scheduled_at = now() + make_interval(secs => @delay_seconds::float8),
    earlier_attempts = t.earlier_attempts || task_attempt(t, @outcome::text, sqlc.narg(reason)::text),
    must_heartbeat_before = NULL
WHERE t.id = @id::bigint
  AND t.state = 'running'
  AND t.processor = @processor::text
  AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
  AND t.must_heartbeat_before > now()
  AND @outcome::text IN ('requeued', 'snoozed')
RETURNING t.*;

-- name: TaskCancel :one
-- TaskCancel cancels a pending or running task: cancelled, finished now,
-- reason as its last_error. A running task's lease is revoked with it
-- (every compare-and-set of its holder asks for state running) and its
-- attempt goes to earlier_attempts, which makes the statement trigger
-- NOTIFY 'cancelled:<id>' (schema/0011), so that a holder that listens
-- stops at once. With processor, the cancellation is its holder's own (a
-- handler giving up on its task): a compare-and-set on (processor, fence
-- when given, lease live), as TaskFail. No row: the task is done, dead or
-- cancelled already, not the holder's, or does not exist.
UPDATE tasks AS t
SET state = 'cancelled',
    processed_at = now(),
    last_error = @reason::text,
    earlier_attempts = CASE WHEN t.state = 'running'
                            THEN t.earlier_attempts || task_attempt(t, 'cancelled', @reason::text)
                            ELSE t.earlier_attempts END
WHERE t.id = @id::bigint AND t.state IN ('pending', 'running')
  AND (sqlc.narg(processor)::text IS NULL
       OR (t.state = 'running' AND t.processor = sqlc.narg(processor)::text
           AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
           AND t.must_heartbeat_before > now()))
RETURNING t.*;

-- name: TaskRetry :one
-- TaskRetry puts a dead or cancelled task back to pending, due now, with a
-- fresh budget of max_attempts (attempts starts again from 0; its earlier
-- attempts stay in its history); the statement trigger NOTIFYs 'requeued'
-- (a pending task due now) so that workers look. A unique key another task
-- now holds makes it fail with a unique violation (23505). No row: the task
-- is not dead or cancelled, or does not exist.
UPDATE tasks AS t
SET state = 'pending',
    scheduled_at = now(),
    attempts = 0,
    processed_at = NULL,
    must_heartbeat_before = NULL
WHERE t.id = @id::bigint AND t.state IN ('dead', 'cancelled')
RETURNING t.*;

-- name: TaskRequeueLapsed :many
-- TaskRequeueLapsed is the reaper's announcement of lapsed task leases: up
-- to batch_size running tasks whose lease ran out go back to pending (due
-- at their old schedule, so first in line) or, when they have used their
-- attempts, dead; the lapsed attempt goes to earlier_attempts. The
-- statement trigger NOTIFYs 'requeued' (and 'finished'), which wakes the
-- workers. Tasks being changed right now are skipped; the next pass takes
-- them.
UPDATE tasks AS t
SET state = CASE WHEN t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
    processed_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END,
    last_error = CASE WHEN t.attempts >= t.max_attempts
                      THEN coalesce(t.last_error, 'the lease lapsed on every attempt (the worker crashed or stalled)')
                      ELSE t.last_error END,
    earlier_attempts = t.earlier_attempts || task_attempt(t, 'expired', NULL),
    must_heartbeat_before = NULL
WHERE t.id IN (
        SELECT x.id FROM tasks AS x
        WHERE x.state = 'running' AND x.must_heartbeat_before <= now()
        ORDER BY x.id
        LIMIT @batch_size
        FOR UPDATE SKIP LOCKED)
  AND t.state = 'running'
  AND t.must_heartbeat_before <= now()
RETURNING t.*;

-- name: TaskNextLapse :one
-- TaskNextLapse tells the reaper when the earliest running task's lease
-- runs out (an hour from now when none runs: a claim that expires sooner
-- than every running task arrives by NOTIFY), read after every claim that
-- skipped that NOTIFY has committed (schema/0009, task_next_lapse).
-- Running tasks are few: one per busy worker.
SELECT coalesce(task_next_lapse(@wait_ms::integer), now() + interval '1 hour')::timestamptz AS next_lapse;

-- name: TaskGet :one
SELECT * FROM tasks WHERE id = @id;

-- name: TaskList :many
-- TaskList pages through tasks in id order, of the states, kinds and
-- queues given (NULL: any), and with started only those ever claimed
-- (tasks_filtered, schema/0011).
SELECT * FROM tasks_filtered(sqlc.narg(states)::text[], sqlc.narg(kinds)::text[], sqlc.narg(queues)::text[],
                             @started::boolean, @after_id::bigint, @row_limit::integer);

-- name: TaskStats :one
-- TaskStats counts tasks by state, and those finished (done) in about the
-- last minute, from the changes the triggers on tasks log (task_counts,
-- schema/0017): a few hundred rows whatever the size of tasks.
SELECT coalesce(sum(n) FILTER (WHERE state = 'pending'), 0)::bigint   AS pending,
       coalesce(sum(n) FILTER (WHERE state = 'running'), 0)::bigint   AS running,
       coalesce(sum(n) FILTER (WHERE state = 'done'), 0)::bigint      AS done,
       coalesce(sum(n) FILTER (WHERE state = 'dead'), 0)::bigint      AS dead,
       coalesce(sum(n) FILTER (WHERE state = 'cancelled'), 0)::bigint AS cancelled,
       coalesce(sum(entered) FILTER (WHERE state = 'done' AND at > now() - interval '1 minute'), 0)::bigint AS done_last_minute
FROM task_counts;

-- name: TaskCountsFold :one
-- TaskCountsFold folds the changes task_counts logged (task_counts_fold,
-- schema/0017) and returns how many rows it folded.
SELECT task_counts_fold()::bigint AS folded;

-- name: TaskNextDue :one
-- TaskNextDue tells an idle dispatcher when the next pending task of its
-- queues and kinds (NULL: all) falls due (scheduled in the future, e.g. a
-- retry's backoff); an hour from now when none is (a new task arrives by
-- NOTIFY).
SELECT coalesce(tasks_next_wake(sqlc.narg(want_queues)::text[], sqlc.narg(want_kinds)::text[]),
                now() + interval '1 hour')::timestamptz AS next_due,
       now()::timestamptz AS db_now;

-- name: TaskListRunning :many
-- TaskListRunning returns running tasks, oldest first (by id).
SELECT * FROM tasks
WHERE state = 'running'
ORDER BY id
LIMIT @row_limit;

-- name: TaskListDead :many
-- TaskListDead returns the most recently dead tasks first.
SELECT * FROM tasks
WHERE state = 'dead'
ORDER BY processed_at DESC, id DESC
LIMIT @row_limit;

-- name: TaskPendingSummary :many
-- TaskPendingSummary counts the pending tasks of each (queue, kind), at most
-- max_count each, with the scheduled_at of the longest-waiting due one
-- (tasks_pending_summary, schema/0011).
-- oldest_wait_seconds is 0 for a (queue, kind) none of whose tasks is due.
SELECT s.queue::text AS queue, s.kind::text AS kind, s.pending::bigint AS pending,
       coalesce(extract(epoch FROM now() - s.oldest_due), 0)::float8 AS oldest_wait_seconds
FROM tasks_pending_summary(@max_count::integer) AS s;

-- name: TaskCompleteAndClaim :many
-- TaskCompleteAndClaim is TaskCompleteMany and a claim of due pending tasks
-- (as TaskClaim without with_lapsed) for the processors claim_for, in one
-- statement and one commit: a busy replica's workers hand in their
-- completions and get their next tasks at once. The first row carries the
-- ids completed; a row's other columns are a claimed task, all NULL in the
-- one row that comes back when nothing was claimed.
WITH input AS (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@processors::text[]) AS processor,
           unnest(@fences::bigint[]) AS fence, unnest(@outputs::jsonb[]) AS output
),
completed AS (
    UPDATE tasks AS c
    SET state = 'done',
        processed_at = now(),
        task_output = input.output,
        last_error = NULL
    FROM input
    WHERE c.id = input.id
      AND c.state = 'running'
      AND c.processor = input.processor
      AND c.fence = input.fence
      AND c.must_heartbeat_before > now()
    RETURNING c.id
),
-- As TaskClaim's: tasks_gated claims the gated tasks itself.
gated AS (
    SELECT g.*
    FROM tasks_gated(sqlc.narg(want_queues)::text[], sqlc.narg(want_kinds)::text[], @claim_for::text[], @ttl_seconds::integer) AS g
    WHERE tasks_gated_waiting()
),
picked AS (
    SELECT d.id, (SELECT count(*) FROM gated) + row_number() OVER (ORDER BY d.priority, d.scheduled_at, d.id) AS n
    FROM tasks_claim_pick(sqlc.narg(want_queues)::text[], sqlc.narg(want_kinds)::text[],
                         cardinality(@claim_for::text[]) - (SELECT count(*)::integer FROM gated),
                         @hint_queues::text[], @hint_kinds::text[], @hint_priorities::smallint[],
                         @hint_at::timestamptz[], @hint_ids::bigint[], @discover::boolean) AS d (id, priority, scheduled_at)
),
assigned AS (
    SELECT picked.id, w.processor, clock_timestamp() AS acquired_at
    FROM picked
    JOIN unnest(@claim_for::text[]) WITH ORDINALITY AS w (processor, n) ON w.n = picked.n
),
ungated AS (
    UPDATE tasks AS t
    SET state = 'running',
        processor = a.processor,
        fence = nextval('lease_fence_seq'),
        ttl_seconds = coalesce(t.ttl_seconds, @ttl_seconds::integer),
        attempts = t.attempts + 1,
        -- As TaskClaim's: the attempt begins as the row is claimed.
        started_at = a.acquired_at,
        last_heartbeat_at = a.acquired_at,
        must_heartbeat_before = a.acquired_at + make_interval(secs => coalesce(t.ttl_seconds, @ttl_seconds::integer))
    FROM assigned AS a
    WHERE t.id = a.id
    RETURNING t.id, t.kind, t.queue, t.priority, t.task_data, t.scheduled_at, t.processor, t.fence, t.ttl_seconds,
              t.attempts, t.max_attempts, t.must_heartbeat_before, t.started_at, t.created_at, t.lock_resource,
              t.schedule, t.schedule_tick, t.metadata
),
claimed AS (
    SELECT * FROM ungated
    UNION ALL
    SELECT g.id, g.kind, g.queue, g.priority, g.task_data, g.scheduled_at, g.processor, g.fence, g.ttl_seconds,
           g.attempts, g.max_attempts, g.must_heartbeat_before, g.started_at, g.created_at, g.lock_resource,
           g.schedule, g.schedule_tick, g.metadata
    FROM gated AS g
)
-- The ids ride on the first row only: repeated on every row, the replica
-- decoded the same array once per claimed task. The claimed columns come
-- back never NULL (id 0 in the row of nothing claimed): a NULL-able column
-- costs the replica an allocation per column and row to decode.
SELECT (CASE WHEN claimed.id IS NULL OR claimed.id = (SELECT min(f.id) FROM claimed AS f)
             THEN done.ids END)::bigint[] AS completed_ids,
       coalesce(claimed.id, 0)::bigint AS id, coalesce(claimed.kind, '')::text AS kind,
       coalesce(claimed.queue, '')::text AS queue, coalesce(claimed.priority, 0)::smallint AS priority,
       claimed.task_data, coalesce(claimed.scheduled_at, 'epoch')::timestamptz AS scheduled_at,
       coalesce(claimed.processor, '')::text AS processor, coalesce(claimed.fence, 0)::bigint AS fence,
       coalesce(claimed.ttl_seconds, 0)::integer AS ttl_seconds, coalesce(claimed.attempts, 0)::integer AS attempts,
       coalesce(claimed.max_attempts, 0)::integer AS max_attempts,
       coalesce(claimed.must_heartbeat_before, 'epoch')::timestamptz AS must_heartbeat_before,
       coalesce(claimed.started_at, 'epoch')::timestamptz AS started_at,
       coalesce(claimed.created_at, 'epoch')::timestamptz AS created_at,
       coalesce(claimed.lock_resource, '')::text AS lock_resource,
       coalesce(claimed.schedule, '')::text AS schedule,
       coalesce(claimed.schedule_tick, 'epoch')::timestamptz AS schedule_tick,
       claimed.metadata
FROM (SELECT coalesce(array_agg(completed.id), '{}') AS ids FROM completed) AS done
LEFT JOIN claimed ON true;

-- name: QueuePause :one
-- QueuePause pauses a queue, until a time or (NULL) until resumed; a
-- second pause replaces the first's until and reason. It announces the
-- change (flow) for the dashboards; the claims need no word.
WITH paused AS (
    INSERT INTO queue_pauses AS p (queue, until, reason)
    VALUES (@queue::text, sqlc.narg(until)::timestamptz, @reason::text)
    ON CONFLICT (queue) DO UPDATE SET until = excluded.until, reason = excluded.reason, paused_at = now()
    RETURNING p.queue, p.paused_at, p.until, p.reason
)
SELECT paused.queue, paused.paused_at, paused.until, paused.reason
FROM paused, (SELECT pg_notify('leasehold_task', 'flow')) AS announced;

-- name: QueueResume :one
-- QueueResume lifts a queue's pause and wakes the claimers (queue_resume).
SELECT queue_resume(@queue::text)::boolean AS resumed;

-- name: QueuePauses :many
-- QueuePauses lists the queues paused now, in name order.
SELECT p.queue, p.paused_at, p.until, p.reason FROM queue_pauses AS p
WHERE p.until IS NULL OR p.until > now()
ORDER BY p.queue;
