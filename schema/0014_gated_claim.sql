-- +goose Up

-- The claim of a gated task acquires its lock and assigns the task in one
-- step, in tasks_gated, instead of in a BEFORE trigger as schema/0012 had
-- it.
--   * The BEFORE trigger made every update of every task lock its row
--     first: one more WAL record per completion, 6-10% of the library's
--     drain (docs/performance.md, issue 15). What follows a running gated
--     task's lease (its renewals and its end) is now an AFTER trigger whose
--     WHEN is false for every other task.
--   * tasks_gated assigns the task itself, not the claim statement that
--     calls it: the function reads with snapshots later than the
--     statement's, so a gated task committed in between (a schedule's
--     tick, due at the tick) is seen by it and not by the statement's own
--     UPDATE, which would leave the task pending and its lock held by a
--     worker that never got it, until the lease ran out.
--   * The claims first ask whether any gated task is pending
--     (tasks_gated_waiting), by a plan no statistics can change.
DROP TRIGGER task_lock_follow ON tasks;
DROP FUNCTION task_lock_follow();
DROP FUNCTION tasks_gated(text[], text[], integer);

-- task_lock_follow keeps a running gated task's lock in step with the
-- task's own lease, in the statement that changes the task (the claim
-- acquired it: tasks_gated):
--   * a renewal of the task's lease renews the lock's to the same expiry;
--     when the lock's lease is gone (released by someone using the
--     processor's name), the renewal fails with SQLSTATE LH001, which the
--     store reports as a lost lease: a gated task never runs on without
--     its lock;
--   * the end of an attempt (done, failed, dead, cancelled, handed back,
--     lapsed) releases the lock's lease of that fence, unless it has
--     expired already.
-- An AFTER trigger whose WHEN is false for every other task: an update of
-- an ungated task costs the evaluation of the WHEN and nothing more (a
-- BEFORE trigger would make every update lock its row first, one more WAL
-- record per completion). Lease events and NOTIFYs follow from
-- leases_changed.
CREATE FUNCTION task_lock_follow() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 'running' OR NEW.fence IS DISTINCT FROM OLD.fence THEN
        UPDATE leases AS l
        SET released_at = least(clock_timestamp(), l.expires_at),
            expires_at  = least(clock_timestamp(), l.expires_at)
        WHERE l.resource = OLD.lock_resource AND l.fence = OLD.fence
          AND l.released_at IS NULL AND l.expires_at > now();
    ELSIF NEW.must_heartbeat_before IS DISTINCT FROM OLD.must_heartbeat_before THEN
        UPDATE leases AS l
        SET renewed_at  = now(),
            ttl_seconds = NEW.ttl_seconds,
            expires_at  = NEW.must_heartbeat_before
        WHERE l.resource = NEW.lock_resource AND l.fence = NEW.fence
          AND l.released_at IS NULL AND l.expired_at IS NULL AND l.expires_at > now();
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the lease of the lock % of task % under fence % is no longer held', NEW.lock_resource, NEW.id, NEW.fence
                USING ERRCODE = 'LH001';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_lock_follow
AFTER UPDATE ON tasks
FOR EACH ROW
WHEN (OLD.lock_resource IS NOT NULL AND OLD.state = 'running')
EXECUTE FUNCTION task_lock_follow();

-- tasks_gated claims up to cardinality(processors) due gated tasks of
-- want_queues and want_kinds (NULL: all), at most one per lock, only of
-- locks whose lease is free: for each, the first of the lock in
-- (priority, scheduled_at, id) order is locked (FOR UPDATE SKIP LOCKED),
-- the lock's lease acquired for the next processor, with a fence drawn
-- under the lease's row lock and the task's TTL (or ttl_default), as an
-- acquisition by the REST API is, and the task assigned to that processor
-- as a claim assigns (TaskClaim): its attempt is that holding of the lock,
-- under the lock's fence, from its acquisition to its expiry. It returns
-- the claimed tasks, in the order of processors. A task whose lock
-- someone took meanwhile stays pending, and its lock untouched. Locks are
-- visited in name order by a loose scan of tasks_gated_idx (one probe
-- each), so a busy lock costs a claim one probe and one look at its lease,
-- however many tasks wait on it.
CREATE FUNCTION tasks_gated(want_queues text[], want_kinds text[], processors text[], ttl_default integer)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
ROWS 1
-- As in schema/0012: the claims call it only while a gated task is pending.
-- Sorts are off as in tasks_gated_waiting: both of its reads of tasks are
-- in tasks_gated_idx's order, which only that index gives without a sort,
-- so no statistics can make it walk the pending tasks of tasks_filter_idx.
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    cur       text;
    next      integer := 1;
    tid       bigint;
    ttl       integer;
    holder    text;
    lock_fence bigint;
    acquired  timestamptz;
    expiry    timestamptz;
    claimed   tasks;
BEGIN
    IF coalesce(cardinality(processors), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT t.lock_resource INTO cur FROM tasks AS t
    WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
    ORDER BY t.lock_resource LIMIT 1;
    WHILE cur IS NOT NULL AND next <= cardinality(processors) LOOP
        IF NOT EXISTS (SELECT 1 FROM leases AS l
                       WHERE l.resource = cur AND l.released_at IS NULL AND l.expires_at > now()) THEN
            SELECT c.id, coalesce(c.ttl_seconds, ttl_default) INTO tid, ttl FROM tasks AS c
            WHERE c.state = 'pending' AND c.lock_resource = cur AND c.scheduled_at <= now()
              AND (want_queues IS NULL OR c.queue = ANY (want_queues))
              AND (want_kinds IS NULL OR c.kind = ANY (want_kinds))
            ORDER BY c.priority, c.scheduled_at, c.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, expires_at)
                VALUES (cur, processors[next], nextval('lease_fence_seq'), ttl,
                        clock_timestamp() + make_interval(secs => ttl))
                ON CONFLICT (resource) DO UPDATE
                SET holder      = excluded.holder,
                    -- Drawn now, under the row lock, and the holding begins
                    -- after the previous one ended (as LeaseAcquire).
                    fence       = nextval('lease_fence_seq'),
                    ttl_seconds = excluded.ttl_seconds,
                    created_at  = clock_timestamp(),
                    renewed_at  = NULL,
                    released_at = NULL,
                    expired_at  = NULL,
                    expires_at  = clock_timestamp() + make_interval(secs => excluded.ttl_seconds)
                WHERE l.released_at IS NOT NULL OR l.expires_at <= now()
                RETURNING l.holder, l.fence, l.created_at, l.expires_at
                INTO holder, lock_fence, acquired, expiry;
                IF FOUND THEN
                    -- The assignment of TaskClaim, for a pending task.
                    UPDATE tasks AS t
                    SET state = 'running',
                        processor = holder,
                        fence = lock_fence,
                        ttl_seconds = ttl,
                        attempts = t.attempts + 1,
                        started_at = acquired,
                        last_heartbeat_at = acquired,
                        must_heartbeat_before = expiry
                    WHERE t.id = tid
                    RETURNING t.* INTO claimed;
                    RETURN NEXT claimed;
                    next := next + 1;
                END IF;
            END IF;
        END IF;
        SELECT t.lock_resource INTO cur FROM tasks AS t
        WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL AND t.lock_resource > cur
        ORDER BY t.lock_resource LIMIT 1;
    END LOOP;
END;
$$;

-- tasks_gated_waiting reports whether any gated task is pending: the
-- claims' one-time filter before they call tasks_gated. An inline EXISTS
-- let the planner read tasks_filter_idx on state = 'pending' instead of
-- the gated tasks' own index whenever the statistics were taken while the
-- queue was empty (they make the two look alike), and then every claim
-- read every pending task: a third of the drain's rate (the capacity
-- bench, docs/performance.md). Asked in tasks_gated_due_idx's order with
-- sorts disabled, only that index can answer without a sort, so the plan is
-- its scan whatever the statistics say (an EXISTS would drop the ORDER BY).
CREATE FUNCTION tasks_gated_waiting() RETURNS boolean
LANGUAGE plpgsql STABLE
-- The one setting it needs: every other path to these rows (a scan of
-- tasks_filter_idx, of the heap, a bitmap) needs a sort for this order.
-- Each SET clause costs every claim a save and a restore.
SET enable_sort = off
AS $$
BEGIN
    PERFORM t.scheduled_at FROM tasks AS t
    WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
    ORDER BY t.scheduled_at
    LIMIT 1;
    RETURN FOUND;
END;
$$;

-- +goose Down
DROP FUNCTION tasks_gated_waiting();
DROP FUNCTION tasks_gated(text[], text[], text[], integer);
DROP TRIGGER task_lock_follow ON tasks;
DROP FUNCTION task_lock_follow();
-- schema/0012's.
CREATE FUNCTION tasks_gated(want_queues text[], want_kinds text[], max_tasks integer)
RETURNS TABLE (id bigint, priority smallint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 1
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    cur       text;
    left_over integer := max_tasks;
    got       integer;
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RETURN;
    END IF;
    SELECT t.lock_resource INTO cur FROM tasks AS t
    WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
    ORDER BY t.lock_resource LIMIT 1;
    WHILE cur IS NOT NULL AND left_over > 0 LOOP
        IF NOT EXISTS (SELECT 1 FROM leases AS l
                       WHERE l.resource = cur AND l.released_at IS NULL AND l.expires_at > now()) THEN
            RETURN QUERY
            SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
            WHERE c.state = 'pending' AND c.lock_resource = cur AND c.scheduled_at <= now()
              AND (want_queues IS NULL OR c.queue = ANY (want_queues))
              AND (want_kinds IS NULL OR c.kind = ANY (want_kinds))
            ORDER BY c.priority, c.scheduled_at, c.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            GET DIAGNOSTICS got = ROW_COUNT;
            left_over := left_over - got;
        END IF;
        SELECT t.lock_resource INTO cur FROM tasks AS t
        WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL AND t.lock_resource > cur
        ORDER BY t.lock_resource LIMIT 1;
    END LOOP;
END;
$$;

CREATE FUNCTION task_lock_follow() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    got      bigint;
    acquired timestamptz;
    expiry   timestamptz;
BEGIN
    IF OLD.state = 'running' AND (NEW.state <> 'running' OR NEW.fence IS DISTINCT FROM OLD.fence) THEN
        UPDATE leases AS l
        SET released_at = least(clock_timestamp(), l.expires_at),
            expires_at  = least(clock_timestamp(), l.expires_at)
        WHERE l.resource = OLD.lock_resource AND l.fence = OLD.fence
          AND l.released_at IS NULL AND l.expires_at > now();
    END IF;
    IF NEW.state = 'running' AND (OLD.state <> 'running' OR NEW.fence IS DISTINCT FROM OLD.fence) THEN
        INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, expires_at)
        VALUES (NEW.lock_resource, NEW.processor, nextval('lease_fence_seq'), NEW.ttl_seconds,
                clock_timestamp() + make_interval(secs => NEW.ttl_seconds))
        ON CONFLICT (resource) DO UPDATE
        SET holder      = excluded.holder,
            fence       = nextval('lease_fence_seq'),
            ttl_seconds = excluded.ttl_seconds,
            created_at  = clock_timestamp(),
            renewed_at  = NULL,
            released_at = NULL,
            expired_at  = NULL,
            expires_at  = clock_timestamp() + make_interval(secs => excluded.ttl_seconds)
        WHERE l.released_at IS NOT NULL OR l.expires_at <= now()
        RETURNING l.fence, l.created_at, l.expires_at INTO got, acquired, expiry;
        IF got IS NULL THEN
            RETURN NULL; -- the lock is held: the task stays as it was
        END IF;
        -- The attempt begins when the lock was acquired, not when the
        -- statement did (it may have waited for the lock's row), and its
        -- lease ends with the lock's.
        NEW.fence := got;
        NEW.started_at := acquired;
        NEW.last_heartbeat_at := acquired;
        NEW.must_heartbeat_before := expiry;
    ELSIF NEW.state = 'running' AND NEW.must_heartbeat_before IS DISTINCT FROM OLD.must_heartbeat_before THEN
        UPDATE leases AS l
        SET renewed_at  = now(),
            ttl_seconds = NEW.ttl_seconds,
            expires_at  = NEW.must_heartbeat_before
        WHERE l.resource = NEW.lock_resource AND l.fence = NEW.fence
          AND l.released_at IS NULL AND l.expired_at IS NULL AND l.expires_at > now();
        IF NOT FOUND THEN
            RETURN NULL; -- the lock's lease is gone: so is the task's
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER task_lock_follow
BEFORE UPDATE ON tasks
FOR EACH ROW
WHEN (NEW.lock_resource IS NOT NULL)
EXECUTE FUNCTION task_lock_follow();
