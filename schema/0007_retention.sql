-- +goose Up

-- Retention: the elected reaper deletes finished tasks, lease events and
-- the rows of ended leases once they are older than a configured age, a
-- small batch at a time (internal/retention).
--
-- The runtime role has no DELETE on any table (docs/least-privilege.sql).
-- It prunes through the functions below, which run as their owner, the
-- role that migrates (SECURITY DEFINER, with search_path pinned so that
-- nothing the caller creates is looked up), and delete only what
-- retention allows: at most batch rows per call, none younger than a
-- minute, never a live lease or an unfinished task. EXECUTE is taken from
-- PUBLIC here and granted to the runtime role by docs/least-privilege.sql.
--
-- Deleting an old lease row never lets a fence go backwards: every fence,
-- of every resource, comes from the one sequence lease_fence_seq, so the
-- acquisition that inserts the resource's row afresh still draws a fence
-- greater than every fence handed out before.
--
-- Why a minute at least: an acquisition that finds no row inserts one and
-- starts its holding interval at its transaction's now(). One that began
-- while the old lease was still live and then waited on the row being
-- pruned would start before the old interval ended, so it would have to
-- have waited longer than the age; an acquisition takes milliseconds. The
-- floor also keeps any holder of EXECUTE from erasing the history as it
-- is written.

-- Each function picks its batch as an array, which the statement computes
-- once: a LIMIT in an "id IN (subquery)" may be run again for every row of
-- a nested loop, each run locking and returning the next rows, and so
-- delete more than the batch. Each plans every call for its own batch and
-- age (force_custom_plan): a generic plan, not knowing the LIMIT, may
-- choose to read every old row.

-- What pruning reads, oldest first, so that it never scans the rows it
-- keeps. No column a renewal (leases) or a heartbeat (tasks) writes is in
-- a key or a predicate: those stay heap-only updates.
CREATE INDEX tasks_finished_idx ON tasks (processed_at) WHERE state IN ('done', 'dead');
CREATE INDEX lease_events_at_idx ON lease_events (at);
-- A lease has ended when it was released or its expiry was announced; it
-- is live again (both NULL) once someone takes it over.
CREATE INDEX leases_ended_idx ON leases ((coalesce(released_at, expired_at)))
    WHERE released_at IS NOT NULL OR expired_at IS NOT NULL;

-- retention_check refuses an age under a minute and a batch outside
-- 1..10000, with a message that says what to pass instead.
CREATE FUNCTION retention_check(age interval, batch integer) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF age IS NULL OR age < interval '1 minute' THEN
        RAISE EXCEPTION 'retention age % is too short', coalesce(age::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass an age of at least 1 minute; to keep rows forever, do not prune them';
    END IF;
    IF batch IS NULL OR batch < 1 OR batch > 10000 THEN
        RAISE EXCEPTION 'retention batch % is out of range', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass a batch between 1 and 10000 rows';
    END IF;
END;
$$;

-- prune_tasks deletes up to batch tasks that ended (done or dead) more
-- than age ago, oldest first, and returns how many it deleted. Pending and
-- running tasks are never touched. Rows locked by someone else are left
-- for the next call.
CREATE FUNCTION prune_tasks(age interval, batch integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    pruned bigint;
BEGIN
    PERFORM retention_check(age, batch);
    DELETE FROM tasks AS t
    WHERE t.id = ANY (ARRAY(
            SELECT f.id FROM tasks AS f
            WHERE f.state IN ('done', 'dead')
              AND f.processed_at < now() - age
            ORDER BY f.processed_at
            LIMIT batch
            FOR UPDATE SKIP LOCKED))
      AND t.state IN ('done', 'dead')
      AND t.processed_at < now() - age;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- prune_lease_events deletes up to batch lease events recorded more than
-- age ago, oldest first, and returns how many it deleted.
CREATE FUNCTION prune_lease_events(age interval, batch integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    pruned bigint;
BEGIN
    PERFORM retention_check(age, batch);
    DELETE FROM lease_events AS e
    WHERE e.id = ANY (ARRAY(
            SELECT o.id FROM lease_events AS o
            WHERE o.at < now() - age
            ORDER BY o.at
            LIMIT batch))
      AND e.at < now() - age;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- prune_leases deletes up to batch rows of leases released, or announced
-- expired, more than age ago, oldest first, and returns how many it
-- deleted. A live lease has neither mark (an acquisition clears both, a
-- renewal needs expired_at NULL), so it is never deleted, however old; an
-- expiry not yet announced waits for the reaper's "expired" event. Rows
-- being changed right now (a takeover) are left alone.
CREATE FUNCTION prune_leases(age interval, batch integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    pruned bigint;
BEGIN
    PERFORM retention_check(age, batch);
    DELETE FROM leases AS l
    WHERE l.id = ANY (ARRAY(
            SELECT o.id FROM leases AS o
            WHERE (o.released_at IS NOT NULL OR o.expired_at IS NOT NULL)
              AND coalesce(o.released_at, o.expired_at) < now() - age
            ORDER BY coalesce(o.released_at, o.expired_at)
            LIMIT batch
            FOR UPDATE SKIP LOCKED))
      AND coalesce(l.released_at, l.expired_at) < now() - age;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

REVOKE EXECUTE ON FUNCTION prune_tasks(interval, integer),
                           prune_lease_events(interval, integer),
                           prune_leases(interval, integer) FROM PUBLIC;

-- +goose Down
DROP FUNCTION prune_leases(interval, integer);
DROP FUNCTION prune_lease_events(interval, integer);
DROP FUNCTION prune_tasks(interval, integer);
DROP FUNCTION retention_check(interval, integer);
DROP INDEX leases_ended_idx;
DROP INDEX lease_events_at_idx;
DROP INDEX tasks_finished_idx;
