-- +goose Up

-- tasks_next_wake: when an idle claimer of want_queues and want_kinds
-- should look again (the next task to fall due in a queue not paused, the
-- end of a pause with an until, the moment a rate lets a waiting task of
-- its key start), and now for a key whose rate lets a task start now, with
-- a free slot and a due task the claimer could take. An idle claimer asks
-- after a claim that found nothing, in a statement of its own: by then the
-- rate may let a start that the claim found spent, or the claim may have
-- read before another claimer's start committed, and nothing else would
-- wake it. A key whose slots are all held is left out (the release of a
-- slot wakes the claimers), and so is one whose waiting tasks the claimer
-- cannot take (of other queues, paused ones, or other kinds).
CREATE OR REPLACE FUNCTION tasks_next_wake(want_queues text[], want_kinds text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
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
$$;

-- +goose Down
CREATE OR REPLACE FUNCTION tasks_next_wake(want_queues text[], want_kinds text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
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
                 (SELECT min(lease_rate_next(ll, now())) FROM lease_limits AS ll
                  WHERE ll.rate_starts IS NOT NULL
                    AND EXISTS (SELECT 1 FROM tasks AS t
                                WHERE t.state = 'pending' AND t.lock_resource = ll.resource
                                  AND t.scheduled_at <= now())));
END;
$$;
