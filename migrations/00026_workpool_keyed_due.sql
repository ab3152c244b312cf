-- +goose NO TRANSACTION
-- +goose Up
-- "Is any keyed work ready" (the loop's census, its keyed probes): one
-- probe in run_at order, not a walk of every keyed entry scheduled later.
-- Built CONCURRENTLY: a plain build holds every write to workpool_work —
-- the enqueues, starts and results of the replicas still running — for a
-- scan of the whole table, finished rows kept for retention included. An
-- index left by a build that failed (invalid, and skipped by the planner)
-- is dropped first: this runs only while version 26 is not recorded.
DROP INDEX CONCURRENTLY IF EXISTS workpool_work_pending_keyed_due;
CREATE INDEX CONCURRENTLY workpool_work_pending_keyed_due ON workpool_work (pool, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS workpool_work_pending_keyed_due;
