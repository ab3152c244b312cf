-- +goose Up
-- workpool (SPEC §3): named pools with a live parallelism limit, work items,
-- and the two inboxes the pool's main loop drains (completions, cancelations).
-- Queries live in workpool/queries.go.

-- One row per pool. generation fences the main loop: every iteration bumps
-- it only if it still holds the value it read, so a stale leader writes
-- nothing. run_* is the loop's published status.
CREATE TABLE workpool_pools (
    name                    text        PRIMARY KEY,
    max_parallelism         integer     NOT NULL CHECK (max_parallelism BETWEEN 1 AND 10000),
    max_parallelism_per_org integer     CHECK (max_parallelism_per_org BETWEEN 1 AND 10000),
    generation              bigint      NOT NULL DEFAULT 0,
    run_kind                text        NOT NULL DEFAULT 'idle' CHECK (run_kind IN ('running', 'scheduled', 'idle')),
    run_saturated           boolean     NOT NULL DEFAULT false,
    run_at                  timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

-- Optional fair-share weights: an org with weight 2 gets two starts for every
-- one of a weight-1 org when work waits for slots.
CREATE TABLE workpool_org_weights (
    pool   text    NOT NULL,
    org_id text    NOT NULL,
    weight integer NOT NULL CHECK (weight BETWEEN 1 AND 100),
    PRIMARY KEY (pool, org_id)
);

-- A work item through its whole life. state:
--   pending  waiting for run_at and a free slot
--   running  given a slot by the loop; claimed_by is the executor running
--            it (null until one claims it), heartbeat_at its last sign of life
--   retrying an attempt failed and will be retried; the loop sets it
--            pending again (with backoff) once it has freed the slot
--   finished outcome, result/error and finished_at are set; kept for the
--            retention period, then purged
-- attempts counts finished attempts. A slot is held by every running item
-- whose slot is not released and by every unprocessed completion. The
-- columns an executor updates while the attempt runs (claimed_by,
-- heartbeat_at, slot_released) are in no index, so those updates stay on
-- their heap page.
CREATE TABLE workpool_work (
    id                  uuid             PRIMARY KEY,
    org_id              text             NOT NULL,
    pool                text             NOT NULL,
    handler             text             NOT NULL,
    args                jsonb            NOT NULL,
    state               text             NOT NULL CHECK (state IN ('pending', 'running', 'retrying', 'finished')),
    run_at              timestamptz      NOT NULL,
    attempts            integer          NOT NULL DEFAULT 0,
    max_attempts        integer          NOT NULL DEFAULT 1,
    initial_backoff_ms  integer          NOT NULL DEFAULT 0,
    backoff_base        double precision NOT NULL DEFAULT 2,
    timeout_ms          integer          NOT NULL,
    on_complete_hook    text,
    on_complete_context jsonb,
    concurrency_key     text,
    key_limit           integer,
    canceled            boolean          NOT NULL DEFAULT false,
    started_at          timestamptz,
    claimed_by          uuid,
    heartbeat_at        timestamptz,
    -- The attempt's handler returned and its slot was handed back (through
    -- a pending completion) before its result was durably recorded.
    slot_released       boolean          NOT NULL DEFAULT false,
    outcome             text             CHECK (outcome IN ('succeeded', 'failed', 'canceled')),
    result              jsonb,
    error               text,
    finished_at         timestamptz,
    -- onComplete bookkeeping: 'done' once the hook ran in a committed
    -- transaction, 'retry' while a failed call waits for hook_next_at.
    hook_state          text             CHECK (hook_state IN ('done', 'retry')),
    hook_attempts       integer          NOT NULL DEFAULT 0,
    hook_next_at        timestamptz,
    hook_error          text,
    created_at          timestamptz      NOT NULL
) WITH (fillfactor = 85);

-- Starts: ready work per org in run_at order (fair share walks the orgs).
CREATE INDEX workpool_work_pending ON workpool_work (pool, org_id, run_at)
    WHERE state = 'pending' AND concurrency_key IS NULL;
-- Keyed work waits per (org, key) in run_at order.
CREATE INDEX workpool_work_pending_keyed ON workpool_work (pool, org_id, concurrency_key, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;
-- Slots in use, recovery, per-org/per-key caps, and executors' claims (the
-- running set is small: at most the pools' limits).
CREATE INDEX workpool_work_active ON workpool_work (pool, org_id)
    WHERE state = 'running';
-- Failed attempts waiting for the loop to schedule their retry.
CREATE INDEX workpool_work_retrying ON workpool_work (pool, org_id)
    WHERE state = 'retrying';
-- Per-org reports and the retention purge.
CREATE INDEX workpool_work_finished ON workpool_work (pool, org_id, finished_at)
    WHERE state = 'finished';
-- Hook calls waiting to be retried.
CREATE INDEX workpool_work_hook_retry ON workpool_work (pool, hook_next_at)
    WHERE hook_state = 'retry';

-- A finished attempt that still holds its slot until the loop processes it;
-- retry says the loop must set the work pending again.
CREATE TABLE workpool_completions (
    pool       text        NOT NULL,
    id         bigint      GENERATED ALWAYS AS IDENTITY,
    work_id    uuid        NOT NULL,
    org_id     text        NOT NULL,
    attempt    integer     NOT NULL,
    outcome    text        NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'canceled')),
    retry      boolean     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, id)
);

-- A requested cancelation, at most one per work item.
CREATE TABLE workpool_cancelations (
    work_id    uuid        PRIMARY KEY,
    pool       text        NOT NULL,
    org_id     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workpool_cancelations_pool ON workpool_cancelations (pool, created_at);
-- The loop asks whether retries wait without scanning dead rows.
CREATE INDEX workpool_completions_retry ON workpool_completions (pool) WHERE retry;

-- +goose Down
DROP TABLE workpool_cancelations;
DROP TABLE workpool_completions;
DROP TABLE workpool_work;
DROP TABLE workpool_org_weights;
DROP TABLE workpool_pools;
