-- +goose Up
-- Per pool, the orgs whose plain work (no concurrency key) may be pending,
-- each with a lower bound of its earliest run_at (docs/workpool.md § "Org
-- queues"), so that the fair pick reads a small table instead of walking
-- the pending index org by org — a probe that passes the index entries of
-- the org's started work before it reaches its queue's head. The invariant every
-- writer keeps: each pending plain item has its (pool, org) row here, with
-- head_at at or before the item's run_at. Enqueue and a result that makes
-- work pending again lower head_at (or insert the row); only the pool's
-- loop raises it or deletes the row, and only when no other transaction
-- touched the row since the snapshot it decided on.
CREATE TABLE workpool_org_queues (
    pool    text        NOT NULL,
    org_id  text        NOT NULL,
    head_at timestamptz NOT NULL,
    PRIMARY KEY (pool, org_id)
) WITH (fillfactor = 50); -- room on the page, so that moving a head is a HOT update

INSERT INTO workpool_org_queues (pool, org_id, head_at)
SELECT pool, org_id, min(run_at) FROM workpool_work
WHERE state = 'pending' AND concurrency_key IS NULL
GROUP BY pool, org_id;

-- +goose Down
DROP TABLE workpool_org_queues;
