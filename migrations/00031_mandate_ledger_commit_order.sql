-- +goose Up
-- A mandate's ledger is listed in the order its entries committed: pos,
-- taken from a sequence as each entry is inserted — always under the
-- mandate row's lock, which its transaction holds until it commits, so a
-- later entry of a mandate has a higher pos. The entry's id (UUIDv7) is
-- made before the spend waits for that lock: ordered by id, a debit that
-- waited (on another replica's batch, a PATCH, an approval's charge)
-- committed behind entries a reader following the cursor had already
-- passed, and the reader never saw it. Existing entries keep their id
-- order. (A ledger is small beside the work tables: one statement.)
ALTER TABLE mandate_ledger ADD COLUMN pos bigint;
CREATE SEQUENCE mandate_ledger_pos_seq OWNED BY mandate_ledger.pos;
UPDATE mandate_ledger l SET pos = o.rn
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn FROM mandate_ledger) o
 WHERE l.id = o.id;
SELECT setval('mandate_ledger_pos_seq', coalesce((SELECT max(pos) FROM mandate_ledger), 0) + 1, false);
ALTER TABLE mandate_ledger ALTER COLUMN pos SET DEFAULT nextval('mandate_ledger_pos_seq'),
                           ALTER COLUMN pos SET NOT NULL;
CREATE UNIQUE INDEX mandate_ledger_mandate_pos ON mandate_ledger (org_id, mandate_id, pos);

-- +goose Down
DROP INDEX mandate_ledger_mandate_pos;
ALTER TABLE mandate_ledger DROP COLUMN pos;
