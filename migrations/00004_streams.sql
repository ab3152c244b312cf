-- +goose Up
-- Chunked run streams (streams/). A stream is (org, run, name); its row
-- holds the chunk counter that appends bump under the row lock, which is what
-- makes indexes gap-free under concurrent writers. Run ids and names sort
-- bytewise (COLLATE "C") so that name cursors follow the primary key.
CREATE TABLE streams (
    id          uuid        NOT NULL UNIQUE,
    org_id      text        NOT NULL,
    run_id      text        COLLATE "C" NOT NULL,
    name        text        COLLATE "C" NOT NULL,
    chunk_count bigint      NOT NULL DEFAULT 0 CHECK (chunk_count >= 0),
    byte_count  bigint      NOT NULL DEFAULT 0 CHECK (byte_count >= 0),
    done        boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz,
    PRIMARY KEY (org_id, run_id, name),
    CHECK (done = (closed_at IS NOT NULL))
);
-- Retention finds closed streams by the time they were closed.
CREATE INDEX streams_closed_at ON streams (closed_at) WHERE done;

-- Chunks are written only by the statement that bumps their stream's counter,
-- so no foreign key is declared: its per-row check would cost appends a
-- lookup each, for an invariant the single writing statement already keeps.
-- byte_start (the stream's bytes before the chunk) lets a read stop at a
-- byte budget with a plain range condition.
CREATE TABLE stream_chunks (
    stream_id   uuid   NOT NULL,
    chunk_index bigint NOT NULL CHECK (chunk_index >= 0),
    org_id      text   NOT NULL,
    byte_start  bigint NOT NULL CHECK (byte_start >= 0),
    data        bytea  NOT NULL,
    PRIMARY KEY (stream_id, chunk_index)
);
-- The Idempotency-Key of each keyed append: a retry whose first attempt
-- committed (its response lost) gets the first attempt's indexes back and
-- appends nothing. Kept as long as the stream.
CREATE TABLE stream_appends (
    stream_id   uuid   NOT NULL,
    key         text   NOT NULL,
    org_id      text   NOT NULL,
    first_index bigint NOT NULL,
    last_index  bigint NOT NULL,
    PRIMARY KEY (stream_id, key)
);

-- +goose Down
DROP TABLE stream_appends;
DROP TABLE stream_chunks;
DROP TABLE streams;
