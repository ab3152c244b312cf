-- +goose Up
-- An Idempotency-Key's requests are compared as JSON values when they are
-- JSON (api/idempotency.go, requestFingerprint): the value's hash is kept
-- beside the raw body's, which request_hash keeps holding, so that a
-- replica of an earlier version, comparing raw hashes only, still matches
-- a byte-identical retry during a rolling upgrade. It holds the raw hash
-- again, then the value's, and counts only beside that same raw hash: an
-- earlier replica taking the record over rewrites request_hash alone. Null:
-- the body was not fingerprinted as JSON (not JSON, too long, or written
-- before this column).
ALTER TABLE idempotency_keys ADD COLUMN request_json_hash bytea;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN request_json_hash;
