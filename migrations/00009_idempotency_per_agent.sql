-- +goose Up
-- A spend's or a wake-up's Idempotency-Key is scoped by (org, agent, key),
-- not (org, key): an agent-bound token that sends another agent's key must
-- get what it would get without the key (a fresh decision), not a "key
-- reused" conflict that tells it the key exists (issue 10, item 3).
ALTER TABLE mandate_spends DROP CONSTRAINT mandate_spends_pkey;
ALTER TABLE mandate_spends ADD PRIMARY KEY (org_id, agent_id, idempotency_key);
DROP INDEX wakeups_idempotency;
CREATE UNIQUE INDEX wakeups_idempotency ON wakeups (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX wakeups_idempotency;
CREATE UNIQUE INDEX wakeups_idempotency ON wakeups (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
ALTER TABLE mandate_spends DROP CONSTRAINT mandate_spends_pkey;
ALTER TABLE mandate_spends ADD PRIMARY KEY (org_id, idempotency_key);
