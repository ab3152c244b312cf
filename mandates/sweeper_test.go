package mandates

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/testkit"
)

func TestSweepExpiresOnlyOverdueRequestsCallingEachHookOnce(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 0)
	overdue := []uuid.UUID{refuse(t, s, "org-a", "llm", 5, ""), refuse(t, s, "org-b", "llm", 5, "")}
	current := refuse(t, s, "org-a", "llm", 5, "")
	for _, id := range overdue {
		makeOverdue(t, db, id)
	}

	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	calls := rec.snapshot()
	require.Len(t, calls, 2)
	got := map[uuid.UUID]string{}
	for _, c := range calls {
		got[c.r.ApprovalID] = c.r.State
		require.Equal(t, StateExpired, c.stateInTx)
		require.Equal(t, "test", c.r.Payload.Kind)
	}
	require.Equal(t, map[uuid.UUID]string{overdue[0]: StateExpired, overdue[1]: StateExpired}, got)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, current)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent, "expiry charges nothing")

	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, rec.snapshot(), 2)
}

func TestSweepLeavesARequestWhoseHookFailsPendingForTheNextSweep(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	rec.fail = context.DeadlineExceeded
	id := refuse(t, s, "org-a", "llm", 5, "")
	makeOverdue(t, db, id)
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)

	rec.fail = nil
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// Requests that keep failing stay pending and are the oldest due; a
// sweep that began again from them after each batch stopped at a batch's
// worth of them, and every org's requests behind them waited for good.
func TestSweepGoesOnPastABatchOfRequestsWhoseHooksKeepFailing(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	s.RegisterResolveHook("stuck", func(context.Context, pgx.Tx, Resolution) error { return errors.New("stuck") })
	for range sweepBatch + 1 {
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-stuck", AgentID: "agent-1", Scope: "llm", Cost: 5,
			OnResolve: &Payload{Kind: "stuck"}})
		require.NoError(t, err)
		require.False(t, r.OK)
	}
	_, err := db.Exec(ctx, `UPDATE mandate_approvals SET expires_at = now() - interval '1 hour' WHERE org_id = 'org-stuck'`)
	require.NoError(t, err)
	behind := refuse(t, s, "org-b", "llm", 5, "")
	makeOverdue(t, db, behind)

	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	a, err := s.GetApproval(ctx, "org-b", AnyAgent, behind)
	require.NoError(t, err)
	require.Equal(t, StateExpired, a.State, "expired behind another org's failures")
	require.Len(t, rec.snapshot(), 1)
	var stuck int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM mandate_approvals WHERE org_id = 'org-stuck' AND state = 'pending'`).Scan(&stuck))
	require.Equal(t, sweepBatch+1, stuck, "the failing ones stay pending for the next sweep")
}

// Two replicas run the sweeper; only the leader sweeps, and an overdue
// request is expired exactly once without anyone calling Sweep.
func TestTheLeaderSweepsOverdueRequestsOnItsOwn(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	cfg := Config{SweepInterval: 10 * time.Millisecond, LeaderRetry: 10 * time.Millisecond, Logger: testkit.Logger(t)}
	replicas := []*Service{New(db, cfg), New(db, cfg)}
	var recs []*recorder
	for _, r := range replicas {
		recs = append(recs, newRecorder(t, r, db, "test"))
	}
	id := refuse(t, replicas[0], "org-a", "llm", 5, "")
	makeOverdue(t, db, id)
	for _, r := range replicas {
		require.NoError(t, r.Start(ctx))
	}
	require.Eventually(t, func() bool {
		a, err := replicas[0].GetApproval(ctx, "org-a", AnyAgent, id)
		return err == nil && a.State == StateExpired
	}, testWait, pollEvery)
	for _, r := range replicas {
		require.NoError(t, r.Stop(ctx))
		require.NoError(t, r.Stop(ctx), "stopping twice is safe")
	}
	require.Equal(t, 1, len(recs[0].snapshot())+len(recs[1].snapshot()), "the hook ran once")
	require.Equal(t, []string{StateExpired}, hookRows(t, db, id))
}

func TestStartTwiceFailsAndStopWithoutStartIsSafe(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	require.NoError(t, s.Stop(ctx))
	require.NoError(t, s.Start(ctx))
	require.Error(t, s.Start(ctx))
	require.NoError(t, s.Stop(ctx))
}

// A sweeper whose replica lost the leadership without noticing yet (another
// replica started a newer term) expires nothing and runs no hook; the
// current leader's sweep does.
func TestADeposedLeadersSweepWritesNothing(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "")
	makeOverdue(t, db, id)
	deposed, err := leader.NewTerm(ctx, db, SweeperLeadership)
	require.NoError(t, err)
	current, err := leader.NewTerm(ctx, db, SweeperLeadership) // another replica took over
	require.NoError(t, err)

	n, err := s.Sweep(leader.WithTerm(ctx, deposed))
	require.ErrorIs(t, err, leader.ErrDeposed)
	require.Zero(t, n)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.Empty(t, rec.snapshot())
	require.Empty(t, hookRows(t, db, id))

	n, err = s.Sweep(leader.WithTerm(ctx, current))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{StateExpired}, hookRows(t, db, id))
}

// A request listed by a sweep's scan but resolved elsewhere before the
// sweep reached it (here withdrawn by a wake-up's cancel) is skipped and
// not counted: Sweep returns how many it expired (it counted both; the
// tool-approval sweeper did not). Found by review.
func TestASweepCountsOnlyWhatItExpired(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	first := refuse(t, s, "org-a", "llm", 5, "")
	second := refuse(t, s, "org-a", "llm", 5, "")
	_, err := db.Exec(ctx, `UPDATE mandate_approvals SET expires_at = now() - interval '2 seconds' WHERE id = $1`, first)
	require.NoError(t, err)
	makeOverdue(t, db, second) // due after first: listed in the same scan
	s.RegisterResolveHook("test", func(ctx context.Context, tx pgx.Tx, r Resolution) error {
		if r.ApprovalID == first { // while the sweep expires first, second is withdrawn elsewhere
			require.NoError(t, pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
				ok, err := s.CancelApprovalTx(context.Background(), tx, "org-a", second)
				require.True(t, ok)
				return err
			}))
		}
		return rec.hook(ctx, tx, r)
	})

	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, second)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, a.State)
	require.EqualValues(t, 1, testutil.ToFloat64(s.metrics.expired), "one request expired")
	require.Equal(t, 1, n, "Sweep returns how many it expired: one, not the one another resolved")
}

// A request the sweeper fails to expire (its hook fails) counts on
// reveille_leader_task_errors_total{task="mandates.sweeper"}, and so does a
// round that fails as a whole (here its scan: the table is gone): a sweep
// that keeps failing showed only in log lines, on whichever replica led.
func TestAFailingSweepCountsOnTheLeaderTaskErrorsMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	db := testkit.NewPool(t)
	s := New(db, Config{Logger: testkit.Logger(t), Registry: reg, SweepInterval: 10 * time.Millisecond, LeaderRetry: 10 * time.Millisecond})
	ctx := context.Background()
	failures := func() float64 {
		return testutil.ToFloat64(s.metrics.sweepErrs)
	}
	require.Equal(t, 1, testutil.CollectAndCount(reg, "reveille_leader_task_errors_total"), "the series is there at 0 from the start")

	rec := newRecorder(t, s, db, "test")
	rec.fail = context.DeadlineExceeded
	for range 2 {
		makeOverdue(t, db, refuse(t, s, "org-a", "llm", 5, ""))
	}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 2.0, failures(), "one for each request left pending")

	_, err = db.Exec(ctx, `ALTER TABLE mandate_approvals RENAME TO mandate_approvals_gone`)
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.Stop(ctx)) })
	require.Eventually(t, func() bool { return failures() > 2 }, testWait, pollEvery, "a failed round counts")
}
