-- name: LeaseAcquire :batchone
-- LeaseAcquire takes the resource for the holder when it has no lease or its
-- lease was released or expired, with a new fence (acquired = true). When
-- someone holds a live lease on it, that lease comes back unchanged
-- (acquired = false). No row at all means the lease changed between the two
-- halves of the statement: the caller tries again. Every lease decision is
-- made by the database clock, now() in the statement.
WITH taken AS (
    INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, expires_at)
    VALUES (@resource, @holder, nextval('lease_fence_seq'), @ttl_seconds::integer,
            now() + make_interval(secs => @ttl_seconds::integer))
    ON CONFLICT (resource) DO UPDATE
    SET holder      = excluded.holder,
        -- A fence drawn now, under the row lock: one drawn when the
        -- statement began could be older than a fence another acquirer
        -- took while this one waited for the lock.
        fence       = nextval('lease_fence_seq'),
        ttl_seconds = excluded.ttl_seconds,
        -- clock_timestamp(), not now(): now() is when the statement began,
        -- which may be before the previous holder's release committed while
        -- this statement waited for its row lock. The new holding interval
        -- must begin after the old one ended.
        created_at  = clock_timestamp(),
        renewed_at  = NULL,
        released_at = NULL,
        expired_at  = NULL,
        expires_at  = clock_timestamp() + make_interval(secs => excluded.ttl_seconds)
    WHERE l.released_at IS NOT NULL OR l.expires_at <= now()
    RETURNING l.*
)
SELECT taken.id, taken.resource, taken.holder, taken.fence, taken.ttl_seconds,
       taken.created_at, taken.renewed_at, taken.released_at, taken.expires_at,
       taken.expired_at, true AS acquired, now()::timestamptz AS db_now
FROM taken
UNION ALL
SELECT cur.id, cur.resource, cur.holder, cur.fence, cur.ttl_seconds,
       cur.created_at, cur.renewed_at, cur.released_at, cur.expires_at,
       cur.expired_at, false AS acquired, now()::timestamptz AS db_now
FROM leases AS cur
WHERE cur.resource = @resource
  AND cur.released_at IS NULL
  AND cur.expires_at > now()
  AND NOT EXISTS (SELECT 1 FROM taken);

-- name: LeaseRenew :batchone
-- LeaseRenew extends the holder's live lease to now() + TTL (the lease's own
-- TTL unless a new one is given). A compare-and-set: no row back means the
-- holder does not hold it. A HOT update: no indexed column changes.
UPDATE leases
SET renewed_at  = now(),
    ttl_seconds = coalesce(sqlc.narg(ttl_seconds)::integer, ttl_seconds),
    expires_at  = now() + make_interval(secs => coalesce(sqlc.narg(ttl_seconds)::integer, ttl_seconds))
WHERE resource = @resource
  AND holder = @holder
  AND (sqlc.narg(fence)::bigint IS NULL OR fence = sqlc.narg(fence)::bigint)
  -- Neither released nor announced expired (once announced, it stays expired). Written as
  -- one test so that the reaper's partial index, whose predicate is these two, cannot be
  -- chosen over the resource's key: on statistics taken while the table was small it was,
  -- and every renewal read every live lease.
  AND coalesce(released_at, expired_at) IS NULL
  AND expires_at > now()
RETURNING *;

-- name: LeaseRelease :batchone
-- LeaseRelease ends the holder's live lease now; with an id, only that lease.
-- The row is locked before the time is taken: a statement holding it (a
-- fenced insert under this lease) commits first, and released_at must not
-- read earlier than that commit.
WITH locked AS (
    SELECT c.id FROM leases AS c
    WHERE c.resource = @resource
      AND c.holder = @holder
      AND (sqlc.narg(fence)::bigint IS NULL OR c.fence = sqlc.narg(fence)::bigint)
      AND (sqlc.narg(id)::bigint IS NULL OR c.id = sqlc.narg(id)::bigint)
      AND c.released_at IS NULL
      AND c.expires_at > now()
    FOR UPDATE
),
stamped AS (
    -- One reading of the clock per row, taken as the locked row comes out.
    SELECT locked.id, clock_timestamp() AS at FROM locked
)
UPDATE leases AS l
SET released_at = least(stamped.at, l.expires_at),
    expires_at  = least(stamped.at, l.expires_at)
FROM stamped
WHERE l.id = stamped.id
RETURNING l.*;

-- name: LeaseGet :one
-- LeaseGet returns one lease with its state by the database clock.
SELECT id, resource, holder, fence, ttl_seconds, created_at, renewed_at,
       released_at, expires_at, expired_at,
       (CASE WHEN released_at IS NOT NULL THEN 'released'
             WHEN expires_at > now() THEN 'active'
             ELSE 'expired' END)::text AS state
FROM leases
WHERE id = @id;

-- name: LeaseList :many
-- LeaseList pages through the leases in id order: all of them (state 'all')
-- or those active, expired, released, or ever renewed; resources starting
-- with prefix (all when it is empty).
SELECT id, resource, holder, fence, ttl_seconds, created_at, renewed_at,
       released_at, expires_at, expired_at,
       (CASE WHEN released_at IS NOT NULL THEN 'released'
             WHEN expires_at > now() THEN 'active'
             ELSE 'expired' END)::text AS state
FROM leases
WHERE id > @after_id
  AND starts_with(resource, @prefix::text)
  AND CASE @state::text
          WHEN 'active'   THEN released_at IS NULL AND expires_at > now()
          WHEN 'expired'  THEN released_at IS NULL AND expires_at <= now()
          WHEN 'released' THEN released_at IS NOT NULL
          WHEN 'renewed'  THEN renewed_at IS NOT NULL
          ELSE true
      END
ORDER BY id
LIMIT @row_limit;

-- name: LeaseEvents :many
-- LeaseEvents pages through the audit history in id order, of one resource
-- or of all when resource is empty.
SELECT * FROM lease_events
WHERE id > @after_id
  AND (@resource::text = '' OR resource = @resource::text)
ORDER BY id
LIMIT @row_limit;

-- name: LeaseMarkExpired :many
-- LeaseMarkExpired announces expiries: it marks up to batch_size leases
-- whose time ran out, so the trigger records and NOTIFYs each. Leases being
-- changed right now are skipped; the next pass takes them.
UPDATE leases
SET expired_at = now()
WHERE id IN (
        SELECT e.id FROM leases AS e
        WHERE e.released_at IS NULL
          AND e.expired_at IS NULL
          AND e.expires_at <= now()
        ORDER BY e.id
        LIMIT @batch_size
        FOR UPDATE SKIP LOCKED)
  AND released_at IS NULL
  AND expired_at IS NULL
  AND expires_at <= now()
RETURNING *;

-- name: LeaseNextExpiry :one
-- LeaseNextExpiry tells the reaper when the earliest unannounced expiry is
-- due (an hour from now when none is: any new lease arrives by NOTIFY), and
-- the database clock, so it can sleep on its own clock until then.
SELECT coalesce(min(expires_at), now() + interval '1 hour')::timestamptz AS next_expiry,
       now()::timestamptz AS db_now
FROM leases
WHERE released_at IS NULL
  AND expired_at IS NULL;

-- name: LeaseGetMany :many
-- LeaseGetMany returns the leases with the given ids, with their states.
SELECT id, resource, holder, fence, ttl_seconds, created_at, renewed_at,
       released_at, expires_at, expired_at,
       (CASE WHEN released_at IS NOT NULL THEN 'released'
             WHEN expires_at > now() THEN 'active'
             ELSE 'expired' END)::text AS state
FROM leases
WHERE id = ANY(@ids::bigint[])
ORDER BY id;

-- name: LeaseListNewest :many
-- LeaseListNewest returns the newest leases other than task leases (the
-- tasks show those), newest first: what a dashboard starts from.
SELECT id, resource, holder, fence, ttl_seconds, created_at, renewed_at,
       released_at, expires_at, expired_at,
       (CASE WHEN released_at IS NOT NULL THEN 'released'
             WHEN expires_at > now() THEN 'active'
             ELSE 'expired' END)::text AS state
FROM leases
WHERE NOT starts_with(resource, 'task:')
ORDER BY id DESC
LIMIT @row_limit;

-- name: LeaseEventsByIDs :many
-- LeaseEventsByIDs returns the events with the given ids, in id order.
SELECT * FROM lease_events
WHERE id = ANY(@ids::bigint[])
ORDER BY id;

-- name: LeaseEventsNonTask :many
-- LeaseEventsNonTask pages through the history of all but task leases
-- after an event id, oldest first.
SELECT * FROM lease_events
WHERE resource NOT LIKE 'task:%'
  AND id > @after_id
ORDER BY id
LIMIT @row_limit;

-- name: LeaseEventsNonTaskNewest :many
-- LeaseEventsNonTaskNewest returns the newest events of all but task
-- leases, newest first.
SELECT * FROM lease_events
WHERE resource NOT LIKE 'task:%'
ORDER BY id DESC
LIMIT @row_limit;

-- name: LeaseSlotAcquire :one
-- LeaseSlotAcquire takes a free slot of a limited key (lease_slot_acquire,
-- schema/0018): the slot granted (acquired), the holder's own live slot,
-- or when every slot is held the one that expires first. No row: the key
-- has no limit and none was given.
SELECT s.id::bigint AS id, s.resource::text AS resource, s.holder::text AS holder,
       s.fence::bigint AS fence, s.ttl_seconds::integer AS ttl_seconds,
       s.created_at::timestamptz AS created_at, s.renewed_at,
       s.released_at, s.expires_at::timestamptz AS expires_at,
       s.expired_at, s.acquired::boolean AS acquired, s.db_now::timestamptz AS db_now
FROM lease_slot_acquire(@resource::text, @holder::text, @ttl_seconds::integer, sqlc.narg(slots)::integer)
     AS s (id, resource, holder, fence, ttl_seconds, created_at, renewed_at, released_at, expires_at, expired_at, acquired, db_now);

-- name: LimitSet :one
-- LimitSet sets a key's limit (lease_limit_set).
SELECT l.resource, l.slots, l.span, l.updated_at FROM lease_limit_set(@resource::text, @slots::integer) AS l;

-- name: LimitSeed :exec
-- LimitSeed gives each key its limit unless it has one already: what
-- naming a limit with a task's lock does.
INSERT INTO lease_limits (resource, slots, span)
SELECT k.v, s.v, s.v
FROM unnest(@resources::text[]) WITH ORDINALITY AS k (v, i)
JOIN unnest(@slots::integer[]) WITH ORDINALITY AS s (v, i) ON s.i = k.i
ON CONFLICT (resource) DO NOTHING;

-- name: LimitList :many
-- LimitList is a page of the limited keys in name order
-- (lease_limit_status).
SELECT s.* FROM lease_limit_status AS s
WHERE s.resource > @after::text
ORDER BY s.resource
LIMIT @row_limit::integer;

-- name: LimitGet :one
-- LimitGet is one limited key, as LimitList.
SELECT s.* FROM lease_limit_status AS s
WHERE s.resource = @resource::text;

-- name: RateSet :exec
-- RateSet sets a key's rate, starts per period (NULL: none; lease_rate_set).
SELECT lease_rate_set(@resource::text, sqlc.narg(starts)::integer,
                      make_interval(secs => sqlc.narg(period_seconds)::integer)) IS NOT NULL AS set;
