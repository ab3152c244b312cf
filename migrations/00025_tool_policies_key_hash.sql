-- +goose Up
-- A tool policy is unique per (org, agent, tool, match), match compared as
-- a JSON value. The key held match itself, and a btree index row holds at
-- most 2704 bytes: a match within its 4 KiB limit (less beside a long agent
-- id) failed the upsert with a 500. The key now holds match's hash, which
-- jsonb's hash opclass computes so that equal values (1 and 1.0, keys in
-- any order) hash alike; the upsert compares the matches themselves before
-- it replaces one (approvals.qUpsertPolicy), so that two matches whose
-- hashes collide never take each other's place.
DROP INDEX tool_policies_key;
CREATE UNIQUE INDEX tool_policies_key ON tool_policies
    (org_id, agent_id, tool_name, (jsonb_hash_extended(coalesce(match, 'null'::jsonb), 0)));

-- +goose Down
DROP INDEX tool_policies_key;
CREATE UNIQUE INDEX tool_policies_key ON tool_policies (org_id, agent_id, tool_name, (coalesce(match, 'null'::jsonb)));
