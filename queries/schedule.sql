-- name: ScheduleCreate :one
-- ScheduleCreate adds a schedule; no row when one of that name exists.
INSERT INTO schedules (name, cron, zone, kind, task_data, queue, priority, unique_ticks, lock_resource,
                       max_attempts, ttl_seconds, next_tick_at)
VALUES (@name, @cron, @zone, @kind, @task_data, @queue, @priority, @unique_ticks, sqlc.narg(lock_resource),
        @max_attempts, sqlc.narg(ttl_seconds), @next_tick_at)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: ScheduleReplace :one
-- ScheduleReplace adds a schedule or replaces the definition of the one of
-- that name, whose next tick is then the one given (its counters and last
-- task stay). inserted says which.
INSERT INTO schedules AS s (name, cron, zone, kind, task_data, queue, priority, unique_ticks, lock_resource,
                            max_attempts, ttl_seconds, next_tick_at)
VALUES (@name, @cron, @zone, @kind, @task_data, @queue, @priority, @unique_ticks, sqlc.narg(lock_resource),
        @max_attempts, sqlc.narg(ttl_seconds), @next_tick_at)
ON CONFLICT (name) DO UPDATE
SET cron = excluded.cron, zone = excluded.zone, kind = excluded.kind, task_data = excluded.task_data,
    queue = excluded.queue, priority = excluded.priority, unique_ticks = excluded.unique_ticks,
    lock_resource = excluded.lock_resource, max_attempts = excluded.max_attempts,
    ttl_seconds = excluded.ttl_seconds, next_tick_at = excluded.next_tick_at,
    updated_at = clock_timestamp()
RETURNING sqlc.embed(s), (s.xmax = 0)::boolean AS inserted;

-- name: ScheduleGet :one
-- ScheduleGet returns a schedule with its last task's state.
SELECT sqlc.embed(s), t.state AS last_task_state, t.processed_at AS last_task_processed_at, t.last_error AS last_task_error
FROM schedules AS s
LEFT JOIN tasks AS t ON t.id = s.last_task_id
WHERE s.name = @name;

-- name: ScheduleList :many
-- ScheduleList returns the schedules in name order, after after_name, each
-- with its last task's state.
SELECT sqlc.embed(s), t.state AS last_task_state, t.processed_at AS last_task_processed_at, t.last_error AS last_task_error
FROM schedules AS s
LEFT JOIN tasks AS t ON t.id = s.last_task_id
WHERE s.name > @after_name
ORDER BY s.name
LIMIT @row_limit;

-- name: ScheduleDelete :one
-- ScheduleDelete removes a schedule (schedule_remove, schema/0012); its
-- tasks stay.
SELECT * FROM schedule_remove(@name::text);

-- name: ScheduleTimes :many
-- ScheduleTimes is what the scheduler reads: every schedule's definition
-- and next tick, and the database clock.
SELECT s.id, s.name, s.cron, s.zone, s.next_tick_at, now()::timestamptz AS db_now
FROM schedules AS s
ORDER BY s.next_tick_at, s.id;

-- name: ScheduleEnqueue :one
-- ScheduleEnqueue makes the task of one tick: a compare-and-set that moves
-- the schedule's next tick from expect_tick to next_tick, only while the
-- holder's scheduler lease with this fence is live (held FOR SHARE against
-- a takeover until the insert commits). The task is due at its tick;
-- (schedule, schedule_tick) is unique, so a tick already made inserts
-- nothing. A unique schedule whose last task is pending or running makes
-- no task and counts the tick skipped. missed is the ticks before this one
-- that fell due while no scheduler ran, which this task stands for. No row
-- back: the lease is not live, or the schedule changed or was removed.
WITH live AS (
    SELECT l.fence FROM leases AS l
    WHERE l.resource = 'leasehold:scheduler'
      AND l.holder = @holder
      AND l.fence = @fence
      AND coalesce(l.released_at, l.expired_at) IS NULL -- not the reaper's index (LeaseRenew)
      AND l.expires_at > now()
    FOR SHARE
),
due AS (
    SELECT s.id, s.name, s.kind, s.task_data, s.queue, s.priority, s.unique_ticks, s.lock_resource,
           s.max_attempts, s.ttl_seconds, s.last_task_id
    FROM schedules AS s
    WHERE s.id = @id AND s.next_tick_at = @expect_tick AND EXISTS (SELECT 1 FROM live)
    FOR UPDATE
),
busy AS (
    SELECT p.id FROM due JOIN tasks AS p ON p.id = due.last_task_id
    WHERE due.unique_ticks AND p.state IN ('pending', 'running')
),
made AS (
    INSERT INTO tasks (task_data, kind, queue, priority, max_attempts, ttl_seconds, lock_resource,
                       schedule, schedule_tick, scheduled_at)
    SELECT due.task_data, due.kind, due.queue, due.priority, due.max_attempts, due.ttl_seconds, due.lock_resource,
           due.name, @tick::timestamptz, @tick::timestamptz
    FROM due
    WHERE NOT EXISTS (SELECT 1 FROM busy)
    ON CONFLICT (schedule, schedule_tick) WHERE schedule IS NOT NULL DO NOTHING
    RETURNING id
)
UPDATE schedules AS s
SET next_tick_at  = @next_tick::timestamptz,
    last_tick_at  = @tick::timestamptz,
    last_task_id  = coalesce((SELECT made.id FROM made), s.last_task_id),
    missed_ticks  = s.missed_ticks + @missed::bigint,
    skipped_ticks = s.skipped_ticks + (SELECT count(*) FROM busy)
FROM due
WHERE s.id = due.id
RETURNING s.id, coalesce((SELECT made.id FROM made), 0)::bigint AS task_id, (SELECT count(*) FROM busy)::bigint AS skipped;

-- name: DBNow :one
-- DBNow reads the database clock, from which a new schedule's first tick
-- is computed.
SELECT now()::timestamptz AS db_now;
