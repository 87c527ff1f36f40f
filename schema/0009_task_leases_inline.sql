-- +goose Up

-- A task's lease lives in the task's own row.
--
-- Until now a task's lease was a row of leases named 'task:<id>': a claim
-- inserted it (and the leases trigger a lease_events row), a completion
-- updated it (and another lease_events row), on top of the two updates of
-- the task itself. Six row writes and two trigger calls per task, where
-- the task row already carried the lease's holder (processor), fence and
-- expiry (must_heartbeat_before) for the compare-and-set of heartbeat,
-- complete and fail. Now those columns are the lease: a claim draws the
-- fence from the same sequence as every other lease, under the task's row
-- lock, and a task costs two row writes after its insert (claim and
-- completion).
--
-- ttl_seconds is the TTL of the current attempt's lease, which a heartbeat
-- renews.
--
-- earlier_attempts is the history: one entry for each attempt that ended
-- otherwise than by the completion (a lapsed lease, a failure, a hand-back
-- on shutdown), appended by the statement that ended it. The attempt in
-- processor, fence, started_at and must_heartbeat_before is the running
-- one, or for a done task the completed one. Each entry is
-- {"processor", "fence", "started_at", "expires_at" (when its lease would
-- have run out), "ended_at", "outcome": "expired" | "failed" | "requeued"}.
-- A task that never fails or lapses writes no history at all.
--
-- A lapsed task lease is turned into an event by the reaper, which puts the
-- task back to pending (or dead, when it has used its attempts); the
-- statement trigger tasks_changed then NOTIFYs 'requeued' (or 'finished').
ALTER TABLE tasks
    ADD COLUMN ttl_seconds      integer,
    ADD COLUMN earlier_attempts jsonb NOT NULL DEFAULT '[]';

-- The running tasks take their lease TTL from their 'task:<id>' lease, so
-- that a task claimed before this migration can still be renewed.
UPDATE tasks AS t
SET ttl_seconds = l.ttl_seconds
FROM leases AS l
WHERE t.state = 'running' AND l.resource = 'task:' || t.id;

-- task_attempt is an entry of earlier_attempts: the attempt in t's lease
-- columns, ended now with outcome.
CREATE FUNCTION task_attempt(t tasks, outcome text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'processor', t.processor,
        'fence', t.fence,
        'started_at', t.started_at,
        'expires_at', t.must_heartbeat_before,
        'ended_at', now(),
        'outcome', outcome))
$$;

-- Claims and completions announce only what someone needs.
--
-- Every notifying commit holds PostgreSQL's global notification lock
-- through its WAL flush, and every notification wakes every LISTEN
-- session: a busy queue paid both on each claim ('claimed:<ms>', for the
-- reaper) and on each completion ('finished', for the dashboards), although
-- nearly always nobody needed them. Now, under the same advisory lock K
-- as inserts (schema/0008), shared and tried, never waited for:
--
-- * 'finished', and 'claimed' for the dashboards, go out only while a
--   waiter registered for all changes (task_waiters.all_changes: a hub with
--   clients) exists.
-- * 'claimed:<ms>' goes out for the reaper only when no running task
--   expires after now() and before the claimed ones. The reaper sleeps at
--   most until the earliest running task's expiry, so a claim that expires
--   later needs no announcement. The reaper reads that expiry through
--   task_next_lapse, which takes K exclusive first: a claim in flight
--   either committed before the reaper looked (and is seen), or tried K
--   while the reaper held or waited for it (and notified).
--
-- 'requeued' (tasks claimable again) always goes out: the workers need it.
ALTER TABLE task_waiters ADD COLUMN all_changes boolean NOT NULL DEFAULT false;

DROP FUNCTION task_waiter_register(text, integer);
-- task_waiter_register records that waiter_name waits for inserted tasks
-- (with all_changes, also for claims and completions) on the LISTEN
-- session whose backend pid is listener_pid, and prunes the rows of ended
-- sessions. The caller then passes task_waiters_barrier before its
-- catch-up read.
CREATE FUNCTION task_waiter_register(waiter_name text, listener_pid integer, all_changes boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
    IF waiter_name IS NULL OR length(waiter_name) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'waiter name % is empty or too long', coalesce(quote_literal(left(waiter_name, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'name the waiter with 1 to 1000 characters, e.g. ''<instance>/workers''';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                   WHERE a.pid = listener_pid AND a.datname = current_database()) THEN
        RAISE EXCEPTION 'no session of this database has pid %', coalesce(listener_pid::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the pid of the waiter''s own LISTEN session (pg_backend_pid() on it) while it is connected';
    END IF;
    PERFORM task_waiters_prune();
    INSERT INTO task_waiters AS w (pid, waiter, all_changes)
    VALUES (listener_pid, waiter_name, coalesce(all_changes, false))
    ON CONFLICT (pid, waiter) DO UPDATE SET all_changes = excluded.all_changes;
END;
$$;
REVOKE EXECUTE ON FUNCTION task_waiter_register(text, integer, boolean) FROM PUBLIC;

-- The look for a running task that expires sooner walks tasks_running_idx
-- backwards from the newest id: the tasks claimed last are those most
-- likely still running (the index keeps an entry for every task run since
-- the last VACUUM, and the oldest are the dead ones). The SET clauses keep
-- the planner on that index whatever the statistics say, and keep JIT
-- off, which the penalty on a sequential scan (the only way to read the
-- small task_waiters) would otherwise set off, at 100 ms a statement.
CREATE OR REPLACE FUNCTION tasks_changed() RETURNS trigger
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    claimed_by timestamptz;
    requeued   boolean;
    finished   boolean;
    watched    boolean;
BEGIN
    -- From the new rows alone (keeping the old ones cost every statement
    -- a copy of each row it changed): a claim stamps started_at, and an
    -- ending processed_at, with the transaction's now(); a row put back to
    -- pending (a failure, a hand-back, the reaper's requeue) has just had
    -- its attempt appended to earlier_attempts, ended now(). Another
    -- update of a pending row (its schedule, say) is no requeue.
    SELECT min(n.must_heartbeat_before) FILTER (WHERE n.state = 'running' AND n.started_at = now()),
           bool_or(n.state = 'pending' AND (n.earlier_attempts -> -1 ->> 'ended_at')::timestamptz = now()),
           bool_or(n.state IN ('done', 'dead') AND n.processed_at = now())
    INTO claimed_by, requeued, finished
    FROM new_rows AS n;

    IF requeued THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    IF claimed_by IS NULL AND NOT finished THEN
        RETURN NULL; -- a heartbeat, or nothing
    END IF;
    -- As in tasks_inserted: look only with K held shared, in READ COMMITTED.
    watched := current_setting('transaction_isolation') <> 'read committed'
               OR NOT pg_try_advisory_xact_lock_shared(7810756277295999348)
               OR EXISTS (SELECT 1 FROM task_waiters WHERE all_changes);
    IF claimed_by IS NOT NULL AND (watched OR (
            SELECT r.id FROM tasks AS r
            WHERE r.state = 'running'
              AND r.must_heartbeat_before > now()
              AND r.must_heartbeat_before < claimed_by
            ORDER BY r.id DESC
            LIMIT 1) IS NULL) THEN
        PERFORM pg_notify('leasehold_task', 'claimed:' || floor(extract(epoch FROM claimed_by) * 1000)::bigint);
    END IF;
    IF finished AND watched THEN
        PERFORM pg_notify('leasehold_task', 'finished');
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER tasks_changed ON tasks;
CREATE TRIGGER tasks_changed
    AFTER UPDATE ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_changed();

-- task_next_lapse returns the earliest expiry of a running task's lease
-- (NULL when none runs), read after every claim that may have skipped its
-- announcement has committed: it takes K exclusive first (see
-- tasks_changed), waiting at most wait_ms (1..60000). When that runs out it
-- returns now(), so that the reaper looks again at once. The lock goes
-- with the statement's transaction.
CREATE FUNCTION task_next_lapse(wait_ms integer) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = public, pg_temp
-- The SET clause makes lock_timeout revert when the function returns.
SET lock_timeout = 1000
AS $$
DECLARE
    lapse timestamptz;
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 1 AND 60000 THEN
        RAISE EXCEPTION 'lock wait % ms is out of range', coalesce(wait_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass a wait between 1 and 60000 milliseconds';
    END IF;
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    BEGIN
        PERFORM pg_advisory_xact_lock(7810756277295999348);
    EXCEPTION WHEN lock_not_available THEN
        RETURN now();
    END;
    -- A statement of its own, so a snapshot of its own (the function is
    -- VOLATILE): it sees every claim that committed before the lock.
    SELECT min(t.must_heartbeat_before) INTO lapse FROM tasks AS t WHERE t.state = 'running';
    RETURN lapse;
END;
$$;

-- +goose Down
DROP FUNCTION task_next_lapse(integer);
DROP TRIGGER tasks_changed ON tasks;
CREATE TRIGGER tasks_changed
    AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_changed();
CREATE OR REPLACE FUNCTION tasks_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    claimed_by timestamptz;
    requeued   boolean;
    finished   boolean;
BEGIN
    SELECT min(n.must_heartbeat_before) FILTER (WHERE n.state = 'running' AND n.fence IS DISTINCT FROM o.fence),
           bool_or(n.state = 'pending' AND o.state <> 'pending'),
           bool_or(n.state IN ('done', 'dead') AND o.state NOT IN ('done', 'dead'))
    INTO claimed_by, requeued, finished
    FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id;

    IF claimed_by IS NOT NULL THEN
        PERFORM pg_notify('leasehold_task', 'claimed:' || floor(extract(epoch FROM claimed_by) * 1000)::bigint);
    END IF;
    IF requeued THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    IF finished THEN
        PERFORM pg_notify('leasehold_task', 'finished');
    END IF;
    RETURN NULL;
END;
$$;
DROP FUNCTION task_waiter_register(text, integer, boolean);
ALTER TABLE task_waiters DROP COLUMN all_changes;
CREATE FUNCTION task_waiter_register(waiter_name text, listener_pid integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
    IF waiter_name IS NULL OR length(waiter_name) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'waiter name % is empty or too long', coalesce(quote_literal(left(waiter_name, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'name the waiter with 1 to 1000 characters, e.g. ''<instance>/workers''';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                   WHERE a.pid = listener_pid AND a.datname = current_database()) THEN
        RAISE EXCEPTION 'no session of this database has pid %', coalesce(listener_pid::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the pid of the waiter''s own LISTEN session (pg_backend_pid() on it) while it is connected';
    END IF;
    PERFORM task_waiters_prune();
    INSERT INTO task_waiters (pid, waiter) VALUES (listener_pid, waiter_name)
    ON CONFLICT (pid, waiter) DO NOTHING;
END;
$$;
REVOKE EXECUTE ON FUNCTION task_waiter_register(text, integer) FROM PUBLIC;
DROP FUNCTION task_attempt(tasks, text);
ALTER TABLE tasks
    DROP COLUMN earlier_attempts,
    DROP COLUMN ttl_seconds;
