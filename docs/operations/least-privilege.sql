-- The privileges leasehold's runtime role needs, and nothing more.
--
-- Run it as the owner of leasehold's tables (the role that runs
-- `leasehold migrate`), in leasehold's database, after the migrations and
-- again after every upgrade (GRANT is idempotent):
--
--   psql "$OWNER_DATABASE_URL" -v role=leasehold_app -f docs/operations/least-privilege.sql
--
-- :"role" is the runtime role, created beforehand by someone allowed to:
--   CREATE ROLE leasehold_app LOGIN PASSWORD '...';
-- :"DBNAME" is the database psql is connected to.
-- internal/server/privilege_test.go runs this file and then every part of
-- leasehold as that role.

-- Only the roles granted it may connect: without CONNECT, a role of the
-- cluster cannot LISTEN to the lease channel nor pg_notify a cancellation
-- into this database. The owner running this keeps its own.
GRANT CONNECT ON DATABASE :"DBNAME" TO :"role", CURRENT_USER;
REVOKE CONNECT ON DATABASE :"DBNAME" FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"role";

-- Leases and tasks are taken, renewed, released and finished in place;
-- the role deletes nothing itself (retention, below, does).
GRANT SELECT, INSERT, UPDATE ON leases, tasks TO :"role";

-- A key's limit is set by the first acquisition or task that names one
-- and changed in place (leasehold limit set); never deleted.
GRANT SELECT, INSERT, UPDATE ON lease_limits TO :"role";
GRANT SELECT ON lease_limit_status TO :"role";

-- Queues are paused and resumed in place (a resume ends the pause now).
GRANT SELECT, INSERT, UPDATE ON queue_pauses TO :"role";

-- Claims of gated tasks move the cursor that serves keys in turn.
GRANT SELECT, UPDATE ON gated_cursor TO :"role";
-- The audit history is written by leasehold's trigger alone, which runs as
-- its owner: the runtime role only reads it, and can neither
-- add, change nor delete an event (the REVOKE makes sure of it, whatever
-- the role was granted before). Nor can it move a fence but forward, to
-- one lease_fence_seq handed out: triggers refuse it.
GRANT SELECT ON lease_events TO :"role";
REVOKE INSERT, UPDATE, DELETE ON lease_events FROM :"role";
-- The generator's switch is one row, updated in place.
GRANT SELECT, UPDATE ON generator_state TO :"role";
-- Each replica registers itself (an upsert).
GRANT SELECT, INSERT, UPDATE ON instances TO :"role";
-- Schedules are added and replaced in place, and their ticks moved on by
-- the scheduler; they are removed through schedule_remove, which runs as
-- its owner and is not PUBLIC's to execute.
GRANT SELECT, INSERT, UPDATE ON schedules TO :"role";
GRANT EXECUTE ON FUNCTION schedule_remove(text) TO :"role";
-- The floor of retention (below): the role reads it, never changes it.
GRANT SELECT ON retention_floor TO :"role";
-- Every new session checks that the fences of the server's timeline lie
-- above an earlier primary's: fence_epoch_check runs as its owner (it may
-- move lease_fence_seq) and is not PUBLIC's to execute.
GRANT SELECT ON fence_epochs TO :"role";
GRANT EXECUTE ON FUNCTION fence_epoch_check() TO :"role";
-- /readyz compares the applied migrations with the binary's.
GRANT SELECT ON leasehold_migrations TO :"role";
-- Fences: nextval('lease_fence_seq'). The identity columns' own sequences
-- need no grant.
GRANT USAGE ON SEQUENCE lease_fence_seq TO :"role";
-- Retention: the elected reaper deletes finished tasks (with their lease
-- rows) and lease history older than their retention through these
-- functions, which run as their owner and delete only that: at most a
-- batch per call, nothing younger than the floor below, never a live lease,
-- an unannounced expiry or an unfinished task. They are not PUBLIC's to
-- execute.
GRANT EXECUTE ON FUNCTION prune_tasks(interval, integer, bigint, bigint[]),
                          prune_lease_events(interval, integer, bigint),
                          prune_leases(interval, integer) TO :"role";
-- The counts of tasks by state are read from a log of changes that the
-- triggers on tasks write as their owner; the elected reaper folds it.
GRANT SELECT ON task_counts TO :"role";
GRANT EXECUTE ON FUNCTION task_counts_fold() TO :"role";
-- Nor anything younger than the floor of retention, whatever age the role
-- asks for: a week, the replicas' default --task-retention and
-- --lease-history-retention. Set it to the shortest of the two if you
-- configured them shorter (the reaper's pruning fails, and says so, with an
-- age below the floor). The runtime role can read the floor, not change it.
UPDATE retention_floor SET min_age = interval '168 hours';

-- Waiting for inserted tasks: inserts
-- notify only while task_waiters has a row. The insert trigger reads it as
-- the inserting role; replicas register and unregister their LISTEN
-- sessions, and prune the rows of ended sessions, through these functions,
-- which run as their owner and are not PUBLIC's to execute (the role has
-- no INSERT, UPDATE or DELETE on the table). task_waiters_barrier changes
-- nothing and stays PUBLIC's. After every upgrade, run this file again
-- (every statement in it may be repeated).
GRANT SELECT ON task_waiters TO :"role";
GRANT EXECUTE ON FUNCTION task_waiter_register(text, integer, boolean),
                          task_waiter_unregister(text, integer),
                          task_waiters_prune() TO :"role";

-- The trigger functions and pg_notify run with EXECUTE granted to PUBLIC,
-- which PostgreSQL does by default, and LISTEN needs no privilege: which is
-- why CONNECT, above, is the runtime role's alone.

-- Nothing to create anywhere: PostgreSQL 15 already keeps PUBLIC from
-- creating in schema public; older versions do not. TEMPORARY is granted
-- to PUBLIC on every database by default; leasehold needs no temporary
-- tables. (These two apply to every role without a grant of its own.)
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE TEMPORARY ON DATABASE :"DBNAME" FROM PUBLIC;
