-- +goose Up

-- The claim's pick of due tasks walks tasks_pending_idx in order, whatever
-- the table's statistics say.
--
-- The pick is "the first n pending tasks by (scheduled_at, id), FOR UPDATE
-- SKIP LOCKED": read in index order, it stops after n rows. But the
-- planner chooses by its statistics, and a queue's statistics are often
-- stale: analysed while the queue was empty, they promise a few pending
-- rows, so it plans a bitmap scan of every due row and a sort, which is
-- cheap for a few rows and ruinous for a burst. Measured: a burst of
-- 20,000 tasks right after the insert (before autovacuum's ANALYZE) made
-- each claim sort all 20,000 rows, 70 ms a statement instead of 3. So the
-- pick runs in a function that rules out the bitmap scan, the sequential
-- scan and the sort, which leaves the ordered index scan (and JIT, which
-- those penalties could otherwise set off). The claim calls it once and
-- joins its rows, locked by it for the rest of the claim's transaction.
-- It is PL/pgSQL rather than SQL so that its plan is kept for the session
-- (an SQL function with SET clauses is planned again at every call). ROWS tells
-- the planner to expect a batch, not a table: it then updates the picked
-- rows by their primary key instead of hashing the whole table to join
-- them (which it did at the default estimate of 1,000 rows).
CREATE FUNCTION tasks_due(max_tasks integer)
RETURNS TABLE (id bigint, scheduled_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.id, c.scheduled_at FROM tasks AS c
    WHERE c.state = 'pending' AND c.scheduled_at <= now()
    ORDER BY c.scheduled_at, c.id
    LIMIT max_tasks
    FOR UPDATE SKIP LOCKED;
END;
$$;

-- +goose Down
DROP FUNCTION tasks_due(integer);
