-- +goose Up
-- Idempotency-Key records (api/): the first response to (org, route, key) is
-- kept for 24 h and replayed; a row without a response marks a request in
-- flight that concurrent duplicates wait for.
CREATE TABLE idempotency_keys (
    org_id        text        NOT NULL,
    route         text        NOT NULL,
    key           text        NOT NULL,
    request_hash  bytea       NOT NULL,
    status_code   integer,
    content_type  text,
    response_body bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    PRIMARY KEY (org_id, route, key)
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

-- +goose Down
DROP TABLE idempotency_keys;
