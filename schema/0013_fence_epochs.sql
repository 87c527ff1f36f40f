-- +goose Up

-- Fences that never repeat, even when a failover loses transactions. With
-- asynchronous replication the promoted standby may not have received the
-- last fences the old primary handed out (nextval's WAL with them), and
-- its lease_fence_seq would hand the same numbers out again. So the first
-- session of leasehold on each timeline of each cluster (system
-- identifier) moves the sequence a margin past anything the old primary
-- could have handed out, once, before any lease is granted on it: the
-- replicas check on every new connection (fence_epoch_check), and a
-- promotion, which starts a new timeline, makes every connection new.
--
-- The margin, 10⁹, is more fences than the old primary could hand out in
-- the replication lag it may lose: at 30,000 fences a second (a busy
-- queue's claims, each drawing one), over nine hours of lag. A bigint
-- holds 9 × 10⁹ such advances.
CREATE TABLE fence_epochs (
    system_identifier bigint      NOT NULL,
    timeline          integer     NOT NULL,
    -- The sequence's value after the advance: every fence handed out on
    -- this timeline is above it.
    fence_floor       bigint      NOT NULL,
    advanced_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (system_identifier, timeline)
);

-- fence_epoch_check returns the fence floor of the cluster's current
-- timeline, advancing lease_fence_seq by the margin first when this is
-- the first check on it (once, whoever checks first: the advisory lock
-- makes the others wait and then find the row) and another timeline or
-- cluster was checked before (the very first check only notes it). NULL on a standby, where
-- nothing can be granted. It runs as its owner (the runtime role may not
-- setval the sequence) with its search_path pinned, and only the role it
-- is granted to may execute it.
CREATE FUNCTION fence_epoch_check() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION fence_epoch_check() FROM PUBLIC;

-- +goose Down
DROP FUNCTION fence_epoch_check();
DROP TABLE fence_epochs;
