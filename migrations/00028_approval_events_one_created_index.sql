-- +goose NO TRANSACTION
-- +goose Up
-- 00014 and 00018 each indexed approval_events (created_at): every event
-- appended wrote two identical btrees. The retention's (00018) stays.
DROP INDEX CONCURRENTLY IF EXISTS approval_events_created;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS approval_events_created ON approval_events (created_at);
