package workpool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func withMaxPending(n int) harnessOpt { return func(c *Config) { c.MaxPendingPerOrg = n } }

func (h *harness) tryEnqueue(opts ...workOpt) error {
	h.t.Helper()
	p := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"}
	for _, o := range opts {
		o(&p)
	}
	_, err := h.m.Enqueue(h.ctx, p)
	return err
}

func (h *harness) pendingBound(org string) int64 {
	h.t.Helper()
	var n int64
	require.NoError(h.t, h.db.QueryRow(h.ctx, `SELECT pending FROM workpool_org_pending WHERE pool = 'default' AND org_id = $1`, org).Scan(&n))
	return n
}

func TestPendingCap_AnOrgPastItsCapIsRefusedAndOtherOrgsAndPoolsAreNot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(3), withPools(map[string]int{"default": 10, "other": 10}))
	for range 3 {
		require.NoError(t, h.tryEnqueue())
	}

	err := h.tryEnqueue()

	require.ErrorIs(t, err, ErrTooManyPending)
	require.ErrorContains(t, err, "org-1")
	require.ErrorContains(t, err, "default")
	require.ErrorContains(t, err, "3")
	require.Equal(t, 3, h.workCount(), "nothing enqueued")
	require.NoError(t, h.tryEnqueue(withOrg("org-2")), "another org has its own cap")
	require.NoError(t, h.tryEnqueue(withPool("other")), "another pool has its own cap")
	var refused dto.Metric
	require.NoError(t, h.m.metrics.refused.WithLabelValues("default").Write(&refused))
	require.Equal(t, 1.0, refused.GetCounter().GetValue())
}

func TestPendingCap_ABatchThatWouldCrossTheCapIsRefusedWhole(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(3))
	require.NoError(t, h.tryEnqueue())
	item := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"}
	other := EnqueueParams{OrgID: "org-2", Pool: "default", Handler: "test_handle"}

	_, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{other, item, item, item})

	require.ErrorIs(t, err, ErrTooManyPending)
	require.Equal(t, 1, h.workCount())
	_, err = h.m.EnqueueMany(h.ctx, []EnqueueParams{other, item, item})
	require.NoError(t, err, "up to the cap")
	require.Equal(t, 4, h.workCount())
}

// Running and retrying work is unfinished work too; finished work frees
// room once the org is counted again (at most once a second per org and
// pool while it is over its cap).
func TestPendingCap_CountsUnfinishedWorkAndFreesRoomAsWorkFinishes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(2))
	running := h.enqueue()
	retrying := h.enqueue(withRetry(3, 60_000, 2))
	h.runMain()
	h.complete(retrying, "failed", 1)
	h.runMain() // one running, one waiting for its retry
	h.clock.Advance(pendingRecountAfter)
	require.ErrorIs(t, h.tryEnqueue(), ErrTooManyPending, "running and retrying work counts")

	h.complete(running, "success", 1)
	h.runMain()
	require.ErrorIs(t, h.tryEnqueue(), ErrTooManyPending, "counted less than a second ago")
	h.clock.Advance(pendingRecountAfter)
	require.NoError(t, h.tryEnqueue(), "counted again: one finished")
	require.EqualValues(t, 2, h.pendingBound("org-1"))
}

func TestPendingCap_ConcurrentEnqueuesStopExactlyAtTheCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(5))
	const tries = 12
	errs := make([]error, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = h.m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"})
		}()
	}
	wg.Wait()

	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, ErrTooManyPending)
	}
	require.Equal(t, 5, ok)
	require.Equal(t, 5, h.workCount())
}

func TestPendingCap_OwedWorkIsCountedButNeverRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(1))
	require.NoError(t, h.tryEnqueue())

	require.NoError(t, h.tryEnqueue(func(p *EnqueueParams) { p.BypassPendingCap = true }))

	require.EqualValues(t, 2, h.pendingBound("org-1"))
	require.ErrorIs(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"), ErrTooManyPending)
	require.NoError(t, h.m.CheckPending(h.ctx, h.db, "org-2", "default"), "an org with nothing pending")
}

func TestPendingCap_CheckPendingCountsAgainWhenTheBoundIsPastTheCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(1))
	id := h.enqueue()
	require.ErrorIs(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"), ErrTooManyPending, "counted: one pending")
	h.runMain()
	h.complete(id, "success", 1)
	h.runMain()
	require.ErrorIs(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"), ErrTooManyPending,
		"a count found the org over its cap less than a second ago")

	h.clock.Advance(pendingRecountAfter)

	require.NoError(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"))
}

// The bound past the cap is what the org enqueued since its last count;
// if that work has finished, the next enqueue (or wake-up check) counts
// and is admitted at once — a recent count that admitted holds nothing
// off. (It was refused for up to a second: the cap acted as a rate limit
// of one admission a second on an org far below it.)
func TestPendingCap_AnOrgWhoseWorkFinishedIsAdmittedHoweverRecentItsLastCount(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"enqueue", "wake-up check, then an enqueue past the cap"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxPending(3))
			for i := range 12 { // four times the cap, the clock standing still
				var id uuid.UUID
				if path == "enqueue" {
					require.NoError(t, h.tryEnqueue(), "enqueue %d", i)
					id = h.observe().pending[0]
				} else {
					require.NoError(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"), "check %d", i)
					id = h.enqueue(func(p *EnqueueParams) { p.BypassPendingCap = true })
				}
				h.runMain()
				h.complete(id, "success", 1)
				h.runMain()
			}
		})
	}
}

// A count that drifted low (kept while the cap was off, or by a replica
// that did not keep it) is repaired by the leader's refresh.
func TestPendingCap_TheLeaderRefreshesStaleCounts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(3))
	for range 3 {
		h.enqueue()
	}
	h.exec(`UPDATE workpool_org_pending SET pending = 0`)
	require.NoError(t, h.tryEnqueue(), "the drifted bound lets one more in")

	h.clock.Advance(pendingRefreshAfter + time.Second)
	require.NoError(t, h.l.refreshPending(h.ctx))

	require.EqualValues(t, 4, h.pendingBound("org-1"))
	require.ErrorIs(t, h.tryEnqueue(), ErrTooManyPending)
}

func TestPendingCap_OffCountsNothingAndRefusesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(NoPendingLimit))
	for range 5 {
		require.NoError(t, h.tryEnqueue())
	}
	var rows int
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM workpool_org_pending`).Scan(&rows))
	require.Zero(t, rows)
}

func TestPendingCap_ARefusedEnqueueKeepsNoIdempotencyKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(1))
	first := h.enqueue()
	_, err := h.enqueueKeyed("k")
	require.ErrorIs(t, err, ErrTooManyPending)
	h.runMain()
	h.complete(first, "success", 1)
	h.runMain()
	h.clock.Advance(pendingRecountAfter)

	id, err := h.enqueueKeyed("k")

	require.NoError(t, err)
	require.NotEqual(t, first, id)
	require.Equal(t, 2, h.workCount())
}

// A batch over several pools and orgs is held to the caps of its own
// (pool, org) pairs only, not to every pool × org combination.
func TestPendingCap_ABatchIsHeldToTheCapsOfItsOwnPairsOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(1), withPools(map[string]int{"default": 10, "other": 10}))
	require.NoError(t, h.tryEnqueue(withOrg("org-2"))) // org-2 is at its cap in default

	_, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{
		{OrgID: "org-1", Pool: "default", Handler: "test_handle"},
		{OrgID: "org-2", Pool: "other", Handler: "test_handle"},
	})

	require.NoError(t, err)
	require.Equal(t, 3, h.workCount())
}

// A replay enqueues nothing, so it takes no room under the cap: an org at
// its cap still gets the first work's id back (a retry after a lost answer
// is not turned into a 429), and a batch's replayed items do not count
// against the room its fresh items need.
func TestPendingCap_AReplayTakesNoRoomUnderTheCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(2))
	item := func(key string) EnqueueParams {
		return EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", IdempotencyKey: key}
	}
	first, err := h.m.Enqueue(h.ctx, item("k"))
	require.NoError(t, err)

	batch, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{item("k"), item("fresh")})
	require.NoError(t, err, "one fresh item fits beside the first")
	require.Equal(t, first, batch[0])

	again, err := h.m.Enqueue(h.ctx, item("k"))
	require.NoError(t, err, "at the cap, a replay is still answered")
	require.Equal(t, first, again)
	_, err = h.m.EnqueueMany(h.ctx, []EnqueueParams{item("k"), item("one-too-many")})
	require.ErrorIs(t, err, ErrTooManyPending)
	require.Equal(t, 2, h.workCount())
	require.EqualValues(t, 2, h.pendingBound("org-1"))
}

// queuedCheck is CheckPending as a caller pipelining it does it: the read
// in a batch beside a statement of its own, the decision after.
func (h *harness) queuedCheck(org string) error {
	h.t.Helper()
	return h.queuedCheckOn(h.db, org)
}

// queuedCheckOn is queuedCheck deciding on q.
func (h *harness) queuedCheckOn(q Querier, org string) error {
	h.t.Helper()
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	c := h.m.QueuePendingCheck(b, org, "default")
	br := h.db.SendBatch(h.ctx, b)
	_, err := br.Exec()
	require.NoError(h.t, err)
	require.NoError(h.t, c.Read(br))
	require.NoError(h.t, br.Close())
	return c.Decide(h.ctx, q)
}

func TestPendingCap_AQueuedCheckDecidesAsCheckPending(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cap     int
		org     string
		prepare func(h *harness, id uuid.UUID)
		refused bool
	}{
		{name: "an org with nothing pending", cap: 1, org: "org-2"},
		{name: "an org at its cap, counted just now", cap: 1, org: "org-1", refused: true},
		{name: "an org whose stale bound is counted again and has room", cap: 1, org: "org-1", prepare: func(h *harness, id uuid.UUID) {
			h.runMain()
			h.complete(id, "success", 1)
			h.runMain()
			h.clock.Advance(pendingRecountAfter)
		}},
		{name: "the cap off", cap: NoPendingLimit, org: "org-1"},
	}
	for _, tt := range tests {
		for _, how := range []string{"CheckPending", "queued"} {
			t.Run(tt.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, withMaxPending(tt.cap))
				id := h.enqueue()
				if tt.prepare != nil {
					tt.prepare(h, id)
				}
				var err error
				if how == "queued" {
					err = h.queuedCheck(tt.org)
				} else {
					err = h.m.CheckPending(h.ctx, h.db, tt.org, "default")
				}
				if tt.refused {
					require.ErrorIs(t, err, ErrTooManyPending)
				} else {
					require.NoError(t, err)
				}
			})
		}
	}
}

func bypassCap(p *EnqueueParams) { p.BypassPendingCap = true }

// finishOwed enqueues n items of org-1 past the cap (owed work) and runs
// each to completion: the bound rises by n, the org's unfinished work
// does not.
func (h *harness) finishOwed(n int) {
	h.t.Helper()
	for range n {
		id := h.enqueue(bypassCap)
		h.runMain()
		h.complete(id, "success", 1)
		h.runMain()
	}
}

// pendingCounter is the test's database, counting the pending counts
// (sqlCountPending) taken on it.
type pendingCounter struct {
	Querier
	counts int
}

func (q *pendingCounter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sql == sqlCountPending {
		q.counts++
	}
	return q.Querier.QueryRow(ctx, sql, args...)
}

// A count that refused a batch because the batch alone would not fit —
// the org had room for fewer — holds off only what would not fit that
// room: the org's next single enqueue, within the second, is counted and
// admitted. (It was refused, "has reached its cap", for a second after,
// though the org was far below it.)
func TestPendingCap_ABatchRefusedForItsOwnSizeDoesNotHoldOffTheOrgsNextSmallEnqueue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		finished, owed  int // the org's items run to completion, then left pending
		batch           int
		refusal         string
		nextFillsTheOrg bool
	}{
		{name: "a batch larger than the cap, the org's work all finished", finished: 3, batch: 4,
			refusal: "org org-1 has 0 unfinished work items in pool default; 4 more would pass its cap of 3"},
		{name: "a batch that does not fit beside the org's work", finished: 1, owed: 2, batch: 2,
			refusal: "org org-1 has 2 unfinished work items in pool default; 2 more would pass its cap of 3", nextFillsTheOrg: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxPending(3))
			h.finishOwed(tt.finished)
			for range tt.owed {
				h.enqueue(bypassCap)
			}
			require.EqualValues(t, 3, h.pendingBound("org-1"), "the bound is at the cap")
			item := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"}
			batch := make([]EnqueueParams, tt.batch)
			for i := range batch {
				batch[i] = item
			}

			_, err := h.m.EnqueueMany(h.ctx, batch)
			require.ErrorIs(t, err, ErrTooManyPending)
			require.EqualError(t, err, tt.refusal+": "+ErrTooManyPending.Error())
			_, err = h.m.EnqueueMany(h.ctx, batch)
			require.EqualError(t, err, tt.refusal+": "+ErrTooManyPending.Error(), "the same batch again, held off")

			require.NoError(t, h.m.CheckPending(h.ctx, h.db, "org-1", "default"), "a wake-up check is not held off")
			require.NoError(t, h.tryEnqueue(), "nor an enqueue of one, the clock standing still")
			if tt.nextFillsTheOrg {
				err := h.tryEnqueue()
				require.ErrorIs(t, err, ErrTooManyPending)
				require.ErrorContains(t, err, "org org-1 has reached its cap of 3 unfinished work items in pool default")
			}
		})
	}
}

// A wake-up check whose count admitted lets the next checks admit without
// a count while what was enqueued since (the bound's growth: the owed
// enqueues that follow admitted checks) fits the room that count found;
// the check that would not fit counts again. (Each check counted, up to
// cap+1 index entries, while the bound stayed past the cap — up to a
// minute, until the leader's count.)
func TestPendingCap_ACheckCountsAgainOnlyOnceTheEnqueuesSinceItsLastCountUseUpTheRoomItFound(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"CheckPending", "queued"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxPending(5))
			h.finishOwed(4)
			h.enqueue(bypassCap)
			h.enqueue(bypassCap) // the bound 6, past the cap; 2 unfinished
			q := &pendingCounter{Querier: h.db}
			check := func() error {
				if how == "queued" {
					return h.queuedCheckOn(q, "org-1")
				}
				return h.m.CheckPending(h.ctx, q, "org-1", "default")
			}

			require.NoError(t, check())
			require.EqualValues(t, 1, q.counts, "the bound past the cap: counted, room for 3")
			for i := range 2 { // owed enqueues after admitted checks, as the gate does
				h.enqueue(bypassCap)
				require.NoError(t, check(), "check %d", i+2)
				require.EqualValues(t, 1, q.counts, "check %d: %d enqueued since the count, room for %d", i+2, i+1, 3-(i+1))
			}
			h.enqueue(bypassCap) // 5 unfinished: at the cap

			require.ErrorIs(t, check(), ErrTooManyPending)
			require.EqualValues(t, 2, q.counts, "3 enqueued since the count: counted again")
			require.ErrorIs(t, check(), ErrTooManyPending)
			require.EqualValues(t, 2, q.counts, "held off: refused without a count within the second")
		})
	}
}

// What a check's count found is compared with the bound's growth only
// while nobody counted the bound again: a count lowers it (to the org's
// unfinished work), and the enqueues after take it up again, past the cap
// with fewer items than the growth since the check's count suggests.
func TestPendingCap_ACheckIsNotFooledByABoundCountedAgainSinceItsLastCount(t *testing.T) {
	t.Parallel()
	refresh := func(h *harness) {
		h.clock.Advance(11 * time.Second)
		require.NoError(h.t, h.l.refreshPending(h.ctx))
	}
	tests := []struct {
		name     string
		finished int           // before the check's count; 2 more stay pending
		early    time.Duration // the clock's advance before the check's count
		recount  func(h *harness)
		owed     int // enqueued after the recount
	}{
		{name: "the leader's count, and enqueues since past the bound the check read",
			finished: 4, early: pendingRefreshAfter - 10*time.Second, recount: refresh, owed: 5},
		{name: "the leader's count, and enqueues since back past the cap but below the bound the check read",
			finished: 6, early: pendingRefreshAfter - 10*time.Second, recount: refresh, owed: 4},
		{name: "an enqueue's count at the same instant as the bound's last", finished: 4, recount: func(h *harness) {
			require.NoError(h.t, h.tryEnqueue(), "counted: 2 unfinished")
		}, owed: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxPending(5))
			h.finishOwed(tt.finished)
			h.enqueue(bypassCap)
			h.enqueue(bypassCap)
			h.clock.Advance(tt.early)
			q := &pendingCounter{Querier: h.db}
			require.NoError(t, h.m.CheckPending(h.ctx, q, "org-1", "default"))
			require.EqualValues(t, 1, q.counts, "counted: 2 unfinished")

			tt.recount(h)
			for range tt.owed {
				h.enqueue(bypassCap)
			}
			require.Greater(t, h.pendingBound("org-1"), int64(5), "past the cap again")

			require.ErrorIs(t, h.m.CheckPending(h.ctx, q, "org-1", "default"), ErrTooManyPending)
			require.EqualValues(t, 2, q.counts, "counted again")
		})
	}
}
