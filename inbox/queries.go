package inbox

// The package's SQL. Tables are in migrations/00014_approval_events.sql.
// Every query filters on org_id except retention's, which spans orgs by
// design.

// notifyChannel carries "<seq>/<org>" for each committed append.
const notifyChannel = "reveille_approval_events"

// qAppend bumps the org's counter (its row lock orders the org's appends
// until commit) and inserts the event under the new seq; the notification
// goes out at commit. $1 org, $2 type, $3 kind, $4 approval id, $5 payload.
const qAppend = `
WITH c AS (
    INSERT INTO approval_event_counters AS c (org_id, seq) VALUES ($1, 1)
    ON CONFLICT (org_id) DO UPDATE SET seq = c.seq + 1
    RETURNING seq
), e AS (
    INSERT INTO approval_events (org_id, seq, type, kind, approval_id, payload)
    SELECT $1, c.seq, $2, $3, $4, $5 FROM c
    RETURNING seq, created_at
)
SELECT e.seq, e.created_at FROM e, LATERAL (SELECT pg_notify('` + notifyChannel + `', e.seq::text || '/' || $1)) n`

// qSeq: $1 org.
const qSeq = `SELECT COALESCE((SELECT seq FROM approval_event_counters WHERE org_id = $1), 0)`

// qWindow: the oldest kept seq and the last. $1 org.
const qWindow = `
SELECT COALESCE((SELECT min(seq) FROM approval_events WHERE org_id = $1), l.seq + 1), l.seq
  FROM (SELECT COALESCE((SELECT seq FROM approval_event_counters WHERE org_id = $1), 0) AS seq) l`

// qAfter: $1 org, $2 after (exclusive), $3 limit.
const qAfter = `
SELECT seq, type, kind, approval_id, payload, created_at FROM approval_events
 WHERE org_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`
