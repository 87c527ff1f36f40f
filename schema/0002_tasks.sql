-- +goose Up

-- The task queue. A task's lease is a row of leases named 'task:<id>',
-- taken, renewed and released in the same statement that changes the task,
-- so the lease API shows it like any other and the reaper announces its
-- expiry like any other. fence, processor and must_heartbeat_before mirror
-- that lease; they are what the compare-and-set of heartbeat, complete and
-- fail checks.
CREATE TABLE tasks (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_data             jsonb       NOT NULL,
    state                 text        NOT NULL DEFAULT 'pending'
                                      CHECK (state IN ('pending', 'running', 'done', 'dead')),
    scheduled_at          timestamptz NOT NULL DEFAULT now(),
    processor             text,
    fence                 bigint,
    attempts              integer     NOT NULL DEFAULT 0,
    max_attempts          integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    last_heartbeat_at     timestamptz,
    must_heartbeat_before timestamptz,
    started_at            timestamptz,
    processed_at          timestamptz,
    task_output           jsonb,
    last_error            text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    -- The fence of the generator lease the task was inserted under; NULL
    -- for tasks inserted through the API.
    generator_fence       bigint
) WITH (fillfactor = 80);

-- What a claim looks at: pending tasks by schedule, and running ones (few:
-- at most one per worker) whose lease may have lapsed. Neither index names
-- a column a heartbeat writes, so heartbeats are HOT updates; finished
-- tasks leave both.
CREATE INDEX tasks_pending_idx ON tasks (scheduled_at, id) WHERE state = 'pending';
CREATE INDEX tasks_running_idx ON tasks (id) WHERE state = 'running';

-- tasks_inserted announces new tasks on leasehold_task, once per
-- statement: a batch insert wakes the workers once.
CREATE FUNCTION tasks_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_task', 'inserted');
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_inserted
    AFTER INSERT ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_inserted();

-- +goose Down
DROP TABLE tasks;
DROP FUNCTION tasks_inserted();
