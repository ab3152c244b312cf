-- +goose Up
-- A tool call's Idempotency-Key is scoped by (org, agent, key), as spends'
-- and wake-ups' are (00009): an agent-bound token that sends another
-- agent's key gets what it would get without the key (a call of its own),
-- not a "key reused" conflict that tells it the key exists (issue 10,
-- item 3).
DROP INDEX tool_approvals_idempotency;
CREATE UNIQUE INDEX tool_approvals_idempotency ON tool_approvals (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX tool_approvals_idempotency;
CREATE UNIQUE INDEX tool_approvals_idempotency ON tool_approvals (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
