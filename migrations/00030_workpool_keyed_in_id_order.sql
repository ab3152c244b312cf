-- +goose NO TRANSACTION
-- +goose Up
-- A key's items start in run_at order and, among equal run_ats, in id
-- order (UUIDv7: the order they were enqueued, a batch's in the batch's
-- order). Ordered by run_at alone, ties went by where each row lay in the
-- table: a serial key's step handed back at a replica's stop (its row
-- rewritten) went behind its batch's others, which ran first. The keyed
-- index gains id so that the key's read stays an index range read.
-- Built CONCURRENTLY, as 00026: a plain build holds every write to
-- workpool_work for a scan of the whole table. An index left by a build
-- that failed (invalid) is dropped first.
DROP INDEX CONCURRENTLY IF EXISTS workpool_work_pending_keyed_id;
CREATE INDEX CONCURRENTLY workpool_work_pending_keyed_id ON workpool_work (pool, org_id, concurrency_key, run_at, id)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workpool_work_pending_keyed;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS workpool_work_pending_keyed ON workpool_work (pool, org_id, concurrency_key, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workpool_work_pending_keyed_id;
