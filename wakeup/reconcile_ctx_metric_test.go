package wakeup

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// reveille_leader_task_errors_total{task="wakeup.reconciler"} counts "each
// item that failed alone and was left for the next round"
// (docs/operations.md); leader.Every does not count a round whose context
// ended, and leader.SweepBatches (the approvals and mandates sweepers) stops
// at a context's end without counting. Reconcile counted every remaining
// intent of its round (up to 500) as a failed item once its context ended
// mid-round — at a stop, or whenever the replica's term ends — so the
// counter jumped on a leadership change where nothing failed. Found by a
// review of this session's diff.
func TestAReconcileRoundWhoseContextEndsCountsNoFailedIntents(t *testing.T) {
	f := newFixture(t)
	f.crash = true
	for range 3 {
		w, err := f.svc.Create(context.Background(), params(""))
		require.Error(t, err)
		require.Equal(t, "funded", f.state(t, w.ID))
	}
	// The first intent's enqueue is held in Postgres until the test ends
	// the round's context (as a stop or a lost term would).
	_, err := f.db.Exec(context.Background(), `
		CREATE FUNCTION hold_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
		CREATE TRIGGER hold_enqueue BEFORE INSERT ON workpool_work FOR EACH STATEMENT EXECUTE FUNCTION hold_enqueue();`)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := f.svc.Reconcile(ctx); done <- err }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`).Scan(&n))
		return n == 1
	}, 30*time.Second, 10*time.Millisecond, "the first intent's enqueue is held")
	cancel()
	<-done

	require.Zero(t, testutil.ToFloat64(f.svc.metrics.reconcileErrs),
		"no intent failed: the round's context ended")
}
