-- +goose Up
-- A tool policy is unique per (org, agent, tool, match), match compared as
-- a JSON value. The key held match itself, and a btree index row holds at
-- most 2704 bytes: a match within its 4 KiB limit (less beside a long agent
-- id) failed the upsert with a 500. The key then held match's hash —
-- as first written, a unique one. But jsonb's hash ignores where nested
-- objects and arrays close ({"env":{"region":"eu"}} and
-- {"env":{},"region":"eu"} hash alike): a database holding two such
-- policies, distinct under 00010's key, failed this migration, and the
-- second of them could not be put. It is built non-unique now, so that
-- such a database upgrades; 00029 replaces it.
DROP INDEX tool_policies_key;
CREATE INDEX tool_policies_key ON tool_policies
    (org_id, agent_id, tool_name, (jsonb_hash_extended(coalesce(match, 'null'::jsonb), 0)));

-- +goose Down
DROP INDEX tool_policies_key;
CREATE UNIQUE INDEX tool_policies_key ON tool_policies (org_id, agent_id, tool_name, (coalesce(match, 'null'::jsonb)));
