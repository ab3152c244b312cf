-- +goose Up
-- The retention loop (internal/retention) purges approvals inbox events by
-- age in bounded batches; without this index each batch scans the table.
CREATE INDEX approval_events_created_at ON approval_events (created_at);

-- +goose Down
DROP INDEX approval_events_created_at;
