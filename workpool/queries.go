package workpool

// SQL of the workpool tables (DDL: migrations/00002_workpool.sql). Every
// statement that compares with the current time takes it as a parameter so
// tests control the clock. Batches use unnest over arrays: one statement per
// batch, never one per item.

// notifyChannel carries every workpool notification. Payloads:
//
//	e:<pool>   work enqueued (the loop may ignore it while saturated)
//	k:<pool>   completion, cancelation or settings change: wake the loop
//	s:<pool>   the loop started work: executors, claim it
//	x:<id>,…   cancel these running items
const notifyChannel = "reveille_workpool"

// --- pools -----------------------------------------------------------------

const sqlEnsurePools = `
INSERT INTO workpool_pools (name, max_parallelism)
SELECT * FROM unnest($1::text[], $2::int[])
ON CONFLICT (name) DO NOTHING`

const sqlListPoolNames = `SELECT name FROM workpool_pools ORDER BY name`

// sqlPoolInfo reads a pool and the caller's org's ($2) counts in it, $3
// now. Besides the totals it reads what the start statement (sqlStartFair)
// would hold back of the org's ready work: for each of its keys, ready
// items beyond the key's room (its limit — the earliest ready item's, as
// sqlStartFair takes it — less its running items) are blocked by the key;
// the rest of the keyed ready items, with the plain ready ones, are what
// the org's cap has to make room for (counted in Go: poolInfos). It also
// reads the org's next future run_at (its own run status: poolInfos).
const sqlPoolInfo = `
SELECT p.name, p.max_parallelism, p.max_parallelism_per_org, p.paused, p.run_kind, p.run_saturated, p.run_at,
  (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'running'),
  (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NULL)
  + (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NOT NULL),
  least(
    (SELECT min(run_at) FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NULL),
    (SELECT min(run_at) FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NOT NULL)),
  (SELECT count(*) FROM workpool_work w
   WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NULL AND w.run_at <= $3),
  k.startable, k.blocked,
  least(
    (SELECT min(run_at) FROM workpool_work w
     WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NULL AND w.run_at > $3),
    (SELECT min(run_at) FROM workpool_work w
     WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NOT NULL AND w.run_at > $3)),
  coalesce((SELECT weight FROM workpool_org_weights wt WHERE wt.pool = p.name AND wt.org_id = $2), 1),
  r.succeeded, r.failed, r.canceled, r.retries
FROM workpool_pools p
CROSS JOIN LATERAL (
  SELECT count(*) FILTER (WHERE w.outcome = 'succeeded') AS succeeded,
         count(*) FILTER (WHERE w.outcome = 'failed') AS failed,
         count(*) FILTER (WHERE w.outcome = 'canceled') AS canceled,
         coalesce(sum(greatest(w.attempts - 1, 0)), 0) AS retries
  FROM workpool_work w WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'finished') r
CROSS JOIN LATERAL (
  SELECT coalesce(sum(least(kk.ready, kk.room)), 0) AS startable, coalesce(sum(greatest(kk.ready - kk.room, 0)), 0) AS blocked
  FROM (
    SELECT count(*) FILTER (WHERE w.state = 'pending' AND w.run_at <= $3) AS ready,
      greatest(coalesce((array_agg(w.key_limit ORDER BY w.run_at, w.id) FILTER (WHERE w.state = 'pending' AND w.run_at <= $3))[1], 1)
        - count(*) FILTER (WHERE w.state = 'running'), 0) AS room
    FROM (SELECT w.concurrency_key, w.state, w.run_at, w.id, w.key_limit FROM workpool_work w
          WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'pending' AND w.concurrency_key IS NOT NULL
          UNION ALL
          SELECT w.concurrency_key, w.state, w.run_at, w.id, w.key_limit FROM workpool_work w
          WHERE w.pool = p.name AND w.org_id = $2 AND w.state = 'running' AND w.concurrency_key IS NOT NULL) w
    GROUP BY w.concurrency_key) kk) k
WHERE p.name = ANY($1)
ORDER BY p.name`

// sqlUpdatePool changes the settings given and locks the pool row for the
// rest of the transaction: $2 max_parallelism (null: keep), $3 whether $4
// replaces max_parallelism_per_org, $5 paused (null: keep). A pause turns a
// published "running" into "scheduled" and drops "saturated" at once: a
// paused pool starts nothing (the loop, woken by the change, publishes the
// precise status — idle when nothing is left).
const sqlUpdatePool = `
UPDATE workpool_pools SET max_parallelism = coalesce($2, max_parallelism),
  max_parallelism_per_org = CASE WHEN $3 THEN $4 ELSE max_parallelism_per_org END,
  paused = coalesce($5, paused), settings_version = settings_version + 1,
  run_kind = CASE WHEN $5 AND run_kind = 'running' THEN 'scheduled' ELSE run_kind END,
  run_saturated = CASE WHEN $5 THEN false ELSE run_saturated END,
  updated_at = now()
WHERE name = $1`

// A weight change restarts the org's fair-share turns at the pool's
// current turn without a word to the loop: the loop's ledger keeps the
// weight each line was charged at, and a pick leaves out a line charged
// at another weight (sqlTurnLine). Starts charged are counted at the
// weight, so a lowered weight would read a long history as far ahead of
// everyone (the org started nothing until the others caught up).

// sqlSetOrgWeights sets the weights of orgs $2 to $3 in pool $1.
const sqlSetOrgWeights = `
INSERT INTO workpool_org_weights (pool, org_id, weight)
SELECT $1, u.org_id, u.weight FROM unnest($2::text[], $3::int[]) AS u(org_id, weight)
ON CONFLICT (pool, org_id) DO UPDATE SET weight = excluded.weight`

// sqlDeleteOrgWeights gives orgs $2 the default weight in pool $1.
const sqlDeleteOrgWeights = `
DELETE FROM workpool_org_weights WHERE pool = $1 AND org_id = ANY($2::text[])`

// sqlClearOrgWeights gives every org the default weight in pool $1: an
// operator's setting across orgs, as the weights themselves are.
const sqlClearOrgWeights = `
DELETE FROM workpool_org_weights WHERE pool = $1`

// sqlOrgWeights lists pool $1's weight overrides, for operators (whose
// settings span orgs).
const sqlOrgWeights = `SELECT org_id, weight FROM workpool_org_weights WHERE pool = $1 ORDER BY org_id`

const sqlNotify = `SELECT pg_notify('` + notifyChannel + `', $1)`

const sqlNotifyEach = `SELECT pg_notify('` + notifyChannel + `', p) FROM unnest($1::text[]) p`

// --- enqueue, status, cancel -------------------------------------------------

// The enqueue statements insert a batch only if every pool it names exists
// ($15 is the number of distinct pools), so an unknown pool writes nothing,
// and only if no (pool, org) pair the cap applies to has a pending count
// past the cap $20. Items flagged in $17 (replays of an idempotency key;
// null: none) are skipped.
//
//   - sqlEnqueueCounted, for a batch of one pair ($18 pool, $19 org, the
//     common case), first adds its $21 items to the pair's pending count
//     in the same statement; $22 false (every item BypassPendingCap) skips
//     the test.
//   - sqlEnqueueGroups tests several pairs, whose counts sqlAddPending
//     raised before it ($18 pools, $19 orgs, $21 the pairs as "pool/org":
//     a pool name holds no "/").
//   - sqlEnqueue tests one pair ($18, $19; "" for none) without counting:
//     sqlEnqueueCounted's second try, after an exact count.
//   - sqlEnqueueInsert alone, with the cap off, tests nothing.
//
// The cap's test takes scalar parameters in the common case and is one
// uncorrelated probe otherwise: with array parameters, or a join with the
// batch, the plan cache re-planned the statement at every call, which
// doubled an enqueue's cost.
var sqlEnqueueCounted = `
WITH counted AS (
  INSERT INTO workpool_org_pending (pool, org_id, pending, counted_at) VALUES ($18, $19, $21, $16)
  ON CONFLICT (pool, org_id) DO UPDATE SET pending = workpool_org_pending.pending + excluded.pending
  RETURNING pending
), ` + sqlQueueOrgsAfter("counted") + sqlEnqueueRows + `
  AND (NOT $22::bool OR (SELECT pending FROM counted) <= $20)`

var sqlEnqueueGroups = sqlEnqueueInsert + `
  AND NOT EXISTS (SELECT 1 FROM workpool_org_pending c
    WHERE c.pool = ANY($18) AND c.org_id = ANY($19) AND c.pool || '/' || c.org_id = ANY($21) AND c.pending > $20)`

var sqlEnqueue = sqlEnqueueInsert + `
  AND NOT EXISTS (SELECT 1 FROM workpool_org_pending c WHERE c.pool = $18 AND c.org_id = $19 AND c.pending > $20)`

var sqlEnqueueInsert = `
WITH ` + sqlQueueOrgsAfter("") + sqlEnqueueRows

// sqlQueueOrgsAfter is the CTE queued of every enqueue, which keeps the
// fair pick's org queues (docs/workpool.md § "Org queues"): each (pool,
// org) of the batch's plain items gets its row, its head lowered to the
// batch's earliest run_at. Not referenced by the insert, it runs after it;
// given counted (the CTE that raises the batch's pending count), it runs
// after that too even when the insert does not read the count (every item
// BypassPendingCap), so that every enqueue locks an org's pending count
// before its queue row (sqlAddPending, before sqlEnqueueGroups, does too)
// and two enqueues of one org cannot deadlock. Rows are locked in (pool,
// org) order. The upsert always writes the row, even when the head stays:
// the pick moves a head only where the row's xmin is unchanged since its
// snapshot, so an enqueue that locked the row without writing it could
// have its items passed over. A batch that inserts nothing (past a cap)
// may leave a head too early, which costs the loop one probe; a batch
// naming an unknown pool writes none.
func sqlQueueOrgsAfter(counted string) string {
	after := ""
	if counted != "" {
		after = " AND (SELECT pending FROM " + counted + ") IS NOT NULL"
	}
	return `queued AS (
  INSERT INTO workpool_org_queues (pool, org_id, head_at)
  SELECT u.pool, u.org_id, min(u.run_at)
  FROM unnest($2::text[], $3::text[], $6::timestamptz[], $13::text[], $17::bool[]) AS u(org_id, pool, run_at, ckey, replay)
  WHERE u.replay IS NOT TRUE AND u.ckey IS NULL AND (SELECT count(*) FROM workpool_pools WHERE name = ANY($3)) = $15` + after + `
  GROUP BY u.pool, u.org_id
  ORDER BY u.pool, u.org_id
  ON CONFLICT (pool, org_id) DO UPDATE SET head_at = least(workpool_org_queues.head_at, excluded.head_at)
)`
}

const sqlEnqueueRows = `
INSERT INTO workpool_work (id, org_id, pool, handler, args, state, run_at, max_attempts, initial_backoff_ms,
  backoff_base, timeout_ms, on_complete_hook, on_complete_context, concurrency_key, key_limit, created_at)
SELECT u.id, u.org_id, u.pool, u.handler, u.args::jsonb, 'pending', u.run_at, u.max_attempts, u.backoff_ms,
  u.base, u.timeout_ms, u.hook, u.hook_context::jsonb, u.ckey, u.klimit, $16
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::int[], $8::int[],
  $9::float8[], $10::int[], $11::text[], $12::text[], $13::text[], $14::int[], $17::bool[])
  AS u(id, org_id, pool, handler, args, run_at, max_attempts, backoff_ms, base, timeout_ms, hook, hook_context, ckey, klimit, replay)
WHERE u.replay IS NOT TRUE AND (SELECT count(*) FROM workpool_pools WHERE name = ANY($3)) = $15`

// sqlClaimKeys records idempotency keys and returns those it inserted. A
// key another transaction is inserting makes this one wait for its
// outcome, so two concurrent enqueues with one key enqueue once.
const sqlClaimKeys = `
INSERT INTO workpool_idempotency_keys (org_id, pool, key, request_hash, work_id, created_at)
SELECT k.org_id, k.pool, k.key, k.hash, k.work_id, $6
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::uuid[]) AS k(org_id, pool, key, hash, work_id)
ON CONFLICT (org_id, pool, key) DO NOTHING
RETURNING org_id, pool, key`

const sqlReadKeys = `
SELECT k.org_id, k.pool, k.key, k.request_hash, k.work_id
FROM workpool_idempotency_keys k
JOIN unnest($1::text[], $2::text[], $3::text[]) AS u(org_id, pool, key)
  ON k.org_id = u.org_id AND k.pool = u.pool AND k.key = u.key`

// sqlPurgeKeys deletes a pool's idempotency keys past retention, a
// bounded batch at a time (a system chore across the pool's orgs).
const sqlPurgeKeys = `
DELETE FROM workpool_idempotency_keys WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM workpool_idempotency_keys WHERE pool = $1 AND created_at < $2 LIMIT $3))`

const sqlKnownPools = `SELECT name FROM workpool_pools WHERE name = ANY($1)`

const sqlStatus = `
SELECT id, org_id, pool, handler, state, attempts, canceled, outcome, result, error, run_at, created_at, finished_at,
  coalesce(concurrency_key, ''), coalesce(key_limit, CASE WHEN concurrency_key IS NOT NULL THEN 1 ELSE 0 END)
FROM workpool_work WHERE id = $1 AND org_id = $2`

// sqlCancel records a cancelation for unfinished work (at most one pending
// per item) and wakes the pool's loop.
const sqlCancel = `
WITH w AS (
  SELECT id, pool, org_id FROM workpool_work WHERE id = $1 AND org_id = $2 AND state <> 'finished'
), ins AS (
  INSERT INTO workpool_cancelations (work_id, pool, org_id, created_at)
  SELECT id, pool, org_id, $3 FROM w
  ON CONFLICT (work_id) DO NOTHING
  RETURNING pool
)
SELECT pg_notify('` + notifyChannel + `', 'k:' || pool) FROM ins`

const sqlCancelAll = `
WITH w AS (
  SELECT id, org_id FROM workpool_work WHERE pool = $2 AND org_id = $1 AND state = 'pending' AND concurrency_key IS NULL AND created_at < $3
  UNION ALL
  SELECT id, org_id FROM workpool_work WHERE pool = $2 AND org_id = $1 AND state = 'pending' AND concurrency_key IS NOT NULL AND created_at < $3
  UNION ALL
  -- (not running work whose cancelation was processed: it only waits for
  -- its attempt's report, and heartbeats tell its executor)
  SELECT id, org_id FROM workpool_work WHERE pool = $2 AND org_id = $1 AND state = 'running' AND NOT canceled AND created_at < $3
), ins AS (
  INSERT INTO workpool_cancelations (work_id, pool, org_id, created_at)
  SELECT id, $2, org_id, $4 FROM w
  ON CONFLICT (work_id) DO NOTHING
  RETURNING 1
)
SELECT count(*) FROM ins`

// --- the attempt lifecycle (docs/workpool.md § "The life of an attempt") ------
//
// A slot is a running attempt: a pool's slots in use are its rows in state
// 'running', nothing else. Only the loop adds to them (a start, fenced by the
// pool's generation); the statement that records an attempt's result — on
// the replica that ran it, or in the loop for an attempt whose executor went
// silent — takes the row out of 'running' and so frees the slot in the same
// write. The fragments below are the only spellings of the slot count and of
// the next-state decision.

// sqlSlotsInUse counts pool $1's slots in use.
const sqlSlotsInUse = `(SELECT count(*) FROM workpool_work WHERE pool = $1 AND state = 'running')`

// sqlFreeSlots is how many slots of pool $1 are free under limit.
func sqlFreeSlots(limit string) string {
	return `greatest(` + limit + ` - ` + sqlSlotsInUse + `, 0)::int`
}

// sqlRunningByOrg is the CTE running: pool $1's slots in use per org, for
// the fair picks, which count the free slots from it (sqlFreeSlotsOfOrgs)
// rather than pass over the running set twice.
const sqlRunningByOrg = `running AS (
  SELECT org_id, count(*) AS n FROM workpool_work WHERE pool = $1 AND state = 'running' GROUP BY org_id
)`

// sqlFreeSlotsOfOrgs is sqlFreeSlots counted from the CTE running.
func sqlFreeSlotsOfOrgs(limit string) string {
	return `greatest(` + limit + ` - (SELECT coalesce(sum(n), 0) FROM running), 0)::int`
}

// Next-state predicates of sqlComplete, over the work row w (before the
// update) and the reported attempt c. A canceled item always finishes (as
// canceled); an attempt handed back at shutdown goes back to pending without
// counting; a retryable failure with attempts left goes back to pending at
// its retry time; everything else finishes.
const (
	sqlHandedBack = `(NOT w.canceled AND c.kind = 'handback')`
	sqlWillRetry  = `(NOT w.canceled AND c.kind = 'failed' AND c.retryable AND w.attempts + 1 < w.max_attempts)`
	sqlRunsAgain  = `(` + sqlHandedBack + ` OR ` + sqlWillRetry + `)`
)

// retryDelayMS is the wait before the next attempt of w in milliseconds,
// once n attempts have finished: initial_backoff_ms·backoff_base^(n−1)·
// U[0.5, 1.5), at most MaxRetryDelay. The power is taken as exp(n·ln base)
// with the exponent clamped at retryExponentCap, so that no policy the
// validation admits (base ≤ 100, attempts ≤ 1000: 100^999 is far past
// float8) can overflow and fail the statement that records the attempt —
// and with it every other result of the batch. e^20·0.5 exceeds 24 h in ms,
// so the clamp never shortens a delay below the cap (for initial_backoff_ms
// ≥ 1), and 86,400,000·e^20·1.5 is far inside float8. The greatest() guards
// keep rows written around the validation (a negative base or attempt
// count) from raising an error here too.
func retryDelayMS(n string) string {
	return `least(greatest(w.initial_backoff_ms, 0)
    * exp(least((greatest(` + n + `, 1) - 1) * ln(greatest(w.backoff_base, 1)), ` + retryExponentCap + `))
    * (0.5 + random()), ` + maxRetryDelayMS + `)`
}

// sqlComplete records a batch of attempt results in one statement and, by
// taking each row out of 'running', frees its slot. An attempt counts only
// while the work is running at that attempt, so a duplicate or stale report
// changes nothing. A hand-back keeps the work's run_at, its place in its
// key's and its org's order. A hand-back, which does not count an attempt, must also
// come from the executor that holds the run ($8): a repeat of one (a batch
// retried after a commit of unknown outcome) cannot hand back the next run
// of the same attempt number on another replica. $1–$6 the results (id,
// attempt, kind: succeeded | failed | handback, result, error, retryable),
// $7 now, $8 the reporting executor. It returns every row it changed, with
// the kind reported.
var sqlComplete = `
WITH c AS (
  SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::bool[])
    AS c(id, attempt, kind, result, error, retryable)
), done AS (
UPDATE workpool_work w SET
  state = CASE WHEN ` + sqlRunsAgain + ` THEN 'pending' ELSE 'finished' END,
  attempts = w.attempts + CASE WHEN ` + sqlHandedBack + ` THEN 0 ELSE 1 END,
  run_at = CASE WHEN ` + sqlWillRetry + ` THEN $7::timestamptz + make_interval(secs => ` + retryDelayMS("w.attempts + 1") + ` / 1000.0)
                ELSE w.run_at END,
  outcome = CASE WHEN ` + sqlRunsAgain + ` THEN NULL
                 WHEN w.canceled THEN 'canceled'
                 WHEN c.kind = 'succeeded' THEN 'succeeded'
                 ELSE 'failed' END,
  result = CASE WHEN NOT w.canceled AND c.kind = 'succeeded' THEN c.result::jsonb END,
  error = CASE WHEN w.canceled OR c.kind = 'succeeded' THEN NULL
               WHEN ` + sqlHandedBack + ` THEN w.error
               ELSE c.error END,
  finished_at = CASE WHEN ` + sqlRunsAgain + ` THEN NULL ELSE $7::timestamptz END,
  hook_state = CASE WHEN ` + sqlRunsAgain + ` THEN NULL WHEN w.on_complete_hook IS NOT NULL THEN 'done' END,
  claimed_by = NULL,
  heartbeat_at = NULL
FROM c
WHERE w.id = c.id AND w.state = 'running' AND w.attempts = c.attempt - 1
  AND (c.kind <> 'handback' OR w.claimed_by = $8::uuid)
RETURNING w.id, w.org_id, w.pool, w.handler, w.state, w.outcome, w.result, w.error, w.attempts,
  w.on_complete_hook, w.on_complete_context, c.kind, w.run_at, w.concurrency_key
), requeued AS (
  -- work pending again goes back into its org's queue (docs/workpool.md §
  -- "Org queues"), rows locked in (pool, org) order as an enqueue locks
  -- them, and always written (see sqlQueueOrgsAfter)
  INSERT INTO workpool_org_queues (pool, org_id, head_at)
  SELECT pool, org_id, min(run_at) FROM done WHERE state = 'pending' AND concurrency_key IS NULL
  GROUP BY pool, org_id
  ORDER BY pool, org_id
  ON CONFLICT (pool, org_id) DO UPDATE SET head_at = least(workpool_org_queues.head_at, excluded.head_at)
)
SELECT id, org_id, pool, handler, state, outcome, result, error, attempts, on_complete_hook, on_complete_context, kind,
  -- (the recording transaction, for a leading loop's planned view: plan.go)
  pg_current_xact_id()::text::bigint AS xid
FROM done`

// sqlCompleteUnstorable finishes attempts whose reported result could not
// be recorded (sqlComplete failed on that item alone: a value Postgres
// refuses) as failed with $3 as the error, so that one item's data never
// holds up the others'. $1 ids, $2 attempts, $4 now.
const sqlCompleteUnstorable = `
UPDATE workpool_work w SET state = 'finished', attempts = w.attempts + 1,
  outcome = CASE WHEN w.canceled THEN 'canceled' ELSE 'failed' END, result = NULL,
  error = CASE WHEN w.canceled THEN NULL ELSE $3 END, finished_at = $4,
  hook_state = CASE WHEN w.on_complete_hook IS NOT NULL THEN 'done' END, claimed_by = NULL, heartbeat_at = NULL
FROM unnest($1::uuid[], $2::int[]) AS c(id, attempt)
WHERE w.id = c.id AND w.state = 'running' AND w.attempts = c.attempt - 1
RETURNING w.id, w.org_id, w.pool, w.handler, w.state, w.outcome, w.result, w.error, w.attempts,
  w.on_complete_hook, w.on_complete_context, 'failed'::text, pg_current_xact_id()::text::bigint AS xid`

// sqlHookFailed schedules failed hook calls for a retry.
const sqlHookFailed = `
UPDATE workpool_work w SET hook_state = 'retry', hook_attempts = w.hook_attempts + 1,
  hook_next_at = u.next_at, hook_error = u.error
FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) AS u(id, next_at, error)
WHERE w.id = u.id`

// sqlHookDeferred puts hook calls the loop did not make in its time (the
// hooks of canceled or recovered work) in the retry queue, due at $2,
// without an attempt counted.
const sqlHookDeferred = `
UPDATE workpool_work SET hook_state = 'retry', hook_next_at = $2
WHERE id = ANY($1) AND hook_state = 'done'`

const sqlHookDone = `
UPDATE workpool_work SET hook_state = 'done', hook_error = NULL, hook_next_at = NULL WHERE id = ANY($1)`

// --- executors --------------------------------------------------------------------

// sqlClaim takes running work no executor holds yet, from the small
// running set. It changes no indexed column, so the update stays on its
// heap page (HOT) and costs no index writes.
const sqlClaim = `
UPDATE workpool_work w SET claimed_by = $1, heartbeat_at = $2
WHERE w.id = ANY(ARRAY(
  SELECT id FROM workpool_work
  WHERE state = 'running' AND claimed_by IS NULL AND handler = ANY($3)
  ORDER BY started_at
  LIMIT $4
  FOR UPDATE SKIP LOCKED))
RETURNING w.id, w.org_id, w.pool, w.handler, w.args, w.attempts, w.timeout_ms, w.canceled, w.on_complete_hook IS NOT NULL`

// sqlReleaseOrphans unclaims the running work claimed for executor $1 that
// it does not run ($2, what it runs): claims a statement committed for it
// whose reply was lost (executor.releaseOrphans). Any executor may claim
// them again; the attempt was never made, so none is counted. It skips
// rows another transaction holds (an iteration canceling or recovering
// them: waited for under executor.claiming, that iteration's commit would
// wait for the lock in turn) and returns how many it freed and how many
// orphans it found.
const sqlReleaseOrphans = `
WITH orphan AS (
  SELECT id FROM workpool_work WHERE state = 'running' AND claimed_by = $1 AND NOT (id = ANY($2))
), freed AS (
  UPDATE workpool_work SET claimed_by = NULL, heartbeat_at = NULL
  WHERE id IN (SELECT id FROM workpool_work WHERE id IN (SELECT id FROM orphan) AND state = 'running' AND claimed_by = $1
               FOR UPDATE SKIP LOCKED)
  RETURNING id
)
SELECT (SELECT count(*) FROM freed), (SELECT count(*) FROM orphan)`

// sqlHeartbeat refreshes this executor's attempts, skipping rows another
// transaction holds (an attempt being recorded right now: waiting for it
// could deadlock with the recording, which locks its batch in another
// order; the next heartbeat comes well within the timeout), and reports
// for every attempt whether it is still this executor's and whether it was
// canceled.
const sqlHeartbeat = `
WITH hb AS (
  UPDATE workpool_work SET heartbeat_at = $3
  WHERE id IN (SELECT id FROM workpool_work WHERE id = ANY($1) AND claimed_by = $2 AND state = 'running'
               FOR UPDATE SKIP LOCKED)
  RETURNING id
)
SELECT w.id, w.canceled, w.state = 'running' AND coalesce(w.claimed_by = $2, false) AS mine, (SELECT count(*) FROM hb)
FROM workpool_work w WHERE w.id = ANY($1)`

// sqlKeepWaiting heartbeats the started work of handlers $1 that no
// executor has claimed (executor.heartbeat, while its executor is full):
// it waits for a free worker. Not canceled work, which waits for nothing:
// recovery finishes it, as canceled, once its heartbeat timeout passes
// (kept alive, it held its slot, its hook unrun, while the executor stayed
// full). Skipping rows another transaction holds (a
// claim taking them right now), as sqlHeartbeat does.
const sqlKeepWaiting = `
UPDATE workpool_work SET heartbeat_at = $2
WHERE id IN (SELECT id FROM workpool_work WHERE state = 'running' AND claimed_by IS NULL AND handler = ANY($1)
               AND NOT canceled
             FOR UPDATE SKIP LOCKED)`

// --- the main loop -------------------------------------------------------------------

const sqlTakeover = `
UPDATE workpool_pools SET generation = generation + 1 WHERE name = $1 RETURNING generation`

// sqlBump fences an iteration: it succeeds only if no other iteration ran
// since this loop's last one, and holds the pool row until commit, which
// serialises iterations. $1 pool, $2 generation, $3 now.
var sqlBump = bumpSQL("$2", "$3")

// bumpSQL is sqlBump with the generation and now at the parameters given.
// It marks the pool "running" — unless it is paused: a paused pool starts
// nothing and keeps the status its loop last published (scheduled or idle).
func bumpSQL(gen, now string) string {
	return `
UPDATE workpool_pools SET generation = generation + 1,
  run_kind = CASE WHEN paused THEN run_kind ELSE 'running' END,
  run_saturated = paused AND run_saturated, run_at = CASE WHEN paused THEN run_at END, updated_at = ` + now + `
WHERE name = $1 AND generation = ` + gen + `
RETURNING max_parallelism, max_parallelism_per_org, paused, settings_version`
}

// sqlTakeCancelations takes the oldest batch of a pool's cancelations. By
// tuple id: the table is empty nearly always, and the generic plan cached
// for an empty table joined it with the batch by comparing every row with
// every row taken — 1.5 s an iteration once a CancelAll of a backlog
// filled it, until an ANALYZE (only the loop deletes these rows).
const sqlTakeCancelations = `
DELETE FROM workpool_cancelations
WHERE ctid = ANY(ARRAY(SELECT ctid FROM workpool_cancelations WHERE pool = $1 ORDER BY created_at LIMIT $2))
RETURNING work_id`

// sqlMarkCanceled flags unfinished work canceled (so it never runs again)
// and reports where each item stands. Rows are locked in id order, the
// order every batch statement takes them in.
const sqlMarkCanceled = `
UPDATE workpool_work SET canceled = true
WHERE id IN (SELECT id FROM workpool_work WHERE id = ANY($1) AND state <> 'finished' ORDER BY id FOR UPDATE)
RETURNING id, state`

// sqlFinishCanceled finishes canceled work that holds no running attempt.
const sqlFinishCanceled = `
UPDATE workpool_work SET state = 'finished', outcome = 'canceled', result = NULL, error = NULL, finished_at = $2,
  hook_state = CASE WHEN on_complete_hook IS NOT NULL THEN 'done' END, claimed_by = NULL, heartbeat_at = NULL
WHERE id = ANY($1) AND state = 'pending' AND canceled
RETURNING id, org_id, pool, handler, state, outcome, result, error, attempts, on_complete_hook, on_complete_context`

// sqlStale finds attempts whose executor stopped heartbeating (or that no
// executor claimed) in time.
const sqlStale = `
SELECT id, attempts, claimed_by IS NULL FROM workpool_work
WHERE pool = $1 AND state = 'running' AND coalesce(heartbeat_at, started_at) < $2
ORDER BY started_at
LIMIT 1000
FOR UPDATE SKIP LOCKED`

const sqlDueHooks = `
SELECT id, org_id, pool, handler, state, outcome, result, error, attempts, on_complete_hook, on_complete_context, hook_attempts
FROM workpool_work
WHERE pool = $1 AND hook_state = 'retry' AND hook_next_at <= $2
ORDER BY hook_next_at
LIMIT 100
FOR UPDATE SKIP LOCKED`

// Starting work. Both iterations pick differently — the full one walks the
// orgs for fair share, keys and per-org caps; the fast one takes the one
// org's ready work in run_at order — and start what they picked with the
// same statement tail (sqlStartPicked), so a start means the same on both
// paths. Parameters common to every start statement: $1 pool, $2 now, $3
// the executors' notification payload, $4 handlers registered here, $5 free
// local capacity, $6 local share (1/replicas), $7 local executor id.

// sqlPickPlain picks one org's plain ready work in run_at order into the
// free slots (CTE free). With one org and no keys or per-org cap, fair share
// makes the same choice.
const sqlPickPlain = `
pick AS (
  ` + sqlPlainReady + `
)`

// sqlPickPlainBesideCancels is sqlPickPlain for a start beside a full batch
// of cancelations: of what it picked, it leaves the work whose cancelation
// waits in a later batch. (Tested after the limit, not in the index read: a
// CancelAll of the org's backlog would have the read pass all of it.)
var sqlPickPlainBesideCancels = `
pick AS (
  SELECT p.* FROM (` + sqlPlainReady + `) p
  WHERE ` + sqlNotBeingCanceled("p") + `
)`

const sqlPlainReady = `
  -- (the census's org: with the org fixed, run_at bounds the index range,
  -- so that a backlog of future work is not read to find the ready items)
  SELECT id, handler, ctid AS tid FROM workpool_work
  WHERE pool = $1 AND org_id = (SELECT org FROM census) AND state = 'pending' AND concurrency_key IS NULL AND run_at <= $2
  ORDER BY run_at
  LIMIT (SELECT n FROM free)
  FOR UPDATE SKIP LOCKED`

// sqlNotBeingCanceled is a picked item's (of row alias) test that no
// cancelation of it waits: the start beside a full batch of cancelations
// (the iteration took only a batch of them) must not start work that a
// later batch cancels. A scalar subquery, one primary-key probe per picked
// item: written NOT EXISTS, the planner made it a hash anti-join that read
// every cancelation waiting, 100,000 of them after a CancelAll of a backlog.
func sqlNotBeingCanceled(alias string) string {
	return `(SELECT true FROM workpool_cancelations x WHERE x.work_id = ` + alias + `.id) IS NULL`
}

// sqlStartPicked starts the work of CTE pick (id, handler): this replica's
// executor's share is claimed in the same statement (picked work of the
// handlers registered here, up to the share and the free local capacity);
// the rest waits, unclaimed, for the executors of other replicas, who are
// notified. It ends in a SELECT of the started work: the lags of every
// start, whether it notified, and the claimed items, column by column;
// extra is prepended to that select list.
func sqlStartPicked(extra string) string {
	return `
split AS (
  SELECT tid, coalesce(handler = ANY($4), false)
    AND row_number() OVER (PARTITION BY coalesce(handler = ANY($4), false))
        <= least($5::int, ceil((SELECT count(*) FROM pick) * $6::float8)) AS mine
  FROM pick
), started_here AS (
  -- (two updates over disjoint rows, each by its tuple-id array: no index
  -- lookup per row, and no per-row search of one set in the other, which
  -- grows with the square of a batch. A picked row is locked, so its tuple
  -- stays; one that another transaction changed after this statement's
  -- snapshot, which only a writer the generation does not fence could do,
  -- would be locked but not started, and left for the next iteration.)
  UPDATE workpool_work w SET state = 'running', started_at = $2, claimed_by = $7::uuid, heartbeat_at = $2
  WHERE w.ctid = ANY(ARRAY(SELECT tid FROM split WHERE mine))
  RETURNING w.id, w.org_id, w.handler, w.args, w.attempts, w.timeout_ms, w.on_complete_hook IS NOT NULL AS hook, w.run_at
), started_elsewhere AS (
  UPDATE workpool_work w SET state = 'running', started_at = $2, claimed_by = NULL, heartbeat_at = NULL
  WHERE w.ctid = ANY(ARRAY(SELECT tid FROM split WHERE NOT mine))
  RETURNING w.id, w.run_at
), started AS (
  SELECT id, org_id, handler, args, attempts, timeout_ms, hook, run_at, true AS mine FROM started_here
  UNION ALL
  SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, run_at, false FROM started_elsewhere
)
SELECT ` + extra + `
  coalesce((SELECT array_agg(extract(epoch FROM $2::timestamptz - run_at)::float8) FROM started), '{}'),
  (SELECT count(*) FROM (SELECT pg_notify('` + notifyChannel + `', $3) FROM started WHERE NOT mine LIMIT 1) n),
  coalesce((SELECT array_agg(id) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(org_id) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(handler) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(args::text) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(attempts) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(timeout_ms) FROM started WHERE mine), '{}'),
  coalesce((SELECT array_agg(hook) FROM started WHERE mine), '{}')`
}

// sqlStartPlain is the full iteration's start when its census found one
// org's plain work only and no per-org cap ($8 max_parallelism). It takes
// the census again in its own snapshot and starts nothing when work of
// another org, or keyed work, became ready since (a read-committed
// transaction's statements each see what has committed when they begin):
// it returns whether it could start (plain.ok) before the starts, and the
// iteration then starts fairly.
var sqlStartPlain = startPlain(sqlPickPlain)

// sqlStartPlainBesideCancels is sqlStartPlain beside a full batch of
// cancelations (sqlPickPlainBesideCancels).
var sqlStartPlainBesideCancels = startPlain(sqlPickPlainBesideCancels)

func startPlain(pick string) string {
	return `
WITH ` + sqlPlainCensus("true") + `,
free AS (SELECT CASE WHEN (SELECT ok FROM plain) THEN ` + sqlFreeSlots("$8::int") + ` ELSE 0 END AS n),
` + pick + `,
` + sqlStartPicked("(SELECT ok FROM plain),")
}

// sqlStartFair gives free slots to ready work fairly: orgs with ready work
// take turns (weighted), an org's running work stays within
// max_parallelism_per_org ($9, or null), and keyed work within its key's
// limit, in run_at order. The turns count starts: the org's n-th
// candidate takes the turn (position + n - 1) / weight, its position the
// later of the starts charged to it (workpool_org_turns, at least the
// pool's current turn's worth: sqlServed) and the current turn plus the
// slots it holds (sqlTurnsHeld); ties go to the org holding fewer slots
// for its weight, then in run_at order; the pick charges what it started
// (sqlChargeTurns). Slots held alone cannot tell orgs apart in a pool of
// one slot (none holds any at a pick), and ordering by n alone would hand
// a single free slot to whichever org queued first. The free count is
// taken in the same snapshot as the start (only the loop ever adds to the
// slots in use). $8 max_parallelism; $10–$14 the loop's turns
// (turnParams). It returns the charges (sqlTurnsCharged) before the starts.
var sqlStartFair = startFair(false)

// sqlStartFairBesideCancels is sqlStartFair beside a full batch of
// cancelations: it leaves picked work whose cancelation waits in a later
// batch (sqlPickFair's besideCancels).
var sqlStartFairBesideCancels = startFair(true)

func startFair(besideCancels bool) string {
	return `
WITH RECURSIVE
` + sqlRunningByOrg + `,
free AS (SELECT ` + sqlFreeSlotsOfOrgs("$8::int") + ` AS n),
` + sqlPickFair("$9::int", 10, besideCancels) + `,
` + sqlStartPicked(sqlTurnsCharged+",")
}

// sqlHeadProbe joins each queued org q (org_id, head_at) with its oldest
// ready plain item h (tid, run_at; null when it has none): one short index
// probe from the recorded head on.
const sqlHeadProbe = `LEFT JOIN LATERAL (
    SELECT w.ctid AS tid, w.run_at FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = q.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
      AND w.run_at >= q.head_at AND w.run_at <= $2
    ORDER BY w.run_at LIMIT 1) h ON true`

// sqlOrgRoom is the most an org may start now: the free slots (CTE free),
// within the per-org cap (perOrgCap, null: none) less its running attempts
// (r.n, from the CTE running).
func sqlOrgRoom(perOrgCap string) string {
	return `greatest(least((SELECT n FROM free),
      CASE WHEN ` + perOrgCap + ` IS NULL THEN 2147483647 ELSE ` + perOrgCap + ` - coalesce(r.n, 0) END), 0)`
}

// sqlNearRead is the CTEs weights, turns, queued, near_plus, near (with
// near_share1 … near_lim), near_next and near_read that both fair picks
// begin with: the free slots' worth of orgs whose next start comes first,
// each read once, from its queue's head, as far as its share of the free
// slots (CTE free) reaches. perOrgCap is the SQL of the per-org cap (null:
// none); turns numbers the loop's turns parameters.
func sqlNearRead(perOrgCap string, turns turnParams) string {
	return `
-- The pool's weights and the loop's turns (one line per org served), each
-- as one map each org is looked up in (sqlOrgWeight, sqlTurnLine): joined as
-- rows, the generic plan compared every queued org with every row — for
-- the turns, which it takes for ten rows whatever the parameter arrays
-- hold, 1,000 orgs × 500 lines, ~30 ms a start; for weights not yet
-- analyzed (a PATCH of many, until autovacuum gets to the table) 10,000
-- orgs × 1,000 weights, ~1.5 s.
weights AS MATERIALIZED (SELECT coalesce(jsonb_object_agg(org_id, weight), '{}') AS m FROM workpool_org_weights WHERE pool = $1),
turns AS MATERIALIZED (
  SELECT coalesce(jsonb_object_agg(t.org_id, jsonb_build_array(t.served, t.weight)), '{}') AS m FROM (` + turns.lines() + `) t
),
queued AS (
  -- the orgs whose plain queues may hold ready work (workpool_org_queues:
  -- a superset, each head at or before the org's oldest pending item),
  -- each with its weight, its running attempts, the starts charged to it
  -- (served, sqlServed), its position less one (vrun, sqlTurnsHeld),
  -- whether the per-org cap lets it start one, and its room, the most it
  -- may start now
  SELECT q.org_id, q.ctid AS qtid, q.head_at, q.xmin AS seen,
    coalesce(wt.weight, 1)::bigint AS weight, coalesce(r.n, 0) AS running,
    ` + sqlServed(turns, "coalesce(wt.weight, 1)") + ` AS served,
    ` + sqlTurnsHeld(turns, "coalesce(wt.weight, 1)") + ` - 1 AS vrun,
    ` + perOrgCap + ` IS NULL OR coalesce(r.n, 0) < ` + perOrgCap + ` AS open,
    ` + sqlOrgRoom(perOrgCap) + ` AS room
  FROM workpool_org_queues q
  CROSS JOIN LATERAL ` + sqlOrgWeight("q.org_id") + ` wt
  LEFT JOIN LATERAL ` + sqlTurnLine("q.org_id") + ` tu ON true
  LEFT JOIN running r ON r.org_id = q.org_id
  WHERE q.pool = $1 AND q.head_at <= $2 AND (SELECT n FROM free) > 0
),
near_plus AS (
  -- the free slots' worth of orgs whose next start comes first, and the
  -- first org after them, in the pick's order with the queue's head for
  -- the item's run_at (sqlNextStart; a head is at or before its org's
  -- first item): only those orgs can take a free slot, since an org's
  -- first item comes before its others — when their first items, as read,
  -- still come before the first org left out at its head (sqlNearExact).
  -- (Not every org tied on the lowest turn: among thousands of orgs tied,
  -- that was a probe per org for a start of one.)
  SELECT x.*, row_number() OVER (ORDER BY ` + sqlNextStart("x.head_at", "x.", "") + `) AS qn FROM (
    SELECT * FROM queued WHERE open ORDER BY ` + sqlNextStart("head_at", "", "") + ` LIMIT (SELECT n FROM free) + 1) x
),
near AS (
  SELECT * FROM near_plus WHERE qn <= (SELECT n FROM free)
),
near_next AS (
  -- the first org left out, and where its next start stands at the earliest
  SELECT ROW(` + sqlNextStart("head_at", "", "") + `) AS k FROM near_plus WHERE qn > (SELECT n FROM free)
),
` + sqlShareBound("near_", "near") + `,
near_read AS (
  -- each near org's candidates (at least its head, to learn that it has
  -- one): one index range read from its queue's head
  SELECT o.org_id, o.qtid, o.head_at, o.seen, o.weight, o.running, o.vrun, o.n, c.tid, c.run_at, c.rn
  FROM near_lim o LEFT JOIN LATERAL (
    -- (numbered outside the limit: a window beside it would read on to
    -- the end of the run_at group)
    SELECT x.tid, x.run_at, row_number() OVER (ORDER BY x.run_at) AS rn FROM (
      SELECT w.ctid AS tid, w.run_at FROM workpool_work w
      WHERE w.pool = $1 AND w.org_id = o.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
        AND w.run_at >= o.head_at AND w.run_at <= $2
      ORDER BY w.run_at LIMIT greatest(o.n, 1)) x) c ON true
)`
}

// sqlPickFair picks ready work into the free slots (CTE free) fairly, as
// sqlStartFair describes; perOrgCap is the SQL of the per-org cap (null:
// none). It needs WITH RECURSIVE.
//
// It has two ways to the same pick. The near one reads only the free
// slots' worth of orgs whose next start comes first, each with one index
// range read from its queue's head; when that proves too little (keyed
// work waits, an org among them has no ready work, or sqlNearExact fails:
// a stale head put one out of turn, or their items cannot fill the free
// slots while orgs were left out), the full one probes every queued org.
// (sqlPickNear is the near way alone.) besideCancels leaves, of what it
// picked (CTE picked), the work whose cancelation waits (pick holds the
// rest): passed over, it is not started, but its org is charged the turn
// all the same, so that the next turn goes to another org — else an org
// whose backlog is being canceled kept the first turn, and with one slot
// free nothing started until its last cancelation.
func sqlPickFair(perOrgCap string, turns turnParams, besideCancels bool) string {
	picked, passOver := "pick", ""
	if besideCancels {
		picked = "picked"
		passOver = `,
pick AS (SELECT id, handler, tid, org_id FROM picked WHERE ` + sqlNotBeingCanceled("picked") + `)`
	}
	return sqlNearRead(perOrgCap, turns) + `,
near_ok AS (
  -- When no keyed work waits, each near org has ready work and their
  -- first items come before any start of the others (sqlNearExact), the
  -- free slots' worth of first starts is theirs: the pick needs nothing
  -- from the others. For a slot or two freed in a busy pool, that is one
  -- org read, not every org.
  SELECT (SELECT org_id FROM keys LIMIT 1) IS NULL AND NOT EXISTS (SELECT 1 FROM near_read WHERE tid IS NULL)
    AND ` + sqlNearExact + ` AS ok
),
queues AS (
  -- otherwise (a head gone stale, keyed work) every queued org, each with
  -- its oldest ready item (null: none): one short probe per org
  SELECT q.org_id, q.qtid, q.head_at, q.seen, h.tid, h.run_at
  FROM queued q ` + sqlHeadProbe + `
  WHERE NOT (SELECT ok FROM near_ok)
),
orgs AS (
  -- each org with ready plain work and its queue's head
  SELECT org_id, tid, run_at FROM queues WHERE tid IS NOT NULL
),
keys(org_id, ckey, klimit) AS (
  (SELECT org_id, concurrency_key, key_limit FROM workpool_work
   WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NOT NULL AND run_at <= $2
   ORDER BY org_id, concurrency_key, run_at, id LIMIT 1)
  UNION ALL
  SELECT n.org_id, n.concurrency_key, n.key_limit
  FROM keys k CROSS JOIN LATERAL (
    SELECT w.org_id, w.concurrency_key, w.key_limit FROM workpool_work w
    WHERE w.pool = $1 AND w.state = 'pending' AND w.concurrency_key IS NOT NULL AND w.run_at <= $2
      AND (w.org_id, w.concurrency_key) > (k.org_id, k.ckey)
    ORDER BY w.org_id, w.concurrency_key, w.run_at, w.id LIMIT 1) n
),
key_room AS (
  -- each ready key's room: its limit (its earliest ready item's) less its
  -- running attempts
  SELECT k.org_id, k.ckey, greatest(coalesce(k.klimit, 1) - (
      SELECT count(*) FROM workpool_work a
      WHERE a.pool = $1 AND a.org_id = k.org_id AND a.state = 'running' AND a.concurrency_key = k.ckey), 0) AS n
  FROM keys k
),
held AS (
  -- every org with ready work: its weight, served and vrun (as in
  -- queued), its running attempts (CTE
  -- running: one pass over the running set for every org, as a probe per
  -- org would walk the running index's dead entries once per org), and its
  -- room, the most it may start now (the free slots, within the per-org
  -- cap; for an org whose ready work is all keyed, within its keys' room
  -- too: dealt a share its keys then refused, the slots would stay idle
  -- while other orgs' work is ready)
  SELECT d.org_id, coalesce(wt.weight, 1)::bigint AS weight, coalesce(r.n, 0) AS running,
    ` + sqlServed(turns, "coalesce(wt.weight, 1)") + ` AS served,
    ` + sqlTurnsHeld(turns, "coalesce(wt.weight, 1)") + ` - 1 AS vrun,
    least(` + sqlOrgRoom(perOrgCap) + `, CASE WHEN p.org_id IS NOT NULL THEN 2147483647 ELSE coalesce(kr.n, 0) END) AS room
  FROM (SELECT org_id FROM orgs UNION SELECT org_id FROM keys) d
  LEFT JOIN orgs p ON p.org_id = d.org_id
  LEFT JOIN (SELECT org_id, sum(n) AS n FROM key_room GROUP BY org_id) kr ON kr.org_id = d.org_id
  CROSS JOIN LATERAL ` + sqlOrgWeight("d.org_id") + ` wt
  LEFT JOIN LATERAL ` + sqlTurnLine("d.org_id") + ` tu ON true
  LEFT JOIN running r ON r.org_id = d.org_id
  WHERE (SELECT n FROM free) > 0
),
` + sqlShareBound("", "held") + `,
cand AS (
  -- the candidates: the near orgs' as read; or each org's plain head found
  -- by queues, then (when it may take more) those after it, read from the
  -- head on, and keyed work
  -- (id only for keyed work, whose ties start in id order)
  SELECT tid, org_id, run_at, NULL::uuid AS id, weight, running, vrun, n FROM near_read WHERE rn <= n AND (SELECT ok FROM near_ok)
  UNION ALL
  SELECT h.tid, h.org_id, h.run_at, NULL, o.weight, o.running, o.vrun, o.n FROM orgs h JOIN lim o ON o.org_id = h.org_id WHERE o.n > 0
  UNION ALL
  SELECT c.tid, h.org_id, c.run_at, NULL, o.weight, o.running, o.vrun, o.n
  FROM orgs h JOIN lim o ON o.org_id = h.org_id CROSS JOIN LATERAL (
    SELECT w.ctid AS tid, w.run_at FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = h.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
      AND w.run_at >= h.run_at AND w.run_at <= $2 AND w.ctid <> h.tid
    ORDER BY w.run_at LIMIT o.n - 1) c
  WHERE o.n > 1
  UNION ALL
  SELECT c.tid, k.org_id, c.run_at, c.id, o.weight, o.running, o.vrun, o.n
  FROM key_room k JOIN lim o ON o.org_id = k.org_id CROSS JOIN LATERAL (
    SELECT w.ctid AS tid, w.run_at, w.id FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = k.org_id AND w.concurrency_key = k.ckey AND w.state = 'pending' AND w.run_at <= $2
    ORDER BY w.run_at, w.id
    LIMIT least(o.n, k.n)) c
  WHERE o.n > 0 AND k.n > 0
),
ranked AS (
  SELECT c.tid, c.org_id, c.run_at, c.weight, c.running, c.vrun, c.n,
    row_number() OVER (PARTITION BY c.org_id ORDER BY c.run_at, c.id) AS rn
  FROM cand c
),
` + picked + ` AS (
  -- (by tuple id: no index lookup per started item)
  SELECT w.id, w.handler, w.ctid AS tid, w.org_id FROM workpool_work w
  WHERE w.ctid = ANY(ARRAY(SELECT tid FROM ranked WHERE rn <= n
                           ORDER BY ` + sqlTurnOrder + ` LIMIT (SELECT n FROM free)))
    AND w.state = 'pending'
  FOR UPDATE SKIP LOCKED
)` + passOver + `,
heads AS (
  -- each org read, with the head its read found (null: no ready item)
  ` + sqlNearHeads + `
  UNION ALL
  SELECT org_id, qtid, head_at, seen, run_at FROM queues
),
` + sqlMoveHeads + `,
` + sqlChargeTurns(picked, "(SELECT org_id, weight, served, vrun FROM near_lim UNION SELECT org_id, weight, served, vrun FROM lim)")
}

// sqlPickNear is sqlPickFair's near way alone, for the fast iteration of a
// pool without keyed work (sqlIterateFastNear): the same pick whenever
// that way can decide it (near_ok), and nothing at all, not even a head
// moved, when it cannot — keyed work waits, a near org has no ready work,
// a stale head put an org among the near ones out of turn, or they would
// leave slots free while orgs were left out (sqlNearExact) — so that the
// loop takes sqlIterateFastShared at once. Without the
// other way's CTEs its plan has half the nodes, which every execution
// initialises (docs/benchmarks.md § pool: a fifth of the fair statement's
// time). It needs the CTE keyed (sqlIterateFair's).
func sqlPickNear(perOrgCap string, turns turnParams) string {
	return sqlNearRead(perOrgCap, turns) + `,
near_ok AS (
  SELECT NOT (SELECT waits FROM keyed) AND NOT EXISTS (SELECT 1 FROM near_read WHERE tid IS NULL)
    AND ` + sqlNearExact + ` AS ok
),
pick AS (
  -- (by tuple id: no index lookup per started item)
  SELECT w.id, w.handler, w.ctid AS tid, w.org_id FROM workpool_work w
  WHERE w.ctid = ANY(ARRAY(SELECT tid FROM near_read WHERE rn <= n AND (SELECT ok FROM near_ok)
                           ORDER BY ` + sqlTurnOrder + ` LIMIT (SELECT n FROM free)))
    AND w.state = 'pending'
  FOR UPDATE SKIP LOCKED
),
heads AS (
  ` + sqlNearHeads + `
),
` + sqlMoveHeads + `,
` + sqlChargeTurns("pick", "near_lim")
}

// sqlClockTurns is the pool's current turn (the clock, num / den, of the
// loop's turns) in starts of an org of the given weight (SQL), rounded up.
// (Spelled with the parameters: a CTE clock read by subqueries put nine
// init plans into every fair pick.)
func sqlClockTurns(turns turnParams, weight string) string {
	num, den := turns.param(3, "bigint"), turns.param(4, "bigint")
	return `(` + num + ` * ` + weight + ` + ` + den + ` - 1) / ` + den
}

// sqlOrgWeight is org's weight (wt.weight; null: the default, 1), from
// CTE weights' map.
func sqlOrgWeight(org string) string {
	return `(SELECT ((SELECT m FROM weights) ->> ` + org + `)::int AS weight)`
}

// sqlTurnLine is org's line of the loop's turns (tu.served), from CTE
// turns' map: none without a line, or with a line charged at another
// weight than the org's current one (wt.weight): a weight change restarts
// its turns. The caller has the org's weight (null: the default) in scope
// as wt.weight.
func sqlTurnLine(org string) string {
	return `(SELECT (l ->> 0)::bigint AS served FROM (SELECT (SELECT m FROM turns) -> ` + org + ` AS l) x
    WHERE (l ->> 1)::int = coalesce(wt.weight, 1))`
}

// sqlServed is the starts charged to an org (tu.served, from the loop's
// turns; none without a line) as its next pick counts them: never fewer
// than reach the pool's current turn at the org's weight (the SQL
// weight), so that an org that had no ready work while the others took
// their turns — or never had any — joins at the current turn instead of
// cashing in its idle time. Rounded up: it joins at most one turn late.
// (fairTurns.prune drops the lines this lifts.)
func sqlServed(turns turnParams, weight string) string {
	return `greatest(coalesce(tu.served, 0), ` + sqlClockTurns(turns, weight) + `)`
}

// sqlTurnsHeld is where an org's next start stands, in its own turns: the
// later of its starts charged (sqlServed) and the pool's current turn plus
// the slots it holds (r.n, from the CTE running). Turns alone would let an
// org whose work runs for hours take every other start until it held
// every slot; slots alone cannot tell orgs apart in a pool of one slot
// (none holds any at a pick). Counting the slots from the second instead
// would split three slots 3:1 by starts at weights 3:1, but let a weight-1
// org whose work runs for hours hold both slots of a pool of two. Only
// starts are charged.
func sqlTurnsHeld(turns turnParams, weight string) string {
	return `greatest(coalesce(tu.served, 0), ` + sqlClockTurns(turns, weight) + ` + coalesce(r.n, 0))`
}

// sqlChargeTurns is the CTEs charged and clock_turn of a fair pick: each
// org that took k items of CTE picked (pick, or what sqlPickFair picked
// beside cancelations) is charged them (served + k), and the clock
// moves to the turn of the last start, the highest a started item took
// (every item picked takes a turn at or past the clock's, so it never
// moves back). orgs is the SQL of the picked orgs' (org_id, weight,
// served, vrun) as the pick ranked them. The statement returns them
// (sqlTurnsCharged); the loop enters them in its turns once it committed.
func sqlChargeTurns(picked, orgs string) string {
	return `charged AS (
  -- last: the turn numerator of the org's last start, vrun + k; charged_to: what
  -- the org has been charged, served + k
  -- (counted before the join: joined first, every started item was
  -- compared with every org, a fifth of a big start's time)
  SELECT p.org_id, o.weight, o.vrun + p.k AS last, o.served + p.k AS charged_to
  FROM (SELECT org_id, count(*) AS k FROM ` + picked + ` GROUP BY org_id) p JOIN ` + orgs + ` o ON o.org_id = p.org_id
),
clock_turn AS (
  SELECT last, weight FROM charged ORDER BY last::float8 / weight DESC LIMIT 1
)`
}

// sqlTurnsCharged is a fair pick's charges as result columns (turnCharges):
// the orgs, their new totals and weights, and the new clock (null: none).
const sqlTurnsCharged = `coalesce((SELECT array_agg(org_id ORDER BY org_id) FROM charged), '{}'),
  coalesce((SELECT array_agg(charged_to ORDER BY org_id) FROM charged), '{}'),
  coalesce((SELECT array_agg(weight::int ORDER BY org_id) FROM charged), '{}'),
  (SELECT last FROM clock_turn), (SELECT weight FROM clock_turn)`

// sqlTurnOrder is the fair order of a pick's candidates (vrun: the org's
// position less one, running, weight, rn: the candidate's place in its
// org's queue): the turn, then the slots held, then run_at, then the org
// (so that no two orgs' candidates tie) — both picks' spelling.
const sqlTurnOrder = `(vrun + rn)::float8 / weight, (running + rn)::float8 / weight, run_at, org_id`

// sqlNextStart is where an org's next start stands in the fair order:
// sqlTurnOrder's terms at rn 1 (first the turn it would take, its
// position / weight, from CTE queued's vrun, its position less one), with
// runAt (SQL) for its item's run_at: the head of its queue before its
// read, the item read after. of ("" or "x.") qualifies the other columns,
// and desc ("" or " DESC") follows each term, for an ORDER BY.
func sqlNextStart(runAt, of, desc string) string {
	return `(` + of + `vrun + 1)::float8 / ` + of + `weight` + desc + `, (` + of + `running + 1)::float8 / ` + of + `weight` + desc +
		`, ` + runAt + desc + `, ` + of + `org_id` + desc
}

// sqlNearExact says that the near orgs' first items, as read, all come
// before any start of the orgs left out (near_next): so the free slots'
// worth of first starts is theirs, and the near pick is the whole one.
// A head gone stale (its items started or canceled since it was moved)
// can put an org among the near ones whose first item comes later; then
// the full pick decides. So does a near pick that would leave free slots
// while orgs were left out: the share bound, dealt over the near orgs
// alone, can give one of them slots it has no items for and the next
// near org none.
var sqlNearExact = `coalesce((SELECT k FROM near_next) > (
    SELECT ROW(` + sqlNextStart("run_at", "", "") + `) FROM near_read WHERE rn = 1
    ORDER BY ` + sqlNextStart("run_at", "", " DESC") + ` LIMIT 1), true)
  AND (NOT EXISTS (SELECT 1 FROM near_next) OR (SELECT count(*) FROM near_read WHERE rn <= n) >= (SELECT n FROM free))`

// sqlNearHeads is, for CTE heads, each near org read with the head its
// read found (null: no ready item), when the near way decided the pick.
const sqlNearHeads = `SELECT org_id, qtid, head_at, seen, run_at FROM near_read WHERE (rn = 1 OR tid IS NULL) AND (SELECT ok FROM near_ok)`

// sqlMoveHeads is the CTEs moved, untouched, raised and dropped of a fair
// pick: they move the queue heads of CTE heads (org_id, qtid the queue
// row's tuple id, head_at and seen as read from the queue, run_at the
// head its read found, null for none). Each row is found by its tuple id:
// joined with the moves by org, the generic plan could run every queue
// row of the pool against every move, three times (2,000 orgs and 100
// moves: ~125 ms of a start, when items have their own run_at and every
// near org's head moves).
const sqlMoveHeads = `moved AS (
  -- each queue whose recorded head is behind: to the head the read found
  -- (past what the last picks started), or, with no ready item, to the
  -- org's first future item (null: nothing pending, the row goes)
  SELECT q.org_id, q.qtid, q.seen, coalesce(q.run_at, (SELECT min(w.run_at) FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = q.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
      AND w.run_at > $2)) AS head_at
  FROM heads q
  WHERE q.run_at IS DISTINCT FROM q.head_at
),
untouched AS (
  -- only rows no other transaction wrote since this snapshot (xmin: a row
  -- written since has another tuple id too) or holds now: an enqueue or a
  -- retry that raced this pick keeps its head
  SELECT q.tid, m.head_at FROM moved m CROSS JOIN LATERAL (
    SELECT q.ctid AS tid FROM workpool_org_queues q
    WHERE q.ctid = m.qtid AND q.pool = $1 AND q.xmin = m.seen
    FOR UPDATE SKIP LOCKED) q
),
raised AS (
  UPDATE workpool_org_queues q SET head_at = u.head_at FROM untouched u
  WHERE q.ctid = u.tid AND q.pool = $1 AND u.head_at IS NOT NULL
),
dropped AS (
  DELETE FROM workpool_org_queues q USING untouched u
  WHERE q.ctid = u.tid AND q.pool = $1 AND u.head_at IS NULL
)`

// sqlShareBound is the CTEs share1, under, bound and lim of a fair pick,
// each name prefixed with prefix: lim is each org of CTE orgs
// (org_id, weight, vrun: its position less one, sqlTurnsHeld, room: the
// most it may start now, and any other columns) with n, how far down its
// queue it can get.
//
// The pick takes the free slots' worth (F) of the lowest turns (vrun +
// n) / weight, and, over a set of N orgs of total weight W with R the sum
// of their vrun, turns up to T = (F + R + N) / W number at least F
// (each org's count is floor(T * weight) - vrun, at least T * weight -
// vrun - 1). So no org needs more than floor(T * weight) - vrun
// turns: the pick deals F + N of them, not F to every org. Orgs with
// nothing below T are left out and T taken again over the rest (a tighter
// bound: one org far past its share no longer raises everyone's). When the
// per-org cap stops the counts short of F, every org gets up to its room,
// as without the bound. If some orgs have fewer ready items than their
// bound, the pick is still the first of the fair order; the next iteration
// takes the rest. (T's sums are window aggregates over the rows they
// bound: a sum joined to every row is evaluated again for each of them.)
func sqlShareBound(prefix, orgs string) string {
	return prefix + `share1 AS (
  SELECT h.org_id, h.weight, h.vrun, h.room,
    (SELECT n FROM free) + (sum(h.vrun) OVER ())::bigint + count(*) OVER () AS num, (sum(h.weight) OVER ())::bigint AS den
  FROM ` + orgs + ` h WHERE h.room > 0
),
` + prefix + `under AS (
  SELECT org_id, weight, vrun, room FROM ` + prefix + `share1 WHERE (num * weight) / den > vrun
),
` + prefix + `bound AS (
  SELECT org_id, least(room, (((SELECT n FROM free) + (sum(vrun) OVER ())::bigint + count(*) OVER ()) * weight)
    / (sum(weight) OVER ())::bigint - vrun) AS n
  FROM ` + prefix + `under
),
` + prefix + `lim AS (
  SELECT h.*,
    CASE WHEN (SELECT coalesce(sum(n), 0) FROM ` + prefix + `bound) >= (SELECT n FROM free) THEN coalesce(b.n, 0) ELSE h.room END AS n
  FROM ` + orgs + ` h LEFT JOIN ` + prefix + `bound b ON b.org_id = h.org_id
)`
}

// sqlKeyedReady is ready keyed work's earliest run_at (null: none): one
// probe of its own index in run_at order (migration 00026). (Ordered, not
// an EXISTS: a generic plan would rather seq-scan for "any row"; and not in
// (org_id, key) order, which walks every entry scheduled later.)
const sqlKeyedReady = `(SELECT run_at FROM workpool_work
   WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NOT NULL AND run_at <= $2
   ORDER BY run_at LIMIT 1)`

// sqlDueQueues is how many orgs (up to 2) may have ready plain work: those
// whose queue's head has come (sqlPlainCensus).
const sqlDueQueues = `(SELECT count(*) FROM (SELECT 1 FROM workpool_org_queues WHERE pool = $1 AND head_at <= $2 LIMIT 2) q)`

// sqlPlainCensus is the CTEs census and plain of the plain starts:
// plain.ok says that the ready work (if any) is one org's plain work and
// noCap (SQL: the pool has no per-org cap), so that fair share has nothing
// to share; census.org is that org (null: none may have ready work).
//
// The orgs come from their queues (workpool_org_queues: every org with
// pending plain work has one, its head at or before its oldest item), not
// from the work: "an org with ready work" asked of the pending index
// (pool, org_id, run_at) walks every entry of the orgs whose work is all
// in the future — a pool holding a week of scheduled work read all of it
// at every iteration. A queue whose head has gone stale (its org's ready
// work started) may count an org with nothing ready: the plain start then
// finds nothing, or the fair one, which moves the heads, runs instead.
func sqlPlainCensus(noCap string) string {
	return `census AS (
  SELECT (SELECT org_id FROM workpool_org_queues WHERE pool = $1 AND head_at <= $2
          ORDER BY org_id LIMIT 1) AS org
), plain AS (
  SELECT ` + noCap + `
    -- (ordered probes: a generic plan would rather seq-scan for "any row")
    AND (SELECT q.org_id FROM workpool_org_queues q
         WHERE q.pool = $1 AND q.head_at <= $2 AND q.org_id > (SELECT org FROM census)
         ORDER BY q.org_id LIMIT 1) IS NULL
    AND ` + sqlKeyedReady + ` IS NULL AS ok
)`
}

// sqlFastTail ends sqlIterateFast: what it reports besides the starts
// (fenced, paused, plain, cancelations waiting, the next start, in the
// fair iterations' shape decided and keyed: true and false, the free
// slots it filled from, and whether work it cannot see the next start of
// may wait: another org's, or keyed work — the loop's full iteration then
// finds it).
const sqlFastTail = `EXISTS (SELECT 1 FROM bump), coalesce((SELECT paused FROM bump), false), (SELECT ok FROM plain),
  EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1),
  -- the next start of the first org's plain work (a retry, say): two index
  -- probes, so that the loop waiting out its cooldown wakes for it in time
  (SELECT min(run_at) FROM workpool_work
   WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NULL AND run_at > $2
     AND org_id = (SELECT org_id FROM workpool_work WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NULL
                   ORDER BY org_id LIMIT 1)),
  true, false, (SELECT n FROM free),
  -- (two ordered index probes: as an EXISTS, the generic plan took a
  -- sequential scan of the whole table, expected to stop at its first row,
  -- for "another org than the first" — which one org's pool never has)
  (SELECT n FROM free) > 0 AND (
    (SELECT org_id FROM workpool_work WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NOT NULL
     ORDER BY org_id LIMIT 1) IS NOT NULL
    OR (SELECT w.org_id FROM workpool_work w WHERE w.pool = $1 AND w.state = 'pending' AND w.concurrency_key IS NULL
          AND w.org_id > (SELECT org_id FROM workpool_work WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NULL
                          ORDER BY org_id LIMIT 1)
        ORDER BY w.org_id LIMIT 1) IS NOT NULL),`

// sqlIterateFast is a whole iteration in one statement for the common
// case: no cancelation to process, and ready work of one org only, without
// keys or a per-org cap. It fences itself like any iteration (every write
// depends on the bump: the free count is 0 without it) and starts the one
// org's ready work into the free slots, as sqlStartPlain would. What it
// cannot handle it leaves and reports: the loop then runs the full
// iteration. A paused pool's free count is 0 (read from the bumped row).
// $8 generation; the rest as every start.
var sqlIterateFast = `
WITH bump AS (` + bumpSQL("$8", "$2") + `
), ` + sqlPlainCensus("EXISTS (SELECT 1 FROM bump WHERE max_parallelism_per_org IS NULL)") + `, free AS (
  SELECT CASE WHEN (SELECT ok FROM plain) AND NOT coalesce((SELECT paused FROM bump), true)
      -- cancelations go first: never start what is about to be canceled
      AND NOT EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1)
    THEN ` + sqlFreeSlots("coalesce((SELECT max_parallelism FROM bump), 0)") + ` ELSE 0 END AS n
),
` + sqlPickPlain + `,
` + sqlStartPicked(sqlFastTail)

// sqlIterateFastShared is sqlIterateFast for work that fair share must
// share (several orgs, keys, a per-org cap): the same fence and
// conditions, and sqlStartFair's pick, the cap read from the bumped row.
// The loop takes it while the last start needed fair share and keyed work
// waited, or when sqlIterateFastNear could not decide: a busy pool of many
// orgs then costs one statement per iteration, as one org's does.
var sqlIterateFastShared = sqlIterateFair(sqlPickFair("(SELECT max_parallelism_per_org FROM bump)", 9, false),
	"true", "(SELECT org_id FROM keys LIMIT 1) IS NOT NULL")

// sqlIterateFastNear is sqlIterateFastShared with sqlPickNear, for a pool
// whose last fair start saw no keyed work: the same pick when it can
// decide; when it cannot it starts nothing and says so (decided false),
// and the loop runs sqlIterateFastShared at once.
var sqlIterateFastNear = sqlIterateFair(sqlPickNear("(SELECT max_parallelism_per_org FROM bump)", 9),
	"(SELECT ok FROM near_ok) OR (SELECT n FROM free) = 0", "(SELECT waits FROM keyed)")

// sqlIterateFair is a fair fast iteration with pick, the CTEs of a fair
// pick; decided and keyed are the SQL of what it reports besides
// sqlFastTail's: whether the pick was made (false: nothing was written but
// the fence) and whether keyed work waits (CTE keyed: whether keyed work
// is ready).
func sqlIterateFair(pick, decided, keyed string) string {
	return `
WITH RECURSIVE bump AS (` + bumpSQL("$8", "$2") + `
), keyed AS (
  SELECT ` + sqlKeyedReady + ` IS NOT NULL AS waits
), plain AS (
  -- (the queues hold every org with ready plain work, perhaps more: "one
  -- org" read from them may say "several", which only keeps fair share)
  SELECT EXISTS (SELECT 1 FROM bump WHERE max_parallelism_per_org IS NULL)
    AND ` + sqlDueQueues + ` <= 1
    AND NOT (SELECT waits FROM keyed) AS ok
), changed AS (
  -- whether a change to the pool's settings committed while the bump
  -- waited for the pool row: the bump returns the new settings, this
  -- statement's snapshot holds the old row and the old weights (a PATCH
  -- writes both), and a pick would mix the two. It picks nothing; the
  -- change's kick brings the loop back at once, to a snapshot with all of it.
  -- (by the settings' version, which every change bumps: a change of the
  -- weights alone leaves the row's limits and pause as they were)
  SELECT EXISTS (SELECT 1 FROM workpool_pools p, bump b WHERE p.name = $1
    AND p.settings_version <> b.settings_version) AS settings
), ` + sqlRunningByOrg + `, free AS (
  SELECT CASE WHEN NOT coalesce((SELECT paused FROM bump), true) AND NOT (SELECT settings FROM changed)
      AND NOT EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1)
    THEN ` + sqlFreeSlotsOfOrgs("coalesce((SELECT max_parallelism FROM bump), 0)") + ` ELSE 0 END AS n
),
` + pick + `,
` + sqlStartPicked(`EXISTS (SELECT 1 FROM bump), coalesce((SELECT paused FROM bump), false), (SELECT ok FROM plain),
  EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1),
  -- the next start of plain work the queues know of (a retry, say), so
  -- that the loop waiting out its cooldown wakes for it in time
  least((SELECT min(head_at) FROM workpool_org_queues WHERE pool = $1 AND head_at > $2),
        (SELECT min(head_at) FROM moved WHERE head_at > $2)),
  `+decided+`, `+keyed+`, (SELECT n FROM free), (SELECT n FROM free) > 0 OR (SELECT settings FROM changed), `+sqlTurnsCharged+`,`)
}

// sqlPendingOrgsWalk is the recursive CTE orgs: every org with pending
// plain work in pool $1 (and a last row of null), one probe of the pending
// index per org — a walk for the chores and the idle outlook, not for a
// start, which reads the orgs from their queues.
const sqlPendingOrgsWalk = `orgs(org_id) AS (
  SELECT (SELECT org_id FROM workpool_work WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NULL
          ORDER BY org_id LIMIT 1)
  UNION ALL
  SELECT (SELECT w.org_id FROM workpool_work w WHERE w.pool = $1 AND w.state = 'pending' AND w.concurrency_key IS NULL
            AND w.org_id > o.org_id ORDER BY w.org_id LIMIT 1)
  FROM orgs o WHERE o.org_id IS NOT NULL
)`

// sqlRepairQueues gives every org with pending plain work in pool $1 its
// queue row, or lowers a row's head to the org's earliest pending run_at
// when it is later (a chore of the leader, and the first thing a new term
// does): the writers keep the queues in the transactions that make work
// pending, so this finds nothing — unless something else wrote work (a
// replica of a version before the queues, during a rolling upgrade, or a
// hand-made INSERT). It only lowers heads, so it cannot hide work either.
// It returns the rows it wrote. One probe per org walks the pending index.
const sqlRepairQueues = `
WITH RECURSIVE ` + sqlPendingOrgsWalk + `
INSERT INTO workpool_org_queues (pool, org_id, head_at)
SELECT $1, o.org_id, (SELECT min(w.run_at) FROM workpool_work w
  WHERE w.pool = $1 AND w.org_id = o.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL)
FROM orgs o WHERE o.org_id IS NOT NULL
ORDER BY o.org_id
ON CONFLICT (pool, org_id) DO UPDATE SET head_at = excluded.head_at
WHERE excluded.head_at < workpool_org_queues.head_at`

// sqlCensus tells an iteration whether fair share has anything to share:
// how many orgs (up to 2) may have ready plain work (their queues' heads
// have come: sqlPlainCensus), and whether keyed work is ready. Index
// probes only.
const sqlCensus = `
SELECT
  ` + sqlDueQueues + `,
  ` + sqlKeyedReady + ` IS NOT NULL`

// sqlOutlook tells an iteration that found nothing to do what remains: slots
// in use, whether ready work waits, the earliest future start and the
// earliest hook retry.
const sqlOutlook = `
WITH RECURSIVE ` + sqlPendingOrgsWalk + `, heads AS (
  SELECT (SELECT min(w.run_at) FROM workpool_work w WHERE w.pool = $1 AND w.org_id = o.org_id AND w.state = 'pending'
            AND w.concurrency_key IS NULL) AS first_at,
         (SELECT min(w.run_at) FROM workpool_work w WHERE w.pool = $1 AND w.org_id = o.org_id AND w.state = 'pending'
            AND w.concurrency_key IS NULL AND w.run_at > $2) AS next_at
  FROM orgs o WHERE o.org_id IS NOT NULL
)
SELECT
  ` + sqlSlotsInUse + `,
  EXISTS (SELECT 1 FROM heads WHERE first_at <= $2)
    OR ` + sqlKeyedReady + ` IS NOT NULL,
  least((SELECT min(next_at) FROM heads),
        (SELECT run_at FROM workpool_work WHERE pool = $1 AND state = 'pending' AND concurrency_key IS NOT NULL AND run_at > $2
         ORDER BY run_at LIMIT 1)),
  (SELECT min(hook_next_at) FROM workpool_work WHERE pool = $1 AND hook_state = 'retry'),
  EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1)`

const sqlSetRunStatus = `
UPDATE workpool_pools SET run_kind = $3, run_saturated = $4, run_at = $5, updated_at = $6
WHERE name = $1 AND generation = $2`

// sqlPurge deletes finished work past retention, a bounded batch at a time,
// keeping work whose hook call still waits for a retry.
const sqlPurge = `
WITH RECURSIVE orgs(org_id) AS (
  SELECT (SELECT org_id FROM workpool_work WHERE pool = $1 AND state = 'finished' ORDER BY org_id LIMIT 1)
  UNION ALL
  SELECT (SELECT w.org_id FROM workpool_work w WHERE w.pool = $1 AND w.state = 'finished' AND w.org_id > o.org_id
          ORDER BY w.org_id LIMIT 1)
  FROM orgs o WHERE o.org_id IS NOT NULL
), victims AS (
  SELECT v.id FROM orgs o CROSS JOIN LATERAL (
    SELECT w.id FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = o.org_id AND w.state = 'finished' AND w.finished_at < $2
      AND w.hook_state IS DISTINCT FROM 'retry'
    ORDER BY w.finished_at LIMIT $3) v
  WHERE o.org_id IS NOT NULL
  LIMIT $3
)
DELETE FROM workpool_work WHERE id IN (SELECT id FROM victims)`

// --- the pending cap (pending.go) -----------------------------------------------

// sqlAddPending adds a batch's fresh items to their orgs' pending counts
// for several (pool, org) pairs, in the order given (sorted, so that
// batches lock the rows in one order); sqlEnqueueCounted does the same for
// one. The row lock serialises an org's enqueues into a pool until they
// commit. A new row starts from the batch: the migration counted what
// existed, and the leader's refresh repairs a row created while work was
// already pending.
const sqlAddPending = `
INSERT INTO workpool_org_pending (pool, org_id, pending, counted_at)
SELECT g.pool, g.org_id, g.n, $4
FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS g(pool, org_id, n, i)
ORDER BY g.i
ON CONFLICT (pool, org_id) DO UPDATE SET pending = workpool_org_pending.pending + excluded.pending`

// sqlReadPendingPairs reads the counts of pairs this transaction holds.
const sqlReadPendingPairs = `
SELECT pool, org_id, pending FROM workpool_org_pending WHERE pool = ANY($1) AND org_id = ANY($2)`

// sqlCountPending counts an org's unfinished work in a pool through the
// partial indexes, each part bounded by $3, and returns at most $3.
const sqlCountPending = `
SELECT least(
  (SELECT count(*) FROM (SELECT 1 FROM workpool_work
     WHERE pool = $1 AND org_id = $2 AND state = 'pending' AND concurrency_key IS NULL LIMIT $3) a)
  + (SELECT count(*) FROM (SELECT 1 FROM workpool_work
     WHERE pool = $1 AND org_id = $2 AND state = 'pending' AND concurrency_key IS NOT NULL LIMIT $3) b)
  + (SELECT count(*) FROM (SELECT 1 FROM workpool_work WHERE pool = $1 AND org_id = $2 AND state = 'running' LIMIT $3) c),
  $3)`

// sqlSetPending stores a count: the bound and when it was counted. Each
// count moves counted_at forward, even on a replica whose clock is behind
// or stands still (a test's), so that a check can tell that the bound
// was counted since it last read it (PendingCheck.Decide's admitLog): a
// count may lower the bound, and the enqueues after it take it back up.
const sqlSetPending = `
UPDATE workpool_org_pending SET pending = $3, counted_at = greatest($4, counted_at + interval '1 microsecond')
WHERE pool = $1 AND org_id = $2`

const sqlReadPending = `SELECT pending, counted_at FROM workpool_org_pending WHERE pool = $1 AND org_id = $2`

const sqlLockPending = `SELECT 1 FROM workpool_org_pending WHERE pool = $1 AND org_id = $2 FOR UPDATE`

// sqlStalePending lists a pool's orgs whose counts are older than $2 (a
// system chore across the pool's orgs).
const sqlStalePending = `
SELECT org_id FROM workpool_org_pending WHERE pool = $1 AND counted_at < $2 ORDER BY counted_at LIMIT $3`
