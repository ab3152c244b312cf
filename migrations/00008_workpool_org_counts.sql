-- +goose Up
-- Per org and pool, an upper bound of the org's unfinished work there
-- (workpool/pending.go), so that enqueue can refuse work past the org's cap
-- (REVEILLE_ORG_MAX_PENDING) without counting rows: pending is the exact
-- count taken at counted_at plus everything enqueued since. Finishing work
-- does not touch it — a row every completion updated would serialise an
-- org's completions with its enqueues — so it only grows until the next
-- count, which an enqueue past the cap takes (at most once a second) and
-- the pool's leader takes every minute.
CREATE TABLE workpool_org_pending (
    pool       text        NOT NULL,
    org_id     text        NOT NULL,
    pending    bigint      NOT NULL,
    counted_at timestamptz NOT NULL,
    PRIMARY KEY (pool, org_id)
);
-- The leader's periodic count, stalest first.
CREATE INDEX workpool_org_pending_counted ON workpool_org_pending (pool, counted_at);

INSERT INTO workpool_org_pending (pool, org_id, pending, counted_at)
SELECT pool, org_id, count(*), now() FROM workpool_work WHERE state <> 'finished' GROUP BY pool, org_id;

-- +goose Down
DROP TABLE workpool_org_pending;
