-- +goose Up

-- Task leases change with every claim and completion, thousands of times a
-- second under load. Announcing each one on leasehold_lease cost a
-- notification per row, parsed by every replica, and nobody needs most of
-- them. From here on a task lease's change is still recorded in
-- lease_events, but only its expiry (which makes the task claimable again)
-- is announced per lease. What happens to tasks is announced once per
-- statement on leasehold_task by the trigger below.
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

    -- at is the time the change took effect, as stored in the lease.
    INSERT INTO lease_events (at, lease_id, resource, holder, fence, kind, expires_at)
    VALUES (event_at, NEW.id, NEW.resource, NEW.holder, NEW.fence, event_kind, NEW.expires_at)
    RETURNING id INTO event_id;

    IF NEW.resource LIKE 'task:%' AND event_kind <> 'expired' THEN
        RETURN NULL; -- announced by tasks_changed, once per statement
    END IF;
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

-- tasks_changed announces, once per statement, what the statement did to
-- tasks' states and leases, on leasehold_task (besides "inserted"):
--   "claimed:<ms>"  tasks were claimed; <ms> is the earliest expiry of
--                   their new leases (epoch milliseconds), which the reaper
--                   must not sleep past;
--   "requeued"      tasks went back to pending (failed with a retry left,
--                   or handed back): workers look again;
--   "finished"      tasks ended done or dead.
-- A heartbeat changes neither state nor fence and announces nothing.
CREATE FUNCTION tasks_changed() RETURNS trigger
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

CREATE TRIGGER tasks_changed
    AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_changed();

-- +goose Down
DROP TRIGGER tasks_changed ON tasks;
DROP FUNCTION tasks_changed();
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
