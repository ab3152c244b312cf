-- +goose Up
-- Fair share's turns now live in the leading loop's memory, and these
-- tables are their saved copy: the loop writes them every second while
-- the turns change and when it stands down, and reads them when it takes
-- the lead (docs/workpool.md § "Fair share"). A turn is charged at the
-- org's weight of the moment; the weight it was charged at is kept beside
-- it, so that a weight changed since — by a replica that could not tell
-- the loop — still restarts the org's turns when the ledger is read back.
-- Rows from before this column count at weight 1: an org of another
-- weight joins at the current turn once.
ALTER TABLE workpool_org_turns ADD COLUMN weight integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 100);

-- +goose Down
ALTER TABLE workpool_org_turns DROP COLUMN weight;
