-- +goose Up
-- What the promise's gauges (internal/gauges) and the admin's list of
-- wake-ups by delivery state read: only the rows still open, which stay
-- few while the system is healthy, however many have settled.
-- The signal outbox's unsent and undeliverable messages, oldest first.
CREATE INDEX queue_messages_outbox_open ON queue_messages (status, created_at)
    WHERE status <> 'delivered' AND signal_workflow_id IS NOT NULL;
-- An org's undeliverable messages (GET /v1/wakeups?delivery=undeliverable).
CREATE INDEX queue_messages_failed ON queue_messages (org_id, queue, idempotency_key)
    WHERE status = 'failed';
-- The wake-ups not yet resolved, by state.
CREATE INDEX wakeups_open ON wakeups (state) WHERE state <> 'resolved';

-- +goose Down
DROP INDEX wakeups_open;
DROP INDEX queue_messages_failed;
DROP INDEX queue_messages_outbox_open;
