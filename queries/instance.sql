-- name: InstanceRegister :exec
-- InstanceRegister records what a replica says about itself at start.
INSERT INTO instances (id, addr, roles, version, started_at)
VALUES (@id, @addr, @roles::text[], @version, now())
ON CONFLICT (id) DO UPDATE
SET addr = excluded.addr, roles = excluded.roles, version = excluded.version, started_at = excluded.started_at;

-- name: InstanceListLive :many
-- InstanceListLive lists the replicas that hold their instance lease:
-- leasehold:instance:<id>, or instance:<id> for a replica of the release
-- before the instance leases moved into the reserved namespace (they run
-- side by side through a rolling upgrade).
SELECT DISTINCT ON (i.id) i.id, i.addr, i.roles, i.version, i.started_at,
       coalesce(l.renewed_at, l.created_at)::timestamptz AS last_seen_at
FROM instances AS i
JOIN leases AS l ON l.resource IN ('leasehold:instance:' || i.id, 'instance:' || i.id)
WHERE l.released_at IS NULL
  AND l.expires_at > now()
ORDER BY i.id;
