package workpool

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A replica whose heartbeats failed for longer than the heartbeat timeout
// has its attempt recovered by the leader and retried. When that replica
// comes back it may claim the retry (the new attempt of the same work)
// before its next heartbeat. The superseded attempt's handler must then be
// told it lost its attempt (its context canceled), as it is when the
// heartbeat comes first; and the pool must never run two attempts of one
// item, nor more than its max_parallelism, at once.
func TestAnAttemptRecoveredFromASilentReplicaIsCanceledThereWhenItClaimsTheRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.NewPool(t)
	// b leads the pool and cannot run "work": every attempt runs on a.
	b := startManager(t, db, Config{Pools: map[string]int{"default": 1}})
	require.Eventually(t, func() bool { return leaderOf(b) == b }, testWait, testTick)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 1}})

	var running, peak atomic.Int64
	firstEnded := make(chan error, 1)
	secondRan := make(chan struct{}, 1)
	a.Register("work", func(hctx context.Context, j Job) (json.RawMessage, error) {
		raisePeak(&peak, running.Add(1))
		defer running.Add(-1)
		if j.Attempt == 1 {
			<-hctx.Done() // a long call, that stops when told to
			firstEnded <- context.Cause(hctx)
			return nil, hctx.Err()
		}
		secondRan <- struct{}{}
		return json.RawMessage(`"second"`), nil
	})

	// a's heartbeats fail from now on (its claims and reports do not).
	_, err := db.Exec(ctx, `
		CREATE FUNCTION fail_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'heartbeat lost (test fault)'; END $$;
		CREATE TRIGGER fail_heartbeat BEFORE UPDATE ON workpool_work FOR EACH ROW
		  WHEN (OLD.state = 'running' AND NEW.state = 'running' AND OLD.claimed_by = '`+a.exec.id.String()+`'::uuid
		        AND NEW.claimed_by = OLD.claimed_by AND NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at)
		  EXECUTE FUNCTION fail_heartbeat();`)
	require.NoError(t, err)

	id, err := a.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "work",
		Retry: &RetryPolicy{MaxAttempts: 3, InitialBackoffMS: 10, Base: 1}})
	require.NoError(t, err)

	// b recovers the silent attempt 1 and starts attempt 2, which a claims.
	select {
	case <-secondRan:
	case <-time.After(testWait):
		t.Fatal("the work was never retried")
	}
	// a's connections are fine again: its heartbeats go through.
	_, err = db.Exec(ctx, `DROP TRIGGER fail_heartbeat ON workpool_work`)
	require.NoError(t, err)
	s := requireFinished(t, b, "org-1", id, OutcomeSucceeded)
	require.Equal(t, 2, s.Attempts)

	select {
	case cause := <-firstEnded:
		require.ErrorIs(t, cause, errLost)
	case <-time.After(testWait):
		t.Fatalf("attempt 1's handler still runs %s after its work finished (attempt 2 succeeded): "+
			"it was never told it lost its attempt; handlers running at once peaked at %d in a pool of 1",
			testWait, peak.Load())
	}
}

// When the connection of the loop's start dies after the server committed
// it, but before the reply came back, the loop stands down (it cannot know
// the outcome). The work that start handed this replica's own executor is
// then running, claimed by that executor — which never got it. Nothing
// runs it: the executor claims only unclaimed work and heartbeats only what
// it runs, so after the heartbeat timeout the recovery counts an attempt it
// never made, and work without a retry policy fails for good with "the
// executor running this attempt stopped heartbeating" — although this
// replica never stopped heartbeating, and its handler never ran.
func TestWorkAStartClaimedForThisReplicaRunsWhenTheStartsReplyIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testkit.NewDatabase(t)
	relay, cut := testkit.NewRelay(t, dsn)
	dbA := testkit.NewPoolFor(t, cut)
	dbDirect := testkit.NewPoolFor(t, dsn)
	a := startManager(t, dbA, Config{Pools: map[string]int{"default": 5}})
	var ran atomic.Int64
	a.Register("work", func(context.Context, Job) (json.RawMessage, error) {
		ran.Add(1)
		return json.RawMessage(`"done"`), nil
	})
	requireLoopSettled(t, dbA, a, "default", "idle")
	// another replica's API enqueues (not through the cut relay)
	other, err := New(dbDirect, liveConfig(t, Config{Pools: map[string]int{"default": 5}}))
	require.NoError(t, err)
	other.Register("work", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })

	// the reply to a's next start statement is lost with its connection
	relay.CutReplyTo("s:default@" + a.origin)
	id, err := other.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "work"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return relay.ReplyCuts() == 1 }, testWait, testTick, "the start's reply was cut")

	s := requireFinished(t, a, "org-1", id, OutcomeSucceeded)
	require.Equal(t, int64(1), ran.Load())
	require.Equal(t, 1, s.Attempts)
}

// The same for an executor's own claim of work another replica's loop
// started: the claim committed, its reply was lost with the connection,
// and the work sat claimed by a live executor that never ran it until
// recovery failed it.
func TestWorkAClaimTookRunsWhenTheClaimsReplyIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testkit.NewDatabase(t)
	relay, cut := testkit.NewRelay(t, dsn)
	// b leads and has no handler for the work: a's executor claims it.
	b := startManager(t, testkit.NewPoolFor(t, dsn), Config{Pools: map[string]int{"default": 5}})
	require.Eventually(t, func() bool { return leaderOf(b) == b }, testWait, testTick)
	b.Register("other", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	a := startManager(t, testkit.NewPoolFor(t, cut), Config{Pools: map[string]int{"default": 5}})
	// another replica's API enqueues (it runs no executor)
	api, err := New(testkit.NewPoolFor(t, dsn), liveConfig(t, Config{Pools: map[string]int{"default": 5}}))
	require.NoError(t, err)
	api.Register("lost-claim-probe", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	id, err := api.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "lost-claim-probe"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := b.Status(ctx, "org-1", id)
		require.NoError(t, err)
		return st.State == StateRunning
	}, testWait, testTick, "b started it, unclaimed")

	// the reply to a's first claim naming the handler is lost
	relay.CutReplyTo("lost-claim-probe")
	var ran atomic.Int64
	a.Register("lost-claim-probe", func(context.Context, Job) (json.RawMessage, error) {
		ran.Add(1)
		return json.RawMessage(`"done"`), nil
	})
	require.Eventually(t, func() bool { return relay.ReplyCuts() == 1 }, testWait, testTick, "the claim's reply was cut")

	s := requireFinished(t, b, "org-1", id, OutcomeSucceeded)
	require.Equal(t, int64(1), ran.Load())
	require.Equal(t, 1, s.Attempts)
}
