-- +goose Up
-- Wake-up intents (wakeup/). state is the intent's own progress:
--   awaiting_approval → funded → enqueued → resolved
-- (awaiting_approval may also resolve directly: denied, expired, canceled).
-- The outcome is set once, when the intent resolves; the signal that carries
-- it is the queue message with idempotency key = the wake-up's id.
CREATE TABLE wakeups (
    id              uuid        PRIMARY KEY,
    org_id          text        NOT NULL,
    agent_id        text        NOT NULL,
    workflow_id     text        NOT NULL,
    run_id          text,
    signal          text        NOT NULL,
    scope           text        NOT NULL,
    reason          text        NOT NULL DEFAULT '',
    cost            bigint      NOT NULL CHECK (cost >= 0),
    pool            text        NOT NULL,
    work            jsonb       NOT NULL,
    state           text        NOT NULL CHECK (state IN ('awaiting_approval', 'funded', 'enqueued', 'resolved')),
    outcome         text        CHECK (outcome IN ('succeeded', 'failed', 'canceled', 'denied')),
    result          jsonb,
    error           text,
    approval_id     uuid,
    work_id         uuid,
    idempotency_key text,
    created_by      text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'resolved') = (outcome IS NOT NULL))
);
CREATE UNIQUE INDEX wakeups_idempotency ON wakeups (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX wakeups_org_workflow ON wakeups (org_id, workflow_id, id);
CREATE INDEX wakeups_org_id ON wakeups (org_id, id);
CREATE INDEX wakeups_funded ON wakeups (updated_at) WHERE state = 'funded';

-- +goose Down
DROP TABLE wakeups;
