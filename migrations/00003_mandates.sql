-- +goose Up
-- Mandates (package mandates): spending authority per (org, agent, scope).
-- `spent` moves only together with a ledger row in the same statement or
-- transaction, so Σ mandate_ledger.amount = spent for every mandate.
CREATE TABLE mandates (
    id          uuid        PRIMARY KEY,
    org_id      text        NOT NULL,
    agent_id    text        NOT NULL,
    scope       text        NOT NULL,
    budget      bigint      NOT NULL CHECK (budget >= 0),
    spent       bigint      NOT NULL DEFAULT 0,
    status      text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    valid_until timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, agent_id, scope)
);
CREATE INDEX mandates_org_id_id ON mandates (org_id, id);

-- Every change of `spent`: debits (+), refunds (-), approved overruns (+).
CREATE TABLE mandate_ledger (
    id              uuid        PRIMARY KEY,
    org_id          text        NOT NULL,
    mandate_id      uuid        NOT NULL REFERENCES mandates (id),
    kind            text        NOT NULL CHECK (kind IN ('debit', 'refund', 'approved_overrun')),
    amount          bigint      NOT NULL,
    reason          text        NOT NULL DEFAULT '',
    idempotency_key text,
    approval_id     uuid,
    remaining       bigint,     -- for a debit: what the mandate had left after it
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mandate_ledger_mandate ON mandate_ledger (org_id, mandate_id, id);
-- A refund key never refunds twice (spend keys are held by mandate_spends).
CREATE UNIQUE INDEX mandate_ledger_refund_key ON mandate_ledger (org_id, idempotency_key)
    WHERE kind = 'refund' AND idempotency_key IS NOT NULL;
-- An approval is charged at most once.
CREATE UNIQUE INDEX mandate_ledger_approval ON mandate_ledger (approval_id) WHERE approval_id IS NOT NULL;

-- Overrun approval requests: a refused spend commits one for a human.
CREATE TABLE mandate_approvals (
    id              uuid        PRIMARY KEY,
    org_id          text        NOT NULL,
    agent_id        text        NOT NULL,
    scope           text        NOT NULL,
    cost            bigint      NOT NULL CHECK (cost >= 0),
    reason          text        NOT NULL DEFAULT '',
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'approved', 'denied', 'expired', 'canceled')),
    requested_by    text        NOT NULL DEFAULT '',
    refusal         text        NOT NULL DEFAULT '', -- why the spend was refused
    remaining       bigint      NOT NULL DEFAULT 0,  -- what the mandate had left then
    on_resolve_kind text        NOT NULL DEFAULT '',
    on_resolve_data jsonb,
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    resolved_by     text,
    note            text
);
CREATE INDEX mandate_approvals_org_state ON mandate_approvals (org_id, state, id);
CREATE INDEX mandate_approvals_org_id ON mandate_approvals (org_id, id);
CREATE INDEX mandate_approvals_expiry ON mandate_approvals (expires_at) WHERE state = 'pending';

-- Keyed spends, one per (org, key), inserted by the statement that decides
-- the spend: a concurrent duplicate's insert waits for it and then finds
-- the first answer through ledger_id (granted) or approval_id (refused),
-- whichever row exists.
CREATE TABLE mandate_spends (
    org_id          text        NOT NULL,
    idempotency_key text        NOT NULL,
    agent_id        text        NOT NULL,
    scope           text        NOT NULL,
    cost            bigint      NOT NULL,
    ledger_id       uuid        NOT NULL,
    approval_id     uuid        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, idempotency_key)
);

-- +goose Down
DROP TABLE mandate_spends;
DROP TABLE mandate_approvals;
DROP TABLE mandate_ledger;
DROP TABLE mandates;
