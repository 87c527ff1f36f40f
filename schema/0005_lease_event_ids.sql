-- +goose Up

-- Lease notifications carry the id of the event they announce, so that a
-- listener (the dashboard's hub) fetches exactly those events.
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

-- The history of everything but task leases, for the dashboard's feed:
-- task leases come and go by the thousand and have a view of their own.
CREATE INDEX lease_events_non_task_idx ON lease_events (id) WHERE resource NOT LIKE 'task:%';

-- +goose Down
DROP INDEX lease_events_non_task_idx;
CREATE OR REPLACE FUNCTION leases_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    event_kind text;
    event_at   timestamptz;
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
    VALUES (event_at, NEW.id, NEW.resource, NEW.holder, NEW.fence, event_kind, NEW.expires_at);

    PERFORM pg_notify('leasehold_lease', json_build_object(
        'id', NEW.id,
        'resource', NEW.resource,
        'fence', NEW.fence,
        'kind', event_kind,
        'expires_at_ms', floor(extract(epoch FROM NEW.expires_at) * 1000)::bigint
    )::text);
    RETURN NULL;
END;
$$;
