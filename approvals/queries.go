package approvals

// The package's SQL. Tables are in migrations/00010_approvals.sql. Every
// query filters on org_id except the sweeper's scan for expired requests,
// which spans orgs by design and resolves each request org-scoped.

const policyColumns = `id, agent_id, tool_name, match, approval, created_at, updated_at, updated_by`

// approvalSelect reads a tool approval with its signal's delivery state
// (the queue message keyed by the approval's id).
const approvalSelect = `
SELECT a.id, a.org_id, a.session_id, a.agent_id, a.tool_name, a.input, a.status, coalesce(a.source, ''), a.policy_id,
       a.requested_by, coalesce(a.resolved_by, ''), coalesce(a.note, ''), coalesce(a.workflow_id, ''), coalesce(a.run_id, ''),
       coalesce(a.signal, ''), m.status, coalesce(m.attempts, 0), coalesce(m.last_error, ''), a.created_at, a.expires_at, a.resolved_at
  FROM tool_approvals a
  LEFT JOIN queue_messages m ON m.org_id = a.org_id AND m.queue = '` + Queue + `' AND m.idempotency_key = a.id::text
`

// qBindSession creates the session bound to the agent, or locks the
// existing one; either way it returns the agent the session is bound to.
// $1 org, $2 session, $3 agent.
const qBindSession = `
INSERT INTO approval_sessions (org_id, session_id, agent_id) VALUES ($1, $2, $3)
ON CONFLICT (org_id, session_id) DO UPDATE SET updated_at = now()
RETURNING agent_id`

// qLockSession locks an existing session. $1 org, $2 session.
const qLockSession = `SELECT agent_id FROM approval_sessions WHERE org_id = $1 AND session_id = $2 FOR UPDATE`

// qAppendEvents bumps the session's counter (under its row lock, which the
// caller already holds) and numbers the events after it.
// $1 org, $2 session, $3 names, $4 payloads (JSON text).
const qAppendEvents = `
WITH s AS (
    UPDATE approval_sessions SET event_count = event_count + cardinality($3::text[]), updated_at = now()
     WHERE org_id = $1 AND session_id = $2
    RETURNING event_count
)
INSERT INTO session_events (org_id, session_id, seq, name, payload)
SELECT $1, $2, s.event_count - cardinality($3::text[]) + t.ord, t.name, t.payload::jsonb
  FROM s, unnest($3::text[], $4::text[]) WITH ORDINALITY AS t(name, payload, ord)`

// qDecidingPolicy picks the policy that decides a call, in SPEC §7's
// order: a matching (conditional) never, then a matching always, then the
// unconditional policy, then a matching once. A call without input ($4
// NULL) matches no conditional policy.
// $1 org, $2 agent, $3 tool, $4 input.
const qDecidingPolicy = `
SELECT ` + policyColumns + ` FROM tool_policies
 WHERE org_id = $1 AND agent_id = $2 AND tool_name = $3 AND (match IS NULL OR $4::jsonb @> match)
 ORDER BY CASE WHEN match IS NULL THEN 2 WHEN approval = 'never' THEN 0 WHEN approval = 'always' THEN 1 ELSE 3 END, id
 LIMIT 1`

// qInsertApproval records a request, pending or decided by a policy; a
// repeated (agent, idempotency key) inserts nothing.
// $1 id, $2 org, $3 session, $4 agent, $5 tool, $6 input, $7 status,
// $8 source, $9 policy, $10 requested_by, $11 workflow, $12 run, $13 signal,
// $14 key, $15 TTL in microseconds.
const qInsertApproval = `
INSERT INTO tool_approvals (id, org_id, session_id, agent_id, tool_name, input, status, source, policy_id, requested_by,
                            workflow_id, run_id, signal, idempotency_key, expires_at, resolved_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
        now() + $15::bigint * interval '1 microsecond', CASE WHEN $7 <> 'pending' THEN now() END)
ON CONFLICT (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING`

// qApprovalByKey finds the request an agent's key first made (a key is
// the agent's own: migration 00010). $1 org, $2 agent, $3 key.
const qApprovalByKey = `SELECT id FROM tool_approvals WHERE org_id = $1 AND agent_id = $2 AND idempotency_key = $3`

// Expiry and answer times are the statement's, not the transaction's
// (now()): an answer runs these once it holds the session's lock, which
// it may have waited for past a call's expiry.

// qPendingForTool locks the unexpired pending calls of a tool in a session
// (expired ones are the sweeper's). $1 org, $2 session, $3 tool.
const qPendingForTool = `
SELECT id, tool_name, requested_by, true, false FROM tool_approvals
 WHERE org_id = $1 AND session_id = $2 AND tool_name = $3 AND status = 'pending' AND expires_at > statement_timestamp()
 ORDER BY id FOR UPDATE`

// qLockApproval locks one request of a session. $1 org, $2 session, $3 id.
const qLockApproval = `
SELECT id, tool_name, requested_by, status = 'pending', expires_at <= statement_timestamp() FROM tool_approvals
 WHERE org_id = $1 AND session_id = $2 AND id = $3
 FOR UPDATE`

// qResolve moves a pending request to its final status and returns what its
// events and signal need. $1 org, $2 id, $3 status, $4 source, $5 resolver,
// $6 note.
const qResolve = `
UPDATE tool_approvals
   SET status = $3, source = $4, resolved_by = NULLIF($5::text, ''), note = NULLIF($6::text, ''), resolved_at = statement_timestamp()
 WHERE org_id = $1 AND id = $2 AND status = 'pending'
RETURNING tool_name, coalesce(workflow_id, ''), coalesce(run_id, ''), coalesce(signal, ''), created_at, resolved_at`

// qExpire is qResolve for the sweeper: only past expires_at.
// $1 org, $2 id.
const qExpire = `
UPDATE tool_approvals SET status = 'expired', source = 'expired', resolved_at = statement_timestamp()
 WHERE org_id = $1 AND id = $2 AND status = 'pending' AND expires_at <= statement_timestamp()
RETURNING tool_name, coalesce(workflow_id, ''), coalesce(run_id, ''), coalesce(signal, ''), created_at, resolved_at`

// qExpiredApprovals lists pending requests past expires_at, across orgs,
// after ($2 expires_at, $3 id) in that order.
const qExpiredApprovals = `
SELECT org_id, session_id, id, expires_at FROM tool_approvals
 WHERE status = 'pending' AND expires_at <= now() AND (expires_at, id) > ($2, $3)
 ORDER BY expires_at, id LIMIT $1`

// qUpsertUnconditionalPolicy sets the unconditional policy for (org,
// agent, tool). $1 id, $2 org, $3 agent, $4 tool, $5 approval, $6
// updated_by.
const qUpsertUnconditionalPolicy = `
INSERT INTO tool_policies (id, org_id, agent_id, tool_name, match, approval, updated_by)
VALUES ($1, $2, $3, $4, NULL, $5, $6)
ON CONFLICT (org_id, agent_id, tool_name) WHERE match IS NULL
DO UPDATE SET approval = EXCLUDED.approval, updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING ` + policyColumns

// qPutConditionalPolicy sets the policy for (org, agent, tool, match $5):
// it replaces the one whose match is equal as a JSON value, or adds one.
// No index holds that key (migration 00029): the caller holds
// qLockToolPolicyPuts. $1 id, $2 org, $3 agent, $4 tool, $5 match, $6
// approval, $7 updated_by.
const qPutConditionalPolicy = `
WITH replaced AS (
  UPDATE tool_policies SET approval = $6, updated_by = $7, updated_at = now()
   WHERE org_id = $2 AND agent_id = $3 AND tool_name = $4 AND match = $5::jsonb
  RETURNING ` + policyColumns + `
), added AS (
  INSERT INTO tool_policies (id, org_id, agent_id, tool_name, match, approval, updated_by)
  SELECT $1, $2, $3, $4, $5, $6, $7 WHERE NOT EXISTS (SELECT 1 FROM replaced)
  RETURNING ` + policyColumns + `
)
SELECT * FROM replaced UNION ALL SELECT * FROM added`

// qLockToolPolicyPuts makes (org $1, agent $2, tool $3)'s policy puts
// take turns, so that qCountConditionalPolicies, in the next statement,
// sees every create committed before it and the cap holds.
const qLockToolPolicyPuts = `SELECT pg_advisory_xact_lock(hashtext('tool_policies'), hashtext($1 || '/' || $2 || '/' || $3))`

// qCountConditionalPolicies counts (org $1, agent $2, tool $3)'s policies
// with a match, and says whether one has match $4 already.
const qCountConditionalPolicies = `
SELECT count(*) FILTER (WHERE match IS NOT NULL), coalesce(bool_or(match = $4::jsonb), false)
  FROM tool_policies WHERE org_id = $1 AND agent_id = $2 AND tool_name = $3`

// qDeletePolicy: $1 org, $2 agent, $3 tool, $4 match (NULL: unconditional).
const qDeletePolicy = `
DELETE FROM tool_policies
 WHERE org_id = $1 AND agent_id = $2 AND tool_name = $3 AND coalesce(match, 'null'::jsonb) = coalesce($4::jsonb, 'null'::jsonb)`

// qUnconditionalPolicy: $1 org, $2 agent, $3 tool.
const qUnconditionalPolicy = `
SELECT approval FROM tool_policies WHERE org_id = $1 AND agent_id = $2 AND tool_name = $3 AND match IS NULL`

// qGetPolicy: $1 org, $2 id.
const qGetPolicy = `SELECT ` + policyColumns + ` FROM tool_policies WHERE org_id = $1 AND id = $2`

// qListPolicies: $1 org, $2 agent, $3 cursor, $4 limit.
const qListPolicies = `
SELECT ` + policyColumns + ` FROM tool_policies
 WHERE org_id = $1 AND agent_id = $2 AND id > coalesce($3::uuid, '00000000-0000-0000-0000-000000000000')
 ORDER BY id LIMIT $4`

// qSessionVisible: whether the session exists for the org (and, with $3,
// belongs to that agent). $1 org, $2 session, $3 agent ("" any).
const qSessionVisible = `
SELECT EXISTS (SELECT 1 FROM approval_sessions WHERE org_id = $1 AND session_id = $2 AND ($3::text = '' OR agent_id = $3))`

// qEvents: $1 org, $2 session, $3 after (exclusive), $4 limit.
const qEvents = `
SELECT seq, name, payload, created_at FROM session_events
 WHERE org_id = $1 AND session_id = $2 AND seq > $3
 ORDER BY seq LIMIT $4`

// qCountPending counts pending requests across orgs, for the gauge.
const qCountPending = `SELECT count(*) FROM tool_approvals WHERE status = 'pending'`
