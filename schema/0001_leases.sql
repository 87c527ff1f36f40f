-- +goose Up

-- One sequence hands out every fence, for every resource: a fence is
-- strictly greater than every fence handed out before it, anywhere.
CREATE SEQUENCE lease_fence_seq AS bigint;

-- One row per resource. Acquiring a free resource inserts its row or takes
-- over the released/expired one in place; renewing touches only columns
-- that no index covers (renewed_at, expires_at, ttl_seconds), so a renewal
-- is a heap-only (HOT) update. fillfactor leaves room on each page for it.
CREATE TABLE leases (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource    text        NOT NULL,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL,
    ttl_seconds integer     NOT NULL CHECK (ttl_seconds BETWEEN 1 AND 3600),
    created_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz,
    released_at timestamptz,
    expires_at  timestamptz NOT NULL,
    -- Set by the reaper when it announces the expiry; NULL while the lease is
    -- live or its expiry has not been announced yet. Never consulted for
    -- correctness: an expired lease is free whether or not it was marked.
    expired_at  timestamptz,
    CONSTRAINT leases_resource_key UNIQUE (resource)
) WITH (fillfactor = 70);

-- The leases whose expiry is still to be announced: what the reaper scans.
-- Neither the key nor the predicate names a column a renewal writes.
CREATE INDEX leases_unannounced_idx ON leases (id)
    WHERE released_at IS NULL AND expired_at IS NULL;

-- The audit history: append-only, written by the trigger below in the same
-- transaction as the change it records.
CREATE TABLE lease_events (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    lease_id   bigint      NOT NULL,
    resource   text        NOT NULL,
    holder     text        NOT NULL,
    fence      bigint      NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('acquired', 'renewed', 'released', 'expired')),
    -- The lease's expires_at after the change: with it the history alone
    -- gives every holding interval [acquired, min(released, expires_at)).
    expires_at timestamptz NOT NULL
);

CREATE INDEX lease_events_resource_idx ON lease_events (resource, id);

-- leases_changed records every change of a lease in lease_events and
-- announces it on the channel leasehold_lease with a small JSON payload
-- (a hint, never the data): id, resource, fence, kind and expires_at in
-- milliseconds since the epoch.
CREATE FUNCTION leases_changed() RETURNS trigger
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

CREATE TRIGGER leases_changed
    AFTER INSERT OR UPDATE ON leases
    FOR EACH ROW EXECUTE FUNCTION leases_changed();

-- +goose Down
DROP TABLE lease_events;
DROP TABLE leases;
DROP FUNCTION leases_changed();
DROP SEQUENCE lease_fence_seq;
