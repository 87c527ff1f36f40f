-- +goose Up

-- Task counts by state that cost the same at ten thousand tasks and at ten
-- million: counting the tasks table (what the stats did) reads every row,
-- and a busy queue keeps millions of finished tasks for its retention.
--
-- task_counts is a log of changes to the counts, one row per state a
-- statement changed, written by triggers on tasks in the statement that
-- made the change, so in its transaction: a count is exact at every
-- snapshot. Rows are only ever appended by the writers (no two writers
-- wait for one counter row); task_counts_fold, called by the elected
-- reaper about every second, folds them: the changes older than two
-- minutes into one row per state, the newer ones into one row per state
-- and second. So the table stays at a few hundred rows, and a read sums
-- them.
--
-- n is the change of the count of tasks in state; entered the tasks that
-- entered state (inserted in it, or moved into it), which the finished-in
-- the-last-minute figure sums; at the changing transaction's time (now()),
-- or for a folded row the second it stands for.
CREATE TABLE task_counts (
    state   text        NOT NULL,
    n       bigint      NOT NULL,
    entered bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);

-- Every fold deletes what it folds: vacuumed as soon as a thousand rows
-- are dead, so that a read scans little more than the live rows.
ALTER TABLE task_counts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

COMMENT ON TABLE task_counts IS
    'changes to the count of tasks by state, summed on read; written by the triggers on tasks, folded by task_counts_fold()';

-- The triggers and the fold run as their owner: the runtime role reads the
-- counts and cannot write them (docs/operations/least-privilege.sql).
CREATE FUNCTION task_counts_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO task_counts (state, n, entered)
    SELECT r.state, count(*), count(*) FROM new_rows AS r GROUP BY r.state;
    RETURN NULL;
END;
$$;

CREATE FUNCTION task_counts_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
BEGIN
    -- Only the rows whose state changed; a heartbeat changes none.
    INSERT INTO task_counts (state, n, entered)
    SELECT c.state, sum(c.n), sum(c.entered)
    FROM (SELECT o.state AS from_state, r.state AS to_state
          FROM new_rows AS r JOIN old_rows AS o ON o.id = r.id
          WHERE r.state <> o.state) AS m
    CROSS JOIN LATERAL (VALUES (m.from_state, -1, 0), (m.to_state, 1, 1)) AS c (state, n, entered)
    GROUP BY c.state
    HAVING sum(c.n) <> 0 OR sum(c.entered) <> 0;
    RETURN NULL;
END;
$$;

CREATE FUNCTION task_counts_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO task_counts (state, n, entered)
    SELECT r.state, -count(*), 0 FROM old_rows AS r GROUP BY r.state;
    RETURN NULL;
END;
$$;

CREATE FUNCTION task_counts_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM task_counts;
    RETURN NULL;
END;
$$;

-- What is in the table now is counted under a lock that keeps writers out
-- until the triggers are in place, so that no change is counted twice or
-- missed.
LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER task_counts_inserted
    AFTER INSERT ON tasks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_inserted();
CREATE TRIGGER task_counts_updated
    AFTER UPDATE ON tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_updated();
CREATE TRIGGER task_counts_deleted
    AFTER DELETE ON tasks REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_deleted();
CREATE TRIGGER task_counts_truncated
    AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_truncated();

INSERT INTO task_counts (state, n, entered, at)
SELECT t.state, count(*), 0, '-infinity' FROM tasks AS t GROUP BY t.state;

-- task_counts_bucket is the row a change folds into: its second while it
-- is younger than two minutes, then one row per state ('-infinity').
CREATE FUNCTION task_counts_bucket(at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN at < now() - interval '2 minutes' THEN '-infinity'::timestamptz
                ELSE date_trunc('second', at) END
$$;

-- task_counts_fold folds the changes into a row per state and bucket
-- (entered counts only in the buckets of seconds: it is summed over the
-- last minute only). Rows a writer appends meanwhile are not seen, and stay
-- for the next fold; two folds at once each fold only the rows it deleted.
-- When every state and bucket has one row already it writes nothing, so
-- that an idle database is not rewritten every second. It returns the rows
-- it folded.
CREATE FUNCTION task_counts_fold() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_catalog, pg_temp
AS $$
DECLARE
    folded bigint;
BEGIN
    PERFORM 1 FROM task_counts AS c
    GROUP BY c.state, task_counts_bucket(c.at)
    HAVING count(*) > 1
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM task_counts RETURNING state, n, entered, at
    ), kept AS (
        INSERT INTO task_counts (state, n, entered, at)
        SELECT g.state, sum(g.n), coalesce(sum(g.entered) FILTER (WHERE g.bucket > '-infinity'), 0), max(g.at)
        FROM (SELECT gone.*, task_counts_bucket(gone.at) AS bucket FROM gone) AS g
        GROUP BY g.state, g.bucket
        HAVING sum(g.n) <> 0 OR coalesce(sum(g.entered) FILTER (WHERE g.bucket > '-infinity'), 0) <> 0
        RETURNING 1
    )
    SELECT count(*) INTO folded FROM gone;
    RETURN folded;
END;
$$;

-- Not PUBLIC's to execute: the trigger functions run only as triggers,
-- the fold for a role granted it.
REVOKE EXECUTE ON FUNCTION task_counts_inserted(), task_counts_updated(), task_counts_deleted(),
                           task_counts_truncated(), task_counts_fold() FROM PUBLIC;

-- +goose Down
DROP FUNCTION task_counts_fold();
DROP FUNCTION task_counts_bucket(timestamptz);
DROP TRIGGER task_counts_truncated ON tasks;
DROP TRIGGER task_counts_deleted ON tasks;
DROP TRIGGER task_counts_updated ON tasks;
DROP TRIGGER task_counts_inserted ON tasks;
DROP FUNCTION task_counts_truncated();
DROP FUNCTION task_counts_deleted();
DROP FUNCTION task_counts_updated();
DROP FUNCTION task_counts_inserted();
DROP TABLE task_counts;
