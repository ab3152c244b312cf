-- +goose Up
-- Retention (internal/retention, issue 15 item 4): each purge finds its old
-- rows by the time they settled, through a partial index that holds only
-- the rows it may ever take, and checks what still needs a row (a pending
-- signal, a spend key naming an approval, a wake-up naming it) by index.
-- (idempotency_keys already has its index on created_at: 00001.)
CREATE INDEX mandate_spends_created_at ON mandate_spends (created_at);
CREATE INDEX mandate_spends_approval ON mandate_spends (approval_id);
CREATE INDEX mandate_approvals_resolved_at ON mandate_approvals (resolved_at) WHERE state <> 'pending';
CREATE INDEX wakeups_resolved_at ON wakeups (updated_at) WHERE state = 'resolved';
CREATE INDEX wakeups_approval ON wakeups (approval_id) WHERE approval_id IS NOT NULL;
CREATE INDEX tool_approvals_resolved_at ON tool_approvals (resolved_at) WHERE status <> 'pending';
CREATE INDEX queue_messages_settled_at ON queue_messages (updated_at) WHERE status <> 'pending';
CREATE INDEX session_events_created_at ON session_events (created_at);

-- +goose Down
DROP INDEX session_events_created_at;
DROP INDEX queue_messages_settled_at;
DROP INDEX tool_approvals_resolved_at;
DROP INDEX wakeups_approval;
DROP INDEX wakeups_resolved_at;
DROP INDEX mandate_approvals_resolved_at;
DROP INDEX mandate_spends_approval;
DROP INDEX mandate_spends_created_at;
