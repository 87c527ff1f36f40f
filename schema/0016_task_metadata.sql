-- +goose Up

-- A task's metadata: small string pairs that travel with it from its insert
-- to each attempt's worker, beside its task_data, which is its handler's
-- input: a trace context (W3C traceparent, so that an attempt's span links
-- to the insert's), a tenant, a request id. NULL for none. A new column at
-- the end, with no default: adding it rewrites no row, and the statements of
-- replicas of the last release, which name their columns, go on working.
ALTER TABLE tasks ADD COLUMN metadata jsonb;

COMMENT ON COLUMN tasks.metadata IS
    'string pairs that travel with the task to its workers (a trace context, a tenant); NULL for none';
