package migrations_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/migrations"
)

// qRefund as in mandates/queries.go (a refund; a repeated key inserts nothing).
const ledgerRefund = `
WITH m AS (
    SELECT id, spent FROM mandates WHERE org_id = $1 AND agent_id = $2 AND scope = $3 FOR UPDATE
), l AS (
    INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount, reason, idempotency_key)
    SELECT $4, $1, m.id, 'refund', -$5::bigint, $6, NULLIF($7::text, '') FROM m WHERE m.spent >= $5
    ON CONFLICT (org_id, idempotency_key) WHERE kind = 'refund' AND idempotency_key IS NOT NULL DO NOTHING
    RETURNING mandate_id
), u AS (
    UPDATE mandates SET spent = spent - $5, updated_at = now() FROM l WHERE mandates.id = l.mandate_id
    RETURNING mandates.id
)
SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM u)`

// A ledger is never purged, and every spend writes it: 00031 numbers the
// entries already there in batches, each committed, so that a refund
// replayed under its key — whose ON CONFLICT check waits for the
// transaction updating the row its key names, while it holds its
// mandate's row, and every spend of that mandate behind it — waits for a
// batch at most, not for the whole ledger (one UPDATE of 300,000 entries
// held them 3.2 s here). Seen from another session, the numbering moves
// while it runs.
func TestMigration31BackfillHoldsNoRefundReplayNorItsMandatesSpends(t *testing.T) {
	ctx := context.Background()
	url, db := databaseAt(t, "ledger_pos_backfill", 30)
	const m = "00000000-0000-7000-8000-00000000000a"
	_, err := db.ExecContext(ctx, `INSERT INTO mandates (id, org_id, agent_id, scope, budget, spent) VALUES
		('`+m+`', 'org-1', 'a', 'llm', 100000000, 1000000)`)
	require.NoError(t, err)
	// a refund made before the upgrade, with its key (first row, lowest id)
	_, err = db.ExecContext(ctx, ledgerRefund, "org-1", "a", "llm", "00000000-0000-0000-0000-000000000001", 1, "r", "refund-1")
	require.NoError(t, err)
	// the rest of a ledger that is never purged
	_, err = db.ExecContext(ctx, `INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount)
		SELECT gen_random_uuid(), 'org-1', '`+m+`', 'debit', 1 FROM generate_series(1, 100000)`)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { _, err := migrations.Up(ctx, openDB(t, url), nil); migrated <- err }()
	require.Eventually(t, func() bool {
		var on bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid() AND query LIKE '%UPDATE mandate_ledger l SET pos%')`).Scan(&on))
		return on
	}, time.Minute, time.Millisecond, "00031's backfill runs")

	var worstReplay, worstSpend time.Duration
	numbered := map[int]bool{} // the counts of numbered entries seen while it ran
	for {
		var on bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid() AND query LIKE '%UPDATE mandate_ledger l SET pos%')`).Scan(&on))
		if !on {
			break
		}
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM mandate_ledger WHERE pos IS NOT NULL`).Scan(&n))
		numbered[n] = true
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the client retries its refund, same key
			defer wg.Done()
			start := time.Now()
			var found, refunded bool
			err := db.QueryRowContext(ctx, ledgerRefund, "org-1", "a", "llm", "00000000-0000-0000-0000-00000000ffff", 1, "r", "refund-1").Scan(&found, &refunded)
			require.NoError(t, err)
			require.False(t, refunded, "a replayed key refunds nothing")
			worstReplay = max(worstReplay, time.Since(start))
		}()
		time.Sleep(20 * time.Millisecond)
		start := time.Now() // meanwhile the agent spends on the same mandate
		_, err := db.ExecContext(ctx, `UPDATE mandates SET spent = spent + 1 WHERE id = '`+m+`'`)
		require.NoError(t, err)
		worstSpend = max(worstSpend, time.Since(start))
		wg.Wait()
	}
	require.NoError(t, <-migrated)
	t.Logf("worst refund replay %s, worst spend on its mandate %s, %d counts of numbered entries seen", worstReplay, worstSpend, len(numbered))
	require.GreaterOrEqual(t, len(numbered), 3, "the backfill commits as it goes, not once at its end: %v", numbered)
	var nulls int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM mandate_ledger WHERE pos IS NULL`).Scan(&nulls))
	require.Zero(t, nulls)
}

// 00031 run again after a run that numbered some of the ledger, then
// failed its index build (an INVALID index left behind): the numbering
// resumes below what it gave, in id order, and the index is built again.
func TestMigration31RunsAgainAfterAPartialRun(t *testing.T) {
	ctx := context.Background()
	_, db := databaseAt(t, "ledger_pos_rerun", 30)
	_, err := db.ExecContext(ctx, `INSERT INTO mandates (id, org_id, agent_id, scope, budget) VALUES
		('00000000-0000-7000-8000-00000000000a', 'org-1', 'a', 'llm', 100)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount)
		SELECT gen_random_uuid(), 'org-1', '00000000-0000-7000-8000-00000000000a', 'debit', 1 FROM generate_series(1, 2500)`)
	require.NoError(t, err)
	// the first run: the column, the newest 1,000 numbered, an entry
	// written meanwhile, an index build that failed
	for _, q := range []string{
		`ALTER TABLE mandate_ledger ADD COLUMN pos bigint`,
		`CREATE SEQUENCE mandate_ledger_pos_seq OWNED BY mandate_ledger.pos`,
		`ALTER TABLE mandate_ledger ALTER COLUMN pos SET DEFAULT nextval('mandate_ledger_pos_seq')`,
		`UPDATE mandate_ledger l SET pos = -o.rn FROM (SELECT id, row_number() OVER (ORDER BY id DESC) AS rn FROM mandate_ledger) o
		  WHERE l.id = o.id AND o.rn <= 1000`,
		`INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount)
		  VALUES (gen_random_uuid(), 'org-1', '00000000-0000-7000-8000-00000000000a', 'debit', 1)`,
		`CREATE INDEX mandate_ledger_mandate_pos ON mandate_ledger (org_id, mandate_id, pos)`,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'mandate_ledger_mandate_pos'::regclass`,
	} {
		_, err = db.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}

	_, err = migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	var valid, unique bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = 'mandate_ledger_mandate_pos'::regclass`).Scan(&valid, &unique))
	require.True(t, valid && unique)
	var n, neg, nulls int
	var inIDOrder bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE pos < 0), count(*) FILTER (WHERE pos IS NULL),
		  array_agg(id ORDER BY id) FILTER (WHERE pos < 0) = array_agg(id ORDER BY pos) FILTER (WHERE pos < 0)
		FROM mandate_ledger`).Scan(&n, &neg, &nulls, &inIDOrder))
	require.Equal(t, []int{2501, 2500, 0}, []int{n, neg, nulls})
	require.True(t, inIDOrder, "the old entries numbered in id order across both runs")
	var lowest int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT min(pos) FROM mandate_ledger`).Scan(&lowest))
	require.Equal(t, -2500, lowest, "numbered -2500 … -1, none twice")
}
