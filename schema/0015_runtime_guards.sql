-- +goose Up

-- What the runtime role (docs/least-privilege.sql) cannot do, whatever SQL
-- it sends: write the lease history itself, move a fence anywhere but
-- forward to one the sequence handed out, or prune history younger than the
-- floor the owner sets.

-- The lease history is written by leases_changed only, which now runs as
-- its owner: the runtime role needs no INSERT on lease_events (the grants
-- take it away), so it cannot add a row of its own. An event's time is
-- the change's, kept within the transaction that made it (from its start,
-- now(), to the moment of the trigger): an UPDATE that sets a release or a
-- renewal in the past is recorded when it happened. Every write of
-- leasehold's sets these times to now() or clock_timestamp() in its own
-- transaction, which the window holds.
CREATE OR REPLACE FUNCTION leases_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
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
$$;

-- Fences move forward only, to a value the sequence has handed out: a
-- fence set back (or to NULL) would let a stale holder's writes through
-- whatever checks it, and one set past the sequence would make the next
-- acquisition's fence smaller than it. The triggers' conditions are
-- evaluated for every row that sets a fence (each claim, each
-- acquisition), in C, without a function call; fence_refused runs only
-- when one is broken, and says so.
CREATE FUNCTION fence_refused() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'the fence of % row % cannot become % (it was %): a fence only moves forward, to one lease_fence_seq handed out',
            TG_TABLE_NAME, NEW.id, coalesce(NEW.fence::text, 'NULL'),
            CASE WHEN TG_OP = 'UPDATE' THEN coalesce(OLD.fence::text, 'NULL') ELSE 'new' END
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER leases_fence_forward
BEFORE UPDATE OF fence ON leases
FOR EACH ROW
WHEN (NEW.fence IS DISTINCT FROM OLD.fence
      AND (NEW.fence IS NULL OR NEW.fence <= OLD.fence
           OR NEW.fence > coalesce(pg_sequence_last_value('lease_fence_seq'), 0)))
EXECUTE FUNCTION fence_refused();

CREATE TRIGGER leases_fence_issued
BEFORE INSERT ON leases
FOR EACH ROW
WHEN (NEW.fence > coalesce(pg_sequence_last_value('lease_fence_seq'), 0))
EXECUTE FUNCTION fence_refused();

CREATE TRIGGER tasks_fence_forward
BEFORE UPDATE OF fence ON tasks
FOR EACH ROW
WHEN (NEW.fence IS DISTINCT FROM OLD.fence
      AND (NEW.fence IS NULL OR NEW.fence <= OLD.fence
           OR NEW.fence > coalesce(pg_sequence_last_value('lease_fence_seq'), 0)))
EXECUTE FUNCTION fence_refused();

CREATE TRIGGER tasks_fence_issued
BEFORE INSERT ON tasks
FOR EACH ROW
WHEN (NEW.fence IS NOT NULL AND NEW.fence > coalesce(pg_sequence_last_value('lease_fence_seq'), 0))
EXECUTE FUNCTION fence_refused();

-- The floor of retention: no prune deletes what is younger than min_age,
-- whoever calls it. The owner sets it (docs/least-privilege.sql sets a
-- week, the replicas' default retention) to the shortest retention the
-- replicas are configured with; the runtime role can read it, not change
-- it. A minute, the floor there always was, until the owner says more.
CREATE TABLE retention_floor (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    min_age   interval NOT NULL DEFAULT interval '1 minute' CHECK (min_age >= interval '1 minute')
);
INSERT INTO retention_floor DEFAULT VALUES;

-- retention_check as in schema/0007, its floor the table's.
CREATE OR REPLACE FUNCTION retention_check(age interval, batch integer, after_id bigint DEFAULT 0) RETURNS void
LANGUAGE plpgsql
SET search_path = public, pg_catalog, pg_temp
AS $$
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
$$;

-- +goose Down
-- schema/0007's retention_check.
CREATE OR REPLACE FUNCTION retention_check(age interval, batch integer, after_id bigint DEFAULT 0) RETURNS void
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
DROP TABLE retention_floor;
DROP TRIGGER tasks_fence_issued ON tasks;
DROP TRIGGER tasks_fence_forward ON tasks;
DROP TRIGGER leases_fence_issued ON leases;
DROP TRIGGER leases_fence_forward ON leases;
DROP FUNCTION fence_refused();
ALTER FUNCTION leases_changed() SECURITY INVOKER RESET search_path;
GRANT EXECUTE ON FUNCTION leases_changed() TO PUBLIC;
