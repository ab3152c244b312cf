-- +goose Up
-- The durable org-scoped message queue (queue/). A message that carries a
-- signal is delivered to Temporal by the dispatcher after its transaction
-- commits; next_attempt_at doubles as the claim lease while a send is in
-- flight.
CREATE TABLE queue_messages (
    id              uuid        PRIMARY KEY,
    org_id          text        NOT NULL,
    queue           text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}',
    idempotency_key text        NOT NULL,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    -- the Temporal signal to send, or NULL for a message that only tracks
    signal_workflow_id text,
    signal_run_id      text,
    signal_name        text,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    not_found_since timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (org_id, queue, idempotency_key)
);
CREATE INDEX queue_messages_due ON queue_messages (next_attempt_at)
    WHERE status = 'pending' AND signal_workflow_id IS NOT NULL;

-- +goose Down
DROP TABLE queue_messages;
