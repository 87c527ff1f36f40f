-- +goose Up

-- Periodic tasks and lease-gated tasks (contract §9).

-- A gated task names the resource whose lease it must hold to run
-- (lock_resource, "lock" in the API). A task made by a schedule names it
-- and the tick it is for; (schedule, schedule_tick) is unique, so that a
-- second enqueuer of a tick, even one that lost the scheduler lease
-- without knowing it, inserts nothing.
ALTER TABLE tasks
    ADD COLUMN lock_resource text        CHECK (octet_length(lock_resource) BETWEEN 1 AND 255),
    ADD COLUMN schedule      text        CHECK (octet_length(schedule) BETWEEN 1 AND 255),
    ADD COLUMN schedule_tick timestamptz,
    ADD CONSTRAINT tasks_schedule_tick_check CHECK ((schedule IS NULL) = (schedule_tick IS NULL));

CREATE UNIQUE INDEX tasks_schedule_tick_idx ON tasks (schedule, schedule_tick) WHERE schedule IS NOT NULL;

-- Gated tasks leave the claim index: a claim of ungated tasks never reads
-- them, however many wait on a busy lock. They have their own, in each
-- lock's order, which a claim reads one lock at a time (tasks_gated), and
-- one by due time for an idle dispatcher's wake-up (tasks_next_due).
DROP INDEX tasks_claim_idx;
CREATE INDEX tasks_claim_idx ON tasks (queue, kind, priority, scheduled_at, id)
    WHERE state = 'pending' AND lock_resource IS NULL;
CREATE INDEX tasks_gated_idx ON tasks (lock_resource, priority, scheduled_at, id)
    WHERE state = 'pending' AND lock_resource IS NOT NULL;
CREATE INDEX tasks_gated_due_idx ON tasks (scheduled_at)
    WHERE state = 'pending' AND lock_resource IS NOT NULL;

-- task_branches, tasks_claimable and tasks_due as in schema/0011, reading
-- only the ungated tasks (the new predicate of tasks_claim_idx).
CREATE OR REPLACE FUNCTION task_branches(want_queues text[], want_kinds text[],
                              hint_queues text[], hint_kinds text[], hint_priorities smallint[],
                              hint_at timestamptz[], hint_ids bigint[])
RETURNS TABLE (queue text, kind text, priority smallint, after_at timestamptz, after_id bigint)
LANGUAGE plpgsql STABLE
ROWS 4
-- No SET clauses: its callers (tasks_claimable, tasks_next_due) have them,
-- and a function's own cost a claim a save and a restore of each setting.
AS $$
#variable_conflict use_column
DECLARE
    pair_queues text[];
    pair_kinds  text[];
    cur_q       text;
    cur_k       text;
    i           integer;
    j           integer;
    cursor_p    integer;
    known_p     smallint;
    known_at    timestamptz;
    known_id    bigint;
    found_p     smallint;
BEGIN
    -- The (queue, kind) pairs: those wanted, or those pending (a loose scan
    -- of the index's leading columns) where a list is NULL.
    IF want_queues IS NULL THEN
        WITH RECURSIVE qs (v) AS (
            (SELECT t.queue FROM tasks AS t WHERE t.state = 'pending' AND t.lock_resource IS NULL ORDER BY t.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT t.queue FROM tasks AS t WHERE t.state = 'pending' AND t.lock_resource IS NULL AND t.queue > qs.v ORDER BY t.queue LIMIT 1)
            FROM qs WHERE qs.v IS NOT NULL
        )
        SELECT array_agg(qs.v ORDER BY qs.v) INTO want_queues FROM qs WHERE qs.v IS NOT NULL;
    END IF;
    IF want_queues IS NULL THEN
        RETURN; -- nothing pending at all
    END IF;
    IF want_kinds IS NULL THEN
        SELECT array_agg(p.q ORDER BY p.q, p.k), array_agg(p.k ORDER BY p.q, p.k)
        INTO pair_queues, pair_kinds
        FROM (SELECT DISTINCT wq AS q FROM unnest(want_queues) AS wq) AS wqs (q)
        CROSS JOIN LATERAL (
            WITH RECURSIVE ks (v) AS (
                (SELECT t.kind FROM tasks AS t WHERE t.state = 'pending' AND t.lock_resource IS NULL AND t.queue = wqs.q ORDER BY t.kind LIMIT 1)
                UNION ALL
                SELECT (SELECT t.kind FROM tasks AS t
                        WHERE t.state = 'pending' AND t.lock_resource IS NULL AND t.queue = wqs.q AND t.kind > ks.v ORDER BY t.kind LIMIT 1)
                FROM ks WHERE ks.v IS NOT NULL
            )
            SELECT wqs.q, ks.v FROM ks WHERE ks.v IS NOT NULL
        ) AS p (q, k);
    ELSE
        -- Every pair once, in plain PL/pgSQL: a statement here would cost
        -- each claim more than the probes below (a claim of an idle
        -- worker waits for it).
        pair_queues := '{}';
        pair_kinds := '{}';
        FOR i IN 1 .. cardinality(want_queues) LOOP
            CONTINUE WHEN array_position(want_queues, want_queues[i]) < i;
            FOR j IN 1 .. cardinality(want_kinds) LOOP
                CONTINUE WHEN array_position(want_kinds, want_kinds[j]) < j;
                pair_queues := pair_queues || want_queues[i];
                pair_kinds := pair_kinds || want_kinds[j];
            END LOOP;
        END LOOP;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(pair_queues), 0) LOOP
        cur_q := pair_queues[i];
        cur_k := pair_kinds[i];
        cursor_p := -32769; -- below every smallint
        LOOP
            -- The next priority this claimer has a hint for, above the cursor
            -- (a loop, not a statement, for the same reason as above).
            known_p := NULL;
            FOR j IN 1 .. coalesce(cardinality(hint_queues), 0) LOOP
                IF hint_queues[j] = cur_q AND hint_kinds[j] = cur_k AND hint_priorities[j] > cursor_p
                   AND (known_p IS NULL OR hint_priorities[j] < known_p) THEN
                    known_p := hint_priorities[j];
                    known_at := hint_at[j];
                    known_id := hint_ids[j];
                END IF;
            END LOOP;
            -- A branch below it (or above the cursor, when there is none):
            -- bounded by known_p, the probe stops there.
            SELECT t.priority INTO found_p FROM tasks AS t
            WHERE t.state = 'pending' AND t.lock_resource IS NULL AND t.queue = cur_q AND t.kind = cur_k
              AND t.priority > cursor_p AND t.priority < coalesce(known_p::integer, 32768)
            ORDER BY t.priority
            LIMIT 1;
            IF FOUND THEN
                queue := cur_q; kind := cur_k; priority := found_p; after_at := '-infinity'; after_id := 0;
                RETURN NEXT;
                cursor_p := found_p;
            ELSIF known_p IS NOT NULL THEN
                queue := cur_q; kind := cur_k; priority := known_p; after_at := known_at; after_id := known_id;
                RETURN NEXT;
                cursor_p := known_p;
            ELSE
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION tasks_claimable(want_queues text[], want_kinds text[], max_tasks integer,
                                hint_queues text[], hint_kinds text[], hint_priorities smallint[],
                                hint_at timestamptz[], hint_ids bigint[], discover boolean)
RETURNS TABLE (id bigint, priority smallint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    bq        text[];
    bk        text[];
    bp        smallint[];
    bat       timestamptz[];
    bid       bigint[];
    n         integer;
    lo        integer := 1;
    hi        integer;
    j         integer;
    left_over integer := max_tasks;
    got       integer;
    share     integer[];
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RETURN;
    END IF;
    IF discover OR coalesce(cardinality(hint_queues), 0) = 0 THEN
        SELECT array_agg(br.queue ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.kind ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.priority ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.after_at ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.after_id ORDER BY br.priority, br.queue, br.kind)
        INTO bq, bk, bp, bat, bid
        FROM task_branches(want_queues, want_kinds, hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids) AS br;
    ELSIF cardinality(hint_queues) = 1 THEN
        -- One branch known, none to look for: the busy claimer's case.
        RETURN QUERY
        SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
        WHERE c.state = 'pending' AND c.lock_resource IS NULL AND c.queue = hint_queues[1] AND c.kind = hint_kinds[1] AND c.priority = hint_priorities[1]
          AND (c.scheduled_at, c.id) > (hint_at[1], hint_ids[1]) AND c.scheduled_at <= now()
        ORDER BY c.scheduled_at, c.id
        LIMIT max_tasks
        FOR UPDATE SKIP LOCKED;
        RETURN;
    ELSE
        -- The branches known from the hints, none looked for.
        SELECT array_agg(h.q ORDER BY h.p, h.q, h.k), array_agg(h.k ORDER BY h.p, h.q, h.k),
               array_agg(h.p ORDER BY h.p, h.q, h.k), array_agg(h.at ORDER BY h.p, h.q, h.k),
               array_agg(h.id ORDER BY h.p, h.q, h.k)
        INTO bq, bk, bp, bat, bid
        FROM unnest(hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids) AS h (q, k, p, at, id);
    END IF;
    n := coalesce(cardinality(bq), 0);
    -- One group of branches of equal priority at a time, lowest lo.
    WHILE lo <= n AND left_over > 0 LOOP
        hi := lo;
        WHILE hi < n AND bp[hi + 1] = bp[lo] LOOP
            hi := hi + 1;
        END LOOP;
        IF lo = hi THEN
            RETURN QUERY
            SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
            WHERE c.state = 'pending' AND c.lock_resource IS NULL AND c.queue = bq[lo] AND c.kind = bk[lo] AND c.priority = bp[lo]
              AND (c.scheduled_at, c.id) > (bat[lo], bid[lo]) AND c.scheduled_at <= now()
            ORDER BY c.scheduled_at, c.id
            LIMIT left_over
            FOR UPDATE SKIP LOCKED;
            GET DIAGNOSTICS got = ROW_COUNT;
            left_over := left_over - got;
        ELSE
            -- How many of the group's best left_over due tasks each branch
            -- holds, read without locks.
            SELECT array_agg(coalesce(best.c, 0) ORDER BY s.i) INTO share
            FROM generate_series(lo, hi) AS s (i)
            LEFT JOIN (
                SELECT x.i, count(*)::integer AS c FROM (
                    SELECT g.i, y.scheduled_at, y.id
                    FROM generate_series(lo, hi) AS g (i)
                    CROSS JOIN LATERAL (
                        SELECT c.scheduled_at, c.id FROM tasks AS c
                        WHERE c.state = 'pending' AND c.lock_resource IS NULL AND c.queue = bq[g.i] AND c.kind = bk[g.i] AND c.priority = bp[g.i]
                          AND (c.scheduled_at, c.id) > (bat[g.i], bid[g.i]) AND c.scheduled_at <= now()
                        ORDER BY c.scheduled_at, c.id
                        LIMIT left_over
                    ) AS y
                    ORDER BY y.scheduled_at, y.id
                    LIMIT left_over
                ) AS x
                GROUP BY x.i
            ) AS best ON best.i = s.i;
            FOR j IN lo .. hi LOOP
                CONTINUE WHEN share[j - lo + 1] = 0;
                RETURN QUERY
                SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
                WHERE c.state = 'pending' AND c.lock_resource IS NULL AND c.queue = bq[j] AND c.kind = bk[j] AND c.priority = bp[j]
                  AND (c.scheduled_at, c.id) > (bat[j], bid[j]) AND c.scheduled_at <= now()
                ORDER BY c.scheduled_at, c.id
                LIMIT share[j - lo + 1]
                FOR UPDATE SKIP LOCKED;
                GET DIAGNOSTICS got = ROW_COUNT;
                left_over := left_over - got;
            END LOOP;
        END IF;
        lo := hi + 1;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION tasks_due(max_tasks integer)
RETURNS TABLE (id bigint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.id, c.scheduled_at FROM tasks AS c
    WHERE c.state = 'pending' AND c.lock_resource IS NULL AND c.queue = 'default' AND c.kind = 'sleep' AND c.priority = 0
      AND c.scheduled_at <= now()
    ORDER BY c.scheduled_at, c.id
    LIMIT max_tasks
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- tasks_gated picks, locks (FOR UPDATE SKIP LOCKED) and returns up to
-- max_tasks due gated tasks of want_queues and want_kinds (NULL: all), at
-- most one per lock, and only of locks whose lease is free: the first of
-- each such lock in (priority, scheduled_at, id) order. Locks are visited
-- in name order by a loose scan of tasks_gated_idx (one probe each), so a
-- busy lock costs a claim one probe and one look at its lease, however
-- many tasks wait on it. The claim acquires the lock's lease as it takes
-- the task (task_lock_follow); one whose lease someone took meanwhile is
-- left pending.
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

-- tasks_next_due as in schema/0011, and the next gated task to fall due
-- (only one in the future: a due one whose lock is busy wakes the
-- claimers when the lock is freed, see leases_changed).
CREATE OR REPLACE FUNCTION tasks_next_due(want_queues text[], want_kinds text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    due timestamptz;
BEGIN
    SELECT min(f.scheduled_at) INTO due
    FROM task_branches(want_queues, want_kinds, NULL, NULL, NULL, NULL, NULL) AS br
    CROSS JOIN LATERAL (
        SELECT c.scheduled_at FROM tasks AS c
        WHERE c.state = 'pending' AND c.lock_resource IS NULL
          AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
        ORDER BY c.scheduled_at, c.id
        LIMIT 1
    ) AS f;
    RETURN least(due, (SELECT min(g.scheduled_at) FROM tasks AS g
                       WHERE g.state = 'pending' AND g.lock_resource IS NOT NULL AND g.scheduled_at > now()));
END;
$$;

-- tasks_pending_summary as in schema/0011, counting gated tasks too (read
-- from tasks_gated_idx, at most 100,000 of them).
CREATE OR REPLACE FUNCTION tasks_pending_summary(max_count integer)
RETURNS TABLE (queue text, kind text, pending bigint, oldest_due timestamptz)
LANGUAGE plpgsql STABLE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT a.queue, a.kind, least(sum(a.pending), max_count)::bigint, min(a.oldest_due)
    FROM (
        SELECT br.queue, br.kind, n.c AS pending, f.scheduled_at AS oldest_due
        FROM task_branches(NULL, NULL, NULL, NULL, NULL, NULL, NULL) AS br
        CROSS JOIN LATERAL (
            SELECT count(*) AS c FROM (
                SELECT 1 FROM tasks AS c
                WHERE c.state = 'pending' AND c.lock_resource IS NULL
                  AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
                LIMIT max_count
            ) AS l
        ) AS n
        LEFT JOIN LATERAL (
            SELECT c.scheduled_at FROM tasks AS c
            WHERE c.state = 'pending' AND c.lock_resource IS NULL
              AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
              AND c.scheduled_at <= now()
            ORDER BY c.scheduled_at, c.id
            LIMIT 1
        ) AS f ON true
        UNION ALL
        SELECT g.queue, g.kind, count(*), min(g.scheduled_at) FILTER (WHERE g.scheduled_at <= now())
        FROM (SELECT c.queue, c.kind, c.scheduled_at FROM tasks AS c
              WHERE c.state = 'pending' AND c.lock_resource IS NOT NULL
              ORDER BY c.lock_resource
              LIMIT 100000) AS g
        GROUP BY g.queue, g.kind
    ) AS a
    GROUP BY a.queue, a.kind
    ORDER BY a.queue, a.kind;
END;
$$;

-- task_lock_follow keeps a gated task's lock in step with the task's own
-- lease, in the statement that changes the task:
--   * a claim (running with a new fence) acquires the lock's lease for the
--     processor, with a fence drawn under the lease's row lock, which the
--     task takes as its own; when the lease is held (someone took it after
--     tasks_gated looked), the row is left as it was: not claimed;
--   * a renewal of the task's lease renews the lock's to the same expiry;
--     when the lock's lease is gone (released by its holder's name), the
--     renewal is refused as a lost lease is;
--   * the end of an attempt (done, failed, dead, cancelled, handed back,
--     lapsed and taken again) releases the lock's lease of that fence,
--     unless it has expired already.
-- The task's lease is the lock's: the claim gives the task the lock's
-- acquisition time as started_at and its expiry, and a renewal sets both
-- alike. Lease events and NOTIFYs follow from leases_changed.
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

-- tasks_changed as in schema/0011, but for how it tells a claim: a row
-- running that started at the statement's time or later. A gated task's
-- claim starts when its lock's lease was acquired (task_lock_follow), which
-- may be after the statement began (it waited for the lock's row).
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
    stopped    bigint[];
BEGIN
    SELECT min(n.must_heartbeat_before) FILTER (WHERE n.state = 'running' AND n.started_at >= now()),
           bool_or(n.state = 'pending' AND ((n.earlier_attempts -> -1 ->> 'ended_at')::timestamptz = now()
                                            OR n.scheduled_at = now())),
           bool_or(n.state IN ('done', 'dead', 'cancelled') AND n.processed_at = now()),
           array_agg(n.id) FILTER (WHERE n.state = 'cancelled' AND n.processed_at = now()
                                     AND n.earlier_attempts -> -1 ->> 'outcome' = 'cancelled'
                                     AND (n.earlier_attempts -> -1 ->> 'ended_at')::timestamptz = now())
    INTO claimed_by, requeued, finished, stopped
    FROM new_rows AS n;

    IF requeued THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    IF stopped IS NOT NULL THEN
        PERFORM pg_notify('leasehold_task', 'cancelled:' || s.id) FROM unnest(stopped) AS s (id);
    END IF;
    IF claimed_by IS NULL AND NOT finished THEN
        RETURN NULL; -- a heartbeat, or nothing
    END IF;
    watched := current_setting('transaction_isolation') <> 'read committed'
               OR NOT pg_try_advisory_xact_lock_shared(7810756277295999348)
               OR EXISTS (SELECT 1 FROM task_waiters WHERE all_changes);
    -- The look for a running task that expires sooner: see schema/0009.
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

CREATE TRIGGER task_lock_follow
BEFORE UPDATE ON tasks
FOR EACH ROW
WHEN (NEW.lock_resource IS NOT NULL)
EXECUTE FUNCTION task_lock_follow();

-- leases_changed as in schema/0006, and besides: a lease released or
-- announced expired on a resource that gated tasks wait for NOTIFYs
-- 'requeued' on leasehold_task, which wakes the claimers (a gated task
-- whose lock was busy becomes claimable without anyone polling).
CREATE OR REPLACE FUNCTION leases_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    event_kind text;
    event_at   timestamptz;
    event_id   bigint;
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN
        event_kind := 'acquired';
        event_at := NEW.created_at;
    ELSIF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN
        event_kind := 'released';
        event_at := NEW.released_at;
    ELSIF NEW.expired_at IS NOT NULL AND OLD.expired_at IS NULL THEN
        event_kind := 'expired';
        event_at := NEW.expired_at;
    ELSIF NEW.renewed_at IS DISTINCT FROM OLD.renewed_at THEN
        event_kind := 'renewed';
        event_at := NEW.renewed_at;
    ELSE
        RETURN NULL;
    END IF;

    INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
    VALUES (event_at, NEW.id, NEW.resource, NEW.holder, NEW.fence, event_kind, NEW.expires_at)
    RETURNING id INTO event_id;

    PERFORM pg_notify('leasehold_lease', json_build_object(
        'id', NEW.id,
        'event_id', event_id,
        'resource', NEW.resource,
        'fence', NEW.fence,
        'kind', event_kind,
        'expires_at_ms', floor(extract(epoch FROM NEW.expires_at) * 1000)::bigint
    )::text);
    IF event_kind IN ('released', 'expired') AND EXISTS (
            SELECT 1 FROM tasks AS t
            WHERE t.state = 'pending' AND t.lock_resource = NEW.resource) THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    RETURN NULL;
END;
$$;

-- Schedules: each makes one task per tick of its cron expression, in its
-- zone. next_tick_at is the next tick to enqueue, computed by whoever
-- writes the row (the API on a change, the scheduler as it enqueues); the
-- scheduler moves it forward by a compare-and-set, under its fenced lease
-- (schedule_enqueue in queries/schedule.sql). missed_ticks counts the
-- ticks that fell due while no scheduler ran, enqueued as one task;
-- skipped_ticks those a unique schedule left out because its previous
-- task had not finished.
CREATE TABLE schedules (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    cron          text        NOT NULL CHECK (octet_length(cron) BETWEEN 1 AND 255),
    zone          text        NOT NULL DEFAULT 'UTC' CHECK (octet_length(zone) BETWEEN 1 AND 255),
    kind          text        NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 255),
    task_data     jsonb       NOT NULL,
    queue         text        NOT NULL DEFAULT 'default' CHECK (octet_length(queue) BETWEEN 1 AND 255),
    priority      smallint    NOT NULL DEFAULT 0,
    unique_ticks  boolean     NOT NULL DEFAULT false,
    lock_resource text        CHECK (octet_length(lock_resource) BETWEEN 1 AND 255),
    max_attempts  integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    ttl_seconds   integer     CHECK (ttl_seconds BETWEEN 1 AND 3600),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    next_tick_at  timestamptz NOT NULL,
    last_tick_at  timestamptz,
    last_task_id  bigint,
    missed_ticks  bigint      NOT NULL DEFAULT 0,
    skipped_ticks bigint      NOT NULL DEFAULT 0,
    CONSTRAINT schedules_name_key UNIQUE (name)
);

-- schedules_changed NOTIFYs leasehold_schedule with 'changed:<name>' for a
-- schedule added, replaced or removed (the scheduler reads the schedules
-- again) and 'ticked:<name>' for a tick enqueued (the dashboard's).
CREATE FUNCTION schedules_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.updated_at = OLD.updated_at THEN
        PERFORM pg_notify('leasehold_schedule', 'ticked:' || NEW.name);
    ELSE
        PERFORM pg_notify('leasehold_schedule', 'changed:' || coalesce(NEW.name, OLD.name));
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER schedules_changed
AFTER INSERT OR UPDATE OR DELETE ON schedules
FOR EACH ROW EXECUTE FUNCTION schedules_changed();

-- schedule_remove removes the schedule of that name (DELETE
-- /api/schedules/{name}) and returns it. The runtime role deletes nothing
-- itself (docs/least-privilege.sql): it runs as its owner, with its
-- search_path pinned, and only the role it is granted to may execute it.
CREATE FUNCTION schedule_remove(schedule_name text) RETURNS SETOF schedules
LANGUAGE sql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
    DELETE FROM schedules WHERE name = schedule_name RETURNING *
$$;
REVOKE EXECUTE ON FUNCTION schedule_remove(text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION schedule_remove(text);
DROP TRIGGER schedules_changed ON schedules;
DROP FUNCTION schedules_changed();
DROP TABLE schedules;
DROP TRIGGER task_lock_follow ON tasks;
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
    stopped    bigint[];
BEGIN
    SELECT min(n.must_heartbeat_before) FILTER (WHERE n.state = 'running' AND n.started_at = now()),
           bool_or(n.state = 'pending' AND ((n.earlier_attempts -> -1 ->> 'ended_at')::timestamptz = now()
                                            OR n.scheduled_at = now())),
           bool_or(n.state IN ('done', 'dead', 'cancelled') AND n.processed_at = now()),
           array_agg(n.id) FILTER (WHERE n.state = 'cancelled' AND n.processed_at = now()
                                     AND n.earlier_attempts -> -1 ->> 'outcome' = 'cancelled'
                                     AND (n.earlier_attempts -> -1 ->> 'ended_at')::timestamptz = now())
    INTO claimed_by, requeued, finished, stopped
    FROM new_rows AS n;

    IF requeued THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    IF stopped IS NOT NULL THEN
        PERFORM pg_notify('leasehold_task', 'cancelled:' || s.id) FROM unnest(stopped) AS s (id);
    END IF;
    IF claimed_by IS NULL AND NOT finished THEN
        RETURN NULL; -- a heartbeat, or nothing
    END IF;
    watched := current_setting('transaction_isolation') <> 'read committed'
               OR NOT pg_try_advisory_xact_lock_shared(7810756277295999348)
               OR EXISTS (SELECT 1 FROM task_waiters WHERE all_changes);
    -- The look for a running task that expires sooner: see schema/0009.
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
DROP FUNCTION task_lock_follow();
DROP FUNCTION tasks_gated(text[], text[], integer);
DROP INDEX tasks_gated_due_idx;
DROP INDEX tasks_gated_idx;
DROP INDEX tasks_claim_idx;
CREATE INDEX tasks_claim_idx ON tasks (queue, kind, priority, scheduled_at, id) WHERE state = 'pending';
DROP INDEX tasks_schedule_tick_idx;
ALTER TABLE tasks DROP CONSTRAINT tasks_schedule_tick_check,
                  DROP COLUMN schedule_tick, DROP COLUMN schedule, DROP COLUMN lock_resource;
CREATE OR REPLACE FUNCTION task_branches(want_queues text[], want_kinds text[],
                              hint_queues text[], hint_kinds text[], hint_priorities smallint[],
                              hint_at timestamptz[], hint_ids bigint[])
RETURNS TABLE (queue text, kind text, priority smallint, after_at timestamptz, after_id bigint)
LANGUAGE plpgsql STABLE
ROWS 4
-- No SET clauses: its callers (tasks_claimable, tasks_next_due) have them,
-- and a function's own cost a claim a save and a restore of each setting.
AS $$
#variable_conflict use_column
DECLARE
    pair_queues text[];
    pair_kinds  text[];
    cur_q       text;
    cur_k       text;
    i           integer;
    j           integer;
    cursor_p    integer;
    known_p     smallint;
    known_at    timestamptz;
    known_id    bigint;
    found_p     smallint;
BEGIN
    -- The (queue, kind) pairs: those wanted, or those pending (a loose scan
    -- of the index's leading columns) where a list is NULL.
    IF want_queues IS NULL THEN
        WITH RECURSIVE qs (v) AS (
            (SELECT t.queue FROM tasks AS t WHERE t.state = 'pending' ORDER BY t.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT t.queue FROM tasks AS t WHERE t.state = 'pending' AND t.queue > qs.v ORDER BY t.queue LIMIT 1)
            FROM qs WHERE qs.v IS NOT NULL
        )
        SELECT array_agg(qs.v ORDER BY qs.v) INTO want_queues FROM qs WHERE qs.v IS NOT NULL;
    END IF;
    IF want_queues IS NULL THEN
        RETURN; -- nothing pending at all
    END IF;
    IF want_kinds IS NULL THEN
        SELECT array_agg(p.q ORDER BY p.q, p.k), array_agg(p.k ORDER BY p.q, p.k)
        INTO pair_queues, pair_kinds
        FROM (SELECT DISTINCT wq AS q FROM unnest(want_queues) AS wq) AS wqs (q)
        CROSS JOIN LATERAL (
            WITH RECURSIVE ks (v) AS (
                (SELECT t.kind FROM tasks AS t WHERE t.state = 'pending' AND t.queue = wqs.q ORDER BY t.kind LIMIT 1)
                UNION ALL
                SELECT (SELECT t.kind FROM tasks AS t
                        WHERE t.state = 'pending' AND t.queue = wqs.q AND t.kind > ks.v ORDER BY t.kind LIMIT 1)
                FROM ks WHERE ks.v IS NOT NULL
            )
            SELECT wqs.q, ks.v FROM ks WHERE ks.v IS NOT NULL
        ) AS p (q, k);
    ELSE
        -- Every pair once, in plain PL/pgSQL: a statement here would cost
        -- each claim more than the probes below (a claim of an idle
        -- worker waits for it).
        pair_queues := '{}';
        pair_kinds := '{}';
        FOR i IN 1 .. cardinality(want_queues) LOOP
            CONTINUE WHEN array_position(want_queues, want_queues[i]) < i;
            FOR j IN 1 .. cardinality(want_kinds) LOOP
                CONTINUE WHEN array_position(want_kinds, want_kinds[j]) < j;
                pair_queues := pair_queues || want_queues[i];
                pair_kinds := pair_kinds || want_kinds[j];
            END LOOP;
        END LOOP;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(pair_queues), 0) LOOP
        cur_q := pair_queues[i];
        cur_k := pair_kinds[i];
        cursor_p := -32769; -- below every smallint
        LOOP
            -- The next priority this claimer has a hint for, above the cursor
            -- (a loop, not a statement, for the same reason as above).
            known_p := NULL;
            FOR j IN 1 .. coalesce(cardinality(hint_queues), 0) LOOP
                IF hint_queues[j] = cur_q AND hint_kinds[j] = cur_k AND hint_priorities[j] > cursor_p
                   AND (known_p IS NULL OR hint_priorities[j] < known_p) THEN
                    known_p := hint_priorities[j];
                    known_at := hint_at[j];
                    known_id := hint_ids[j];
                END IF;
            END LOOP;
            -- A branch below it (or above the cursor, when there is none):
            -- bounded by known_p, the probe stops there.
            SELECT t.priority INTO found_p FROM tasks AS t
            WHERE t.state = 'pending' AND t.queue = cur_q AND t.kind = cur_k
              AND t.priority > cursor_p AND t.priority < coalesce(known_p::integer, 32768)
            ORDER BY t.priority
            LIMIT 1;
            IF FOUND THEN
                queue := cur_q; kind := cur_k; priority := found_p; after_at := '-infinity'; after_id := 0;
                RETURN NEXT;
                cursor_p := found_p;
            ELSIF known_p IS NOT NULL THEN
                queue := cur_q; kind := cur_k; priority := known_p; after_at := known_at; after_id := known_id;
                RETURN NEXT;
                cursor_p := known_p;
            ELSE
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
END;
$$;

-- tasks_claimable picks, locks (FOR UPDATE SKIP LOCKED) and returns up to
-- max_tasks due pending tasks of want_queues and want_kinds (NULL: all)
-- with the lowest (priority, scheduled_at, id), reading only their
-- branches' ranges of tasks_claim_idx (see task_branches for the hints).
-- With discover false, the branches are those of the hints alone, none is
-- looked for: the claims of a busy claimer between those that discover
-- (worker.Pool's, which discover at least once a second), which then cost
-- one index scan per branch and nothing more, as a claim from one queue
-- did before kinds and queues existed. The hints must then lie within
-- want_queues and want_kinds.
-- The claim that calls it joins its rows, locked for the rest of the
-- claim's transaction, and takes every one of them: a row it locked and
-- left would be skipped by a concurrent claim and then sit before that
-- claimer's hint.
--
-- Branches are taken in priority order. Within one priority, several
-- branches (kinds, queues) merge by (scheduled_at, id): a first read, with
-- no locks, of the first max_tasks due keys of each says how many of the
-- best max_tasks each holds; then each is locked for that many. Rows that
-- a concurrent claim holds are skipped, so the claim may come back with
-- fewer than asked while more are due (as any SKIP LOCKED claim may).
--
-- The SET clauses keep the planner on the index whatever the statistics
-- say (schema/0010); PL/pgSQL keeps each statement's plan for the session.
CREATE OR REPLACE FUNCTION tasks_claimable(want_queues text[], want_kinds text[], max_tasks integer,
                                hint_queues text[], hint_kinds text[], hint_priorities smallint[],
                                hint_at timestamptz[], hint_ids bigint[], discover boolean)
RETURNS TABLE (id bigint, priority smallint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    bq        text[];
    bk        text[];
    bp        smallint[];
    bat       timestamptz[];
    bid       bigint[];
    n         integer;
    lo        integer := 1;
    hi        integer;
    j         integer;
    left_over integer := max_tasks;
    got       integer;
    share     integer[];
BEGIN
    IF max_tasks IS NULL OR max_tasks < 1 THEN
        RETURN;
    END IF;
    IF discover OR coalesce(cardinality(hint_queues), 0) = 0 THEN
        SELECT array_agg(br.queue ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.kind ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.priority ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.after_at ORDER BY br.priority, br.queue, br.kind),
               array_agg(br.after_id ORDER BY br.priority, br.queue, br.kind)
        INTO bq, bk, bp, bat, bid
        FROM task_branches(want_queues, want_kinds, hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids) AS br;
    ELSIF cardinality(hint_queues) = 1 THEN
        -- One branch known, none to look for: the busy claimer's case.
        RETURN QUERY
        SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
        WHERE c.state = 'pending' AND c.queue = hint_queues[1] AND c.kind = hint_kinds[1] AND c.priority = hint_priorities[1]
          AND (c.scheduled_at, c.id) > (hint_at[1], hint_ids[1]) AND c.scheduled_at <= now()
        ORDER BY c.scheduled_at, c.id
        LIMIT max_tasks
        FOR UPDATE SKIP LOCKED;
        RETURN;
    ELSE
        -- The branches known from the hints, none looked for.
        SELECT array_agg(h.q ORDER BY h.p, h.q, h.k), array_agg(h.k ORDER BY h.p, h.q, h.k),
               array_agg(h.p ORDER BY h.p, h.q, h.k), array_agg(h.at ORDER BY h.p, h.q, h.k),
               array_agg(h.id ORDER BY h.p, h.q, h.k)
        INTO bq, bk, bp, bat, bid
        FROM unnest(hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids) AS h (q, k, p, at, id);
    END IF;
    n := coalesce(cardinality(bq), 0);
    -- One group of branches of equal priority at a time, lowest lo.
    WHILE lo <= n AND left_over > 0 LOOP
        hi := lo;
        WHILE hi < n AND bp[hi + 1] = bp[lo] LOOP
            hi := hi + 1;
        END LOOP;
        IF lo = hi THEN
            RETURN QUERY
            SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
            WHERE c.state = 'pending' AND c.queue = bq[lo] AND c.kind = bk[lo] AND c.priority = bp[lo]
              AND (c.scheduled_at, c.id) > (bat[lo], bid[lo]) AND c.scheduled_at <= now()
            ORDER BY c.scheduled_at, c.id
            LIMIT left_over
            FOR UPDATE SKIP LOCKED;
            GET DIAGNOSTICS got = ROW_COUNT;
            left_over := left_over - got;
        ELSE
            -- How many of the group's best left_over due tasks each branch
            -- holds, read without locks.
            SELECT array_agg(coalesce(best.c, 0) ORDER BY s.i) INTO share
            FROM generate_series(lo, hi) AS s (i)
            LEFT JOIN (
                SELECT x.i, count(*)::integer AS c FROM (
                    SELECT g.i, y.scheduled_at, y.id
                    FROM generate_series(lo, hi) AS g (i)
                    CROSS JOIN LATERAL (
                        SELECT c.scheduled_at, c.id FROM tasks AS c
                        WHERE c.state = 'pending' AND c.queue = bq[g.i] AND c.kind = bk[g.i] AND c.priority = bp[g.i]
                          AND (c.scheduled_at, c.id) > (bat[g.i], bid[g.i]) AND c.scheduled_at <= now()
                        ORDER BY c.scheduled_at, c.id
                        LIMIT left_over
                    ) AS y
                    ORDER BY y.scheduled_at, y.id
                    LIMIT left_over
                ) AS x
                GROUP BY x.i
            ) AS best ON best.i = s.i;
            FOR j IN lo .. hi LOOP
                CONTINUE WHEN share[j - lo + 1] = 0;
                RETURN QUERY
                SELECT c.id, c.priority, c.scheduled_at FROM tasks AS c
                WHERE c.state = 'pending' AND c.queue = bq[j] AND c.kind = bk[j] AND c.priority = bp[j]
                  AND (c.scheduled_at, c.id) > (bat[j], bid[j]) AND c.scheduled_at <= now()
                ORDER BY c.scheduled_at, c.id
                LIMIT share[j - lo + 1]
                FOR UPDATE SKIP LOCKED;
                GET DIAGNOSTICS got = ROW_COUNT;
                left_over := left_over - got;
            END LOOP;
        END IF;
        lo := hi + 1;
    END LOOP;
END;
$$;

-- tasks_next_due returns when the next pending task of want_queues and
-- want_kinds (NULL: all) falls due (NULL when none is pending): the least
-- first scheduled_at of their branches. An idle dispatcher sleeps until
-- then (a retry's backoff, a task scheduled for later).
CREATE OR REPLACE FUNCTION tasks_next_due(want_queues text[], want_kinds text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    due timestamptz;
BEGIN
    SELECT min(f.scheduled_at) INTO due
    FROM task_branches(want_queues, want_kinds, NULL, NULL, NULL, NULL, NULL) AS br
    CROSS JOIN LATERAL (
        SELECT c.scheduled_at FROM tasks AS c
        WHERE c.state = 'pending' AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
        ORDER BY c.scheduled_at, c.id
        LIMIT 1
    ) AS f;
    RETURN due;
END;
$$;

-- tasks_due is the claim of the previous release's replicas (schema/0010),
-- which run beside the new ones during a rolling upgrade: they run only the
-- demo's kind, so it now gives them only that kind's due tasks of the
-- default queue at priority 0 (one branch of tasks_claim_idx, in order),
-- never a task of a kind they cannot run.
CREATE OR REPLACE FUNCTION tasks_due(max_tasks integer)
RETURNS TABLE (id bigint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.id, c.scheduled_at FROM tasks AS c
    WHERE c.state = 'pending' AND c.queue = 'default' AND c.kind = 'sleep' AND c.priority = 0
      AND c.scheduled_at <= now()
    ORDER BY c.scheduled_at, c.id
    LIMIT max_tasks
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- Retention prunes cancelled tasks as it prunes done and dead ones
-- (prune_tasks as in schema/0007 otherwise).
CREATE OR REPLACE FUNCTION tasks_pending_summary(max_count integer)
RETURNS TABLE (queue text, kind text, pending bigint, oldest_due timestamptz)
LANGUAGE plpgsql STABLE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT br.queue, br.kind, least(sum(n.c), max_count)::bigint, min(f.scheduled_at)
    FROM task_branches(NULL, NULL, NULL, NULL, NULL, NULL, NULL) AS br
    CROSS JOIN LATERAL (
        SELECT count(*) AS c FROM (
            SELECT 1 FROM tasks AS c
            WHERE c.state = 'pending' AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
            LIMIT max_count
        ) AS l
    ) AS n
    LEFT JOIN LATERAL (
        SELECT c.scheduled_at FROM tasks AS c
        WHERE c.state = 'pending' AND c.queue = br.queue AND c.kind = br.kind AND c.priority = br.priority
          AND c.scheduled_at <= now()
        ORDER BY c.scheduled_at, c.id
        LIMIT 1
    ) AS f ON true
    GROUP BY br.queue, br.kind
    ORDER BY br.queue, br.kind;
END;
$$;
CREATE OR REPLACE FUNCTION leases_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    event_kind text;
    event_at   timestamptz;
    event_id   bigint;
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN
        event_kind := 'acquired';
        event_at := NEW.created_at;
    ELSIF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN
        event_kind := 'released';
        event_at := NEW.released_at;
    ELSIF NEW.expired_at IS NOT NULL AND OLD.expired_at IS NULL THEN
        event_kind := 'expired';
        event_at := NEW.expired_at;
    ELSIF NEW.renewed_at IS DISTINCT FROM OLD.renewed_at THEN
        event_kind := 'renewed';
        event_at := NEW.renewed_at;
    ELSE
        RETURN NULL;
    END IF;

    INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
    VALUES (event_at, NEW.id, NEW.resource, NEW.holder, NEW.fence, event_kind, NEW.expires_at)
    RETURNING id INTO event_id;

    PERFORM pg_notify('leasehold_lease', json_build_object(
        'id', NEW.id,
        'event_id', event_id,
        'resource', NEW.resource,
        'fence', NEW.fence,
        'kind', event_kind,
        'expires_at_ms', floor(extract(epoch FROM NEW.expires_at) * 1000)::bigint
    )::text);
    RETURN NULL;
END;
$$;
