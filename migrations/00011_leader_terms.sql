-- +goose Up
-- The fencing term of each leadership (internal/leader): a replica that
-- takes a leadership bumps its name's term, and every write of a
-- leader-only loop succeeds only while the term it was handed is still the
-- current one, so a deposed leader that has not noticed yet writes nothing.
-- Leaderships are the system's, not an org's: no org_id.
CREATE TABLE leader_terms (
    name text   PRIMARY KEY,
    term bigint NOT NULL
);

-- +goose Down
DROP TABLE leader_terms;
