package retention

import (
	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/wakeup"
)

// The purges' SQL. The tables are other packages' (their migrations name
// them); the indexes the purges use are in 00017_retention.sql. Each
// statement deletes at most $2 rows settled before $1, across orgs by
// design: a row is kept or purged by its own age and by what still needs
// it, and every check of what needs it matches on the row's own org_id.
// Rows another transaction holds are skipped (SKIP LOCKED): they are being
// written, so not settled, or will be taken by the next pass.

// uuidKey is a queue message's idempotency key as a uuid when it is one
// (the wake-up and tool-approval queues key their messages by their row's
// id), else NULL, so that a key of another shape never fails the cast.
const uuidKey = `(CASE WHEN m.idempotency_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                 THEN m.idempotency_key::uuid END)`

// qPurgeIdempotencyKeys deletes the API's Idempotency-Key records past
// their window (api/idempotency.go replays them for as long).
const qPurgeIdempotencyKeys = `
DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM idempotency_keys WHERE created_at < $1
     -- (an answer is replayed for the window from when it was recorded;
     -- a record still in flight is its request's, unless an hour old: no
     -- request runs that long, so its replica died)
     AND (completed_at < $1 OR (completed_at IS NULL AND created_at < now() - interval '1 hour'))
   LIMIT $2 FOR UPDATE SKIP LOCKED))`

// qPurgeSpendKeys deletes mandate spends' idempotency rows past their
// window: a replay of the key within it still finds the first answer.
const qPurgeSpendKeys = `
DELETE FROM mandate_spends WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM mandate_spends WHERE created_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`

// qPurgeMandateApprovals deletes resolved overrun requests, except those a
// spend key still names (its replay reads the refusal from the request) or
// a wake-up still shows.
const qPurgeMandateApprovals = `
DELETE FROM mandate_approvals WHERE id = ANY(ARRAY(
  SELECT a.id FROM mandate_approvals a
   WHERE a.state <> 'pending' AND a.resolved_at < $1
     AND NOT EXISTS (SELECT 1 FROM mandate_spends s WHERE s.approval_id = a.id AND s.org_id = a.org_id)
     AND NOT EXISTS (SELECT 1 FROM wakeups w WHERE w.approval_id = a.id AND w.org_id = a.org_id)
   LIMIT $2 FOR UPDATE OF a SKIP LOCKED))`

// qPurgeWakeups deletes resolved wake-ups whose signal is no longer
// pending: delivered, or undeliverable past retention. A wake-up whose
// signal is still queued stays, and so does that signal.
const qPurgeWakeups = `
DELETE FROM wakeups WHERE id = ANY(ARRAY(
  SELECT w.id FROM wakeups w
   WHERE w.state = 'resolved' AND w.updated_at < $1
     AND NOT EXISTS (SELECT 1 FROM queue_messages m
                      WHERE m.org_id = w.org_id AND m.queue = '` + wakeup.Queue + `' AND m.idempotency_key = w.id::text
                        AND (m.status = 'pending' OR m.updated_at >= $1))
   LIMIT $2 FOR UPDATE OF w SKIP LOCKED))`

// qPurgeToolApprovals deletes decided tool calls whose signal (if they
// named a workflow) is no longer pending.
const qPurgeToolApprovals = `
DELETE FROM tool_approvals WHERE id = ANY(ARRAY(
  SELECT a.id FROM tool_approvals a
   WHERE a.status <> 'pending' AND a.resolved_at < $1
     AND NOT EXISTS (SELECT 1 FROM queue_messages m
                      WHERE m.org_id = a.org_id AND m.queue = '` + approvals.Queue + `' AND m.idempotency_key = a.id::text
                        AND (m.status = 'pending' OR m.updated_at >= $1))
   LIMIT $2 FOR UPDATE OF a SKIP LOCKED))`

// qPurgeQueueMessages deletes delivered and undeliverable messages, except
// a wake-up's or a tool call's while that row stands: its delivery state is
// read from the message, which must outlive it.
const qPurgeQueueMessages = `
DELETE FROM queue_messages WHERE id = ANY(ARRAY(
  SELECT m.id FROM queue_messages m
   WHERE m.status <> 'pending' AND m.updated_at < $1
     AND NOT (m.queue = '` + wakeup.Queue + `' AND EXISTS (
              SELECT 1 FROM wakeups w WHERE w.id = ` + uuidKey + ` AND w.org_id = m.org_id))
     AND NOT (m.queue = '` + approvals.Queue + `' AND EXISTS (
              SELECT 1 FROM tool_approvals a WHERE a.id = ` + uuidKey + ` AND a.org_id = m.org_id))
   LIMIT $2 FOR UPDATE OF m SKIP LOCKED))`

// qLockIdleSessions locks the sessions with old events and no tool call
// pending, skipping those a writer holds (a call being requested or
// answered), and returns their keys for qPurgeSessionEvents. Every session
// writer takes the session row first, so once it is locked here no call
// can become pending in it until the purge commits.
const qLockIdleSessions = `
SELECT s.org_id, s.session_id FROM approval_sessions s
 WHERE (s.org_id, s.session_id) IN (
   SELECT e.org_id, e.session_id FROM session_events e
    WHERE e.created_at < $1
      AND NOT EXISTS (SELECT 1 FROM tool_approvals a
                       WHERE a.org_id = e.org_id AND a.session_id = e.session_id AND a.status = 'pending')
    LIMIT $2)
 FOR UPDATE OF s SKIP LOCKED`

// qPurgeSessionEvents deletes old events of the sessions qLockIdleSessions
// locked ($3 orgs, $4 sessions) that still have no tool call pending, read
// on this statement's snapshot, taken once the sessions were locked (an
// agent waiting on a call may still read its session's events; a call
// that committed while the lock statement ran was not seen by it). The
// session row stays: it binds the session to its agent and numbers its
// events, so a reader's cursor stays valid.
const qPurgeSessionEvents = `
DELETE FROM session_events WHERE ctid = ANY(ARRAY(
  SELECT e.ctid FROM session_events e
    JOIN unnest($3::text[], $4::text[]) AS k(org_id, session_id) ON e.org_id = k.org_id AND e.session_id = k.session_id
   WHERE e.created_at < $1
     AND NOT EXISTS (SELECT 1 FROM tool_approvals a
                      WHERE a.org_id = e.org_id AND a.session_id = e.session_id AND a.status = 'pending')
   LIMIT $2 FOR UPDATE OF e SKIP LOCKED))`

// qPurgeApprovalEvents deletes old approvals inbox events. The per-org
// counters stay, so seq never restarts; a reader resuming from a purged
// seq is sent a reset (inbox.Log.Window).
const qPurgeApprovalEvents = `
DELETE FROM approval_events WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM approval_events
   WHERE created_at < $1
   LIMIT $2 FOR UPDATE SKIP LOCKED))`
