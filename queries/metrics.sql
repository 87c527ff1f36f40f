-- name: MetricsGauges :one
-- MetricsGauges reads the state gauges of a /metrics scrape, in one
-- statement. It stays cheap however big the tables grow: the task counts
-- are exact, summed in one read of the log of changes the writes keep
-- (task_counts, schema/0017); the leases neither released nor announced as
-- expired (leases_unannounced_idx, a set as large as the live leases plus
-- the expiries not yet announced) are walked once for the active count,
-- which stops at max_count, and once for the expired ones, whose count
-- (capped at max_count) and oldest expiry come from the same walk; the
-- oldest due task is the first due entry of each branch of tasks_claim_idx
-- (tasks_pending_summary); and the tables' sizes are the planner's
-- estimates (pg_class.reltuples, refreshed by VACUUM and ANALYZE, -1 before
-- the first), never a count of every row. Done tasks and past leases have
-- no gauge: they only grow.
WITH unannounced AS (
    SELECT least(count(*), @max_count::bigint) AS expired, min(expires_at) AS oldest FROM leases
    WHERE released_at IS NULL AND expired_at IS NULL AND expires_at <= now()
), counts AS (
    SELECT coalesce(sum(n) FILTER (WHERE state = 'pending'), 0) AS pending,
           coalesce(sum(n) FILTER (WHERE state = 'running'), 0) AS running,
           coalesce(sum(n) FILTER (WHERE state = 'dead'), 0)    AS dead
    FROM task_counts
)
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM leases
        WHERE released_at IS NULL AND expired_at IS NULL AND expires_at > now()
        LIMIT @max_count::bigint) AS a)::bigint AS leases_active,
    (SELECT u.expired FROM unannounced AS u)::bigint AS leases_expired_unannounced,
    coalesce((SELECT extract(epoch FROM now() - u.oldest) FROM unannounced AS u), 0)::float8
        AS oldest_unannounced_expiry_seconds,
    (SELECT c.pending FROM counts AS c)::bigint AS tasks_pending,
    (SELECT c.running FROM counts AS c)::bigint AS tasks_running,
    (SELECT c.dead FROM counts AS c)::bigint AS tasks_dead,
    coalesce((SELECT extract(epoch FROM now() - min(s.oldest_due)) FROM tasks_pending_summary(@max_count::integer) AS s),
             0)::float8 AS oldest_due_task_seconds,
    (SELECT reltuples FROM pg_catalog.pg_class WHERE oid = 'leases'::regclass)::float8 AS leases_rows_estimate,
    (SELECT reltuples FROM pg_catalog.pg_class WHERE oid = 'lease_events'::regclass)::float8 AS lease_events_rows_estimate,
    (SELECT reltuples FROM pg_catalog.pg_class WHERE oid = 'tasks'::regclass)::float8 AS tasks_rows_estimate;
