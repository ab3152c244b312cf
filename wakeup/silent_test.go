package wakeup

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// withFundedIntent is a wake-up service on db (its wakeup pool set up and
// stopped, a mandate for agent a of org o) whose every enqueue crashes
// between the two transactions, with cfg's reconciler settings, and the
// funded intent its one request left for the reconciler.
func withFundedIntent(t *testing.T, db *pgxpool.Pool, cfg Config) (*Service, Wakeup) {
	t.Helper()
	ctx := context.Background()
	pool, err := workpool.New(db, workpool.Config{Pools: map[string]int{"wakeup": 5}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	pool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
	require.NoError(t, pool.Start(ctx))
	require.NoError(t, pool.Stop(ctx))
	ms := mandates.New(db, mandates.Config{Logger: testkit.Logger(t)})
	_, err = ms.Create(ctx, "o", mandates.CreateParams{AgentID: "a", Scope: "s", Budget: 10})
	require.NoError(t, err)
	cfg.Logger = testkit.Logger(t)
	cfg.BeforeEnqueue = func(context.Context, uuid.UUID) error { return errors.New("crash between the transactions") }
	svc := New(db, pool, ms, cfg)
	w, err := svc.Create(ctx, params(""))
	require.Error(t, err) // a funded intent, left for the reconciler
	return svc, w
}

// A reconcile round whose find of funded intents goes silent gives up
// after leader.StatementTimeout, and the next round enqueues them: the
// round ran under its leadership's context alone, which ends only when the
// lock's own (healthy) connection fails, so one silent connection stopped
// the reconciler on every replica, every intent a crash left funded
// unwoken until the kernel gave up on the connection.
func TestAReconcileRoundOnASilentConnectionGivesUpAndTheNextEnqueues(t *testing.T) {
	t.Parallel()
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	t.Cleanup(relay.Cut)
	db := testkit.NewPoolFor(t, relayed)
	direct := testkit.NewPoolFor(t, dsn)
	ctx := context.Background()
	svc, w := withFundedIntent(t, db, Config{ReconcileAfter: time.Millisecond, ReconcileInterval: 200 * time.Millisecond})

	muted := relay.SilenceAt("WHERE state = 'funded' AND updated_at < now() - $1::interval")
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = svc.Stop(sctx)
	})
	select {
	case <-muted:
	case <-time.After(10 * time.Second):
		t.Fatal("the reconciler's round never went out")
	}
	state := func() string {
		var s string
		require.NoError(t, direct.QueryRow(ctx, `SELECT state FROM wakeups WHERE id = $1`, w.ID).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return state() == "enqueued" }, leader.StatementTimeout+20*time.Second, 50*time.Millisecond,
		"the funded intent was never enqueued (reconcile interval 200 ms); state %s", state())
}

// The reconciler's enqueue of a funded intent's work (in a fenced
// transaction) writes the org's queue row of the wakeup pool, which a
// record with hooks requeuing a retried attempt of the same org holds for
// as long as its hook calls take. Here a transaction writes the row as
// such a requeue does and holds it past leader.StatementTimeout: the
// reconciler waits and enqueues (bounded per round trip, the fenced
// transaction cut the legitimate wait, and the intent stayed funded).
func TestAReconcileWaitingOnAnOrgQueueARecordHoldsEnqueues(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	svc, w := withFundedIntent(t, db, Config{ReconcileAfter: time.Millisecond})

	// a record with hooks' requeue of org o's work in the wakeup pool,
	// held through its hook calls
	holder, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `INSERT INTO workpool_org_queues (pool, org_id, head_at) VALUES ('wakeup', 'o', now() + interval '1 minute')
		ON CONFLICT (pool, org_id) DO UPDATE SET head_at = least(workpool_org_queues.head_at, excluded.head_at)`)
	require.NoError(t, err)
	go func() {
		time.Sleep(leader.StatementTimeout + 3*time.Second)
		_ = holder.Commit(ctx)
	}()
	t0 := time.Now()
	n, err := svc.Reconcile(ctx)
	took := time.Since(t0)
	require.NoError(t, err)
	var state string
	require.NoError(t, db.QueryRow(ctx, `SELECT state FROM wakeups WHERE id = $1`, w.ID).Scan(&state))
	require.Equal(t, 1, n, "the reconciler's legitimate wait was cut after %s; the intent is %s", took, state)
	require.Equal(t, "enqueued", state)
}
