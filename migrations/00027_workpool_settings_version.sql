-- +goose Up
-- Every settings change of a pool (UpdatePool: limits, pause, weights)
-- bumps it, so that a fair start whose snapshot predates a change that
-- committed while it waited for the pool row sees that it straddles one —
-- a change of weights alone leaves the row's other settings as they were.
-- (waits at most 1 s for the table's lock: Up tries again, so that no
-- replica's enqueues queue behind a migration that waits for a transaction)
SET LOCAL lock_timeout = '1s';
ALTER TABLE workpool_pools ADD COLUMN settings_version bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE workpool_pools DROP COLUMN settings_version;
