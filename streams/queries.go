package streams

// notifyChannel is the one channel every append and close notifies, and the
// Hub listens on. A payload is "<last index>/<run>/<name>/<org>": run ids
// and names hold no "/", so the org, which may, goes last. It carries no
// chunk bytes; subscribers read those from the table.
const notifyChannel = "reveille_streams"

// appendSQL creates the stream on first append, bumps its counter under the
// row lock (which serialises the writers of one stream and so numbers their
// chunks without gaps), refuses a closed stream by returning no row, inserts
// the chunks and queues the notification delivered on commit — one
// statement, one round trip.
//
// $1 new stream id, $2 org, $3 run, $4 name, $5 chunk count, $6 chunks.
const appendSQL = `
WITH s AS (
    INSERT INTO streams AS st (id, org_id, run_id, name, chunk_count)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (org_id, run_id, name) DO UPDATE
       SET chunk_count = st.chunk_count + EXCLUDED.chunk_count, updated_at = now()
     WHERE NOT st.done
    RETURNING st.id, st.chunk_count
), c AS (
    INSERT INTO stream_chunks (stream_id, chunk_index, org_id, data)
    SELECT s.id, s.chunk_count - $5 + t.ord - 1, $2, t.data
      FROM s, unnest($6::bytea[]) WITH ORDINALITY AS t(data, ord)
)
SELECT s.chunk_count - $5, pg_notify('` + notifyChannel + `', (s.chunk_count - 1)::text || '/' || $3 || '/' || $4 || '/' || $2)::text
  FROM s`

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
SELECT pg_notify('` + notifyChannel + `', (s.chunk_count - 1)::text || '/' || $3 || '/' || $4 || '/' || $2)::text
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
// save that the first is always read (so a reader always progresses). An absent stream gives no row; a stream with
// nothing to read gives one row with a NULL chunk.
const readSQL = `
SELECT s.chunk_count, s.done, c.chunk_index, c.data
  FROM streams s
  LEFT JOIN LATERAL (
      SELECT w.chunk_index, w.data FROM (
          SELECT chunk_index, data, sum(octet_length(data)) OVER (ORDER BY chunk_index) AS upto
            FROM stream_chunks
           WHERE stream_id = s.id AND org_id = s.org_id AND chunk_index >= $4
           ORDER BY chunk_index
           LIMIT $5) w
       WHERE w.upto <= $6 OR w.chunk_index = $4
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

// purgeStreamsSQL deletes the streams $1, whose chunks are gone (a closed
// stream takes no more chunks).
const purgeStreamsSQL = `
DELETE FROM streams WHERE id = ANY ($1) AND done`
