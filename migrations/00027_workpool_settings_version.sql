-- +goose Up
-- Every settings change of a pool (UpdatePool: limits, pause, weights)
-- bumps it, so that a fair start whose snapshot predates a change that
-- committed while it waited for the pool row sees that it straddles one —
-- a change of weights alone leaves the row's other settings as they were.
-- (While the ALTER waits for the table's lock behind a transaction under
-- way, every enqueue queues behind it: it waits at most 100 ms, and Up
-- tries again a second later.)
SET LOCAL lock_timeout = '100ms';
ALTER TABLE workpool_pools ADD COLUMN settings_version bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE workpool_pools DROP COLUMN settings_version;
