-- +goose Up
-- Workpool v2 (issue 12): a slot is held by a running attempt and by nothing
-- else. The statement that records an attempt's result frees its slot and
-- decides the next state — finished, or pending again at its retry time —
-- so there are no pending completions for the loop to drain, no "retrying"
-- state and no separately released slots.

-- Failed attempts that waited for the loop to schedule their retry: pending
-- now (their backoff restarts from now); those canceled meanwhile get a
-- cancelation, which the loop finishes as canceled.
INSERT INTO workpool_cancelations (work_id, pool, org_id, created_at)
SELECT id, pool, org_id, now() FROM workpool_work WHERE state = 'retrying' AND canceled
ON CONFLICT (work_id) DO NOTHING;
UPDATE workpool_work SET state = 'pending', run_at = now() WHERE state = 'retrying';

DROP TABLE workpool_completions;
DROP INDEX workpool_work_retrying;
ALTER TABLE workpool_work DROP COLUMN slot_released;
ALTER TABLE workpool_work DROP CONSTRAINT workpool_work_state_check;
ALTER TABLE workpool_work ADD CONSTRAINT workpool_work_state_check CHECK (state IN ('pending', 'running', 'finished'));

-- +goose Down
ALTER TABLE workpool_work DROP CONSTRAINT workpool_work_state_check;
ALTER TABLE workpool_work ADD CONSTRAINT workpool_work_state_check CHECK (state IN ('pending', 'running', 'retrying', 'finished'));
ALTER TABLE workpool_work ADD COLUMN slot_released boolean NOT NULL DEFAULT false;
CREATE INDEX workpool_work_retrying ON workpool_work (pool, org_id) WHERE state = 'retrying';
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
CREATE INDEX workpool_completions_retry ON workpool_completions (pool) WHERE retry;
