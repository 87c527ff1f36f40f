-- +goose Up

-- Retention: the elected reaper deletes finished tasks, lease events and
-- the rows of ended leases once they are older than a configured age, a
-- small batch at a time (internal/retention).
--
-- The runtime role has no DELETE on any table (docs/least-privilege.sql).
-- It prunes through the functions below, which run as their owner, the
-- role that migrates (SECURITY DEFINER, with search_path pinned so that
-- nothing the caller creates is looked up), and delete only what
-- retention allows: at most batch rows of their kind per call, none
-- younger than a minute, never a live lease, an expiry not yet announced
-- or an unfinished task. EXECUTE is taken from PUBLIC here and granted to
-- the runtime role by docs/least-privilege.sql.
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
--
-- No index a task pays for. Every task writes a tasks row, a lease row
-- 'task:<id>' and lease events; an index ordering them by when they
-- ended would be written on every completion and every lease event, for
-- a job that runs once a minute. Pruning walks the primary keys instead,
-- in id order, a batch per call, with a cursor the caller carries from
-- call to call and from walk to walk:
--   lease events are appended in id order, and their at is the time of
--   the change, never later than the insert, so the oldest are at the
--   head: a walk deletes what it passes and stops at the first event
--   younger than the age, where the next walk goes on;
--   tasks get their ids in insertion order too, but an old task may still
--   be pending (scheduled far ahead, retried) or running: a walk steps
--   over what it keeps, and stops at the first task created less than the
--   age ago (none after it can have ended earlier). The ids it kept are
--   looked at again, by id, by the next walk, which then goes on from
--   where this one stopped: no walk reads again what it deleted, whose
--   index entries stay until VACUUM. A task's lease row goes with it,
--   found through the unique index on resource;
--   the remaining lease rows (not tasks') are few: an index of those that
--   ended, whose predicate is false for every task lease, so no task's
--   claim, heartbeat or completion ever writes to it.
-- A walk cannot see rows whose insert has not committed; the caller
-- starts a walk from the first row now and then (internal/retention) so
-- that a row passed that way is found all the same.
-- The index below names no column a renewal writes: renewals stay
-- heap-only updates.
--
-- Each function plans every call for its own batch and age
-- (force_custom_plan): a generic plan, not knowing the LIMIT, may choose
-- to read every row. Each computes its batch once, as an array: a LIMIT in
-- an "id IN (subquery)" may be run again for every row of a nested loop,
-- each run returning the next rows, and so delete more than the batch.

-- A lease has ended when it was released or its expiry was announced; it
-- is live again (both NULL) once someone takes it over.
CREATE INDEX leases_ended_idx ON leases ((coalesce(released_at, expired_at)))
    WHERE resource NOT LIKE 'task:%' AND (released_at IS NOT NULL OR expired_at IS NOT NULL);

-- retention_check refuses an age under a minute, a batch outside
-- 1..10000 and a negative cursor, with a message that says what to pass
-- instead.
CREATE FUNCTION retention_check(age interval, batch integer, after_id bigint DEFAULT 0) RETURNS void
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
    IF after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'retention cursor % is out of range', coalesce(after_id::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass 0 to start from the first row, then the last_id the previous call returned';
    END IF;
END;
$$;

-- prune_tasks looks at the next batch tasks after after_id, in id order,
-- or, when ids is not NULL, at the tasks of ids (at most batch of them:
-- those an earlier walk kept), and deletes those that ended (done or dead)
-- more than age ago, each with its lease row 'task:<id>'. It returns how
-- many tasks and lease rows it deleted, the ids it looked at and kept
-- (for a later walk to look at again), and where the walk stands: the
-- next call goes on after last_id; done says the walk is over, having
-- reached the table's end or a task created less than age ago (no task
-- after it can have ended long enough ago, but for a few a little out of
-- order). Then last_id is just before that task, where the next walk
-- goes on, and kept holds none of the tasks from there.
--
-- Pending and running tasks are never touched. A finished task stays, for
-- a later walk, while its lease row is live (someone took 'task:<id>'
-- over), its expiry is not announced yet, or it ended less than age ago:
-- a lease row is never deleted without its task, nor a task without its
-- lease row. Rows locked by someone else are kept for a later walk too.
-- The window is read without locks, so claims and heartbeats of the
-- tasks it keeps go on undisturbed.
CREATE FUNCTION prune_tasks(age interval, batch integer, after_id bigint, ids bigint[],
                            OUT pruned_tasks bigint, OUT pruned_leases bigint,
                            OUT last_id bigint, OUT done boolean, OUT kept bigint[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    cutoff     timestamptz;
    window_ids bigint[];
    present    bigint[];
    candidates bigint[];
    young      bigint; -- the first task of the window created less than age ago
    gone       bigint[];
BEGIN
    PERFORM retention_check(age, batch, after_id);
    IF cardinality(ids) > batch THEN
        RAISE EXCEPTION 'retention ids: % ids are more than the batch of %', cardinality(ids), batch
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass at most batch ids at a time';
    END IF;
    cutoff := now() - age;
    IF ids IS NULL THEN
        window_ids := ARRAY(SELECT t.id FROM tasks AS t WHERE t.id > after_id ORDER BY t.id LIMIT batch);
        last_id := coalesce(window_ids[cardinality(window_ids)], after_id);
        done := cardinality(window_ids) < batch;
    ELSE
        window_ids := ids;
        last_id := after_id;
        done := false;
    END IF;

    SELECT coalesce(array_agg(w.id ORDER BY w.id), '{}'),
           coalesce(array_agg(w.id) FILTER (WHERE w.state IN ('done', 'dead') AND w.processed_at < cutoff), '{}'),
           min(w.id) FILTER (WHERE ids IS NULL AND w.created_at >= cutoff)
    INTO present, candidates, young
    FROM tasks AS w
    WHERE w.id = ANY (window_ids);

    WITH doomed AS (
        SELECT f.id, 'task:' || f.id AS resource
        FROM tasks AS f
        WHERE f.id = ANY (candidates)
          AND f.state IN ('done', 'dead')
          AND f.processed_at < cutoff
        FOR UPDATE SKIP LOCKED
    ),
    ended AS (
        SELECT l.id, l.resource
        FROM leases AS l
        WHERE l.resource = ANY (ARRAY(SELECT d.resource FROM doomed AS d))
          AND coalesce(l.released_at, l.expired_at) < cutoff
        FOR UPDATE SKIP LOCKED
    ),
    gone_leases AS (
        DELETE FROM leases AS l
        WHERE l.id = ANY (ARRAY(SELECT e.id FROM ended AS e))
        RETURNING l.id
    ),
    gone_tasks AS (
        DELETE FROM tasks AS t
        WHERE t.id = ANY (ARRAY(
                SELECT d.id FROM doomed AS d
                WHERE d.resource IN (SELECT e.resource FROM ended AS e)
                   OR NOT EXISTS (SELECT 1 FROM leases AS o WHERE o.resource = d.resource)))
        RETURNING t.id
    )
    SELECT coalesce(array_agg(g.id), '{}'), (SELECT count(*) FROM gone_leases)
    INTO gone, pruned_leases
    FROM gone_tasks AS g;
    pruned_tasks := cardinality(gone);

    IF young IS NOT NULL THEN
        done := true;
        last_id := young - 1;
    END IF;
    kept := ARRAY(SELECT k.id
                  FROM (SELECT unnest(present) EXCEPT SELECT unnest(gone)) AS k (id)
                  WHERE young IS NULL OR k.id < young
                  ORDER BY k.id);
END;
$$;

-- prune_lease_events looks at the next batch lease events after after_id,
-- in id order, and deletes those recorded more than age ago. It returns
-- how many it deleted and where the walk stands: the next call goes on
-- after last_id; done says the walk is over, having reached the table's
-- end or an event recorded less than age ago. Then last_id is just before
-- that event, where the next walk goes on: the few events a little out of
-- order after it (recorded by a transaction that began earlier than the
-- one before) go in a later walk.
CREATE FUNCTION prune_lease_events(age interval, batch integer, after_id bigint,
                                   OUT pruned bigint, OUT last_id bigint, OUT done boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    cutoff timestamptz;
    doomed bigint[];
    young  bigint; -- the first event of the window recorded less than age ago
BEGIN
    PERFORM retention_check(age, batch, after_id);
    cutoff := now() - age;
    SELECT coalesce(max(w.id), after_id),
           count(*) < batch,
           min(w.id) FILTER (WHERE w.at >= cutoff),
           coalesce(array_agg(w.id) FILTER (WHERE w.at < cutoff), '{}')
    INTO last_id, done, young, doomed
    FROM (SELECT e.id, e.at
          FROM lease_events AS e
          WHERE e.id > after_id
          ORDER BY e.id
          LIMIT batch) AS w;
    -- Events are never updated (the runtime role may not): nothing to lock.
    DELETE FROM lease_events AS e
    WHERE e.id = ANY (doomed)
      AND e.at < cutoff;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    IF young IS NOT NULL THEN
        done := true;
        last_id := young - 1;
    END IF;
END;
$$;

-- prune_leases deletes up to batch rows of leases other than tasks'
-- released, or announced expired, more than age ago, oldest first, and
-- returns how many it deleted. A live lease has neither mark (an
-- acquisition clears both, a renewal needs expired_at NULL), so it is
-- never deleted, however old; an expiry not yet announced waits for the
-- reaper's "expired" event. Rows being changed right now (a takeover) are
-- left alone. A task's lease row goes with its task (prune_tasks).
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
            WHERE o.resource NOT LIKE 'task:%'
              AND (o.released_at IS NOT NULL OR o.expired_at IS NOT NULL)
              AND coalesce(o.released_at, o.expired_at) < now() - age
            ORDER BY coalesce(o.released_at, o.expired_at)
            LIMIT batch
            FOR UPDATE SKIP LOCKED))
      AND coalesce(l.released_at, l.expired_at) < now() - age;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

REVOKE EXECUTE ON FUNCTION prune_tasks(interval, integer, bigint, bigint[]),
                           prune_lease_events(interval, integer, bigint),
                           prune_leases(interval, integer) FROM PUBLIC;

-- +goose Down
DROP FUNCTION prune_leases(interval, integer);
DROP FUNCTION prune_lease_events(interval, integer, bigint);
DROP FUNCTION prune_tasks(interval, integer, bigint, bigint[]);
DROP FUNCTION retention_check(interval, integer, bigint);
DROP INDEX leases_ended_idx;
