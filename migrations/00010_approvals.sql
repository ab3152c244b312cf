-- +goose Up
-- Tool approvals (approvals/). A session is (org, session_id), bound to the
-- agent that first used it; its row holds the event counter that every
-- writer bumps under the row lock, which numbers a session's events without
-- gaps under concurrent writers (a rolled-back writer rolls its bump back).
CREATE TABLE approval_sessions (
    org_id      text        NOT NULL,
    session_id  text        NOT NULL,
    agent_id    text        NOT NULL,
    event_count bigint      NOT NULL DEFAULT 0 CHECK (event_count >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, session_id)
);

-- Append-only session events; seq is 1, 2, 3 … per session.
CREATE TABLE session_events (
    org_id     text        NOT NULL,
    session_id text        NOT NULL,
    seq        bigint      NOT NULL CHECK (seq >= 1),
    name       text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, session_id, seq)
);

-- Standing policies per (org, agent, tool): at most one unconditional
-- (match NULL) and one per distinct match object (jsonb equality ignores key
-- order and spacing, so {"a":1,"b":2} and {"b":2, "a":1} are one policy).
CREATE TABLE tool_policies (
    id         uuid        PRIMARY KEY,
    org_id     text        NOT NULL,
    agent_id   text        NOT NULL,
    tool_name  text        NOT NULL,
    match      jsonb       CHECK (match IS NULL OR jsonb_typeof(match) = 'object'),
    approval   text        NOT NULL CHECK (approval IN ('always', 'once', 'never')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX tool_policies_key ON tool_policies (org_id, agent_id, tool_name, (coalesce(match, 'null'::jsonb)));

-- Tool-call requests: decided by a policy at once (source policy) or
-- pending until a human answers or they expire. A pending request that
-- names a workflow is signalled through the queue (queue 'tool_approval',
-- idempotency key = the request's id) when it is resolved.
CREATE TABLE tool_approvals (
    id              uuid        PRIMARY KEY,
    org_id          text        NOT NULL,
    session_id      text        NOT NULL,
    agent_id        text        NOT NULL,
    tool_name       text        NOT NULL,
    input           jsonb,
    status          text        NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    source          text        CHECK (source IN ('human', 'policy', 'expired')),
    policy_id       uuid,       -- the policy that decided (source policy)
    requested_by    text        NOT NULL DEFAULT '',
    resolved_by     text,
    note            text,
    workflow_id     text,
    run_id          text,
    signal          text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    resolved_at     timestamptz,
    CHECK ((status = 'pending') = (source IS NULL)),
    CHECK ((status = 'pending') = (resolved_at IS NULL))
);
-- A tool call's Idempotency-Key is per (org, agent, key), as spends' and
-- wake-ups' are (00009): another agent's key is fresh to an agent.
CREATE UNIQUE INDEX tool_approvals_idempotency ON tool_approvals (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX tool_approvals_org_id ON tool_approvals (org_id, id);
CREATE INDEX tool_approvals_pending ON tool_approvals (org_id, session_id, tool_name) WHERE status = 'pending';
CREATE INDEX tool_approvals_expiry ON tool_approvals (expires_at) WHERE status = 'pending';

-- +goose Down
DROP TABLE tool_approvals;
DROP TABLE tool_policies;
DROP TABLE session_events;
DROP TABLE approval_sessions;
