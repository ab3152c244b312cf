-- +goose Up
-- What became of a webhook's deliveries (webhooks.HookName, the hook each
-- delivery's work item completes through): the one that finished last,
-- and the last that did not succeed, each {seq, work_id, url, outcome,
-- error?, finished_at}. Null until one has finished.
ALTER TABLE approval_webhooks ADD COLUMN last_delivery jsonb, ADD COLUMN last_failure jsonb;

-- +goose Down
ALTER TABLE approval_webhooks DROP COLUMN last_delivery, DROP COLUMN last_failure;
