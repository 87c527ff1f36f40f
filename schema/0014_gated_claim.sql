-- +goose Up

-- tasks_gated claims the tasks too, not only their locks. Until now it
-- acquired each lock's lease and returned the task, which the calling
-- claim then assigned by its own UPDATE. But the function reads with
-- snapshots of its own, taken later than the claim's statement: a gated
-- task committed after the statement began (a schedule's tick, due at the
-- tick; an insert that began before the claim) is seen by the function
-- and not by the statement's UPDATE, which then left it pending with its
-- lock's lease held by a processor that never got it, until the lease ran
-- out. Acquiring the lock and assigning the task in the function, by one
-- snapshot's reads and under the task's row lock, keeps the two together.
DROP FUNCTION tasks_gated(text[], text[], text[], integer);

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
-- schema/0012's: it acquires the locks, and the claims assign the tasks.
CREATE FUNCTION tasks_gated(want_queues text[], want_kinds text[], processors text[], ttl_default integer)
RETURNS TABLE (id bigint, processor text, fence bigint, acquired_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 1
-- The SET clauses keep the planner on the indexes whatever the statistics
-- say, as tasks_claimable's; they cost a call a save and a restore of each,
-- so the claims call it only while a gated task is pending (TaskClaim).
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    cur  text;
    next integer := 1;
    tid  bigint;
    ttl  integer;
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
                RETURNING tid, l.holder, l.fence, l.created_at, l.expires_at
                INTO id, processor, fence, acquired_at, expires_at;
                IF FOUND THEN
                    RETURN NEXT;
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
