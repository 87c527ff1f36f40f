-- name: WaiterSessionPID :one
-- WaiterSessionPID is the backend pid of the session it runs on: run on a
-- LISTEN session, the pid that names it in task_waiters (schema/0008).
SELECT pg_backend_pid()::integer AS pid;

-- name: WaiterRegister :exec
-- WaiterRegister records that waiter waits for inserted tasks (with
-- all_changes, also for claims and completions) on the LISTEN session
-- listener_pid, so that those notify from now on, and deletes the rows of
-- sessions that have ended. WaiterBarrier comes next.
SELECT task_waiter_register(@waiter::text, @listener_pid::integer, @all_changes::boolean);

-- name: WaiterBarrier :exec
-- WaiterBarrier returns once every insert that may have missed the
-- registrations committed before it has committed; after wait_ms it fails
-- with lock_not_available (55P03) and may be tried again.
SELECT task_waiters_barrier(@wait_ms::integer);

-- name: WaiterUnregister :exec
-- WaiterUnregister deletes waiter's row on the session listener_pid, or
-- every row of that session when waiter is NULL.
SELECT task_waiter_unregister(sqlc.narg('waiter')::text, @listener_pid::integer);

-- name: WaiterPrune :one
-- WaiterPrune deletes the rows whose LISTEN session has ended and returns
-- how many.
SELECT task_waiters_prune()::bigint AS pruned;

-- name: WaiterList :many
-- WaiterList is every registered waiter, oldest first.
SELECT pid, waiter, since FROM task_waiters ORDER BY since, pid, waiter;
