package streams

// notifyChannel is the one channel every append and close notifies, and the
// Hub listens on. A payload is "a<last index>/<run>/<name>/<org>" for an
// append, "c…" for a close: run ids and names hold no "/", so the org, which
// may, goes last. It carries no chunk bytes; subscribers read those from
// the table.
const notifyChannel = "reveille_streams"

// appendSQL creates the stream on first append, bumps its counters under
// the row lock (which serialises the writers of one stream and so numbers
// their chunks without gaps), refuses a closed stream by returning no row
// and inserts the chunks — one statement, one round trip. With $7 it also
// queues the notification, delivered when the caller's transaction commits.
//
// $1 new stream id, $2 org, $3 run, $4 name, $5 chunk count, $6 chunks,
// $7 notify, $8 bytes in all, $9 each chunk's offset within the append.
const appendSQL = `
WITH s AS (
    INSERT INTO streams AS st (id, org_id, run_id, name, chunk_count, byte_count)
    VALUES ($1, $2, $3, $4, $5, $8)
    ON CONFLICT (org_id, run_id, name) DO UPDATE
       SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
           byte_count = st.byte_count + EXCLUDED.byte_count,
           updated_at = now()
     WHERE NOT st.done
    RETURNING st.id, st.chunk_count, st.byte_count
), c AS (
    INSERT INTO stream_chunks (stream_id, chunk_index, org_id, byte_start, data)
    SELECT s.id, s.chunk_count - $5 + t.ord - 1, $2, s.byte_count - $8 + t.off, t.data
      FROM s, unnest($6::bytea[], $9::bigint[]) WITH ORDINALITY AS t(data, off, ord)
)
SELECT s.chunk_count - $5, s.id,
       CASE WHEN $7 THEN pg_notify('` + notifyChannel + `', 'a' || (s.chunk_count - 1)::text || '/' || $3 || '/' || $4 || '/' || $2)::text END
  FROM s`

// appendKeyedSQL is appendSQL, without notifying, for an append carrying
// an idempotency key: when the key was used on this stream already it
// appends nothing and returns the first use's range and fingerprint,
// flagged as a replay. Two concurrent first uses meet on the key's primary
// key: the loser fails with a unique violation once the winner commits,
// and is run again.
//
// $1 new stream id, $2 org, $3 run, $4 name, $5 chunk count, $6 chunks,
// $7 key, $8 bytes in all, $9 each chunk's offset within the append, $10
// the chunks' fingerprint.
const appendKeyedSQL = `
WITH prior AS (
    SELECT a.first_index, a.last_index, a.request_hash
      FROM streams p JOIN stream_appends a ON a.stream_id = p.id AND a.org_id = p.org_id
     WHERE p.org_id = $2 AND p.run_id = $3 AND p.name = $4 AND a.key = $7
), s AS (
    INSERT INTO streams AS st (id, org_id, run_id, name, chunk_count, byte_count)
    SELECT $1, $2, $3, $4, $5, $8 WHERE NOT EXISTS (SELECT 1 FROM prior)
    ON CONFLICT (org_id, run_id, name) DO UPDATE
       SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
           byte_count = st.byte_count + EXCLUDED.byte_count,
           updated_at = now()
     WHERE NOT st.done
    RETURNING st.id, st.chunk_count, st.byte_count
), c AS (
    INSERT INTO stream_chunks (stream_id, chunk_index, org_id, byte_start, data)
    SELECT s.id, s.chunk_count - $5 + t.ord - 1, $2, s.byte_count - $8 + t.off, t.data
      FROM s, unnest($6::bytea[], $9::bigint[]) WITH ORDINALITY AS t(data, off, ord)
), k AS (
    INSERT INTO stream_appends (stream_id, key, org_id, first_index, last_index, request_hash)
    SELECT s.id, $7, $2, s.chunk_count - $5, s.chunk_count - 1, $10 FROM s
)
SELECT s.chunk_count - $5, s.chunk_count - 1, false, NULL::bytea, s.id FROM s
UNION ALL
SELECT first_index, last_index, true, request_hash, NULL::uuid FROM prior`

// notifySQL announces committed appends ($1, payloads) in a transaction of
// its own. Postgres serialises the commits of notifying transactions (a
// lock held through the commit's WAL flush), so notifying inside each
// durable append would cap appends at one per flush across the whole
// server; this transaction holds no data, so it commits without waiting
// for the flush (nothing is lost by a crash: listeners reconnect and
// re-read then).
const notifySQL = `
SELECT set_config('synchronous_commit', 'off', true), count(pg_notify('` + notifyChannel + `', p))
  FROM unnest($1::text[]) AS p`

// closeSQL marks the stream done, creating it empty when absent; a stream
// already closed keeps its closed_at (retention counts from the first
// close) and notifies nobody.
//
// $1 new stream id, $2 org, $3 run, $4 name.
const closeSQL = `
WITH s AS (
    INSERT INTO streams AS st (id, org_id, run_id, name, done, closed_at)
    VALUES ($1, $2, $3, $4, true, now())
    ON CONFLICT (org_id, run_id, name) DO UPDATE
       SET done = true, closed_at = now(), updated_at = now()
     WHERE NOT st.done
    RETURNING st.chunk_count
)
SELECT pg_notify('` + notifyChannel + `', 'c' || (s.chunk_count - 1)::text || '/' || $3 || '/' || $4 || '/' || $2)::text
  FROM s`

const infoSQL = `
SELECT chunk_count, done FROM streams WHERE org_id = $1 AND run_id = $2 AND name = $3`

// listNamesSQL pages a run's stream names after the cursor name ($3, the
// empty string for the first page).
const listNamesSQL = `
SELECT name FROM streams
 WHERE org_id = $1 AND run_id = $2 AND name > $3
 ORDER BY name
 LIMIT $4`

// readSQL reads, in one snapshot, the stream's counter and state and its
// chunks from index $4: at most $5 of them and no more than $6 bytes in all,
// save that the first is always read (so a reader always progresses).
// Indexes have no gaps and byte_start is cumulative, so both bounds are
// plain range conditions on the chunks. An absent stream gives no row; a
// stream with nothing to read gives one row with a NULL chunk.
const readSQL = `
SELECT s.chunk_count, s.done, c.chunk_index, c.data, s.id
  FROM streams s
  LEFT JOIN LATERAL (
      SELECT chunk_index, data
        FROM stream_chunks
       WHERE stream_id = s.id AND org_id = s.org_id
         AND chunk_index >= $4 AND chunk_index < $4 + $5
         AND (chunk_index = $4 OR byte_start + octet_length(data) <= $6 +
              coalesce((SELECT f.byte_start FROM stream_chunks f WHERE f.stream_id = s.id AND f.chunk_index = $4),
                       -- (chunk $4 purged: the first stored one after it, that the page goes on to)
                       (SELECT f.byte_start + octet_length(f.data) - $6 FROM stream_chunks f WHERE f.stream_id = s.id AND f.chunk_index > $4
                        ORDER BY f.chunk_index LIMIT 1)))
       ORDER BY chunk_index
  ) c ON true
 WHERE s.org_id = $1 AND s.run_id = $2 AND s.name = $3
 ORDER BY c.chunk_index`

// expiredSQL picks a batch of streams closed before $1, oldest first.
const expiredSQL = `
SELECT id FROM streams WHERE done AND closed_at < $1 ORDER BY closed_at LIMIT $2`

// purgeChunksSQL deletes up to $2 chunks of the streams $1.
const purgeChunksSQL = `
DELETE FROM stream_chunks WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM stream_chunks WHERE stream_id = ANY ($1) LIMIT $2))`

// purgeKeysSQL deletes up to $2 append keys of the streams $1.
const purgeKeysSQL = `
DELETE FROM stream_appends WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM stream_appends WHERE stream_id = ANY ($1) LIMIT $2))`

// purgeStreamsSQL deletes the streams $1, whose chunks are gone (a closed
// stream takes no more chunks).
const purgeStreamsSQL = `
DELETE FROM streams WHERE id = ANY ($1) AND done`
