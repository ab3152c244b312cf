-- +goose Up
-- The fingerprint of each keyed append's chunks (streams.appendKeyed): a
-- key used again for other chunks — by another caller of the org, or after
-- the HTTP layer's record of the key expired — is refused (409) instead of
-- answered with the first append's indexes while its own chunks are
-- dropped. Null for appends made before this column: those keys replay as
-- before.
ALTER TABLE stream_appends ADD COLUMN request_hash bytea;

-- +goose Down
ALTER TABLE stream_appends DROP COLUMN request_hash;
