-- +goose Up
-- "Is any keyed work ready" (the loop's census, its keyed probes): one
-- probe in run_at order, not a walk of every keyed entry scheduled later.
CREATE INDEX workpool_work_pending_keyed_due ON workpool_work (pool, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;

-- +goose Down
DROP INDEX workpool_work_pending_keyed_due;
