-- +goose Up
-- A policy is unique per (org, agent, tool, match), match compared as a
-- JSON value. No index can hold that key: match itself overflows a btree
-- row (00025), and its hash (00025's unique key as first written) holds
-- apart only what it hashes apart — not {"env":{"region":"eu"}} and
-- {"env":{},"region":"eu"}, two policies. So the unconditional policy (one
-- per org, agent and tool) keeps a unique key, and conditional puts take
-- turns under an advisory lock and compare matches as values
-- (approvals.PutPolicy). The index on (org, agent, tool) serves both the
-- puts and every tool call's policy read.
-- (DROP INDEX locks the table from every tool call while it waits for one
-- under way: it waits at most 100 ms, and Up tries again a second later.)
SET LOCAL lock_timeout = '100ms';
DROP INDEX IF EXISTS tool_policies_key;
CREATE UNIQUE INDEX tool_policies_unconditional ON tool_policies (org_id, agent_id, tool_name) WHERE match IS NULL;
CREATE INDEX tool_policies_tool ON tool_policies (org_id, agent_id, tool_name);

-- +goose Down
DROP INDEX tool_policies_unconditional;
DROP INDEX tool_policies_tool;
CREATE UNIQUE INDEX tool_policies_key ON tool_policies
    (org_id, agent_id, tool_name, (jsonb_hash_extended(coalesce(match, 'null'::jsonb), 0)));
