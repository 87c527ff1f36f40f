-- The schema as the migrations in schema/ leave it: generated, do not edit.
-- Regenerate after a migration: go test ./schema -run TestLiveSchema -update

-- Tables

CREATE TABLE fence_epochs (
    system_identifier bigint NOT NULL,
    timeline integer NOT NULL,
    fence_floor bigint NOT NULL,
    advanced_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE gated_cursor (
    singleton boolean NOT NULL DEFAULT true,
    last_key text
);

CREATE TABLE generator_state (
    id integer NOT NULL DEFAULT 1,
    started boolean NOT NULL DEFAULT false,
    changed_at timestamp with time zone NOT NULL DEFAULT now(),
    changed_by text NOT NULL DEFAULT ''::text
);

CREATE TABLE instances (
    id text NOT NULL,
    addr text NOT NULL,
    roles text[] NOT NULL,
    version text NOT NULL,
    started_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE lease_events (
    id bigint NOT NULL,
    at timestamp with time zone NOT NULL DEFAULT now(),
    lease_id bigint NOT NULL,
    resource text NOT NULL,
    holder text NOT NULL,
    fence bigint NOT NULL,
    kind text NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE lease_limits (
    resource text NOT NULL,
    slots integer NOT NULL,
    span integer NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    rate_starts integer,
    rate_period interval,
    rate_recent timestamp with time zone[] NOT NULL DEFAULT '{}'::timestamp with time zone[]
);

CREATE TABLE leasehold_migrations (
    version bigint NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE leases (
    id bigint NOT NULL,
    resource text NOT NULL,
    holder text NOT NULL,
    fence bigint NOT NULL,
    ttl_seconds integer NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    renewed_at timestamp with time zone,
    released_at timestamp with time zone,
    expires_at timestamp with time zone NOT NULL,
    expired_at timestamp with time zone
);

CREATE TABLE queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone NOT NULL DEFAULT now(),
    until timestamp with time zone,
    reason text NOT NULL DEFAULT ''::text
);

CREATE TABLE retention_floor (
    singleton boolean NOT NULL DEFAULT true,
    min_age interval NOT NULL DEFAULT '00:01:00'::interval
);

CREATE TABLE schedules (
    id bigint NOT NULL,
    name text NOT NULL,
    cron text NOT NULL,
    zone text NOT NULL DEFAULT 'UTC'::text,
    kind text NOT NULL,
    task_data jsonb NOT NULL,
    queue text NOT NULL DEFAULT 'default'::text,
    priority smallint NOT NULL DEFAULT 0,
    unique_ticks boolean NOT NULL DEFAULT false,
    lock_resource text,
    max_attempts integer NOT NULL DEFAULT 5,
    ttl_seconds integer,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    next_tick_at timestamp with time zone NOT NULL,
    last_tick_at timestamp with time zone,
    last_task_id bigint,
    missed_ticks bigint NOT NULL DEFAULT 0,
    skipped_ticks bigint NOT NULL DEFAULT 0
);

CREATE TABLE task_counts (
    state text NOT NULL,
    n bigint NOT NULL,
    entered bigint NOT NULL,
    at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE task_waiters (
    pid integer NOT NULL,
    waiter text NOT NULL,
    since timestamp with time zone NOT NULL DEFAULT now(),
    all_changes boolean NOT NULL DEFAULT false
);

CREATE TABLE tasks (
    id bigint NOT NULL,
    task_data jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending'::text,
    scheduled_at timestamp with time zone NOT NULL DEFAULT now(),
    processor text,
    fence bigint,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 5,
    last_heartbeat_at timestamp with time zone,
    must_heartbeat_before timestamp with time zone,
    started_at timestamp with time zone,
    processed_at timestamp with time zone,
    task_output jsonb,
    last_error text,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    generator_fence bigint,
    ttl_seconds integer,
    earlier_attempts jsonb NOT NULL DEFAULT '[]'::jsonb,
    kind text NOT NULL DEFAULT 'sleep'::text,
    queue text NOT NULL DEFAULT 'default'::text,
    priority smallint NOT NULL DEFAULT 0,
    unique_key text,
    lock_resource text,
    schedule text,
    schedule_tick timestamp with time zone,
    metadata jsonb
);

-- Constraints

ALTER TABLE fence_epochs ADD CONSTRAINT fence_epochs_pkey PRIMARY KEY (system_identifier, timeline);

ALTER TABLE gated_cursor ADD CONSTRAINT gated_cursor_pkey PRIMARY KEY (singleton);

ALTER TABLE gated_cursor ADD CONSTRAINT gated_cursor_singleton_check CHECK (singleton);

ALTER TABLE generator_state ADD CONSTRAINT generator_state_id_check CHECK ((id = 1));

ALTER TABLE generator_state ADD CONSTRAINT generator_state_pkey PRIMARY KEY (id);

ALTER TABLE instances ADD CONSTRAINT instances_pkey PRIMARY KEY (id);

ALTER TABLE lease_events ADD CONSTRAINT lease_events_kind_check CHECK ((kind = ANY (ARRAY['acquired'::text, 'renewed'::text, 'released'::text, 'expired'::text])));

ALTER TABLE lease_events ADD CONSTRAINT lease_events_pkey PRIMARY KEY (id);

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_check CHECK (((span >= slots) AND (span <= 1000)));

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_check1 CHECK (((rate_starts IS NULL) = (rate_period IS NULL)));

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_pkey PRIMARY KEY (resource);

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_rate_period_check CHECK (((rate_period >= '00:00:01'::interval) AND (rate_period <= '1 day'::interval)));

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_rate_starts_check CHECK (((rate_starts >= 1) AND (rate_starts <= 1000)));

ALTER TABLE lease_limits ADD CONSTRAINT lease_limits_slots_check CHECK (((slots >= 1) AND (slots <= 1000)));

ALTER TABLE leasehold_migrations ADD CONSTRAINT leasehold_migrations_pkey PRIMARY KEY (version);

ALTER TABLE leases ADD CONSTRAINT leases_pkey PRIMARY KEY (id);

ALTER TABLE leases ADD CONSTRAINT leases_resource_key UNIQUE (resource);

ALTER TABLE leases ADD CONSTRAINT leases_ttl_seconds_check CHECK (((ttl_seconds >= 1) AND (ttl_seconds <= 3600)));

ALTER TABLE queue_pauses ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue);

ALTER TABLE retention_floor ADD CONSTRAINT retention_floor_min_age_check CHECK ((min_age >= '00:01:00'::interval));

ALTER TABLE retention_floor ADD CONSTRAINT retention_floor_pkey PRIMARY KEY (singleton);

ALTER TABLE retention_floor ADD CONSTRAINT retention_floor_singleton_check CHECK (singleton);

ALTER TABLE schedules ADD CONSTRAINT schedules_cron_check CHECK (((octet_length(cron) >= 1) AND (octet_length(cron) <= 255)));

ALTER TABLE schedules ADD CONSTRAINT schedules_kind_check CHECK (((octet_length(kind) >= 1) AND (octet_length(kind) <= 255)));

ALTER TABLE schedules ADD CONSTRAINT schedules_lock_resource_check CHECK (((octet_length(lock_resource) >= 1) AND (octet_length(lock_resource) <= 255)));

ALTER TABLE schedules ADD CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100)));

ALTER TABLE schedules ADD CONSTRAINT schedules_name_check CHECK (((octet_length(name) >= 1) AND (octet_length(name) <= 255)));

ALTER TABLE schedules ADD CONSTRAINT schedules_name_key UNIQUE (name);

ALTER TABLE schedules ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);

ALTER TABLE schedules ADD CONSTRAINT schedules_queue_check CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 255)));

ALTER TABLE schedules ADD CONSTRAINT schedules_ttl_seconds_check CHECK (((ttl_seconds >= 1) AND (ttl_seconds <= 3600)));

ALTER TABLE schedules ADD CONSTRAINT schedules_zone_check CHECK (((octet_length(zone) >= 1) AND (octet_length(zone) <= 255)));

ALTER TABLE task_waiters ADD CONSTRAINT task_waiters_pkey PRIMARY KEY (pid, waiter);

ALTER TABLE tasks ADD CONSTRAINT tasks_kind_check CHECK (((octet_length(kind) >= 1) AND (octet_length(kind) <= 255)));

ALTER TABLE tasks ADD CONSTRAINT tasks_lock_resource_check CHECK (((octet_length(lock_resource) >= 1) AND (octet_length(lock_resource) <= 255)));

ALTER TABLE tasks ADD CONSTRAINT tasks_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100)));

ALTER TABLE tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (id);

ALTER TABLE tasks ADD CONSTRAINT tasks_queue_check CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 255)));

ALTER TABLE tasks ADD CONSTRAINT tasks_schedule_check CHECK (((octet_length(schedule) >= 1) AND (octet_length(schedule) <= 255)));

ALTER TABLE tasks ADD CONSTRAINT tasks_schedule_tick_check CHECK (((schedule IS NULL) = (schedule_tick IS NULL)));

ALTER TABLE tasks ADD CONSTRAINT tasks_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'dead'::text, 'cancelled'::text])));

ALTER TABLE tasks ADD CONSTRAINT tasks_unique_key_check CHECK (((octet_length(unique_key) >= 1) AND (octet_length(unique_key) <= 255)));

-- Indexes (besides those of the constraints above)

CREATE INDEX lease_events_non_task_idx ON public.lease_events USING btree (id) WHERE (resource !~~ 'task:%'::text);

CREATE INDEX lease_events_resource_idx ON public.lease_events USING btree (resource, id);

CREATE INDEX lease_limits_rated_idx ON public.lease_limits USING btree (resource) WHERE (rate_starts IS NOT NULL);

CREATE INDEX leases_ended_idx ON public.leases USING btree (COALESCE(released_at, expired_at)) WHERE ((resource !~~ 'task:%'::text) AND ((released_at IS NOT NULL) OR (expired_at IS NOT NULL)));

CREATE INDEX leases_fence_idx ON public.leases USING btree (fence);

CREATE INDEX leases_unannounced_idx ON public.leases USING btree (id) WHERE ((released_at IS NULL) AND (expired_at IS NULL));

CREATE INDEX tasks_cancelled_idx ON public.tasks USING btree (processed_at DESC, id DESC) WHERE (state = 'cancelled'::text);

CREATE INDEX tasks_claim_idx ON public.tasks USING btree (queue, kind, priority, scheduled_at, id) WHERE ((state = 'pending'::text) AND (lock_resource IS NULL));

CREATE INDEX tasks_dead_idx ON public.tasks USING btree (processed_at DESC, id DESC) WHERE (state = 'dead'::text);

CREATE INDEX tasks_filter_idx ON public.tasks USING btree (state, kind, queue, id) WHERE (state <> 'running'::text);

CREATE INDEX tasks_gated_due_idx ON public.tasks USING btree (scheduled_at) WHERE ((state = 'pending'::text) AND (lock_resource IS NOT NULL));

CREATE INDEX tasks_gated_idx ON public.tasks USING btree (lock_resource, priority, scheduled_at, id) WHERE ((state = 'pending'::text) AND (lock_resource IS NOT NULL));

CREATE INDEX tasks_running_idx ON public.tasks USING btree (id) WHERE (state = 'running'::text);

CREATE UNIQUE INDEX tasks_schedule_tick_idx ON public.tasks USING btree (schedule, schedule_tick) WHERE (schedule IS NOT NULL);

CREATE UNIQUE INDEX tasks_unique_key_idx ON public.tasks USING btree (kind, unique_key) WHERE ((unique_key IS NOT NULL) AND (state <> 'cancelled'::text));

-- Sequences

CREATE SEQUENCE lease_events_id_seq;

CREATE SEQUENCE lease_fence_seq;

CREATE SEQUENCE leases_id_seq;

CREATE SEQUENCE schedules_id_seq;

CREATE SEQUENCE tasks_id_seq;

-- Functions

CREATE OR REPLACE FUNCTION public.fence_epoch_check()
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    sysid bigint;
    tl    integer;
    fl    bigint;
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN NULL;
    END IF;
    SELECT s.system_identifier INTO sysid FROM pg_control_system() AS s;
    -- The timeline WAL is written on now: the first 8 hex digits of the
    -- current WAL file's name (pg_control_checkpoint's is the last
    -- checkpoint's, which may predate the promotion).
    tl := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer;
    SELECT e.fence_floor INTO fl FROM fence_epochs AS e WHERE e.system_identifier = sysid AND e.timeline = tl;
    IF FOUND THEN
        RETURN fl;
    END IF;
    PERFORM pg_advisory_xact_lock(7810756277295999349); -- one above the waiters' key (schema/0008)
    SELECT e.fence_floor INTO fl FROM fence_epochs AS e WHERE e.system_identifier = sysid AND e.timeline = tl;
    IF FOUND THEN
        RETURN fl;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fence_epochs) THEN
        -- The first check of this database (a new one, or one upgraded
        -- from a release without the check): nothing to move past yet,
        -- the timeline is only noted.
        SELECT q.last_value INTO fl FROM lease_fence_seq AS q;
    ELSE
        fl := nextval('lease_fence_seq') + 1000000000;
        PERFORM setval('lease_fence_seq', fl);
    END IF;
    INSERT INTO fence_epochs (system_identifier, timeline, fence_floor) VALUES (sysid, tl, fl);
    RETURN fl;
END;
$function$

CREATE OR REPLACE FUNCTION public.fence_refused()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RAISE EXCEPTION 'the fence of % row % cannot become % (it was %): a fence only moves forward, to one lease_fence_seq handed out',
            TG_TABLE_NAME, NEW.id, coalesce(NEW.fence::text, 'NULL'),
            CASE WHEN TG_OP = 'UPDATE' THEN coalesce(OLD.fence::text, 'NULL') ELSE 'new' END
        USING ERRCODE = 'integrity_constraint_violation';
END;
$function$

CREATE OR REPLACE FUNCTION public.generator_state_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('leasehold_generator', CASE WHEN NEW.started THEN 'STARTED' ELSE 'STOPPED' END);
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.lease_limit_changed(key text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM tasks AS t WHERE t.state = 'pending' AND t.lock_resource = key) THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    PERFORM pg_notify('leasehold_task', 'flow');
END;
$function$

CREATE OR REPLACE FUNCTION public.lease_limit_set(key text, slots integer)
 RETURNS lease_limits
 LANGUAGE plpgsql
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.lease_rate_next(lim lease_limits, at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE
RETURN CASE WHEN (((lim).rate_starts IS NOT NULL) AND (cardinality((lim).rate_recent) >= (lim).rate_starts) AND ((lim).rate_recent[((cardinality((lim).rate_recent) - (lim).rate_starts) + 1)] > (at - (lim).rate_period))) THEN ((lim).rate_recent[((cardinality((lim).rate_recent) - (lim).rate_starts) + 1)] + (lim).rate_period) ELSE NULL::timestamp with time zone END

CREATE OR REPLACE FUNCTION public.lease_rate_set(key text, starts integer, period interval)
 RETURNS lease_limits
 LANGUAGE plpgsql
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.lease_slot_acquire(key text, who text, ttl integer, want_slots integer)
 RETURNS TABLE(id bigint, resource text, holder text, fence bigint, ttl_seconds integer, created_at timestamp with time zone, renewed_at timestamp with time zone, released_at timestamp with time zone, expires_at timestamp with time zone, expired_at timestamp with time zone, acquired boolean, db_now timestamp with time zone)
 LANGUAGE plpgsql
 ROWS 1
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.lease_slot_freed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM tasks AS t
               WHERE t.state = 'pending'
                 AND t.lock_resource = substring(NEW.resource FROM '^(.*)#[0-9]+$')) THEN
        PERFORM pg_notify('leasehold_task', 'requeued');
    END IF;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.lease_slot_names(key text, n integer)
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT ((lease_slot_names.key || '#'::text) || i.i) FROM generate_series(1, lease_slot_names.n) i(i) ORDER BY i.i)

CREATE OR REPLACE FUNCTION public.lease_slot_take(key text, slots integer, span integer, holder text, ttl integer)
 RETURNS SETOF leases
 LANGUAGE plpgsql
 ROWS 1
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.lease_take(res text, holder text, ttl integer)
 RETURNS SETOF leases
 LANGUAGE sql
 ROWS 1
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.leases_changed()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
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
    event_at := greatest(least(event_at, clock_timestamp()), now());

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
$function$

CREATE OR REPLACE FUNCTION public.prune_lease_events(age interval, batch integer, after_id bigint, OUT pruned bigint, OUT last_id bigint, OUT done boolean)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.prune_leases(age interval, batch integer)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.prune_tasks(age interval, batch integer, after_id bigint, ids bigint[], OUT pruned_tasks bigint, OUT pruned_leases bigint, OUT last_id bigint, OUT done boolean, OUT kept bigint[])
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.queue_resume(q text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.queues_open(want_queues text[], want_kinds text[], paused text[])
 RETURNS text[]
 LANGUAGE sql
 STABLE
RETURN CASE WHEN (want_queues IS NULL) THEN ARRAY(SELECT DISTINCT br.queue FROM task_branches(NULL::text[], queues_open.want_kinds, NULL::text[], NULL::text[], NULL::smallint[], NULL::timestamp with time zone[], NULL::bigint[]) br(queue, kind, priority, after_at, after_id) WHERE (br.queue <> ALL (queues_open.paused))) ELSE ARRAY(SELECT q.q FROM unnest(queues_open.want_queues) q(q) WHERE (q.q <> ALL (queues_open.paused))) END

CREATE OR REPLACE FUNCTION public.queues_paused()
 RETURNS text[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN ARRAY(SELECT p.queue FROM queue_pauses AS p WHERE p.until IS NULL OR p.until > now());
END;
$function$

CREATE OR REPLACE FUNCTION public.rate_kept(recent timestamp with time zone[], starts timestamp with time zone[], n integer)
 RETURNS timestamp with time zone[]
 LANGUAGE sql
 IMMUTABLE
RETURN ARRAY(SELECT r.at FROM (SELECT x.at FROM unnest((rate_kept.recent || rate_kept.starts)) x(at) ORDER BY x.at DESC LIMIT rate_kept.n) r ORDER BY r.at)

CREATE OR REPLACE FUNCTION public.retention_check(age interval, batch integer, after_id bigint DEFAULT 0)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    floor_age interval := coalesce((SELECT f.min_age FROM retention_floor AS f), interval '1 minute');
BEGIN
    IF age IS NULL OR age < floor_age THEN
        RAISE EXCEPTION 'retention age % is below the floor %', coalesce(age::text, 'NULL'), floor_age
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass an age of at least the floor (retention_floor.min_age, which the database owner sets); to keep rows forever, do not prune them';
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
$function$

CREATE OR REPLACE FUNCTION public.schedule_remove(schedule_name text)
 RETURNS SETOF schedules
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
    DELETE FROM schedules WHERE name = schedule_name RETURNING *
$function$

CREATE OR REPLACE FUNCTION public.schedules_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.updated_at = OLD.updated_at THEN
        PERFORM pg_notify('leasehold_schedule', 'ticked:' || NEW.name);
    ELSE
        PERFORM pg_notify('leasehold_schedule', 'changed:' || coalesce(NEW.name, OLD.name));
    END IF;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_attempt(t tasks, outcome text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
    SELECT task_attempt(t, outcome, NULL)
$function$

CREATE OR REPLACE FUNCTION public.task_attempt(t tasks, outcome text, error text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
    SELECT jsonb_build_array(jsonb_build_object(
        'processor', t.processor,
        'fence', t.fence,
        'started_at', t.started_at,
        'expires_at', t.must_heartbeat_before,
        'ended_at', now(),
        'outcome', outcome,
        'error', error))
$function$

CREATE OR REPLACE FUNCTION public.task_branches(want_queues text[], want_kinds text[], hint_queues text[], hint_kinds text[], hint_priorities smallint[], hint_at timestamp with time zone[], hint_ids bigint[])
 RETURNS TABLE(queue text, kind text, priority smallint, after_at timestamp with time zone, after_id bigint)
 LANGUAGE plpgsql
 STABLE ROWS 4
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.task_counts_bucket(at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN at < now() - interval '2 minutes' THEN '-infinity'::timestamptz
                ELSE date_trunc('second', at) END
$function$

CREATE OR REPLACE FUNCTION public.task_counts_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO task_counts (state, n, entered)
    SELECT r.state, -count(*), 0 FROM old_rows AS r GROUP BY r.state;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_counts_fold()
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    folded bigint;
BEGIN
    PERFORM 1 FROM task_counts AS c
    GROUP BY c.state, task_counts_bucket(c.at)
    HAVING count(*) > 1
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM task_counts RETURNING state, n, entered, at
    ), kept AS (
        INSERT INTO task_counts (state, n, entered, at)
        SELECT g.state, sum(g.n), coalesce(sum(g.entered) FILTER (WHERE g.bucket > '-infinity'), 0), max(g.at)
        FROM (SELECT gone.*, task_counts_bucket(gone.at) AS bucket FROM gone) AS g
        GROUP BY g.state, g.bucket
        HAVING sum(g.n) <> 0 OR coalesce(sum(g.entered) FILTER (WHERE g.bucket > '-infinity'), 0) <> 0
        RETURNING 1
    )
    SELECT count(*) INTO folded FROM gone;
    RETURN folded;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_counts_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO task_counts (state, n, entered)
    SELECT r.state, count(*), count(*) FROM new_rows AS r GROUP BY r.state;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_counts_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    DELETE FROM task_counts;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_counts_updated()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    -- Only the rows whose state changed; a heartbeat changes none.
    INSERT INTO task_counts (state, n, entered)
    SELECT c.state, sum(c.n), sum(c.entered)
    FROM (SELECT o.state AS from_state, r.state AS to_state
          FROM new_rows AS r JOIN old_rows AS o ON o.id = r.id
          WHERE r.state <> o.state) AS m
    CROSS JOIN LATERAL (VALUES (m.from_state, -1, 0), (m.to_state, 1, 1)) AS c (state, n, entered)
    GROUP BY c.state
    HAVING sum(c.n) <> 0 OR sum(c.entered) <> 0;
    RETURN NULL;
END;
$function$

CREATE OR REPLACE FUNCTION public.task_lock_follow()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.task_next_lapse(wait_ms integer)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
 SET lock_timeout TO '1000'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.task_waiter_register(waiter_name text, listener_pid integer, all_changes boolean)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.task_waiter_unregister(waiter_name text, listener_pid integer)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    DELETE FROM task_waiters AS w
    WHERE w.pid = listener_pid
      AND (waiter_name IS NULL OR w.waiter = waiter_name);
END;
$function$

CREATE OR REPLACE FUNCTION public.task_waiters_barrier(wait_ms integer)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '1000'
AS $function$
BEGIN
    IF wait_ms IS NULL OR wait_ms NOT BETWEEN 1 AND 60000 THEN
        RAISE EXCEPTION 'barrier wait % ms is out of range', coalesce(wait_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass a wait between 1 and 60000 milliseconds';
    END IF;
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_xact_lock(7810756277295999348);
END;
$function$

CREATE OR REPLACE FUNCTION public.task_waiters_prune()
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM task_waiters AS w
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                      WHERE a.pid = w.pid AND a.datname = current_database());
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$function$

CREATE OR REPLACE FUNCTION public.tasks_changed()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_claim_pick(want_queues text[], want_kinds text[], max_tasks integer, hint_queues text[], hint_kinds text[], hint_priorities smallint[], hint_at timestamp with time zone[], hint_ids bigint[], discover boolean)
 RETURNS TABLE(id bigint, priority smallint, scheduled_at timestamp with time zone)
 LANGUAGE plpgsql
 ROWS 10
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_claimable(want_queues text[], want_kinds text[], max_tasks integer, hint_queues text[], hint_kinds text[], hint_priorities smallint[], hint_at timestamp with time zone[], hint_ids bigint[], discover boolean)
 RETURNS TABLE(id bigint, priority smallint, scheduled_at timestamp with time zone)
 LANGUAGE plpgsql
 ROWS 10
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_sort TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_due(max_tasks integer)
 RETURNS TABLE(id bigint, scheduled_at timestamp with time zone)
 LANGUAGE plpgsql
 ROWS 10
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_sort TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_filtered(want_states text[], want_kinds text[], want_queues text[], started boolean, after_id bigint, row_limit integer)
 RETURNS SETOF tasks
 LANGUAGE plpgsql
 STABLE ROWS 100
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_gated(want_queues text[], want_kinds text[], processors text[], ttl_default integer)
 RETURNS SETOF tasks
 LANGUAGE plpgsql
 ROWS 1
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_gated_pick(key text, want_queues text[], want_kinds text[], paused text[], taken bigint[], n integer, ttl_default integer)
 RETURNS TABLE(id bigint, ttl integer)
 LANGUAGE sql
AS $function$
SELECT c.id, coalesce(c.ttl_seconds, ttl_default) FROM tasks AS c
WHERE c.state = 'pending' AND c.lock_resource = key AND c.scheduled_at <= now()
  AND (want_queues IS NULL OR c.queue = ANY (want_queues))
  AND (want_kinds IS NULL OR c.kind = ANY (want_kinds))
  AND c.queue <> ALL (paused)
  AND c.id <> ALL (taken)
ORDER BY c.priority, c.scheduled_at, c.id
LIMIT n
FOR UPDATE SKIP LOCKED
$function$

CREATE OR REPLACE FUNCTION public.tasks_gated_waiting()
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET enable_sort TO 'off'
AS $function$
BEGIN
    PERFORM t.scheduled_at FROM tasks AS t
    WHERE t.state = 'pending' AND t.lock_resource IS NOT NULL
    ORDER BY t.scheduled_at
    LIMIT 1;
    RETURN FOUND;
END;
$function$

CREATE OR REPLACE FUNCTION public.tasks_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_next_due(want_queues text[], want_kinds text[])
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

CREATE OR REPLACE FUNCTION public.tasks_next_wake(want_queues text[], want_kinds text[])
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
AS $function$
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
                 (SELECT min(coalesce(lease_rate_next(ll, now()), now())) FROM lease_limits AS ll
                  WHERE ll.rate_starts IS NOT NULL
                    AND cardinality(want_queues) IS DISTINCT FROM 0
                    AND EXISTS (SELECT 1 FROM tasks AS t
                                WHERE t.state = 'pending' AND t.lock_resource = ll.resource
                                  AND t.scheduled_at <= now()
                                  AND (want_queues IS NULL OR t.queue = ANY (want_queues))
                                  AND (want_kinds IS NULL OR t.kind = ANY (want_kinds)))
                    AND (lease_rate_next(ll, now()) IS NOT NULL
                         OR (SELECT count(*) FROM leases AS l
                             WHERE l.resource = ANY (lease_slot_names(ll.resource, ll.span))
                               AND l.released_at IS NULL AND l.expires_at > now()) < ll.slots)));
END;
$function$

CREATE OR REPLACE FUNCTION public.tasks_pending_summary(max_count integer)
 RETURNS TABLE(queue text, kind text, pending bigint, oldest_due timestamp with time zone)
 LANGUAGE plpgsql
 STABLE ROWS 10
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$

-- Triggers

CREATE TRIGGER generator_state_changed AFTER UPDATE ON public.generator_state FOR EACH ROW EXECUTE FUNCTION generator_state_changed();

CREATE TRIGGER lease_slot_freed AFTER UPDATE ON public.leases FOR EACH ROW WHEN (((((new.released_at IS NOT NULL) AND (old.released_at IS NULL)) OR ((new.expired_at IS NOT NULL) AND (old.expired_at IS NULL))) AND (new.resource ~~ '%#%'::text))) EXECUTE FUNCTION lease_slot_freed();

CREATE TRIGGER leases_changed AFTER INSERT OR UPDATE ON public.leases FOR EACH ROW EXECUTE FUNCTION leases_changed();

CREATE TRIGGER leases_fence_forward BEFORE UPDATE OF fence ON public.leases FOR EACH ROW WHEN (((new.fence IS DISTINCT FROM old.fence) AND ((new.fence IS NULL) OR (new.fence <= old.fence) OR (new.fence > COALESCE(pg_sequence_last_value('lease_fence_seq'::regclass), (0)::bigint))))) EXECUTE FUNCTION fence_refused();

CREATE TRIGGER leases_fence_issued BEFORE INSERT ON public.leases FOR EACH ROW WHEN ((new.fence > COALESCE(pg_sequence_last_value('lease_fence_seq'::regclass), (0)::bigint))) EXECUTE FUNCTION fence_refused();

CREATE TRIGGER schedules_changed AFTER INSERT OR DELETE OR UPDATE ON public.schedules FOR EACH ROW EXECUTE FUNCTION schedules_changed();

CREATE TRIGGER task_counts_deleted AFTER DELETE ON public.tasks REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION task_counts_deleted();

CREATE TRIGGER task_counts_inserted AFTER INSERT ON public.tasks REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION task_counts_inserted();

CREATE TRIGGER task_counts_truncated AFTER TRUNCATE ON public.tasks FOR EACH STATEMENT EXECUTE FUNCTION task_counts_truncated();

CREATE TRIGGER task_counts_updated AFTER UPDATE ON public.tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION task_counts_updated();

CREATE TRIGGER task_lock_follow AFTER UPDATE ON public.tasks FOR EACH ROW WHEN (((old.lock_resource IS NOT NULL) AND (old.state = 'running'::text))) EXECUTE FUNCTION task_lock_follow();

CREATE TRIGGER tasks_changed AFTER UPDATE ON public.tasks REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tasks_changed();

CREATE TRIGGER tasks_fence_forward BEFORE UPDATE OF fence ON public.tasks FOR EACH ROW WHEN (((new.fence IS DISTINCT FROM old.fence) AND ((new.fence IS NULL) OR (new.fence <= old.fence) OR (new.fence > COALESCE(pg_sequence_last_value('lease_fence_seq'::regclass), (0)::bigint))))) EXECUTE FUNCTION fence_refused();

CREATE TRIGGER tasks_fence_issued BEFORE INSERT ON public.tasks FOR EACH ROW WHEN (((new.fence IS NOT NULL) AND (new.fence > COALESCE(pg_sequence_last_value('lease_fence_seq'::regclass), (0)::bigint)))) EXECUTE FUNCTION fence_refused();

CREATE TRIGGER tasks_inserted AFTER INSERT ON public.tasks FOR EACH STATEMENT EXECUTE FUNCTION tasks_inserted();
