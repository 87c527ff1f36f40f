-- +goose Up

-- Keys of k slots: a limited resource (a semaphore). A key with a limit is
-- held through its slots, each a lease of its own named KEY#1 .. KEY#k,
-- with its own fence from the one sequence: a holder that lost its slot is
-- refused by whatever its fence guards, as any lease holder is. A slot's
-- lease is acquired, renewed, released and expires as every lease does, in
-- the leases table, and its history is the lease history.
--
-- lease_limits holds each key's limit. slots is what grants obey now;
-- span is the highest slot that may still be live, which is more than
-- slots only after the limit was lowered while slots above it were held:
-- those holders finish, and no slot is granted until fewer than slots are
-- live. Grants on a key take its row's lock, so that two cannot both see
-- the last slot free; renewals and releases never touch it.
--
-- A key may also have a rate: at most rate_starts task starts in any
-- rate_period, by the database clock. rate_recent holds the start times of
-- the key's last rate_starts tasks, oldest first, written by the claim that
-- starts them, under the row lock, in its own transaction: a task starts
-- only when fewer than rate_starts of them lie within the period before its
-- start, so no window of the period ever holds more, however many replicas
-- claim.
CREATE TABLE lease_limits (
    resource    text          PRIMARY KEY,
    slots       integer       NOT NULL CHECK (slots BETWEEN 1 AND 1000),
    span        integer       NOT NULL CHECK (span >= slots AND span <= 1000),
    updated_at  timestamptz   NOT NULL DEFAULT now(),
    rate_starts integer       CHECK (rate_starts BETWEEN 1 AND 1000),
    rate_period interval      CHECK (rate_period BETWEEN interval '1 second' AND interval '1 day'),
    rate_recent timestamptz[] NOT NULL DEFAULT '{}',
    CHECK ((rate_starts IS NULL) = (rate_period IS NULL))
);

-- lease_rate_next is when key's rate lets the next task start: NULL when
-- it lets one start now (or the key has no rate).
CREATE FUNCTION lease_rate_next(lim lease_limits, at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN lim.rate_starts IS NOT NULL
             AND cardinality(lim.rate_recent) >= lim.rate_starts
             AND lim.rate_recent[cardinality(lim.rate_recent) - lim.rate_starts + 1] > at - lim.rate_period
            THEN lim.rate_recent[cardinality(lim.rate_recent) - lim.rate_starts + 1] + lim.rate_period
       END;

-- The keys with a rate, which an idle claimer looks at (tasks_next_wake).
CREATE INDEX lease_limits_rated_idx ON lease_limits (resource) WHERE rate_starts IS NOT NULL;

-- Paused queues: their pending tasks are not claimed (their running ones
-- finish), until the pause is lifted or its until passes. Resuming wakes
-- the claimers at once; a pause with an until wakes them then, through
-- tasks_next_wake.
CREATE TABLE queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    until     timestamptz,
    reason    text        NOT NULL DEFAULT ''
);

-- queues_paused is the queues paused now.
CREATE FUNCTION queues_paused() RETURNS text[]
LANGUAGE sql STABLE
RETURN ARRAY(SELECT p.queue FROM queue_pauses AS p WHERE p.until IS NULL OR p.until > now());

-- queue_resume lifts queue's pause (it ends now; the row stays for the
-- next pause) and wakes the claimers; false when it was not paused.
CREATE FUNCTION queue_resume(q text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    UPDATE queue_pauses AS p SET until = now()
    WHERE p.queue = q AND (p.until IS NULL OR p.until > now());
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('leasehold_task', 'requeued');
    PERFORM pg_notify('leasehold_task', 'flow');
    RETURN true;
END;
$$;

-- queues_open is want_queues (NULL: every queue, here those with pending
-- tasks of want_kinds) less the queues paused.
CREATE FUNCTION queues_open(want_queues text[], want_kinds text[], paused text[]) RETURNS text[]
LANGUAGE sql STABLE
RETURN CASE WHEN want_queues IS NULL
            THEN ARRAY(SELECT DISTINCT br.queue
                       FROM task_branches(NULL, want_kinds, NULL, NULL, NULL, NULL, NULL) AS br
                       WHERE br.queue <> ALL (paused))
            ELSE ARRAY(SELECT q FROM unnest(want_queues) AS q WHERE q <> ALL (paused))
       END;

-- tasks_claim_pick is the claims' pick of due ungated tasks:
-- tasks_claimable (schema/0012) of the queues not paused. With
-- no pause (the usual case) it costs one probe of queue_pauses. With some,
-- want_queues (all: NULL) becomes the queues with pending tasks but the
-- paused ones, and hints of paused queues are dropped.
CREATE FUNCTION tasks_claim_pick(want_queues text[], want_kinds text[], max_tasks integer,
                                 hint_queues text[], hint_kinds text[], hint_priorities smallint[],
                                 hint_at timestamptz[], hint_ids bigint[], discover boolean)
RETURNS TABLE (id bigint, priority smallint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
AS $$
#variable_conflict use_column
DECLARE
    paused text[] := queues_paused();
BEGIN
    IF cardinality(paused) > 0 THEN
        want_queues := queues_open(want_queues, want_kinds, paused);
        IF cardinality(want_queues) = 0 THEN
            RETURN;
        END IF;
        SELECT array_agg(h.q ORDER BY h.i), array_agg(h.k ORDER BY h.i), array_agg(h.p ORDER BY h.i),
               array_agg(h.at ORDER BY h.i), array_agg(h.id ORDER BY h.i)
        INTO hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids
        FROM unnest(hint_queues, hint_kinds, hint_priorities, hint_at, hint_ids) WITH ORDINALITY AS h (q, k, p, at, id, i)
        WHERE h.q <> ALL (paused);
        hint_queues := coalesce(hint_queues, '{}');
        hint_kinds := coalesce(hint_kinds, '{}');
        hint_priorities := coalesce(hint_priorities, '{}');
        hint_at := coalesce(hint_at, '{}');
        hint_ids := coalesce(hint_ids, '{}');
    END IF;
    RETURN QUERY
    SELECT o.id, o.priority, o.scheduled_at
    FROM tasks_claimable(want_queues, want_kinds, max_tasks, hint_queues, hint_kinds, hint_priorities,
                         hint_at, hint_ids, discover) AS o;
END;
$$;

-- tasks_next_wake is when an idle claimer of want_queues and want_kinds
-- should look again: the next task to fall due in a queue not paused, the
-- end of a pause with an until, the moment a rate lets a waiting task of
-- its key start, whichever comes first.
CREATE FUNCTION tasks_next_wake(want_queues text[], want_kinds text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    paused text[] := queues_paused();
    due    timestamptz;
BEGIN
    IF cardinality(paused) > 0 THEN
        want_queues := queues_open(want_queues, want_kinds, paused);
    END IF;
    IF cardinality(want_queues) IS DISTINCT FROM 0 THEN
        due := tasks_next_due(want_queues, want_kinds);
    END IF;
    RETURN least(due,
                 (SELECT min(p.until) FROM queue_pauses AS p WHERE p.until > now()),
                 (SELECT min(lease_rate_next(ll, now())) FROM lease_limits AS ll
                  WHERE ll.rate_starts IS NOT NULL
                    AND EXISTS (SELECT 1 FROM tasks AS t
                                WHERE t.state = 'pending' AND t.lock_resource = ll.resource
                                  AND t.scheduled_at <= now())));
END;
$$;

-- A gated task's lease is found by its fence (task_lock_follow): a slot's
-- resource is not the task's lock. Fences change only on acquisition, so a
-- renewal stays a heap-only update.
CREATE INDEX leases_fence_idx ON leases (fence);

-- lease_slot_names is the resources of slots 1 .. n of key.
CREATE FUNCTION lease_slot_names(key text, n integer) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT key || '#' || i FROM generate_series(1, n) AS i ORDER BY i);

-- lease_take takes resource for holder for ttl seconds when its lease is
-- free (never leased, released or expired), as LeaseAcquire does, and
-- returns the lease; nothing when it is held. The holding begins when it
-- is taken (clock_timestamp(), a new row's too, not the transaction's
-- now()), with a fence drawn under the row lock.
CREATE FUNCTION lease_take(res text, holder text, ttl integer) RETURNS SETOF leases
LANGUAGE sql VOLATILE
ROWS 1
AS $$
INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at)
VALUES (res, holder, nextval('lease_fence_seq'), ttl, clock_timestamp(), clock_timestamp() + make_interval(secs => ttl))
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
RETURNING l.*
$$;

-- lease_slot_take grants one free slot of key to holder for ttl seconds
-- and returns its lease, or nothing when the key's slots are all held. The
-- caller holds the key's lease_limits row lock, and passes its slots and
-- span as read under it.
--   * A slot's holding begins when it is taken (clock_timestamp(), a new
--     row's too, not the transaction's now()): a rate counts that moment
--     as the task's start.
--   * With span = slots the slots are the only leases that can be live,
--     and each is taken over in its own row exactly as LeaseAcquire takes
--     a lease: at most slots holders by construction.
--   * With span > slots (the limit was lowered) the live slots are
--     counted first. A renewal is decided by its statement's start time,
--     so one begun before a slot's expiry could still renew it after the
--     count read it as free: the expired slots are marked expired first
--     (as the reaper would announce them), a write that such a renewal
--     waits for and then finds the slot gone. When no slot above the
--     limit is live any more, span comes down to slots.
CREATE FUNCTION lease_slot_take(key text, slots integer, span integer, holder text, ttl integer)
RETURNS SETOF leases
LANGUAGE plpgsql VOLATILE
ROWS 1
AS $$
DECLARE
    live  integer;
    above integer;
    name  text;
    got   leases;
BEGIN
    IF span > slots THEN
        UPDATE leases AS l
        SET expired_at = now()
        WHERE l.resource = ANY (lease_slot_names(key, span))
          AND l.released_at IS NULL AND l.expired_at IS NULL AND l.expires_at <= now();
        SELECT count(*), count(*) FILTER (WHERE l.resource <> ALL (lease_slot_names(key, slots)))
        INTO live, above
        FROM leases AS l
        WHERE l.resource = ANY (lease_slot_names(key, span))
          AND l.released_at IS NULL AND l.expires_at > now();
        IF above = 0 THEN
            UPDATE lease_limits AS ll SET span = ll.slots WHERE ll.resource = key;
        END IF;
        IF live >= slots THEN
            RETURN;
        END IF;
    END IF;
    FOR i IN 1 .. slots LOOP
        name := key || '#' || i;
        -- A live slot is passed by with a read, not a row lock: its holder
        -- renews it undisturbed.
        CONTINUE WHEN EXISTS (SELECT 1 FROM leases AS l
                              WHERE l.resource = name AND l.released_at IS NULL AND l.expires_at > now());
        got := NULL;
        SELECT lt.* INTO got FROM lease_take(name, holder, ttl) AS lt;
        IF got.id IS NOT NULL THEN
            RETURN NEXT got;
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- lease_slot_acquire takes a slot of key for who, the acquisition of the
-- lease API with slots. want_slots, when given, is the key's limit if it
-- has none yet (a key's limit, once set, changes only by lease_limit_set).
-- One row comes back, shaped as LeaseAcquire's: the slot granted
-- (acquired), the slot who already holds (not acquired: an idempotent
-- retry), or, when every slot is held, the held slot that expires first
-- (not acquired, another holder's). No row: the key has no limit.
CREATE FUNCTION lease_slot_acquire(key text, who text, ttl integer, want_slots integer)
RETURNS TABLE (id bigint, resource text, holder text, fence bigint, ttl_seconds integer,
               created_at timestamptz, renewed_at timestamptz, released_at timestamptz,
               expires_at timestamptz, expired_at timestamptz, acquired boolean, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 1
AS $$
#variable_conflict use_column
DECLARE
    lim lease_limits;
    got leases;
BEGIN
    IF want_slots IS NOT NULL THEN
        INSERT INTO lease_limits AS ll (resource, slots, span) VALUES (key, want_slots, want_slots)
        ON CONFLICT (resource) DO NOTHING;
    END IF;
    SELECT ll.* INTO lim FROM lease_limits AS ll WHERE ll.resource = key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The holder's own live slot: an idempotent retry.
    RETURN QUERY
    SELECT l.id, l.resource, l.holder, l.fence, l.ttl_seconds, l.created_at, l.renewed_at,
           l.released_at, l.expires_at, l.expired_at, false, now()
    FROM leases AS l
    WHERE l.resource = ANY (lease_slot_names(key, lim.span)) AND l.holder = who
      AND l.released_at IS NULL AND l.expires_at > now()
    ORDER BY l.fence
    LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT t.* INTO got FROM lease_slot_take(key, lim.slots, lim.span, who, ttl) AS t;
    IF got.id IS NOT NULL THEN
        RETURN QUERY SELECT got.id, got.resource, got.holder, got.fence, got.ttl_seconds, got.created_at,
                            got.renewed_at, got.released_at, got.expires_at, got.expired_at, true, now();
        RETURN;
    END IF;
    RETURN QUERY
    SELECT l.id, l.resource, l.holder, l.fence, l.ttl_seconds, l.created_at, l.renewed_at,
           l.released_at, l.expires_at, l.expired_at, false, now()
    FROM leases AS l
    WHERE l.resource = ANY (lease_slot_names(key, lim.span))
      AND l.released_at IS NULL AND l.expires_at > now()
    ORDER BY l.expires_at
    LIMIT 1;
END;
$$;

-- lease_limit_status is each limited key with what the API shows of it:
-- its live slots, its pending tasks (counted up to 10,000), and its rate's
-- spend and next start.
CREATE VIEW lease_limit_status AS
SELECT ll.resource, ll.slots, ll.updated_at,
       (SELECT count(*) FROM leases AS l
        WHERE l.resource = ANY (lease_slot_names(ll.resource, ll.span))
          AND l.released_at IS NULL AND l.expires_at > now())::integer AS held,
       (SELECT count(*) FROM (SELECT 1 FROM tasks AS t
                              WHERE t.state = 'pending' AND t.lock_resource = ll.resource
                              LIMIT 10000) AS w)::integer AS waiting,
       coalesce(ll.rate_starts, 0)::integer AS rate_starts,
       coalesce(extract(epoch FROM ll.rate_period), 0)::integer AS rate_period_seconds,
       (SELECT count(*) FROM unnest(ll.rate_recent) AS r (at) WHERE r.at > now() - ll.rate_period)::integer AS rate_spent,
       lease_rate_next(ll, now()) AS rate_next
FROM lease_limits AS ll;

-- lease_limit_changed announces a change of key's limit or rate: it wakes
-- the claims of tasks waiting on the key (a new limit or rate may let them
-- start), and the dashboards (flow).
CREATE FUNCTION lease_limit_changed(key text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tasks AS t WHERE t.state = 'pending' AND t.lock_resource = key) THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    PERFORM pg_notify('leasehold_task', 'flow');
END;
$$;

-- lease_limit_set sets key's limit to slots. Raising it wakes the claims
-- of tasks waiting on the key at once; lowering it lets the holders above
-- it finish and grants no slot until fewer than slots are held.
CREATE FUNCTION lease_limit_set(key text, slots integer) RETURNS lease_limits
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    lim lease_limits;
BEGIN
    INSERT INTO lease_limits AS ll (resource, slots, span) VALUES (key, slots, slots)
    ON CONFLICT (resource) DO UPDATE
    SET slots = excluded.slots, span = greatest(ll.span, excluded.slots), updated_at = now()
    RETURNING ll.* INTO lim;
    PERFORM lease_limit_changed(key);
    RETURN lim;
END;
$$;

-- lease_rate_set gives key a rate of starts per period (NULL: none),
-- creating its limit with the most slots (lease.MaxSlots) when it has
-- none: a rate alone bounds how often its tasks start, not how many run.
-- It wakes the claims of tasks waiting on the key, which a new rate may
-- let start.
CREATE FUNCTION lease_rate_set(key text, starts integer, period interval) RETURNS lease_limits
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    lim lease_limits;
BEGIN
    INSERT INTO lease_limits AS ll (resource, slots, span, rate_starts, rate_period)
    VALUES (key, 1000, 1000, starts, period)
    ON CONFLICT (resource) DO UPDATE
    SET rate_starts = excluded.rate_starts, rate_period = excluded.rate_period, updated_at = now()
    RETURNING ll.* INTO lim;
    PERFORM lease_limit_changed(key);
    RETURN lim;
END;
$$;

-- A slot freed (released or expired) wakes the claimers when a task waits
-- on its key, as leases_changed does for an unlimited lock's lease. Its
-- WHEN is false for every other change of a lease.
CREATE FUNCTION lease_slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tasks AS t
               WHERE t.state = 'pending'
                 AND t.lock_resource = substring(NEW.resource FROM '^(.*)#[0-9]+$')) THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER lease_slot_freed
AFTER UPDATE ON leases
FOR EACH ROW
WHEN (((NEW.released_at IS NOT NULL AND OLD.released_at IS NULL)
       OR (NEW.expired_at IS NOT NULL AND OLD.expired_at IS NULL))
      AND NEW.resource LIKE '%#%')
EXECUTE FUNCTION lease_slot_freed();

-- task_lock_follow as in schema/0014, finding the lock's lease by its
-- fence: for a limited key that lease is a slot's.
CREATE OR REPLACE FUNCTION task_lock_follow() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 'running' OR NEW.fence IS DISTINCT FROM OLD.fence THEN
        UPDATE leases AS l
        SET released_at = least(clock_timestamp(), l.expires_at),
            expires_at  = least(clock_timestamp(), l.expires_at)
        WHERE l.fence = OLD.fence
          AND (l.resource = OLD.lock_resource OR starts_with(l.resource, OLD.lock_resource || '#'))
          AND l.released_at IS NULL AND l.expires_at > now();
    ELSIF NEW.must_heartbeat_before IS DISTINCT FROM OLD.must_heartbeat_before THEN
        UPDATE leases AS l
        SET renewed_at  = now(),
            ttl_seconds = NEW.ttl_seconds,
            expires_at  = NEW.must_heartbeat_before
        WHERE l.fence = NEW.fence
          AND (l.resource = NEW.lock_resource OR starts_with(l.resource, NEW.lock_resource || '#'))
          AND l.released_at IS NULL AND l.expired_at IS NULL AND l.expires_at > now();
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the lease of the lock % of task % under fence % is no longer held', NEW.lock_resource, NEW.id, NEW.fence
                USING ERRCODE = 'LH001';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- tasks_gated as in schema/0014, with limited keys, paused queues and
-- keys served in turn (gated_cursor): a
-- key with a limit grants as many of its tasks as it has free slots
-- (lease_slot_take) and its rate allows, each task's attempt the holding
-- of its slot, under the slot's fence. Its limit row is locked with SKIP
-- LOCKED: a key another claim is granting right now is passed by, and that
-- claim serves it; when it runs out of processors first, it announces
-- (requeued, at its commit) that the key may have more to start, so that
-- claimers that passed it by and went idle look again. A full key, or one
-- whose rate is spent, costs a claim its limit row and one read of its
-- slots, however many tasks wait on it. Tasks of paused queues are not
-- taken.
DROP FUNCTION tasks_gated(text[], text[], text[], integer);

-- gated_cursor is the key the last claim of gated tasks served: the next
-- begins after it and wraps round, so that keys are served in turn, and a
-- key early in name order with a long backlog does not take every worker
-- while keys after it wait.
CREATE TABLE gated_cursor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_key  text
);
INSERT INTO gated_cursor DEFAULT VALUES;

-- tasks_gated_pick locks (FOR UPDATE SKIP LOCKED) and returns, with its
-- TTL (ttl_default when it has none), up to n due pending tasks of the
-- lock key that a claim of want_queues and want_kinds may take: not of a
-- paused queue, not among taken; in (priority, scheduled_at, id) order,
-- which tasks_gated_idx gives.
CREATE FUNCTION tasks_gated_pick(key text, want_queues text[], want_kinds text[], paused text[],
                                 taken bigint[], n integer, ttl_default integer)
RETURNS TABLE (id bigint, ttl integer)
LANGUAGE sql VOLATILE
AS $$
SELECT c.id, coalesce(c.ttl_seconds, ttl_default) FROM tasks AS c
WHERE c.state = 'pending' AND c.lock_resource = key AND c.scheduled_at <= now()
  AND (want_queues IS NULL OR c.queue = ANY (want_queues))
  AND (want_kinds IS NULL OR c.kind = ANY (want_kinds))
  AND c.queue <> ALL (paused)
  AND c.id <> ALL (taken)
ORDER BY c.priority, c.scheduled_at, c.id
LIMIT n
FOR UPDATE SKIP LOCKED
$$;

-- rate_kept is the start times a rate of n starts keeps: the last n of
-- recent and starts, oldest first.
CREATE FUNCTION rate_kept(recent timestamptz[], starts timestamptz[], n integer) RETURNS timestamptz[]
LANGUAGE sql IMMUTABLE
RETURN ARRAY(SELECT r.at FROM (SELECT x.at FROM unnest(recent || starts) AS x (at) ORDER BY x.at DESC LIMIT n) AS r
             ORDER BY r.at);

CREATE FUNCTION tasks_gated(want_queues text[], want_kinds text[], processors text[], ttl_default integer)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
ROWS 1
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    cur        text;
    next       integer := 1;
    tid        bigint;
    ttl        integer;
    lim        lease_limits;
    slot       leases;
    paused     text[] := queues_paused();
    left_over  boolean := false;
    pivot      text := (SELECT c.last_key FROM gated_cursor AS c);
    wrapped    boolean := false;
    served     text;
    rec        record;
    free       text[];
    want       integer;
    p_ids      bigint[];
    p_ttls     integer[];
    starts     timestamptz[];
    -- The tasks claimed, assigned in one statement at the end.
    a_id       bigint[] := '{}';
    a_holder   text[] := '{}';
    a_fence    bigint[] := '{}';
    a_ttl      integer[] := '{}';
    a_start    timestamptz[] := '{}';
    a_expiry   timestamptz[] := '{}';
BEGIN
    IF coalesce(cardinality(processors), 0) = 0 THEN
        RETURN;
    END IF;
    -- The keys after the one the last claim served first, then from the
    -- first key round to it.
    -- (Two statements: an OR of the two cases would not bound the index
    -- scan, and a claim would read every pending gated task before pivot.)
    IF pivot IS NULL THEN
        SELECT t.lock_resource INTO cur FROM tasks AS t
        WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
        ORDER BY t.lock_resource LIMIT 1;
    ELSE
        SELECT t.lock_resource INTO cur FROM tasks AS t
        WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL AND t.lock_resource > pivot
        ORDER BY t.lock_resource LIMIT 1;
    END IF;
    WHILE next <= cardinality(processors) LOOP
        IF cur IS NULL AND pivot IS NOT NULL AND NOT wrapped THEN
            wrapped := true;
            SELECT t.lock_resource INTO cur FROM tasks AS t
            WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
            ORDER BY t.lock_resource LIMIT 1;
        END IF;
        EXIT WHEN cur IS NULL OR (wrapped AND cur > pivot);
        lim := NULL;
        IF EXISTS (SELECT 1 FROM lease_limits AS ll WHERE ll.resource = cur)
           -- A claim that could take none of the key's tasks (of other
           -- queues or kinds, or paused) leaves its row alone: holding it,
           -- it would make a claim that could pass the key by.
           AND (want_queues IS NULL AND want_kinds IS NULL AND cardinality(paused) = 0
                OR EXISTS (SELECT 1 FROM tasks AS c
                           WHERE c.state = 'pending' AND c.lock_resource = cur AND c.scheduled_at <= now()
                             AND (want_queues IS NULL OR c.queue = ANY (want_queues))
                             AND (want_kinds IS NULL OR c.kind = ANY (want_kinds))
                             AND c.queue <> ALL (paused))) THEN
            SELECT ll.* INTO lim FROM lease_limits AS ll WHERE ll.resource = cur FOR UPDATE SKIP LOCKED;
            -- Locked by another claim or acquisition: passed by (lim stays
            -- NULL). Out of starts for now: passed by too, before any of
            -- its tasks is read.
            IF lease_rate_next(lim, clock_timestamp()) IS NOT NULL THEN
                lim := NULL;
            END IF;
        END IF;
        IF lim.resource IS NOT NULL AND lim.span = lim.slots THEN
            -- The free slots, read once; as many tasks as they, the
            -- processors left and the rate allow, taken in one statement,
            -- their slots in another. Only claims and acquisitions that
            -- hold the key's row take its slots, so every free slot read
            -- here is this claim's to take.
            free := ARRAY(SELECT s.name FROM unnest(lease_slot_names(cur, lim.slots)) WITH ORDINALITY AS s (name, i)
                          WHERE NOT EXISTS (SELECT 1 FROM leases AS l
                                            WHERE l.resource = s.name AND l.released_at IS NULL AND l.expires_at > now())
                          ORDER BY s.i);
            want := least(cardinality(free), cardinality(processors) - next + 1);
            IF lim.rate_starts IS NOT NULL THEN
                -- The rate, decided by the clock now: the tasks start
                -- later (their slots' acquisitions), so no window ending
                -- at a start holds more than the rate allows.
                want := least(want, lim.rate_starts - (SELECT count(*) FROM unnest(lim.rate_recent) AS r (at)
                                                       WHERE r.at > clock_timestamp() - lim.rate_period)::integer);
            END IF;
            p_ids := '{}';
            p_ttls := '{}';
            IF want > 0 THEN
                SELECT coalesce(array_agg(pk.id), '{}'), coalesce(array_agg(pk.ttl), '{}') INTO p_ids, p_ttls
                FROM tasks_gated_pick(cur, want_queues, want_kinds, paused, a_id, want, ttl_default) AS pk;
            END IF;
            starts := '{}';
            IF cardinality(p_ids) > 0 THEN
                FOR rec IN
                    INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at)
                    SELECT s.name, s.holder, nextval('lease_fence_seq'), s.ttl, clock_timestamp(), clock_timestamp() + make_interval(secs => s.ttl)
                    FROM unnest(free[1:cardinality(p_ids)], processors[next:next + cardinality(p_ids) - 1], p_ttls) AS s (name, holder, ttl)
                    ON CONFLICT (resource) DO UPDATE
                    SET holder      = excluded.holder,
                        -- As LeaseAcquire: a fence drawn under the row lock,
                        -- a holding that begins after the previous one ended.
                        fence       = nextval('lease_fence_seq'),
                        ttl_seconds = excluded.ttl_seconds,
                        created_at  = clock_timestamp(),
                        renewed_at  = NULL,
                        released_at = NULL,
                        expired_at  = NULL,
                        expires_at  = clock_timestamp() + make_interval(secs => excluded.ttl_seconds)
                    WHERE l.released_at IS NOT NULL OR l.expires_at <= now()
                    RETURNING l.resource, l.holder, l.fence, l.ttl_seconds, l.created_at, l.expires_at
                LOOP
                    -- The task given the slot's place among those taken.
                    a_id := a_id || p_ids[array_position(free, rec.resource)];
                    a_holder := a_holder || rec.holder;
                    a_fence := a_fence || rec.fence;
                    a_ttl := a_ttl || rec.ttl_seconds;
                    a_start := a_start || rec.created_at;
                    a_expiry := a_expiry || rec.expires_at;
                    starts := starts || rec.created_at;
                END LOOP;
                next := next + cardinality(p_ids);
                IF cardinality(starts) > 0 THEN
                    served := cur;
                    IF lim.rate_starts IS NOT NULL THEN
                        UPDATE lease_limits AS ll SET rate_recent = rate_kept(lim.rate_recent, starts, lim.rate_starts)
                        WHERE ll.resource = cur;
                    END IF;
                END IF;
                -- Out of processors with the key perhaps able to start
                -- more: other claims passed it by while this one held it,
                -- and may be idle now.
                left_over := left_over OR next > cardinality(processors);
            END IF;
        ELSIF lim.resource IS NOT NULL THEN
            -- The limit was lowered below slots still held: one task at a
            -- time, each slot taken by lease_slot_take, which counts them.
            WHILE next <= cardinality(processors) LOOP
                SELECT pk.id, pk.ttl INTO tid, ttl
                FROM tasks_gated_pick(cur, want_queues, want_kinds, paused, a_id, 1, ttl_default) AS pk;
                EXIT WHEN NOT FOUND;
                EXIT WHEN lease_rate_next(lim, clock_timestamp()) IS NOT NULL;
                slot := NULL;
                SELECT s.* INTO slot FROM lease_slot_take(cur, lim.slots, lim.span, processors[next], ttl) AS s;
                EXIT WHEN slot.id IS NULL;
                -- The span may have come down to the limit.
                lim.span := (SELECT ll.span FROM lease_limits AS ll WHERE ll.resource = cur);
                IF lim.rate_starts IS NOT NULL THEN
                    lim.rate_recent := rate_kept(lim.rate_recent, ARRAY[slot.created_at], lim.rate_starts);
                    UPDATE lease_limits AS ll SET rate_recent = lim.rate_recent WHERE ll.resource = cur;
                END IF;
                a_id := a_id || tid;
                a_holder := a_holder || slot.holder;
                a_fence := a_fence || slot.fence;
                a_ttl := a_ttl || ttl;
                a_start := a_start || slot.created_at;
                a_expiry := a_expiry || slot.expires_at;
                next := next + 1;
                served := cur;
                left_over := left_over OR next > cardinality(processors);
            END LOOP;
        ELSIF lim.resource IS NULL AND NOT EXISTS (SELECT 1 FROM lease_limits AS ll WHERE ll.resource = cur)
              AND NOT EXISTS (SELECT 1 FROM leases AS l
                              WHERE l.resource = cur AND l.released_at IS NULL AND l.expires_at > now()) THEN
            -- A lock without a limit: its one lease, the key's own.
            SELECT pk.id, pk.ttl INTO tid, ttl
            FROM tasks_gated_pick(cur, want_queues, want_kinds, paused, a_id, 1, ttl_default) AS pk;
            IF FOUND THEN
                slot := NULL;
                SELECT lt.* INTO slot FROM lease_take(cur, processors[next], ttl) AS lt;
                IF slot.id IS NOT NULL THEN
                    a_id := a_id || tid;
                    a_holder := a_holder || slot.holder;
                    a_fence := a_fence || slot.fence;
                    a_ttl := a_ttl || ttl;
                    a_start := a_start || slot.created_at;
                    a_expiry := a_expiry || slot.expires_at;
                    next := next + 1;
                    served := cur;
                END IF;
            END IF;
        END IF;
        SELECT t.lock_resource INTO cur FROM tasks AS t
        WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL AND t.lock_resource > cur
        ORDER BY t.lock_resource LIMIT 1;
    END LOOP;
    IF left_over THEN
        -- Sent at commit, when the key's row is free again: the idle
        -- claimers look again.
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    IF served IS NOT NULL THEN
        -- The next claim begins after it. Passed by when another claim is
        -- moving it: the cursor is for fairness, not for safety.
        UPDATE gated_cursor AS c SET last_key = served
        WHERE c.singleton AND c.last_key IS DISTINCT FROM served
          AND c.singleton IN (SELECT l.singleton FROM gated_cursor AS l FOR UPDATE SKIP LOCKED);
    END IF;
    -- The assignment of TaskClaim, for every task claimed, in one
    -- statement: its attempt is the holding of its lock or slot, under
    -- that lease's fence.
    RETURN QUERY
    UPDATE tasks AS t
    SET state = 'running',
        processor = a.holder,
        fence = a.fence,
        ttl_seconds = a.ttl,
        attempts = t.attempts + 1,
        started_at = a.start,
        last_heartbeat_at = a.start,
        must_heartbeat_before = a.expiry
    FROM unnest(a_id, a_holder, a_fence, a_ttl, a_start, a_expiry) AS a (id, holder, fence, ttl, start, expiry)
    WHERE t.id = a.id
    RETURNING t.*;
END;
$$;

-- +goose Down
DROP FUNCTION tasks_next_wake(text[], text[]);
DROP FUNCTION tasks_claim_pick(text[], text[], integer, text[], text[], smallint[], timestamptz[], bigint[], boolean);
DROP FUNCTION queues_open(text[], text[], text[]);
DROP FUNCTION queue_resume(text);
DROP FUNCTION queues_paused();
DROP TABLE queue_pauses;
DROP FUNCTION lease_rate_set(text, integer, interval);
DROP FUNCTION tasks_gated(text[], text[], text[], integer);
DROP FUNCTION rate_kept(timestamptz[], timestamptz[], integer);
DROP FUNCTION tasks_gated_pick(text, text[], text[], text[], bigint[], integer, integer);
DROP TABLE gated_cursor;
-- schema/0014's.
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

CREATE OR REPLACE FUNCTION task_lock_follow() RETURNS trigger
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

DROP TRIGGER lease_slot_freed ON leases;
DROP FUNCTION lease_slot_freed();
DROP FUNCTION lease_limit_set(text, integer);
DROP FUNCTION lease_limit_changed(text);
DROP VIEW lease_limit_status;
DROP FUNCTION lease_slot_acquire(text, text, integer, integer);
DROP FUNCTION lease_slot_take(text, integer, integer, text, integer);
DROP FUNCTION lease_take(text, text, integer);
DROP FUNCTION lease_slot_names(text, integer);
DROP INDEX leases_fence_idx;
DROP FUNCTION lease_rate_next(lease_limits, timestamptz);
DROP TABLE lease_limits;
