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
-- step is short on the table's lock: the column (no default to fill in)
-- waits at most 100 ms for it (Up tries again a second later, as 00027);
-- existing entries are then numbered below every new one (negative, in id
-- order), with row locks only — the ledger is append-only; and the index
-- is built CONCURRENTLY. Each step may run again after a failed one.
-- +goose StatementBegin
DO $$
BEGIN
  SET LOCAL lock_timeout = '100ms';
  ALTER TABLE mandate_ledger ADD COLUMN IF NOT EXISTS pos bigint;
  CREATE SEQUENCE IF NOT EXISTS mandate_ledger_pos_seq OWNED BY mandate_ledger.pos;
  ALTER TABLE mandate_ledger ALTER COLUMN pos SET DEFAULT nextval('mandate_ledger_pos_seq');
END $$;
-- +goose StatementEnd
UPDATE mandate_ledger l SET pos = o.rn - o.n - 1
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn, count(*) OVER () AS n
          FROM mandate_ledger WHERE pos IS NULL OR pos < 0) o
 WHERE l.id = o.id AND l.pos IS DISTINCT FROM o.rn - o.n - 1;
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
