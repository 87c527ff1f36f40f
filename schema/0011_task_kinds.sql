-- +goose Up

-- Work of any kind (contract §6): a task has a kind (what code runs it), a
-- queue (which workers take it), a priority (lower runs first among due
-- tasks), an optional unique key, and may be cancelled. Every existing task
-- is the demo's: kind 'sleep', queue 'default', priority 0.
ALTER TABLE tasks
    ADD COLUMN kind       text     NOT NULL DEFAULT 'sleep'
                                   CHECK (octet_length(kind) BETWEEN 1 AND 255),
    ADD COLUMN queue      text     NOT NULL DEFAULT 'default'
                                   CHECK (octet_length(queue) BETWEEN 1 AND 255),
    ADD COLUMN priority   smallint NOT NULL DEFAULT 0,
    ADD COLUMN unique_key text     CHECK (octet_length(unique_key) BETWEEN 1 AND 255);

ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled'));

-- ttl_seconds, NULL until a task's first claim unless its insert asked
-- for one, is from now on the TTL the task's leases get: the insert's, or
-- the first claimer's default. (It was the running attempt's TTL, which
-- it still is.)

-- What a claim reads: the pending tasks of each (queue, kind, priority),
-- a "branch", in (scheduled_at, id) order, so that the due ones of a branch
-- are a prefix of its range and a claim of given kinds and queues reads
-- only their branches, whatever else is pending (tasks_claimable, below).
-- It replaces tasks_pending_idx (scheduled_at, id).
DROP INDEX tasks_pending_idx;
CREATE INDEX tasks_claim_idx ON tasks (queue, kind, priority, scheduled_at, id) WHERE state = 'pending';

-- A unique key is unique per kind among the tasks not cancelled, until
-- retention prunes them: an insert that names a key already taken inserts
-- nothing (ON CONFLICT DO NOTHING on this index).
CREATE UNIQUE INDEX tasks_unique_key_idx ON tasks (kind, unique_key)
    WHERE unique_key IS NOT NULL AND state <> 'cancelled';

-- The lists' filters (?state=&kind=&queue=, paged by id): an equality on
-- all three is a range of this index in id order; a list that names fewer
-- reads each (state, kind, queue) it may match the same way and merges them
-- (tasks_filtered). Running tasks are left out: they are few (one per busy
-- worker), tasks_running_idx finds them, and a claim, which makes a task
-- running, then writes no entry here. A completion writes one (the done
-- task's); an insert one more (the pending task's). That is what the
-- filters cost: a claim and a completion are not HOT updates (they change
-- state, which partial indexes name), so each writes an entry to every
-- index whose predicate the new row meets, whatever columns it changed.
CREATE INDEX tasks_filter_idx ON tasks (state, kind, queue, id) WHERE state <> 'running';

-- The cancelled tasks, newest first, for the dashboard (as tasks_dead_idx).
CREATE INDEX tasks_cancelled_idx ON tasks (processed_at DESC, id DESC) WHERE state = 'cancelled';

-- An attempt's entry of earlier_attempts now carries the error it ended
-- with ("error": the failure's, the cancellation's reason, or null), and
-- the outcomes are: "expired", "failed", "requeued" (handed back),
-- "snoozed" (the handler asked to run again later) and "cancelled".
CREATE FUNCTION task_attempt(t tasks, outcome text, error text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'processor', t.processor,
        'fence', t.fence,
        'started_at', t.started_at,
        'expires_at', t.must_heartbeat_before,
        'ended_at', now(),
        'outcome', outcome,
        'error', error))
$$;

-- The two-argument form stays for the replicas of the previous release,
-- which run beside the new ones during a rolling upgrade (docs/operations.md).
CREATE OR REPLACE FUNCTION task_attempt(t tasks, outcome text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT task_attempt(t, outcome, NULL)
$$;

-- tasks_changed as in schema/0009, and besides:
--   * cancelled is among the ends ('finished');
--   * "requeued" goes out too for a row made pending and due now (a retry
--     of a dead or cancelled task), not only for a row put back with its
--     attempt just appended;
--   * "cancelled:<id>" goes out for each running task cancelled (its
--     attempt appended with outcome cancelled), so that its worker, which
--     listens, stops it at once instead of at its next heartbeat.
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

-- task_branches returns the branches (queue, kind, priority) that have
-- pending tasks among want_queues and want_kinds (NULL: every queue, every
-- kind), in (queue, kind, priority) order, each with the claimer's hint for
-- it: the (scheduled_at, id) of the last task it claimed there, given in the
-- hint_* arrays (element i of each names one branch and its hint), or
-- ('-infinity', 0).
--
-- Why hints. A claim moves tasks out of the pending index's ranges only
-- logically: their entries stay, dead, at the head of each branch until
-- VACUUM removes them, and a scan for the first live entry walks every one
-- of them. While a queue drains a backlog that walk grows with each claim
-- (measured: 250,000 tasks claimed since the last vacuum cost each claim of
-- 100 tasks 964 index pages, 1.4 ms). A claimer that starts each branch's
-- scan after the last task it took there skips the walk. A hint is only a
-- shortcut: a pending task may sit before it (an insert that committed
-- late, a lapsed task put back at its old schedule, one that a concurrent
-- statement held locked), so claimers also claim without hints now and then
-- (worker.Pool: when woken, when a hinted claim comes back short, and at
-- least once a second), and that claim sees everything.
--
-- Branches are found with as few probes of the index as there are branches:
-- a probe for the lowest priority between two known ones (or above the
-- last) is bounded, so it stops at the next branch without walking its
-- dead entries; only a branch this claimer has no hint for is searched from
-- its head.
CREATE FUNCTION task_branches(want_queues text[], want_kinds text[],
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
CREATE FUNCTION tasks_claimable(want_queues text[], want_kinds text[], max_tasks integer,
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
CREATE FUNCTION tasks_next_due(want_queues text[], want_kinds text[]) RETURNS timestamptz
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
CREATE OR REPLACE FUNCTION prune_tasks(age interval, batch integer, after_id bigint, ids bigint[],
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
           coalesce(array_agg(w.id) FILTER (WHERE w.state IN ('done', 'dead', 'cancelled') AND w.processed_at < cutoff), '{}'),
           min(w.id) FILTER (WHERE ids IS NULL AND w.created_at >= cutoff)
    INTO present, candidates, young
    FROM tasks AS w
    WHERE w.id = ANY (window_ids);

    WITH doomed AS (
        SELECT f.id, 'task:' || f.id AS resource
        FROM tasks AS f
        WHERE f.id = ANY (candidates)
          AND f.state IN ('done', 'dead', 'cancelled')
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

-- tasks_filtered returns up to row_limit tasks with an id after after_id,
-- in id order, of want_states, want_kinds and want_queues (NULL: any), and
-- when started only those ever claimed: the task lists of the API. With no
-- filter it walks the primary key. Otherwise it reads, for each (state,
-- kind, queue) the filters may match, that range of tasks_filter_idx from
-- after_id on, at most row_limit entries each, and merges them: the
-- combinations are found by a loose scan of the index (one probe each), so
-- a list stays index-bound however many tasks the table holds. Running
-- tasks, which that index leaves out, come from tasks_running_idx, their
-- kind and queue read from the rows (one per busy worker).
CREATE FUNCTION tasks_filtered(want_states text[], want_kinds text[], want_queues text[],
                               started boolean, after_id bigint, row_limit integer)
RETURNS SETOF tasks
LANGUAGE plpgsql STABLE
ROWS 100
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    cs      text[] := '{}';
    ck      text[] := '{}';
    cq      text[] := '{}';
    st      text;
    k       text;
    sk      text[];
    skq     text[];
    running boolean;
BEGIN
    IF want_states IS NULL AND want_kinds IS NULL AND want_queues IS NULL THEN
        RETURN QUERY
        SELECT t.* FROM tasks AS t
        WHERE t.id > after_id AND (NOT started OR t.started_at IS NOT NULL)
        ORDER BY t.id
        LIMIT row_limit;
        RETURN;
    END IF;
    IF want_states IS NULL THEN
        want_states := ARRAY['cancelled', 'dead', 'done', 'pending', 'running'];
    END IF;
    running := 'running' = ANY (want_states);
    FOREACH st IN ARRAY want_states LOOP
        CONTINUE WHEN st = 'running';
        sk := want_kinds;
        IF sk IS NULL THEN
            sk := ARRAY(
                WITH RECURSIVE d (v) AS (
                    (SELECT t.kind FROM tasks AS t WHERE t.state <> 'running' AND t.state = st ORDER BY t.kind LIMIT 1)
                    UNION ALL
                    SELECT (SELECT t.kind FROM tasks AS t
                            WHERE t.state <> 'running' AND t.state = st AND t.kind > d.v ORDER BY t.kind LIMIT 1)
                    FROM d WHERE d.v IS NOT NULL
                )
                SELECT d.v FROM d WHERE d.v IS NOT NULL);
        END IF;
        FOREACH k IN ARRAY sk LOOP
            skq := want_queues;
            IF skq IS NULL THEN
                skq := ARRAY(
                    WITH RECURSIVE d (v) AS (
                        (SELECT t.queue FROM tasks AS t
                         WHERE t.state <> 'running' AND t.state = st AND t.kind = k ORDER BY t.queue LIMIT 1)
                        UNION ALL
                        SELECT (SELECT t.queue FROM tasks AS t
                                WHERE t.state <> 'running' AND t.state = st AND t.kind = k AND t.queue > d.v
                                ORDER BY t.queue LIMIT 1)
                        FROM d WHERE d.v IS NOT NULL
                    )
                    SELECT d.v FROM d WHERE d.v IS NOT NULL);
            END IF;
            cs := cs || array_fill(st, ARRAY[cardinality(skq)]);
            ck := ck || array_fill(k, ARRAY[cardinality(skq)]);
            cq := cq || skq;
        END LOOP;
    END LOOP;
    -- The state <> 'running' beside each equality lets the planner use the
    -- partial index with the state a parameter.
    RETURN QUERY
    SELECT x.* FROM (
        SELECT y.* FROM unnest(cs, ck, cq) AS c (s, k, q)
        CROSS JOIN LATERAL (
            SELECT t.* FROM tasks AS t
            WHERE t.state <> 'running' AND t.state = c.s AND t.kind = c.k AND t.queue = c.q AND t.id > after_id
              AND (NOT started OR t.started_at IS NOT NULL)
            ORDER BY t.id
            LIMIT row_limit
        ) AS y
        UNION ALL
        (SELECT r.* FROM tasks AS r
         WHERE running AND r.state = 'running' AND r.id > after_id
           AND (want_kinds IS NULL OR r.kind = ANY (want_kinds))
           AND (want_queues IS NULL OR r.queue = ANY (want_queues))
         ORDER BY r.id
         LIMIT row_limit)
    ) AS x
    ORDER BY x.id
    LIMIT row_limit;
END;
$$;

-- tasks_pending_summary counts the pending tasks of each (queue, kind), at
-- most max_count each (a count equal to it means "at least"), and returns
-- the scheduled_at of its longest-waiting due task (NULL when none is due):
-- the gauges that show a kind nobody works. One walk of each branch's
-- range, never of the whole table.
CREATE FUNCTION tasks_pending_summary(max_count integer)
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

-- +goose Down
DROP FUNCTION tasks_pending_summary(integer);
DROP FUNCTION tasks_filtered(text[], text[], text[], boolean, bigint, integer);
DROP FUNCTION tasks_next_due(text[], text[]);
DROP FUNCTION tasks_claimable(text[], text[], integer, text[], text[], smallint[], timestamptz[], bigint[], boolean);
DROP FUNCTION task_branches(text[], text[], text[], text[], smallint[], timestamptz[], bigint[]);
CREATE OR REPLACE FUNCTION prune_tasks(age interval, batch integer, after_id bigint, ids bigint[],
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
    WHERE c.state = 'pending' AND c.scheduled_at <= now()
    ORDER BY c.scheduled_at, c.id
    LIMIT max_tasks
    FOR UPDATE SKIP LOCKED;
END;
$$;

CREATE OR REPLACE FUNCTION task_attempt(t tasks, outcome text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'processor', t.processor,
        'fence', t.fence,
        'started_at', t.started_at,
        'expires_at', t.must_heartbeat_before,
        'ended_at', now(),
        'outcome', outcome))
$$;
DROP FUNCTION task_attempt(tasks, text, text);

DROP INDEX tasks_cancelled_idx;
DROP INDEX tasks_filter_idx;
DROP INDEX tasks_unique_key_idx;
DROP INDEX tasks_claim_idx;
CREATE INDEX tasks_pending_idx ON tasks (scheduled_at, id) WHERE state = 'pending';
DELETE FROM tasks WHERE state = 'cancelled';
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check CHECK (state IN ('pending', 'running', 'done', 'dead'));
ALTER TABLE tasks DROP COLUMN unique_key, DROP COLUMN priority, DROP COLUMN queue, DROP COLUMN kind;
