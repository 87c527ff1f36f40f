-- +goose Up

-- Inserted tasks are announced only while someone waits for them.
--
-- PostgreSQL holds one global lock from a notifying transaction's
-- pre-commit through its WAL flush, so notifying commits cannot share a
-- flush: single-row inserts from many clients, each notifying, ran at half
-- the rate of the same inserts without the NOTIFY. Yet most inserts wake
-- nobody: a replica whose workers are all busy claims again as soon as one
-- is free, whether or not it is told. So a process that is about to sleep
-- until tasks arrive (a dispatcher with idle workers whose last claim found
-- too little, a dashboard hub with clients) registers here first, and the
-- insert trigger notifies only while this table has a row.
--
-- No wake-up is lost. An inserter (READ COMMITTED) tries to take the
-- advisory lock K shared: when it gets it, it checks for waiters with a
-- snapshot taken after it has the lock, and holds the lock until its
-- commit is visible; when it does not (a waiter holds K or is queued for
-- it), it notifies without looking. A waiter commits its row, then takes K
-- exclusive and lets it go at once (task_waiters_barrier), and only then
-- runs its catch-up claim, and sleeps, LISTENing since before it
-- registered. For each inserter, either:
--   * it had K before the waiter asked for it: it has committed before the
--     barrier returns, and the catch-up claim, a later statement, sees its
--     tasks; or
--   * it got K after the barrier let it go, which is after the waiter's row
--     committed: its check sees the row and it notifies; or
--   * it did not get K, because a barrier held it or waited for it, which
--     is after that waiter's row committed: it notifies.
-- Inserters never wait: not for each other (shared), nor for a barrier (a
-- try). A barrier waits only for the inserts in flight, one commit each. It
-- gives up after wait_ms (an insert transaction left open, say): the
-- waiter stays registered, so later inserts notify, and it tries the
-- barrier again later.
--
-- A REPEATABLE READ or SERIALIZABLE inserter checks with its transaction's
-- snapshot, which may be older than a registration it follows, so it always
-- notifies: safe, at the old cost. Leasehold's own inserts are single
-- READ COMMITTED statements (the server's default isolation).
--
-- A row names its waiter's LISTEN session by backend pid. A process that
-- dies leaves its row behind, which only costs notifications nobody needs:
-- every registration, and the reaper after it marked a lease expired,
-- delete the rows whose session has ended. A waiter whose LISTEN session is
-- lost registers again, with the new session's pid, after the reconnect
-- (the resync that catches up what was missed meanwhile).
--
-- The table is UNLOGGED: a registration writes no WAL, so its commit
-- does not wait for a flush, and after a crash (when every session is gone
-- anyway) it starts empty. The runtime role reads it (the trigger runs as
-- the inserter) and changes it only through the functions below.
CREATE UNLOGGED TABLE task_waiters (
    pid    integer     NOT NULL, -- the backend pid of the waiter's LISTEN session
    waiter text        NOT NULL, -- who waits, e.g. 'replica-a/workers'
    since  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pid, waiter)
);

-- K is 7810756277295999348, "leaswait" in ASCII, here and in
-- task_waiters_barrier.
CREATE OR REPLACE FUNCTION tasks_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A plain expression, not a query: cheap, on every insert. It notifies
    -- without looking when the snapshot may predate a registration, or
    -- when a waiter is registering (it holds K, or waits for it).
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock_shared(7810756277295999348) THEN
        PERFORM pg_notify('leasehold_task', 'inserted');
    -- Evaluated after the lock was granted, with a snapshot of its own: in
    -- READ COMMITTED it sees every registration committed before.
    ELSIF EXISTS (SELECT 1 FROM task_waiters) THEN
        PERFORM pg_notify('leasehold_task', 'inserted');
    END IF;
    RETURN NULL;
END;
$$;

-- task_waiters_prune deletes the rows whose LISTEN session has ended and
-- returns how many.
CREATE FUNCTION task_waiters_prune() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM task_waiters AS w
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                      WHERE a.pid = w.pid AND a.datname = current_database());
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- task_waiter_register records that waiter_name waits for inserted tasks on
-- the LISTEN session whose backend pid is listener_pid, and prunes the rows
-- of ended sessions. The caller then passes task_waiters_barrier before its
-- catch-up claim.
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

-- task_waiter_unregister deletes the row of waiter_name on the session
-- listener_pid; all of that session's rows when waiter_name is NULL.
CREATE FUNCTION task_waiter_unregister(waiter_name text, listener_pid integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
    DELETE FROM task_waiters AS w
    WHERE w.pid = listener_pid
      AND (waiter_name IS NULL OR w.waiter = waiter_name);
END;
$$;

-- task_waiters_barrier returns once every insert that held K shared when it
-- was called has committed (or rolled back): it takes K exclusive and lets
-- it go with its statement. Meanwhile inserts notify without looking. After wait_ms (1..60000) without the lock it
-- fails with lock_not_available (55P03) and may be called again. It changes
-- nothing, so it stays executable by PUBLIC, like pg_advisory_xact_lock
-- itself.
CREATE FUNCTION task_waiters_barrier(wait_ms integer) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- The SET clause makes lock_timeout revert when the function returns.
SET lock_timeout = 1000
AS $$
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 1 AND 60000 THEN
        RAISE EXCEPTION 'barrier wait % ms is out of range', coalesce(wait_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass a wait between 1 and 60000 milliseconds';
    END IF;
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_xact_lock(7810756277295999348);
END;
$$;

REVOKE EXECUTE ON FUNCTION task_waiters_prune(),
                           task_waiter_register(text, integer),
                           task_waiter_unregister(text, integer) FROM PUBLIC;

-- +goose Down
DROP FUNCTION task_waiters_barrier(integer);
DROP FUNCTION task_waiter_unregister(text, integer);
DROP FUNCTION task_waiter_register(text, integer);
DROP FUNCTION task_waiters_prune();
CREATE OR REPLACE FUNCTION tasks_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_task', 'inserted');
    RETURN NULL;
END;
$$;
DROP TABLE task_waiters;
