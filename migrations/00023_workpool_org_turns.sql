-- +goose Up
-- Fair share's memory (docs/workpool.md § "Fair share"): orgs take turns by
-- starts, so the pick must know how many starts each org has been charged
-- and where the pool's turns stand — a pool of one slot has no running work
-- to tell the orgs apart. Per pool and org, served is the starts charged so
-- far; per pool, the turn of the last fair start, a fraction turn_num /
-- turn_den. An org with no row, or one behind that turn (it had no ready
-- work while the others took theirs), joins at it: idle time earns no
-- credit. Charged only by the pool's loop, fenced by the pool's generation
-- (a plain start, one org's work with nothing to share, charges nothing);
-- a weight change deletes the org's row. The pick's order is in
-- docs/workpool.md § "Fair share".
CREATE TABLE workpool_org_turns (
    pool   text   NOT NULL,
    org_id text   NOT NULL,
    served bigint NOT NULL CHECK (served >= 0),
    PRIMARY KEY (pool, org_id)
) WITH (fillfactor = 50); -- room on the page: a charge is a HOT update

CREATE TABLE workpool_fair_clocks (
    pool     text   PRIMARY KEY,
    turn_num bigint NOT NULL CHECK (turn_num >= 0),
    turn_den bigint NOT NULL CHECK (turn_den >= 1)
) WITH (fillfactor = 50);

-- +goose Down
DROP TABLE workpool_fair_clocks;
DROP TABLE workpool_org_turns;
