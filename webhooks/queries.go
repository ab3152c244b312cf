package webhooks

// The package's SQL. The table is in migrations/00015_approval_webhooks.sql
// (and 00022);
// every query filters on org_id.

const webhookColumns = `name, url, format, created_at, updated_at, last_delivery, last_failure`

// qUpsert creates a webhook with its secret, or replaces its url and format
// and keeps its secret; created says which (xmax is 0 only for a row this
// statement inserted). A new name is inserted only while the org has fewer
// than $6 webhooks; an org's puts take turns (qLockOrgPuts), so the count
// sees every create before it.
// $1 org, $2 name, $3 url, $4 format, $5 secret, $6 the cap.
const qUpsert = `
INSERT INTO approval_webhooks (org_id, name, url, format, secret, created_at, updated_at)
SELECT $1, $2, $3, $4, $5, now(), now()
 WHERE (SELECT count(*) FROM approval_webhooks WHERE org_id = $1) < $6
    OR EXISTS (SELECT 1 FROM approval_webhooks WHERE org_id = $1 AND name = $2)
ON CONFLICT (org_id, name) DO UPDATE SET url = EXCLUDED.url, format = EXCLUDED.format, updated_at = EXCLUDED.updated_at
RETURNING ` + webhookColumns + `, xmax = 0 AS created`

// qLockOrgPuts serializes an org's puts, so that qUpsert's count sees
// every create committed before it and the cap holds. $1 org.
const qLockOrgPuts = `SELECT pg_advisory_xact_lock(hashtext('approval_webhooks'), hashtext($1))`

// qGet reads one webhook. $1 org, $2 name.
const qGet = `SELECT ` + webhookColumns + ` FROM approval_webhooks WHERE org_id = $1 AND name = $2`

// qList reads an org's webhooks by name. $1 org.
const qList = `SELECT ` + webhookColumns + ` FROM approval_webhooks WHERE org_id = $1 ORDER BY name`

// qDelete removes one webhook. $1 org, $2 name.
const qDelete = `DELETE FROM approval_webhooks WHERE org_id = $1 AND name = $2`

// qTargets reads what a delivery needs of each of an org's webhooks, in
// the event's transaction, FOR KEY SHARE: a DELETE of one, or a PUT that
// replaces it (qLockForReplace), waits for the event to commit, so once it
// has answered no event that commits later is sent to the webhook deleted
// or to the URL replaced. (Not FOR SHARE: a delivery's completion, whose
// hook updates the row (qDelivered) after its own statement locked the
// org's queue row, would wait for the event while the event's enqueue
// waits for that queue row — a deadlock.) $1 org.
const qTargets = `SELECT name, url, format, secret, created_at FROM approval_webhooks WHERE org_id = $1 ORDER BY name FOR KEY SHARE`

// qLockForReplace locks a webhook before a PUT replaces it, so that the
// PUT waits for the events that read it (qTargets); its upsert alone
// changes no key and would not. $1 org, $2 name.
const qLockForReplace = `SELECT 1 FROM approval_webhooks WHERE org_id = $1 AND name = $2 FOR UPDATE`

// qDelivered records a finished delivery on its webhook, in the pool's
// completion transaction: as the last delivery, and as the last failure
// when it did not succeed. A deleted webhook has no row to record on.
// $1 org, $2 name, $3 the delivery ({seq, work_id, url, outcome, error?,
// finished_at}), $4 whether it succeeded, $5 the webhook's created_at when
// the delivery was enqueued (NULL: not known), so that a webhook created
// again under the name records nothing of the deleted one's deliveries.
// $6 is when the delivery finished: a record of one that finished later
// is kept (a retried hook call records an older delivery after newer ones).
const qDelivered = `
UPDATE approval_webhooks
   SET last_delivery = CASE WHEN last_delivery IS NULL OR (last_delivery->>'finished_at')::timestamptz <= $6 THEN $3 ELSE last_delivery END,
       last_failure = CASE WHEN $4 OR (last_failure IS NOT NULL AND (last_failure->>'finished_at')::timestamptz > $6) THEN last_failure ELSE $3 END
 WHERE org_id = $1 AND name = $2 AND ($5::timestamptz IS NULL OR created_at = $5)`

// qWorkFinished is when a delivery's work item finished (in the
// completion's transaction, or committed before a retried hook call). $1
// org, $2 id.
const qWorkFinished = `SELECT finished_at FROM workpool_work WHERE org_id = $1 AND id = $2`
