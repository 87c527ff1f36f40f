-- name: TaskInsert :many
-- TaskInsert adds tasks in one statement (one NOTIFY): the i-th task gets
-- task_data[i], scheduled_at[i] (an RFC 3339 time, or '' for now) and
-- max_attempts[i].
INSERT INTO tasks (task_data, scheduled_at, max_attempts)
SELECT d.v, coalesce(nullif(s.v, '')::timestamptz, now()), m.v
FROM unnest(@task_data::jsonb[]) WITH ORDINALITY AS d (v, i)
JOIN unnest(@scheduled_at::text[]) WITH ORDINALITY AS s (v, i) ON s.i = d.i
JOIN unnest(@max_attempts::integer[]) WITH ORDINALITY AS m (v, i) ON m.i = d.i
ORDER BY d.i
RETURNING *;

-- name: TaskInsertGenerated :many
-- TaskInsertGenerated is the generator's fenced insert: it adds the tasks
-- only while the generator is started and the holder's generator lease with
-- this fence is live, holding that lease row locked against a takeover
-- until the insert commits. No rows back: not (or no longer) allowed.
WITH live AS (
    SELECT l.fence FROM leases AS l
    WHERE l.resource = 'leasehold:generator'
      AND l.holder = @holder
      AND l.fence = @fence
      AND l.released_at IS NULL
      AND l.expired_at IS NULL
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
-- TaskClaim claims up to one task per processor named, oldest schedule
-- first, each under a new lease held in the task's row (a new fence from
-- lease_fence_seq, drawn under the row lock; TTL ttl_seconds): pending
-- tasks that are due and, with with_lapsed, running tasks whose lease
-- lapsed before a reaper put them back (the claim counts an attempt either
-- way, and records the lapsed one in earlier_attempts); lapsed tasks that
-- have used all their attempts are then declared dead instead. Without
-- with_lapsed the claim reads no running task: their index holds an entry
-- for every task run since the last VACUUM, too many to walk on every
-- claim of a busy queue, where the reaper puts lapsed tasks back anyway.
WITH buried AS (
    UPDATE tasks AS b
    SET state = 'dead',
        processed_at = now(),
        last_error = coalesce(b.last_error, 'the lease lapsed on every attempt (the worker crashed or stalled)'),
        earlier_attempts = b.earlier_attempts || task_attempt(b, 'expired'),
        must_heartbeat_before = NULL
    WHERE b.id IN (
            SELECT x.id FROM tasks AS x
            WHERE sqlc.arg(with_lapsed)::boolean
              AND x.state = 'running'
              AND x.must_heartbeat_before <= now()
              AND x.attempts >= x.max_attempts
            FOR UPDATE SKIP LOCKED)
    RETURNING b.id
),
-- Two index-driven picks (an OR of the two would scan every claimable row):
-- due pending tasks by schedule, and lapsed running ones. Each locks at
-- most one row per processor; rows not used stay locked only until this
-- statement commits.
-- tasks_due (schema/0010) is the first of these, in index order whatever
-- the statistics say: the due pending tasks by schedule.
due AS (
    SELECT d.id, d.scheduled_at FROM tasks_due(cardinality(@processors::text[])) AS d (id, scheduled_at)
),
lapsed AS (
    SELECT r.id, r.scheduled_at FROM tasks AS r
    WHERE sqlc.arg(with_lapsed)::boolean
      AND r.state = 'running' AND r.must_heartbeat_before <= now() AND r.attempts < r.max_attempts
    LIMIT cardinality(@processors::text[])
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT p.id, row_number() OVER (ORDER BY p.scheduled_at, p.id) AS n
    FROM (SELECT due.id, due.scheduled_at FROM due
          UNION ALL
          SELECT lapsed.id, lapsed.scheduled_at FROM lapsed) AS p
),
assigned AS (
    SELECT picked.id, w.processor
    FROM picked
    JOIN unnest(@processors::text[]) WITH ORDINALITY AS w (processor, n) ON w.n = picked.n
)
UPDATE tasks AS t
SET state = 'running',
    earlier_attempts = CASE WHEN t.state = 'running' THEN t.earlier_attempts || task_attempt(t, 'expired')
                            ELSE t.earlier_attempts END,
    processor = a.processor,
    -- Drawn now, under the row lock: the fence of every earlier attempt
    -- was drawn before it.
    fence = nextval('lease_fence_seq'),
    ttl_seconds = @ttl_seconds::integer,
    attempts = t.attempts + 1,
    started_at = now(),
    last_heartbeat_at = now(),
    must_heartbeat_before = now() + make_interval(secs => @ttl_seconds::integer)
FROM assigned AS a
WHERE t.id = a.id
RETURNING t.*;

-- name: TaskHeartbeat :one
-- TaskHeartbeat renews the task's lease for its processor: a
-- compare-and-set on (processor, fence when given, lease live). No row:
-- the task is not this processor's, is finished, or its lease lapsed. It
-- writes no indexed column, so it is a heap-only update.
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
-- under the same compare-and-set as TaskHeartbeat: at most once.
-- must_heartbeat_before keeps the expiry the lease had when it ended.
UPDATE tasks AS t
SET state = 'done',
    processed_at = now(),
    task_output = @task_output::jsonb
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
    task_output = input.output
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
-- compare-and-set: back to pending after an exponential backoff with
-- jitter (base_seconds × 2^(attempts−1), at most max_backoff_seconds,
-- times 0.5–1.0), or dead when the attempts are used up. With requeue, the
-- attempt is not counted and the task is due at once (a worker shutting
-- down hands it back). The attempt goes to earlier_attempts either way.
UPDATE tasks AS t
SET state = CASE WHEN NOT sqlc.arg(requeue)::boolean AND t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
    attempts = CASE WHEN sqlc.arg(requeue)::boolean THEN t.attempts - 1 ELSE t.attempts END,
    scheduled_at = CASE
        WHEN sqlc.arg(requeue)::boolean THEN now()
        ELSE now() + make_interval(secs => least(sqlc.arg(base_seconds)::float8 * power(2, t.attempts - 1), sqlc.arg(max_backoff_seconds)::float8)
                                           * (0.5 + random() / 2))
    END,
    processed_at = CASE WHEN NOT sqlc.arg(requeue)::boolean AND t.attempts >= t.max_attempts THEN now() END,
    last_error = sqlc.arg(error)::text,
    earlier_attempts = t.earlier_attempts
        || task_attempt(t, CASE WHEN sqlc.arg(requeue)::boolean THEN 'requeued' ELSE 'failed' END),
    must_heartbeat_before = NULL
WHERE t.id = @id::bigint
  AND t.state = 'running'
  AND t.processor = @processor::text
  AND (sqlc.narg(fence)::bigint IS NULL OR t.fence = sqlc.narg(fence)::bigint)
  AND t.must_heartbeat_before > now()
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
    earlier_attempts = t.earlier_attempts || task_attempt(t, 'expired'),
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
-- TaskList pages through tasks in id order: all ('all'), those processed
-- (done or dead) or those started.
SELECT * FROM tasks
WHERE id > @after_id
  AND CASE @filter::text
          WHEN 'processed' THEN state IN ('done', 'dead')
          WHEN 'started'   THEN started_at IS NOT NULL
          ELSE true
      END
ORDER BY id
LIMIT @row_limit;

-- name: TaskStats :one
-- TaskStats counts tasks by state, and those finished in the last minute.
SELECT count(*) FILTER (WHERE state = 'pending')                                  AS pending,
       count(*) FILTER (WHERE state = 'running')                                  AS running,
       count(*) FILTER (WHERE state = 'done')                                     AS done,
       count(*) FILTER (WHERE state = 'dead')                                     AS dead,
       count(*) FILTER (WHERE state = 'done' AND processed_at > now() - interval '1 minute') AS done_last_minute
FROM tasks;

-- name: TaskNextDue :one
-- TaskNextDue tells an idle dispatcher when the next pending task falls
-- due (scheduled in the future, e.g. a retry's backoff); an hour from now
-- when none is (a new task arrives by NOTIFY).
SELECT coalesce(min(scheduled_at), now() + interval '1 hour')::timestamptz AS next_due,
       now()::timestamptz AS db_now
FROM tasks
WHERE state = 'pending';

-- name: TaskListRunning :many
-- TaskListRunning returns running tasks, oldest claim first.
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
        task_output = input.output
    FROM input
    WHERE c.id = input.id
      AND c.state = 'running'
      AND c.processor = input.processor
      AND c.fence = input.fence
      AND c.must_heartbeat_before > now()
    RETURNING c.id
),
picked AS (
    SELECT d.id, row_number() OVER (ORDER BY d.scheduled_at, d.id) AS n
    FROM tasks_due(cardinality(@claim_for::text[])) AS d (id, scheduled_at)
),
claimed AS (
    UPDATE tasks AS t
    SET state = 'running',
        processor = w.processor,
        fence = nextval('lease_fence_seq'),
        ttl_seconds = @ttl_seconds::integer,
        attempts = t.attempts + 1,
        started_at = now(),
        last_heartbeat_at = now(),
        must_heartbeat_before = now() + make_interval(secs => @ttl_seconds::integer)
    FROM picked
    JOIN unnest(@claim_for::text[]) WITH ORDINALITY AS w (processor, n) ON w.n = picked.n
    WHERE t.id = picked.id
    RETURNING t.id, t.task_data, t.scheduled_at, t.processor, t.fence, t.attempts, t.max_attempts,
              t.must_heartbeat_before, t.started_at, t.created_at
)
-- The ids ride on the first row only: repeated on every row, the replica
-- decoded the same array once per claimed task.
SELECT (CASE WHEN claimed.id IS NULL OR claimed.id = (SELECT min(f.id) FROM claimed AS f)
             THEN done.ids END)::bigint[] AS completed_ids,
       claimed.*
FROM (SELECT coalesce(array_agg(completed.id), '{}') AS ids FROM completed) AS done
LEFT JOIN claimed ON true;
