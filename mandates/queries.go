package mandates

// The package's SQL. Tables are in migrations/00003_mandates.sql. Every
// query filters on org_id except the sweeper's scan for expired requests,
// which spans orgs by design and resolves each request org-scoped.

const mandateColumns = `id, org_id, agent_id, scope, budget, spent, status, valid_until, created_at, updated_at`

const approvalColumns = `id, org_id, agent_id, scope, cost, reason, state, requested_by, refusal, on_resolve_kind,
	on_resolve_data, expires_at, created_at, resolved_at, resolved_by, note, budget, spent`

const ledgerColumns = `id, mandate_id, kind, amount, reason, idempotency_key, approval_id, created_at`

// qSpendDecide is the whole decision in one statement. A keyed spend first
// inserts its key (claim); when the key exists, or a concurrent first use
// commits it while the insert waits, nothing else happens and the caller
// reads the first answer (qSpendAnswer). The debit is the conditional
// UPDATE: the row lock serialises concurrent spenders and each re-checks the
// condition on the latest row, so the budget cannot be exceeded. Without a
// debit it inserts the approval request. The claim names both possible
// outcome rows in advance, so the answer needs no second write.
//
// $1 org, $2 agent, $3 scope, $4 cost, $5 reason, $6 key (empty: none),
// $7 ledger id, $8 approval id, $9 requested_by, $10 TTL in microseconds,
// $11 on_resolve kind, $12 on_resolve data.
const qSpendDecide = `
WITH claim AS (
    INSERT INTO mandate_spends (org_id, idempotency_key, agent_id, scope, cost, ledger_id, approval_id)
    SELECT $1, $6, $2, $3, $4, $7, $8 WHERE $6::text <> ''
    ON CONFLICT (org_id, agent_id, idempotency_key) DO NOTHING
    RETURNING 1
), proceed AS (
    SELECT 1 WHERE $6::text = '' OR EXISTS (SELECT 1 FROM claim)
), locked AS (
    -- (the mandate's row as it is once locked: the debit and the refusal
    -- both decide on it, not the debit on the row from the statement's
    -- snapshot, which a change the spend waited for may have replaced)
    SELECT id, status, valid_until, budget, spent FROM mandates
     WHERE org_id = $1 AND agent_id = $2 AND scope = $3
       AND EXISTS (SELECT 1 FROM proceed)
       FOR NO KEY UPDATE
), decided_at AS (
    -- (the time the decision is made: once the mandate's row is locked,
    -- not when the statement or its transaction began — a spend that
    -- waited for the row past valid_until is decided after it)
    SELECT clock_timestamp() AS at FROM (SELECT count(*) FROM locked) l
), debit AS (
    UPDATE mandates SET spent = mandates.spent + $4, updated_at = now()
      FROM locked
     WHERE mandates.id = locked.id
       AND locked.status = 'active' AND (locked.valid_until IS NULL OR locked.valid_until > (SELECT at FROM decided_at))
       -- (what is left is never below 0: past an approved overrun a spend
       -- of 0, an authority check, still passes, as at spent = budget)
       AND $4 <= GREATEST(locked.budget - locked.spent, 0)
    RETURNING mandates.id, GREATEST(mandates.budget - mandates.spent, 0) AS remaining
), ledger AS (
    INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount, reason, idempotency_key, remaining)
    SELECT $7, $1, debit.id, 'debit', $4, $5, NULLIF($6::text, ''), debit.remaining FROM debit
), refusal AS (
    SELECT CASE WHEN m.id IS NULL THEN 'no_mandate'
                WHEN m.status <> 'active' THEN 'revoked'
                WHEN m.valid_until IS NOT NULL AND m.valid_until <= (SELECT at FROM decided_at) THEN 'expired'
                ELSE 'insufficient' END AS why,
           GREATEST(COALESCE(m.budget - m.spent, 0), 0) AS remaining, m.budget, m.spent
      FROM (SELECT 1) AS one
      -- (the row the debit refused, as locked)
      LEFT JOIN locked m ON true
     WHERE EXISTS (SELECT 1 FROM proceed) AND NOT EXISTS (SELECT 1 FROM debit)
), request AS (
    INSERT INTO mandate_approvals (id, org_id, agent_id, scope, cost, reason, requested_by, refusal, remaining,
                                   on_resolve_kind, on_resolve_data, expires_at, budget, spent)
    SELECT $8, $1, $2, $3, $4, $5, $9, why, remaining, $11, $12, now() + $10::bigint * interval '1 microsecond', budget, spent
      FROM refusal
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM proceed),
       (SELECT id FROM debit), (SELECT remaining FROM debit),
       (SELECT id FROM request), (SELECT why FROM refusal), (SELECT remaining FROM refusal)`

// qSpendAnswer reads the first answer to an agent's key from whichever
// outcome row its decision wrote, with the first spend's reason, which that
// row keeps. $1 org, $2 key, $3 agent.
const qSpendAnswer = `
SELECT s.agent_id, s.scope, s.cost, COALESCE(l.reason, a.reason), l.mandate_id, l.remaining, a.id, a.refusal, a.remaining
  FROM mandate_spends s
  LEFT JOIN mandate_ledger l ON l.id = s.ledger_id
  LEFT JOIN mandate_approvals a ON a.id = s.approval_id
 WHERE s.org_id = $1 AND s.idempotency_key = $2 AND s.agent_id = $3`

// qRefund writes a refund's ledger row and lowers spent in one statement.
// The mandate row is locked first so that concurrent refunds see each other
// and spent never goes below zero; a repeated key inserts nothing.
// $1 org, $2 agent, $3 scope, $4 ledger id, $5 amount (> 0 lowers spent),
// $6 reason, $7 key (empty: none).
const qRefund = `
WITH m AS (
    SELECT id, spent FROM mandates WHERE org_id = $1 AND agent_id = $2 AND scope = $3 FOR UPDATE
), l AS (
    INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount, reason, idempotency_key)
    SELECT $4, $1, m.id, 'refund', -$5::bigint, $6, NULLIF($7::text, '') FROM m WHERE m.spent >= $5
    ON CONFLICT (org_id, idempotency_key) WHERE kind = 'refund' AND idempotency_key IS NOT NULL DO NOTHING
    RETURNING mandate_id
), u AS (
    UPDATE mandates SET spent = spent - $5, updated_at = now() FROM l WHERE mandates.id = l.mandate_id
    RETURNING mandates.id
)
SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM u)`

// qRefundExists tells a replayed refund key from an excessive refund.
const qRefundExists = `
SELECT EXISTS (SELECT 1 FROM mandate_ledger WHERE org_id = $1 AND kind = 'refund' AND idempotency_key = $2)`

// qCharge charges an approved overrun, creating a budget-0 mandate when none
// exists. It charges nothing (no row) when the charge would take spent past
// $9, MaxAmount: spent stays a number every JSON client holds exactly (and
// can never overflow bigint), and the caller refuses the approval. The
// conflicting row is locked before the WHERE is checked, so the bound holds
// under concurrent approvals.
// $1 new mandate id, $2 org, $3 agent, $4 scope, $5 cost, $6 ledger
// id, $7 reason, $8 approval id, $9 the largest spent.
const qCharge = `
WITH m AS (
    INSERT INTO mandates (id, org_id, agent_id, scope, budget, spent)
    VALUES ($1, $2, $3, $4, 0, $5)
    ON CONFLICT (org_id, agent_id, scope) DO UPDATE
       SET spent = mandates.spent + EXCLUDED.spent, updated_at = now()
     WHERE mandates.spent <= $9::bigint - EXCLUDED.spent
    RETURNING id
)
INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount, reason, approval_id)
SELECT $6, $2, m.id, 'approved_overrun', $5, $7, $8 FROM m`

// qChargeRefused reads the spent that refused a charge. $1 org, $2 agent,
// $3 scope.
const qChargeRefused = `SELECT spent FROM mandates WHERE org_id = $1 AND agent_id = $2 AND scope = $3`

// qResolve is the compare-and-set from pending. Expiry ($6 true) takes only
// requests past expires_at and ignores who resolves; approve and deny take
// only unexpired ones not created by the resolver. Times are read once the
// request's row is locked (decided_at), not the transaction's (now()) nor
// the statement's start: either may come before a wait for the row past
// the expiry.
// $1 org, $2 id, $3 new state, $4 resolver, $5 note, $6 expiring.
const qResolve = `
WITH decided_at AS (
    -- (read once the request's row is locked: a resolution that waited
    -- for another one, which rolled back, is decided when it gets the row)
    SELECT clock_timestamp() AS at
      FROM (SELECT count(*) FROM (SELECT 1 FROM mandate_approvals
                                   WHERE org_id = $1 AND id = $2 AND state = 'pending' FOR UPDATE) r) locked
)
UPDATE mandate_approvals
   SET state = $3, resolved_at = (SELECT at FROM decided_at), resolved_by = NULLIF($4::text, ''), note = NULLIF($5::text, '')
 WHERE org_id = $1 AND id = $2 AND state = 'pending'
   AND CASE WHEN $6::boolean THEN expires_at <= (SELECT at FROM decided_at)
            ELSE expires_at > (SELECT at FROM decided_at) AND NOT (requested_by <> '' AND requested_by = $4) END
RETURNING ` + approvalColumns

// qResolveDiagnose explains a failed qResolve.
const qResolveDiagnose = `
SELECT state, requested_by, expires_at <= statement_timestamp() FROM mandate_approvals WHERE org_id = $1 AND id = $2`

// qCancelApproval withdraws a pending request for its caller.
const qCancelApproval = `
UPDATE mandate_approvals SET state = 'canceled', resolved_at = now()
 WHERE org_id = $1 AND id = $2 AND state = 'pending'
RETURNING ` + approvalColumns

// qExpiredApprovals lists pending requests past expires_at, across orgs,
// after ($2 expires_at, $3 id) in that order.
const qExpiredApprovals = `
SELECT org_id, id, expires_at FROM mandate_approvals
 WHERE state = 'pending' AND expires_at <= now() AND (expires_at, id) > ($2, $3)
 ORDER BY expires_at, id LIMIT $1`

// qGetApproval: $1 org, $2 id, $3 agent (empty: any). The agent is in the
// WHERE clause so that another agent's request is absent exactly as another
// org's is.
const qGetApproval = `SELECT ` + approvalColumns + ` FROM mandate_approvals
 WHERE org_id = $1 AND id = $2 AND ($3::text = '' OR agent_id = $3)`

// qListApprovals: $1 org, $2 state (empty: any), $3 agent (empty: any), $4 cursor, $5 limit.
const qListApprovals = `
SELECT ` + approvalColumns + ` FROM mandate_approvals
 WHERE org_id = $1 AND ($2::text = '' OR state = $2) AND ($3::text = '' OR agent_id = $3)
   AND id > coalesce($4::uuid, '00000000-0000-0000-0000-000000000000')
 ORDER BY id LIMIT $5`

// qListApprovalsNewestFirst: qListApprovals in reverse; the cursor is the
// last (oldest) id of the page before.
const qListApprovalsNewestFirst = `
SELECT ` + approvalColumns + ` FROM mandate_approvals
 WHERE org_id = $1 AND ($2::text = '' OR state = $2) AND ($3::text = '' OR agent_id = $3)
   AND id < coalesce($4::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
 ORDER BY id DESC LIMIT $5`

// qCreateMandate: $1 id, $2 org, $3 agent, $4 scope, $5 budget, $6 valid_until.
const qCreateMandate = `
INSERT INTO mandates (id, org_id, agent_id, scope, budget, valid_until)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (org_id, agent_id, scope) DO NOTHING
RETURNING ` + mandateColumns

// qGetMandate: $1 org, $2 id, $3 agent (empty: any), as qGetApproval.
const qGetMandate = `SELECT ` + mandateColumns + ` FROM mandates
 WHERE org_id = $1 AND id = $2 AND ($3::text = '' OR agent_id = $3)`

// qFindMandate: $1 org, $2 agent, $3 scope.
const qFindMandate = `SELECT ` + mandateColumns + ` FROM mandates WHERE org_id = $1 AND agent_id = $2 AND scope = $3`

// qListMandates: $1 org, $2 agent (empty: any), $3 scope (empty: any), $4 cursor, $5 limit.
const qListMandates = `
SELECT ` + mandateColumns + ` FROM mandates
 WHERE org_id = $1 AND ($2::text = '' OR agent_id = $2) AND ($3::text = '' OR scope = $3)
   AND id > coalesce($4::uuid, '00000000-0000-0000-0000-000000000000')
 ORDER BY id LIMIT $5`

// qPatchMandate changes only the fields given, and moves updated_at only
// when one of them changes (an empty patch, or one that sets what is
// already there, is no change). $1 org, $2 id, $3 budget (NULL keep),
// $4 status (NULL keep), $5 set valid_until, $6 valid_until, $7 agent
// (empty: any).
const qPatchMandate = `
UPDATE mandates
   SET budget = COALESCE($3, budget), status = COALESCE($4, status),
       valid_until = CASE WHEN $5::boolean THEN $6 ELSE valid_until END,
       updated_at = CASE WHEN (COALESCE($3, budget), COALESCE($4, status), CASE WHEN $5::boolean THEN $6 ELSE valid_until END)
                              IS DISTINCT FROM (budget, status, valid_until)
                         THEN now() ELSE updated_at END
 WHERE org_id = $1 AND id = $2 AND ($7::text = '' OR agent_id = $7)
RETURNING ` + mandateColumns

// qLedger: $1 org, $2 mandate, $3 cursor (the id of the last entry of the
// page before), $4 limit. Entries are in commit order (pos: migration
// 00031, which numbered the entries before it below 0); the cursor stays an entry's id, its pos looked up (a cursor that
// names no entry of the mandate stands where its id would: pos of the
// last entry at or before it). The bound is one of the index's range,
// never an OR: the generic plan Postgres reuses after five executions
// keeps an OR as a filter, and each page then read the mandate's whole
// ledger up to the cursor (a ledger is never purged).
const qLedger = `
SELECT ` + ledgerColumns + ` FROM mandate_ledger
 WHERE org_id = $1 AND mandate_id = $2 AND pos > coalesce(
   (SELECT pos FROM mandate_ledger WHERE org_id = $1 AND mandate_id = $2 AND id = $3::uuid),
   (SELECT pos FROM mandate_ledger WHERE org_id = $1 AND mandate_id = $2 AND id <= $3::uuid ORDER BY id DESC LIMIT 1),
   -9223372036854775808)
 ORDER BY pos LIMIT $4`
