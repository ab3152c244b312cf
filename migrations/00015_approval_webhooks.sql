-- +goose Up
-- Approval webhooks (webhooks/): where an org's approval events are posted.
-- The secret signs the json format's bodies (HMAC-SHA256); it is shown once,
-- when the webhook is created, and kept when the webhook is replaced.
CREATE TABLE approval_webhooks (
    org_id     text        NOT NULL,
    name       text        NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    url        text        NOT NULL,
    format     text        NOT NULL CHECK (format IN ('json', 'slack')),
    secret     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, name)
);

-- +goose Down
DROP TABLE approval_webhooks;
