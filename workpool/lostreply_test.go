package workpool

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// releaseOrphans holds executor.claiming (write) while its UPDATE runs; a
// full iteration takes claiming (read) with its transaction open, holding
// the rows it marked. When that iteration marked an orphan (canceled it)
// and the release was waiting for the lock (another loop's statement held
// it shared), the two waited on each other — the release's UPDATE on the
// iteration's row lock, the iteration on the release's lock — until
// idle_in_transaction_session_timeout (30 s) ended the iteration: every
// loop and claim of the replica stalled. The release now skips rows
// another transaction holds (and looks again at its next pass). Found by
// a review of the change that brought the release. (The sleeps let each
// side reach its wait; should one not, the test passes without the
// interleaving, it cannot fail for it.)
func TestReleasingOrphansDoesNotStallBehindAnIterationHoldingTheirRows(t *testing.T) {
	ctx := context.Background()
	db := testkit.NewPool(t)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	api, err := New(db, liveConfig(t, Config{Pools: map[string]int{"default": 5}}))
	require.NoError(t, err)
	inHook, release := make(chan struct{}, 1), make(chan struct{})
	hook := func(context.Context, pgx.Tx, Completion) error {
		select {
		case inHook <- struct{}{}:
			<-release
		default:
		}
		return nil
	}
	a.RegisterHook("h", hook)
	api.RegisterHook("h", hook)
	api.Register("nobody", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	api.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })

	// an orphan: work started unclaimed (no executor runs "nobody"),
	// claimed for a's executor by a statement whose reply a never got
	id, err := api.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "nobody"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := a.Status(ctx, "org-1", id)
		return err == nil && st.State == StateRunning
	}, testWait, testTick)
	_, err = db.Exec(ctx, `UPDATE workpool_work SET claimed_by = $1, heartbeat_at = now() WHERE id = $2`, [16]byte(a.exec.id), id)
	require.NoError(t, err)
	// pending work with a hook, not yet due
	later, err := api.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop", RunAt: time.Now().Add(time.Hour),
		OnComplete: &OnComplete{Hook: "h", Context: json.RawMessage(`{}`)}})
	require.NoError(t, err)

	// both canceled at once: the iteration marks both rows, then runs the
	// pending one's hook (in its transaction)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := a.CancelTx(ctx, tx, "org-1", id); err != nil {
			return err
		}
		return a.CancelTx(ctx, tx, "org-1", later)
	}))
	<-inHook
	a.exec.claiming.RLock() // another pool's loop has its start statement in flight
	a.exec.claimLost()      // a lost reply: the claim loop's release waits for claiming
	time.Sleep(300 * time.Millisecond)
	close(release) // the iteration goes on to its commit, which waits for claiming
	time.Sleep(300 * time.Millisecond)
	a.exec.claiming.RUnlock() // the other loop's statement is done

	id2, err := api.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := a.Status(ctx, "org-1", id2)
		return err == nil && st.State == StateFinished
	}, testWait, testTick, "the replica's loops and claims stalled")
}
