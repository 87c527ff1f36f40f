-- name: RetentionPruneTasks :one
-- RetentionPruneTasks looks at the next batch_size tasks after after_id, in
-- id order, or, when ids is not NULL, at the tasks of ids (those an earlier
-- walk kept), and deletes those that ended (done or dead) more than
-- age_seconds ago, with their lease rows. It returns how many tasks and
-- lease rows it deleted, where the walk stands and the ids it kept. It
-- runs as the tables' owner (prune_tasks, schema/0007_retention.sql): the
-- runtime role has no DELETE.
SELECT p.pruned_tasks::bigint AS pruned_tasks, p.pruned_leases::bigint AS pruned_leases,
       p.last_id::bigint AS last_id, p.done::boolean AS done, p.kept::bigint[] AS kept
FROM prune_tasks(make_interval(secs => @age_seconds::float8), @batch_size::integer, @after_id::bigint,
                 sqlc.narg(ids)::bigint[]) AS p;

-- name: RetentionPruneLeaseEvents :one
-- RetentionPruneLeaseEvents looks at the next batch_size lease events after
-- after_id, in id order, and deletes those recorded more than age_seconds
-- ago. It returns how many it deleted, the last id it looked at and whether
-- the walk is over.
SELECT p.pruned::bigint AS pruned, p.last_id::bigint AS last_id, p.done::boolean AS done
FROM prune_lease_events(make_interval(secs => @age_seconds::float8), @batch_size::integer, @after_id::bigint) AS p;

-- name: RetentionPruneLeases :one
-- RetentionPruneLeases deletes up to batch_size rows of leases other than
-- tasks' released, or announced expired, more than age_seconds ago, oldest
-- first, and returns how many. Live leases are never deleted; a task's
-- lease row goes with its task.
SELECT prune_leases(make_interval(secs => @age_seconds::float8), @batch_size::integer)::bigint AS pruned;
