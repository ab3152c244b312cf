package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// queueHeads reads the default pool's org queues (workpool_org_queues).
func (h *harness) queueHeads() map[string]time.Time {
	h.t.Helper()
	rows, err := h.db.Query(h.ctx, `SELECT org_id, head_at FROM workpool_org_queues WHERE pool = 'default'`)
	require.NoError(h.t, err)
	heads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		org string
		at  time.Time
	}, error) {
		var v struct {
			org string
			at  time.Time
		}
		err := r.Scan(&v.org, &v.at)
		return v, err
	})
	require.NoError(h.t, err)
	out := map[string]time.Time{}
	for _, v := range heads {
		out[v.org] = v.at.UTC()
	}
	return out
}

// withPerOrgCap keeps every start on the fair pick (a per-org cap is
// something only fair share enforces).
func withPerOrgCap(t *testing.T, h *harness, n int) {
	t.Helper()
	require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", &n))
}

func TestOrgQueues_EveryEnqueuePathRecordsEachOrgsEarliestPlainRunAt(t *testing.T) {
	for _, c := range []struct {
		name string
		cap  int // MaxPendingPerOrg
		many bool
	}{
		{"one org per batch, capped", 0, false},
		{"several orgs per batch, capped", 0, true},
		{"one org per batch, cap off", NoPendingLimit, false},
		{"several orgs per batch, cap off", NoPendingLimit, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(cfg *Config) { cfg.MaxPendingPerOrg = c.cap })
			now := h.clock.Now()
			item := func(org string, at time.Duration, key string) EnqueueParams {
				return EnqueueParams{OrgID: org, Pool: "default", Handler: "test_handle", RunAt: now.Add(at), ConcurrencyKey: key}
			}
			batches := [][]EnqueueParams{
				{item("a", 5*time.Second, ""), item("a", 3*time.Second, "")},
				{item("a", time.Second, "")},  // earlier: a's head moves back
				{item("b", time.Second, "k")}, // keyed: no queue
				{item("c", 2*time.Second, "")},
				{item("a", 9*time.Second, "")}, // later: a's head stays
			}
			if c.many {
				batches = [][]EnqueueParams{{
					item("a", 5*time.Second, ""), item("c", 2*time.Second, ""), item("b", time.Second, "k"),
					item("a", 9*time.Second, ""), item("a", time.Second, ""),
				}}
			}
			for _, b := range batches {
				_, err := h.m.EnqueueMany(h.ctx, b)
				require.NoError(t, err)
			}
			require.Equal(t, map[string]time.Time{"a": now.Add(time.Second), "c": now.Add(2 * time.Second)}, h.queueHeads())
		})
	}
}

func TestOrgQueues_AnEnqueueNamingAnUnknownPoolQueuesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	_, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{
		{OrgID: "a", Pool: "default", Handler: "test_handle"},
		{OrgID: "a", Pool: "nope", Handler: "test_handle"},
	})
	require.Error(t, err)
	require.Empty(t, h.queueHeads())
}

func TestOrgQueues_TheFairPickMovesHeadsPastStartedWorkAndDropsEmptyQueues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 10)
	now := h.clock.Now()
	a1 := h.enqueue(withOrg("a"))
	h.clock.Advance(time.Millisecond)
	a2 := h.enqueue(withOrg("a"))
	h.clock.Advance(time.Millisecond)
	h.enqueue(withOrg("b"))
	future := now.Add(time.Hour)
	h.enqueue(withOrg("c"), withRunAt(future))

	h.runMain() // starts everything ready
	obs := h.observe()
	require.True(t, obs.isRunning(a1) && obs.isRunning(a2))
	h.runMain() // finds a's and b's queues empty
	require.Equal(t, map[string]time.Time{"c": future}, h.queueHeads())

	// a queue whose head is behind moves to the head the probe finds
	h.exec(`UPDATE workpool_org_queues SET head_at = $1 WHERE org_id = 'c'`, now.Add(-time.Hour))
	h.enqueue(withOrg("c"), withRunAt(now.Add(30*time.Minute)))
	h.exec(`UPDATE workpool_org_queues SET head_at = $1 WHERE org_id = 'c'`, now.Add(-time.Hour))
	h.runMain()
	require.Equal(t, map[string]time.Time{"c": now.Add(30 * time.Minute)}, h.queueHeads())
}

func TestOrgQueues_ARetryGoesBackIntoItsOrgsQueueAndStartsWhenDue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 10)
	id := h.enqueue(withOrg("a"), withRetry(3, 1000, 1))
	h.enqueue(withOrg("b"))
	h.runMain()
	h.runMain() // both queues now empty
	require.Empty(t, h.queueHeads())

	h.complete(id, "failed", 1)
	require.Contains(t, h.queueHeads(), "a", "a retry is pending work of its org's queue")
	h.clock.Advance(2 * time.Second)
	h.runMain()
	require.True(t, h.observe().isRunning(id), "the retry started on the fair pick")
}

func TestOrgQueues_AHandBackGoesBackIntoItsOrgsQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 10)
	id := h.enqueue(withOrg("a"))
	h.runMain()
	h.runMain()
	require.Empty(t, h.queueHeads())
	h.exec(`UPDATE workpool_work SET claimed_by = $1 WHERE id = $2`, h.m.exec.id, id)

	err := pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: id, pool: "default", attempt: 1, kind: kindHandBack}})
		return err
	})
	require.NoError(t, err)

	require.Contains(t, h.queueHeads(), "a")
	h.runMain()
	require.True(t, h.observe().isRunning(id))
}

// A hand-back (a replica stopping) does not count its attempt, nor cost
// the work its place: it keeps its run_at, so a key limited to 1 runs its
// items in run_at order across a deploy, and an org's work in its order.
func TestAHandedBackItemKeepsItsPlaceBeforeTheWorkEnqueuedAfterIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []workOpt
	}{
		{"on a key limited to 1", []workOpt{withKey("k", 1)}},
		{"in its org's queue (fair pick)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, withMaxParallelism(1))
			withPerOrgCap(t, h, 1)
			t0 := h.clock.Now()
			first := h.enqueue(append([]workOpt{withOrg("a"), withRunAt(t0)}, tc.opts...)...)
			later := h.enqueue(append([]workOpt{withOrg("a"), withRunAt(t0.Add(time.Millisecond))}, tc.opts...)...)
			h.runMain()
			require.True(t, h.observe().isRunning(first))
			h.exec(`UPDATE workpool_work SET claimed_by = $1 WHERE id = $2`, h.m.exec.id, first)
			h.clock.Advance(time.Minute) // (the stop comes later)
			require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
				_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: first, pool: "default", attempt: 1, kind: kindHandBack}})
				return err
			}))
			var runAt time.Time
			require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1`, first).Scan(&runAt))
			require.True(t, runAt.Equal(t0), "run_at %v, enqueued for %v", runAt, t0)

			h.runMain()
			o := h.observe()
			require.True(t, o.isRunning(first), "the handed-back item runs again first")
			require.False(t, o.isRunning(later))
		})
	}
}

// The same for the steps of a serial key enqueued together (one batch, one
// run_at): the hand-back's rewritten row went behind its batch's others,
// which then ran first (ties went by where a row lay in the table). A
// key's ties now go by id: the order of enqueue, a batch's order. Found by
// review.
func TestAHandedBackStepOfASerialKeyKeepsItsPlaceAmongItsBatch(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		var ps []EnqueueParams
		for range 3 {
			ps = append(ps, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", ConcurrencyKey: "k", KeyLimit: 1})
		}
		ids, err := h.m.EnqueueMany(h.ctx, ps)
		require.NoError(t, err)
		h.runMain()
		require.Equal(t, []uuid.UUID{ids[0]}, h.observe().running, "the batch's first step starts first")
		h.exec(`UPDATE workpool_work SET claimed_by = $1 WHERE id = $2`, h.m.exec.id, ids[0])
		require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
			_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: ids[0], pool: "default", attempt: 1, kind: kindHandBack}})
			return err
		}))
		require.Equal(t, StatePending, h.status(ids[0]).State)

		h.runMain()
		o := h.observe()
		require.True(t, o.isRunning(ids[0]), "the handed-back first step runs again before the batch's second")
		require.False(t, o.isRunning(ids[1]))
	}, withMaxParallelism(1))
}

// The same for two single enqueues given one run_at (a client scheduling
// two steps of a serial key for the same moment): ties go by id, the
// order of enqueue. Found by review.
func TestAHandedBackStepKeepsItsPlaceBeforeAStepOfTheSameRunAtEnqueuedAfterIt(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		at := h.clock.Now().Add(-time.Second).Truncate(time.Second)
		first := h.enqueue(withKey("k", 1), withRunAt(at))
		h.clock.Advance(time.Second)
		second := h.enqueue(withKey("k", 1), withRunAt(at))
		h.runMain()
		require.Equal(t, []uuid.UUID{first}, h.observe().running)
		h.exec(`UPDATE workpool_work SET claimed_by = $1 WHERE id = $2`, h.m.exec.id, first)
		require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
			_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: first, pool: "default", attempt: 1, kind: kindHandBack}})
			return err
		}))
		h.runMain()
		o := h.observe()
		require.True(t, o.isRunning(first), "the handed-back first step runs again before the second")
		require.False(t, o.isRunning(second))
	}, withMaxParallelism(1))
}

// A key's items run in run_at order, ties in enqueue order, whatever else
// is enqueued: a batch's three steps given T all run before a step
// another enqueue gave T+1µs (a first fix, which set a batch's ties a
// microsecond apart, put the batch's third behind it; found by a review of
// this session's diff), and a step given T-1µs after them all runs first.
func TestAKeysItemsRunInRunAtThenEnqueueOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	t0 := h.clock.Now().Add(-time.Minute).Truncate(time.Microsecond)
	step := func(at time.Time) EnqueueParams {
		return EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", ConcurrencyKey: "k", KeyLimit: 1,
			RunAt: at, RunAtSet: true}
	}
	batch, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{step(t0), step(t0), step(t0)})
	require.NoError(t, err)
	later, err := h.m.Enqueue(h.ctx, step(t0.Add(time.Microsecond)))
	require.NoError(t, err)
	earlier, err := h.m.Enqueue(h.ctx, step(t0.Add(-time.Microsecond)))
	require.NoError(t, err)

	var order []uuid.UUID
	for range 5 {
		h.runMain()
		running := h.observe().running
		require.Len(t, running, 1, "a serial key runs one item at a time")
		order = append(order, running[0])
		h.complete(running[0], "success", 1)
	}
	require.Equal(t, append(append([]uuid.UUID{earlier}, batch...), later), order)
}

// The pick moves a queue's head only if no other transaction holds its
// row: an enqueue still in flight keeps the head it lowered, and the loop
// does not wait for it.
func TestOrgQueues_AnEnqueueInFlightKeepsItsHeadAndDoesNotHoldUpTheLoop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 10)
	h.enqueue(withOrg("a"))
	h.runMain()
	h.exec(`UPDATE workpool_org_queues SET head_at = $1 WHERE org_id = 'a'`, h.clock.Now().Add(-time.Hour))
	// a's queue row is stale (nothing ready) and about to be dropped; an
	// enqueue for a holds it
	tx, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(h.ctx) }()
	id, err := h.m.EnqueueTx(h.ctx, tx, EnqueueParams{OrgID: "a", Pool: "default", Handler: "test_handle"})
	require.NoError(t, err)

	done := make(chan struct{})
	go func() { defer close(done); h.runMain() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop waited for the enqueue's transaction")
	}
	require.NoError(t, tx.Commit(h.ctx))

	require.Contains(t, h.queueHeads(), "a")
	h.runMain()
	require.True(t, h.observe().isRunning(id), "the enqueued item started")
}

// Many writers at once — enqueues of several orgs with run_at in the past
// and future, retries — against a running loop held on the fair pick: the
// queues never lose a pending item, so every item finishes.
func TestOrgQueues_UnderConcurrentEnqueuesAndRetriesEveryItemFinishes(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	m, err := New(db, liveConfig(t, Config{Pools: map[string]int{"default": 8}}))
	require.NoError(t, err)
	var attempts sync.Map
	m.Register("flaky", func(_ context.Context, j Job) (json.RawMessage, error) {
		n, _ := attempts.LoadOrStore(j.ID, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) == 1 && j.ID[15]%3 == 0 {
			return nil, errors.New("first attempt fails")
		}
		return nil, nil
	})
	ctx := context.Background()
	perOrg := 3
	require.NoError(t, m.SetMaxParallelismPerOrg(ctx, "default", &perOrg))
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(ctx)
	})

	const writers, batches = 6, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				ps := make([]EnqueueParams, 0, 4)
				for i := range 4 {
					ps = append(ps, EnqueueParams{
						OrgID: fmt.Sprintf("org-%d", (w+b+i)%5), Pool: "default", Handler: "flaky",
						// some behind every head already recorded, some ahead
						RunAt: time.Now().Add(time.Duration((b+i)%5-2) * 100 * time.Millisecond),
						Retry: &RetryPolicy{MaxAttempts: 2, InitialBackoffMS: 20, Base: 1},
					})
				}
				_, err := m.EnqueueMany(ctx, ps)
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		var unfinished int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE state <> 'finished'`).Scan(&unfinished))
		return unfinished == 0
	}, 60*time.Second, 50*time.Millisecond, "every item finished")
	var succeeded int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE outcome = 'succeeded'`).Scan(&succeeded))
	require.Equal(t, writers*batches*4, succeeded)
}

// An enqueue locks its org's pending count before its queue row, whatever
// its items say about the cap: a wake-up's owed work (BypassPendingCap)
// once took the queue row first and deadlocked with an API enqueue of the
// same org, which takes the count first.
func TestOrgQueues_AnEnqueueLocksItsPendingCountBeforeItsQueue(t *testing.T) {
	for _, bypass := range []bool{false, true} {
		t.Run(fmt.Sprintf("bypass=%v", bypass), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.enqueue(withOrg("a")) // both rows exist
			holder, err := h.db.Begin(h.ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(h.ctx) }()
			_, err = holder.Exec(h.ctx, sqlLockPending, "default", "a")
			require.NoError(t, err)

			done := make(chan error, 1)
			go func() {
				_, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{{OrgID: "a", Pool: "default", Handler: "test_handle", BypassPendingCap: bypass}})
				done <- err
			}()
			require.Eventually(t, func() bool { // the enqueue waits for the count
				var waiting bool
				require.NoError(t, h.db.QueryRow(h.ctx,
					`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid')`).Scan(&waiting))
				return waiting
			}, 10*time.Second, 10*time.Millisecond)
			// …and does not hold the queue row meanwhile
			_, err = h.db.Exec(h.ctx, `SELECT 1 FROM workpool_org_queues WHERE pool = 'default' AND org_id = 'a' FOR UPDATE NOWAIT`)
			require.NoError(t, err, "the waiting enqueue holds the org's queue row")

			require.NoError(t, holder.Rollback(h.ctx))
			require.NoError(t, <-done)
		})
	}
}

// A retry does not move a queue's head past work that was already waiting.
func TestOrgQueues_ARetryLaterThanTheHeadKeepsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 1)
	first := h.enqueue(withOrg("a"), withRetry(3, 60_000, 1))
	h.clock.Advance(time.Millisecond)
	second := h.enqueue(withOrg("a"))
	h.runMain() // the cap lets one start: first
	require.True(t, h.observe().isRunning(first))
	h.runMain() // a's head moves to second

	h.complete(first, "failed", 1) // its retry is due a minute from now

	h.runMain()
	require.True(t, h.observe().isRunning(second), "the item queued before the retry started")
}

// The leader writes back a queue that work was made pending without (a
// replica of a version before the queues, during a rolling upgrade), and
// leaves correct queues as they are.
func TestOrgQueues_TheRepairWritesBackAMissingQueueAndCountsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	withPerOrgCap(t, h, 10)
	now := h.clock.Now()
	lost := h.enqueue(withOrg("a"), withRunAt(now.Add(-time.Second)))
	h.enqueue(withOrg("b"))
	h.exec(`DELETE FROM workpool_org_queues WHERE org_id = 'a'`)
	var xmin string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT xmin::text FROM workpool_org_queues WHERE org_id = 'b'`).Scan(&xmin))

	_, err := h.l.repairQueues(h.ctx)
	require.NoError(t, err)

	require.Equal(t, now.Add(-time.Second), h.queueHeads()["a"])
	var after string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT xmin::text FROM workpool_org_queues WHERE org_id = 'b'`).Scan(&after))
	require.Equal(t, xmin, after, "a correct queue is not rewritten")
	require.Equal(t, 1.0, testutil.ToFloat64(h.m.metrics.queueRepairs.WithLabelValues("default")))
	h.runMain()
	require.True(t, h.observe().isRunning(lost))
}

// The pick probes only the orgs nearest in turn when each of them has
// ready work; a stale queue among them (its work all gone) makes it probe
// every org, so that the free slot still goes to the next org in the fair
// order rather than to nobody.
func TestOrgQueues_AStaleQueueNearestInTurnDoesNotHoldUpAFreeSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(3))
	withPerOrgCap(t, h, 10)
	h.enqueue(withOrg("b"))
	h.enqueue(withOrg("c"))
	h.runMain() // b and c hold a slot each
	h.clock.Advance(time.Millisecond)
	b2 := h.enqueue(withOrg("b"))
	h.clock.Advance(time.Millisecond)
	c2 := h.enqueue(withOrg("c"))
	// a queue for org a, which holds no slot (the lowest next turn) and
	// has no work
	h.exec(`INSERT INTO workpool_org_queues (pool, org_id, head_at) VALUES ('default', 'a', $1)`, h.clock.Now().Add(-time.Hour))

	h.runMain() // one free slot

	obs := h.observe()
	require.True(t, obs.isRunning(b2), "the slot went to the next org in the fair order")
	require.True(t, obs.isPending(c2))
	require.NotContains(t, h.queueHeads(), "a", "the stale queue is dropped")
}

// An enqueue that commits after the fair pick took its snapshot, but
// before the pick locks the org's queue row to move its head, keeps the
// head it lowered: the pick moves a head only when the row's xmin is the
// one it read. (The pick is held at its first write — the pool row, locked
// here — after its snapshot, so the enqueue's commit lands in between.)
func TestOrgQueues_AnEnqueueCommittedDuringThePickKeepsTheHeadItLowered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	withPerOrgCap(t, h, 1)
	t0 := h.clock.Now()
	a1 := h.enqueue(withOrg("a"))
	h.clock.Advance(10 * time.Millisecond)
	a2 := h.enqueue(withOrg("a"))
	h.runMain() // starts a1
	h.runMain() // nothing to start; from now on the loop starts fairly in one statement
	require.True(t, h.l.shared)
	h.complete(a1, "success", 1)
	require.Equal(t, t0, h.queueHeads()["a"])

	var late uuid.UUID
	h.iterateAround(func() {
		// a's next item, a2, is ahead of a's head: this pick would move the
		// head to it, past the item enqueued now
		var err error
		late, err = h.m.Enqueue(h.ctx, EnqueueParams{OrgID: "a", Pool: "default", Handler: "test_handle", RunAt: t0.Add(5 * time.Millisecond)})
		require.NoError(t, err)
	})
	require.True(t, h.observe().isRunning(a2), "the pick started what its snapshot showed")

	require.False(t, h.queueHeads()["a"].After(t0.Add(5*time.Millisecond)), "the head stays at or before the late item")
	h.complete(a2, "success", 1)
	h.runMain()
	require.True(t, h.observe().isRunning(late), "the late item starts on the next pick")
}

// Work that no org queue names — written by something that does not keep
// them: a hand-made INSERT, a replica of a version before the queues
// during a rolling upgrade — is seen by no start, which reads the orgs
// from their queues. The loop's outlook still sees it ready with nothing
// running, and asks the leader's chores to repair the queues at once
// rather than at their next tick (a minute apart with the default
// retention): the work starts, and the repair is counted and logged.
func TestWorkNoQueueNamesStartsWithoutWaitingForTheChoresTick(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Registry: reg, WorkRetention: 24 * time.Hour})
	ctx := context.Background()
	requireLoopSettled(t, db, m, "default", "idle") // (its term began: the takeover's repair is behind it)
	var id uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `
		INSERT INTO workpool_work (id, org_id, pool, handler, args, state, run_at, max_attempts, initial_backoff_ms,
		  backoff_base, timeout_ms, created_at)
		VALUES (gen_random_uuid(), 'org-1', 'default', 'noop', '{}', 'pending', now(), 1, 1000, 2, 60000, now())
		RETURNING id`).Scan(&id))
	// what an older replica's enqueue would send
	_, err := db.Exec(ctx, sqlNotify, "k:default")
	require.NoError(t, err)

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Equal(t, 1.0, counterValue(t, m.metrics.queueRepairs.WithLabelValues("default")))
}
