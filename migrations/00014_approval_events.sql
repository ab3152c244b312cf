-- +goose Up
-- The approvals inbox (issue 14): the per-org log of approval requests and
-- answers, both kinds, that GET /v1/approvals/events streams. seq numbers an
-- org's events 1, 2, 3… without gaps: an append bumps the org's counter row
-- in the transaction of the state change, so that row's lock orders an
-- org's appends, and they commit in seq order.
CREATE TABLE approval_events (
    org_id      text        NOT NULL,
    seq         bigint      NOT NULL,
    type        text        NOT NULL CHECK (type IN ('requested', 'resolved')),
    kind        text        NOT NULL CHECK (kind IN ('tool_call', 'mandate_overrun')),
    approval_id uuid        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, seq)
);
-- Retention prunes by age across orgs.
CREATE INDEX approval_events_created ON approval_events (created_at);

CREATE TABLE approval_event_counters (
    org_id text   PRIMARY KEY,
    seq    bigint NOT NULL
);

-- What the mandate had when a spend was refused, for the human who answers
-- (NULL: no mandate existed, or the request predates these columns).
ALTER TABLE mandate_approvals ADD COLUMN budget bigint, ADD COLUMN spent bigint;

-- +goose Down
ALTER TABLE mandate_approvals DROP COLUMN budget, DROP COLUMN spent;
DROP TABLE approval_event_counters;
DROP TABLE approval_events;
