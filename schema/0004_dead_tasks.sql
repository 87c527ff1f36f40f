-- +goose Up

-- The dead tasks, newest first, for the dashboard: few rows, and no column a
-- heartbeat writes, so heartbeats stay HOT.
CREATE INDEX tasks_dead_idx ON tasks (processed_at DESC, id DESC) WHERE state = 'dead';

-- +goose Down
DROP INDEX tasks_dead_idx;
