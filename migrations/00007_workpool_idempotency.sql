-- +goose Up
-- Idempotency keys of enqueued work (workpool/): an enqueue that repeats a
-- key returns the first one's work id and enqueues nothing. A key lives
-- apart from its work record, so that it outlives the record's retention:
-- it is kept for at least 24 h (the loop's purge deletes it after
-- max(24 h, REVEILLE_WORK_RETENTION)). request_hash tells a repeat of the
-- same request from a different request under the same key.
CREATE TABLE workpool_idempotency_keys (
    org_id       text        NOT NULL,
    pool         text        NOT NULL,
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    work_id      uuid        NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (org_id, pool, key)
);
-- The purge, pool by pool, oldest first.
CREATE INDEX workpool_idempotency_keys_created ON workpool_idempotency_keys (pool, created_at);

-- +goose Down
DROP TABLE workpool_idempotency_keys;
