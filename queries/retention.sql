-- name: RetentionPruneTasks :one
-- RetentionPruneTasks deletes up to batch_size tasks that ended (done or
-- dead) more than age_seconds ago, oldest first, and returns how many. It
-- runs as the tables' owner (prune_tasks, schema/0007_retention.sql): the
-- runtime role has no DELETE.
SELECT prune_tasks(make_interval(secs => @age_seconds::float8), @batch_size::integer)::bigint AS pruned;

-- name: RetentionPruneLeaseEvents :one
-- RetentionPruneLeaseEvents deletes up to batch_size lease events recorded
-- more than age_seconds ago, oldest first, and returns how many.
SELECT prune_lease_events(make_interval(secs => @age_seconds::float8), @batch_size::integer)::bigint AS pruned;

-- name: RetentionPruneLeases :one
-- RetentionPruneLeases deletes up to batch_size rows of leases released,
-- or announced expired, more than age_seconds ago, oldest first, and
-- returns how many. Live leases are never deleted.
SELECT prune_leases(make_interval(secs => @age_seconds::float8), @batch_size::integer)::bigint AS pruned;
