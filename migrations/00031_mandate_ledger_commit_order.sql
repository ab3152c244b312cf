-- +goose NO TRANSACTION
-- +goose Up
-- A mandate's ledger is listed in the order its entries committed: pos,
-- taken from a sequence as each entry is inserted — always under the
-- mandate row's lock, which its transaction holds until it commits, so a
-- later entry of a mandate has a higher pos. The entry's id (UUIDv7) is
-- made before the spend waits for that lock: ordered by id, a debit that
-- waited (on another replica's batch, a PATCH, an approval's charge)
-- committed behind entries a reader following the cursor had already
-- passed, and the reader never saw it.
--
-- Every spend writes this table, and a ledger is never purged, so each
-- step is short on what it locks: the column (no default to fill in)
-- waits at most 100 ms for the table's lock (Up tries again a second
-- later, as 00027); the entries already there are numbered below every
-- new one (negative, in id order) a thousand at a time, each thousand
-- committed (a refund replayed under its key waits for the row its key
-- names: at most one batch); and the index is built CONCURRENTLY. Each
-- step may run again after a failed one: the numbering resumes below the
-- lowest number it gave.
-- +goose StatementBegin
DO $$
BEGIN
  SET LOCAL lock_timeout = '100ms';
  ALTER TABLE mandate_ledger ADD COLUMN IF NOT EXISTS pos bigint;
  CREATE SEQUENCE IF NOT EXISTS mandate_ledger_pos_seq OWNED BY mandate_ledger.pos;
  ALTER TABLE mandate_ledger ALTER COLUMN pos SET DEFAULT nextval('mandate_ledger_pos_seq');
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
DECLARE
  next_pos bigint;   -- the number the batch's newest entry gets
  below uuid;        -- the batch reads the entries older than this one
  n bigint;
BEGIN
  SELECT pos, id INTO next_pos, below FROM mandate_ledger WHERE pos < 0 ORDER BY pos LIMIT 1;
  next_pos := coalesce(next_pos - 1, -1);
  below := coalesce(below, 'ffffffff-ffff-ffff-ffff-ffffffffffff');
  LOOP
    -- (EXECUTE: planned for each batch's bound, a range read of the
    -- primary key down from it; a plan cached for any bound sorted the
    -- whole table every batch)
    EXECUTE $q$
      WITH b AS (
        SELECT id, $1 + 1 - row_number() OVER (ORDER BY id DESC) AS p FROM (
          SELECT id FROM mandate_ledger WHERE id < $2 AND pos IS NULL ORDER BY id DESC LIMIT 1000) x
      ), numbered AS (
        UPDATE mandate_ledger l SET pos = b.p FROM b WHERE l.id = b.id RETURNING l.id, l.pos
      )
      SELECT count(*), min(pos), (SELECT id FROM numbered ORDER BY pos LIMIT 1) FROM numbered$q$
      INTO n, next_pos, below USING next_pos, below;
    EXIT WHEN n = 0;
    next_pos := next_pos - 1;
    COMMIT;
  END LOOP;
END $$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS mandate_ledger_mandate_pos;
CREATE UNIQUE INDEX CONCURRENTLY mandate_ledger_mandate_pos ON mandate_ledger (org_id, mandate_id, pos);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS mandate_ledger_mandate_pos;
-- +goose StatementBegin
DO $$
BEGIN
  SET LOCAL lock_timeout = '100ms';
  ALTER TABLE mandate_ledger DROP COLUMN IF EXISTS pos;
END $$;
-- +goose StatementEnd
