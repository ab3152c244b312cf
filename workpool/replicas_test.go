package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/testkit"
)

// crash makes a started Manager behave like a killed process: no more
// claims, heartbeats, reports or iterations; its lock connections close.
func (m *Manager) crash() {
	m.exec.crashed.Store(true)
	m.exec.stopClaiming()
	_ = m.life.Stop(context.Background())
	m.drained.Do(func() {}) // a later Stop drains nothing: the process is gone
	m.exec.stopHandler(errStopping)
	m.exec.stopBg()
}

// hookTable records hook calls in the completing transaction, so a call
// counts only if its transaction committed.
func hookTable(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `CREATE TABLE hook_calls (work_id uuid PRIMARY KEY, outcome text NOT NULL, calls int NOT NULL)`)
	require.NoError(t, err)
}

func recordHook(_ context.Context, tx pgx.Tx, c Completion) error {
	_, err := tx.Exec(context.Background(), `INSERT INTO hook_calls (work_id, outcome, calls) VALUES ($1, $2, 1)
		ON CONFLICT (work_id) DO UPDATE SET calls = hook_calls.calls + 1`, c.WorkID, string(c.Outcome))
	return err
}

// hookCallsOf returns how often the hook committed for id, and the outcome it saw.
func hookCallsOf(t *testing.T, db *pgxpool.Pool, id uuid.UUID) (int, string) {
	t.Helper()
	var (
		n       int
		outcome string
	)
	err := db.QueryRow(context.Background(), `SELECT calls, outcome FROM hook_calls WHERE work_id = $1`, id).Scan(&n, &outcome)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ""
	}
	require.NoError(t, err)
	return n, outcome
}

func leaderOf(ms ...*Manager) *Manager {
	var found *Manager
	for _, m := range ms {
		if l := m.loopFor("default"); l != nil && l.leading.Load() {
			if found != nil {
				return nil // two leaders: never acceptable
			}
			found = m
		}
	}
	return found
}

func TestTwoLoopsOnOnePool_OnlyTheLeaderMakesProgress(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	b := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	require.Eventually(t, func() bool { return leaderOf(a, b) != nil }, testWait, testTick)
	lead := leaderOf(a, b)
	standby := a
	if lead == a {
		standby = b
	}

	var ids []uuid.UUID
	for range 20 {
		id, err := lead.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		requireFinished(t, standby, "org-1", id, OutcomeSucceeded)
	}

	require.Same(t, lead, leaderOf(a, b))
	require.Positive(t, lead.loopFor("default").iterations.Load())
	require.Zero(t, standby.loopFor("default").iterations.Load(), "the standby never iterates")
}

func TestTwoLoopsOnOnePool_AStaleGenerationsWritesAreRejected(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stale := h.l
	id := h.enqueue()
	newer := newLoop(h.m, "default")
	require.NoError(t, newer.takeover(h.ctx))

	_, err := stale.iterate(h.ctx)

	require.ErrorIs(t, err, errGenerationMismatch)
	require.Equal(t, []uuid.UUID{id}, h.observe().pending, "the stale loop started nothing")
	h.l = newer
	h.runMain()
	require.Equal(t, []uuid.UUID{id}, h.observe().running)
}

// lockHolder returns the backend pid holding the advisory lock of name.
func lockHolder(t *testing.T, db *pgxpool.Pool, name string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		err := db.QueryRow(context.Background(), `SELECT pid FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = $1`, leader.Key(name)).Scan(&pid)
		return err == nil
	}, testWait, testTick)
	return pid
}

func TestTwoLoopsOnOnePool_TheStandbyTakesOverWhenTheLeadersConnectionDies(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	// The first replica is slow to notice and slow to retry, so the
	// standby's takeover is what the test sees.
	a := startManager(t, db, Config{Pools: map[string]int{"default": 5}, LeaderRetry: time.Second})
	require.Eventually(t, func() bool { return leaderOf(a) == a }, testWait, testTick)
	b := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	var genBefore int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT generation FROM workpool_pools WHERE name = 'default'`).Scan(&genBefore))

	pid := lockHolder(t, db, "workpool.loop.default")
	_, err := db.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return leaderOf(a, b) == b }, testWait, testTick, "the standby took over")
	var genAfter int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT generation FROM workpool_pools WHERE name = 'default'`).Scan(&genAfter))
	require.Greater(t, genAfter, genBefore, "the new term fenced out the old one")
	id, err := a.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, a, "org-1", id, OutcomeSucceeded)
}

func TestKickStartsWorkEnqueuedWhileTheLoopIsIdle(t *testing.T) {
	t.Parallel()
	// No timer could start the work: recovery is an hour away and an idle
	// loop sets none. Only the enqueue's notification can.
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, RecoveryPeriod: time.Hour})
	requireLoopSettled(t, db, m, "default", "idle")
	before := m.loopFor("default").iterations.Load()

	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Greater(t, m.loopFor("default").iterations.Load(), before)
}

func TestTwoReplicas_ThousandItemsNeverExceedMaxParallelismAndEachHookFiresOnce(t *testing.T) {
	t.Parallel()
	const n, limit = 1000, 10
	db := testkit.NewPool(t)
	hookTable(t, db)
	var running, peak atomic.Int64
	handler := func(context.Context, Job) (json.RawMessage, error) {
		raisePeak(&peak, running.Add(1))
		time.Sleep(time.Millisecond) // simulated work, so attempts overlap
		running.Add(-1)
		return json.RawMessage(`{"ok":true}`), nil
	}
	ms := startRecordingReplicas(t, db, limit, handler)

	ctx, stopSampling := context.WithCancel(context.Background())
	var sampledPeak, samples atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var used int64
			// The slots in use: running attempts (recording a result frees
			// its slot in the same statement).
			err := db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE pool = 'default' AND state = 'running'`).Scan(&used)
			if err != nil {
				continue // the sampler's context ended mid-query
			}
			samples.Add(1)
			if used > sampledPeak.Load() {
				sampledPeak.Store(used)
			}
		}
	}()

	ps := make([]EnqueueParams, n)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "work", OnComplete: &OnComplete{Hook: "record"}}
	}
	ids, err := ms[0].EnqueueMany(context.Background(), ps[:n/2])
	require.NoError(t, err)
	more, err := ms[1].EnqueueMany(context.Background(), ps[n/2:])
	require.NoError(t, err)
	ids = append(ids, more...)

	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&done))
		return done == n
	}, time.Minute, 20*time.Millisecond)
	stopSampling()
	wg.Wait()

	require.LessOrEqual(t, peak.Load(), int64(limit), "handlers running at once")
	require.Positive(t, peak.Load())
	require.LessOrEqual(t, sampledPeak.Load(), int64(limit), "running set sampled from the database")
	require.Positive(t, samples.Load(), "the sampler read the database")
	var succeeded, hooked, calls int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE outcome = 'succeeded' AND id = ANY($1)`, ids).Scan(&succeeded))
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(calls), 0) FROM hook_calls WHERE work_id = ANY($1)`, ids).Scan(&hooked, &calls))
	require.Equal(t, n, succeeded)
	require.Equal(t, n, hooked, "every item's hook fired")
	require.Equal(t, n, calls, "and exactly once")
}

// blockingHandler blocks until its context ends and reports what ended it.
func blockingHandler(started chan<- uuid.UUID, ended chan<- error) Handler {
	return func(ctx context.Context, j Job) (json.RawMessage, error) {
		started <- j.ID
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return nil, ctx.Err()
	}
}

func TestCrash_AnExecutorThatStopsHeartbeatingIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	hookTable(t, db)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	started, ended := make(chan uuid.UUID, 1), make(chan error, 1)
	a.Register("flaky", blockingHandler(started, ended))
	a.RegisterHook("record", recordHook)
	id, err := a.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "flaky",
		Retry: &RetryPolicy{MaxAttempts: 3, InitialBackoffMS: 10, Base: 2}, OnComplete: &OnComplete{Hook: "record"}})
	require.NoError(t, err)
	require.Equal(t, id, <-started)

	b := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	var ranOnB atomic.Int64
	b.Register("flaky", func(context.Context, Job) (json.RawMessage, error) {
		ranOnB.Add(1)
		return json.RawMessage(`"second"`), nil
	})
	b.RegisterHook("record", recordHook)
	a.crash()

	s := requireFinished(t, b, "org-1", id, OutcomeSucceeded)
	require.Equal(t, 2, s.Attempts, "the silent attempt counted as failed and was retried")
	require.JSONEq(t, `"second"`, string(s.Result))
	require.Equal(t, int64(1), ranOnB.Load())
	calls, outcome := hookCallsOf(t, db, id)
	require.Equal(t, 1, calls)
	require.Equal(t, "succeeded", outcome)
}

func TestCrash_WithoutRetryPolicyTheWorkFailsAndItsHookFiresOnce(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	hookTable(t, db)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	started, ended := make(chan uuid.UUID, 1), make(chan error, 1)
	a.Register("flaky", blockingHandler(started, ended))
	a.RegisterHook("record", recordHook)
	id, err := a.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "flaky",
		OnComplete: &OnComplete{Hook: "record"}})
	require.NoError(t, err)
	require.Equal(t, id, <-started)

	b := startManager(t, db, Config{Pools: map[string]int{"default": 5}})
	b.RegisterHook("record", recordHook)
	a.crash()

	s := requireFinished(t, b, "org-1", id, OutcomeFailed)
	require.Contains(t, s.Error, "stopped heartbeating")
	require.Equal(t, 1, s.Attempts)
	calls, outcome := hookCallsOf(t, db, id)
	require.Equal(t, 1, calls)
	require.Equal(t, "failed", outcome)
	require.Eventually(t, func() bool { return slotsInUse(t, db, "default") == 0 }, testWait, testTick, "the slot is freed")
}

func TestCancelWhileRunningOnTheOtherReplica_CancelsTheHandlerThereAndFreesTheSlot(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	// b leads the loop; only a can run "block", so the work runs on a.
	b := startManager(t, db, Config{Pools: map[string]int{"default": 1}})
	require.Eventually(t, func() bool { return leaderOf(b) == b }, testWait, testTick)
	a := startManager(t, db, Config{Pools: map[string]int{"default": 1}})
	started, ended := make(chan uuid.UUID, 1), make(chan error, 1)
	a.Register("block", blockingHandler(started, ended))
	id, err := a.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	require.Equal(t, id, <-started)

	require.NoError(t, b.Cancel(context.Background(), "org-1", id))

	select {
	case cause := <-ended:
		require.ErrorIs(t, cause, errWorkCanceled, "the handler's context was canceled because the work was")
	case <-time.After(testWait):
		t.Fatal("the handler on the other replica was never canceled")
	}
	requireFinished(t, b, "org-1", id, OutcomeCanceled)
	require.Eventually(t, func() bool { return slotsInUse(t, db, "default") == 0 }, testWait, testTick, "the slot is freed")
	next, err := b.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, b, "org-1", next, OutcomeSucceeded)
}

// Both iterations are fenced: a loop whose generation another took over
// writes nothing, whether its next iteration would take the fast path (no
// recovery due) or the full one.
func TestFencing_AStaleLoopWritesNothingOnEitherPath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fullOnly bool
	}{{"fast path", false}, {"full path", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.runMain() // the term's first iteration: recovery is done
			stale := h.l
			stale.fullOnly = tc.fullOnly
			id := h.enqueue()
			genBefore := h.observe().generation
			newer := newLoop(h.m, "default")
			require.NoError(t, newer.takeover(h.ctx))

			_, err := stale.iterate(h.ctx)

			require.ErrorIs(t, err, errGenerationMismatch)
			o := h.observe()
			require.Equal(t, []uuid.UUID{id}, o.pending, "the stale loop started nothing")
			require.Empty(t, o.running)
			require.Equal(t, genBefore+1, o.generation, "only the takeover bumped the generation")
		})
	}
}

// The leader's chores are fenced by its leadership term, as its iterations
// are by the generation: a deposed leader's purge and recount write nothing.
func TestFencing_ADeposedLeadersChoresWriteNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.WorkRetention = time.Minute })
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)
	h.clock.Advance(2 * time.Minute) // past retention
	name := "workpool.loop.default"
	deposed, err := leader.NewTerm(h.ctx, h.db, name)
	require.NoError(t, err)
	current, err := leader.NewTerm(h.ctx, h.db, name) // another replica took over
	require.NoError(t, err)

	n, err := h.l.purge(leader.WithTerm(h.ctx, deposed))

	require.ErrorIs(t, err, leader.ErrDeposed)
	require.Zero(t, n)
	require.Equal(t, "finished", h.work(id).state, "the finished work is still there")
	n, err = h.l.purge(leader.WithTerm(h.ctx, current))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// startRecordingReplicas starts two replicas on db, each with pool default
// of limit slots, handler as "work" and recordHook as "record".
func startRecordingReplicas(t *testing.T, db *pgxpool.Pool, limit int, handler Handler) []*Manager {
	t.Helper()
	var ms []*Manager
	for range 2 {
		m := startManager(t, db, Config{Pools: map[string]int{"default": limit}})
		m.Register("work", handler)
		m.RegisterHook("record", recordHook)
		ms = append(ms, m)
	}
	return ms
}
