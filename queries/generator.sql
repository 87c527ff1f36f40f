-- name: GeneratorGet :one
-- GeneratorGet returns the generator switch and the live generator lease,
-- if any: the same truth whichever replica asks.
SELECT g.started, g.changed_at, g.changed_by,
       l.holder AS holder, l.fence AS fence, l.expires_at AS lease_expires_at
FROM generator_state AS g
LEFT JOIN leases AS l
       ON l.resource = 'leasehold:generator'
      AND l.released_at IS NULL
      AND l.expires_at > now()
WHERE g.id = 1;

-- name: GeneratorSet :one
-- GeneratorSet starts or stops generation cluster-wide; the trigger
-- NOTIFYs every replica.
UPDATE generator_state
SET started = @started, changed_at = now(), changed_by = @changed_by
WHERE id = 1
RETURNING *;
