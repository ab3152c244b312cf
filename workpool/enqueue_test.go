package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	var names []string
	for _, f := range inv.Fields {
		names = append(names, f.Field)
	}
	require.Contains(t, names, field)
}

func (h *harness) workCount() int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM workpool_work`).Scan(&n))
	return n
}

func TestEnqueue_RejectsBadInputNamingTheFieldAndWritesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.m.RegisterHook("known", func(context.Context, pgx.Tx, Completion) error { return nil })
	valid := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"}
	cases := map[string]func(p *EnqueueParams){
		"pool":                     func(p *EnqueueParams) { p.Pool = "nope" },
		"handler":                  func(p *EnqueueParams) { p.Handler = "nope" },
		"org_id":                   func(p *EnqueueParams) { p.OrgID = "" },
		"args":                     func(p *EnqueueParams) { p.Args = json.RawMessage(`{bad`) },
		"retry.max_attempts":       func(p *EnqueueParams) { p.Retry = &RetryPolicy{MaxAttempts: -1, Base: 2} },
		"retry.initial_backoff_ms": func(p *EnqueueParams) { p.Retry = &RetryPolicy{MaxAttempts: 2, InitialBackoffMS: -5, Base: 2} },
		"retry.base":               func(p *EnqueueParams) { p.Retry = &RetryPolicy{MaxAttempts: 2, Base: 0.5} },
		"timeout_ms":               func(p *EnqueueParams) { p.TimeoutMS = -1 },
		"on_complete.hook":         func(p *EnqueueParams) { p.OnComplete = &OnComplete{Hook: "unknown"} },
		"on_complete.context":      func(p *EnqueueParams) { p.OnComplete = &OnComplete{Hook: "known", Context: json.RawMessage(`[`)} },
		"key_limit":                func(p *EnqueueParams) { p.KeyLimit = 2 },
		"idempotency_key":          func(p *EnqueueParams) { p.IdempotencyKey = strings.Repeat("k", maxIdempotencyKey+1) },
	}
	for field, mutate := range cases {
		p := valid
		mutate(&p)
		_, err := h.m.Enqueue(h.ctx, p)
		requireInvalid(t, err, field)
	}
	require.Zero(t, h.workCount())
	_, err := h.m.Enqueue(h.ctx, valid)
	require.NoError(t, err)
}

func TestEnqueue_AnUnknownPoolIsAnInvalidErrorNotANotFound(t *testing.T) {
	t.Parallel()
	h := newHarness(t)

	_, err := h.m.Enqueue(h.ctx, EnqueueParams{OrgID: "org-1", Pool: "missing", Handler: "test_handle"})

	requireInvalid(t, err, "pool")
	require.False(t, errors.Is(err, apperr.ErrNotFound))
}

func TestEnqueueMany_NamesTheBadItemAndWritesNone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := []EnqueueParams{
		{OrgID: "org-1", Pool: "default", Handler: "test_handle"},
		{OrgID: "org-1", Pool: "default", Handler: "nope"},
		{OrgID: "org-1", Pool: "gone", Handler: "test_handle"},
	}

	_, err := h.m.EnqueueMany(h.ctx, ps)
	requireInvalid(t, err, "[1].handler")
	ps[1].Handler = "test_handle"
	_, err = h.m.EnqueueMany(h.ctx, ps)
	requireInvalid(t, err, "[2].pool")

	require.Zero(t, h.workCount())
}

func TestEnqueueMany_AddsEveryItemInOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := make([]EnqueueParams, 50)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", Args: json.RawMessage(`{"i":` + strings.Repeat("1", i%3+1) + `}`)}
	}

	ids, err := h.m.EnqueueMany(h.ctx, ps)

	require.NoError(t, err)
	require.Len(t, ids, 50)
	require.Equal(t, 50, h.workCount())
	for _, id := range ids {
		require.Equal(t, StatePending, h.status(id).State)
	}
}

func TestEnqueueTx_RolledBackLeavesNoWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tx, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	id, err := h.m.EnqueueTx(h.ctx, tx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"})
	require.NoError(t, err)

	require.NoError(t, tx.Rollback(h.ctx))

	_, err = h.m.Status(h.ctx, "org-1", id)
	require.ErrorIs(t, err, ErrNotFound)
	h.runMain()
	require.Empty(t, h.observe().running)
}

func TestEnqueue_DefaultsTimeoutAndRunAt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()

	var timeout, maxAttempts int
	var runAt time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT timeout_ms, max_attempts, run_at FROM workpool_work WHERE id = $1`, id).
		Scan(&timeout, &maxAttempts, &runAt))
	require.Equal(t, DefaultTimeoutMS, timeout)
	require.Equal(t, 1, maxAttempts)
	require.True(t, runAt.Equal(h.clock.Now()))
}

func TestStatus_AnotherOrgsWorkLooksAbsent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()

	_, err := h.m.Status(h.ctx, "org-2", id)

	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, err, apperr.ErrNotFound)
	require.NoError(t, h.m.Cancel(h.ctx, "org-2", id))
	require.Empty(t, h.observe().pendingCancelation, "another org's cancel is a no-op")
}

func TestStatus_ReportsPreviousAttemptsWhilePendingAndRunning(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(3, 10, 1))
	h.runMain()
	h.complete(id, "failed", 1)
	require.Equal(t, Status{State: StatePending, PreviousAttempts: 1}, coarse(h.status(id)), "a failed attempt awaiting its retry")
	h.runMain()
	h.clock.Advance(time.Second)
	h.runMain()

	require.Equal(t, Status{State: StateRunning, PreviousAttempts: 1}, coarse(h.status(id)))
	s := h.status(id)
	require.Empty(t, s.Error, "an unfinished item reports no error yet")
}

func coarse(s Status) Status { return Status{State: s.State, PreviousAttempts: s.PreviousAttempts} }

func TestCancelAll_CancelsOnlyTheOrgsWorkCreatedBefore(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	old1, old2 := h.enqueue(), h.enqueue()
	h.runMain() // one of them runs
	other := h.enqueue(withOrg("org-2"))
	h.clock.Advance(time.Second)
	cutoff := h.clock.Now()
	h.clock.Advance(time.Second)
	young := h.enqueue()

	n, err := h.m.CancelAll(h.ctx, "org-1", "default", cutoff)

	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.ElementsMatch(t, []any{old1, old2}, toAny(h.observe().pendingCancelation))
	h.runMain()
	require.False(t, h.work(young).canceled)
	require.False(t, h.work(other).canceled)
}

func toAny[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func TestRetryBackoff_GrowsByBaseWithJitterInHalfToOneAndAHalf(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(5, 1000, 3))
	for attempt, want := range []time.Duration{time.Second, 3 * time.Second, 9 * time.Second} {
		h.runMain()
		h.complete(id, "failed", attempt+1)
		h.runMain()
		var runAt time.Time
		require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1`, id).Scan(&runAt))
		wait := runAt.Sub(h.clock.Now())
		require.GreaterOrEqual(t, wait, want/2, "attempt %d", attempt+1)
		require.Less(t, wait, want*3/2, "attempt %d", attempt+1)
		h.clock.Advance(wait)
	}
}

func TestParsePools_ReadsNamesAndLimits(t *testing.T) {
	t.Parallel()
	got, err := ParsePools(" default=25, wakeup=3 ")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"default": 25, "wakeup": 3}, got)

	for _, bad := range []string{"default", "default=0", "default=10001", "Bad=1", "a=1,a=2", "x=y"} {
		_, err := ParsePools(bad)
		require.Error(t, err, bad)
	}
}

func TestNew_CreatesMissingPoolsAndKeepsExistingSettings(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(7))
	require.NoError(t, h.m.SetMaxParallelism(h.ctx, "default", 3))

	m2, err := New(h.db, Config{Pools: map[string]int{"default": 50, "extra": 4}, Logger: h.m.logger})
	require.NoError(t, err)

	info, err := m2.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.Equal(t, 3, info.MaxParallelism, "an existing pool keeps its limit")
	info, err = m2.Pool(h.ctx, "org-1", "extra")
	require.NoError(t, err)
	require.Equal(t, 4, info.MaxParallelism)
	_, err = m2.Pool(h.ctx, "org-1", "missing")
	require.ErrorIs(t, err, ErrPoolNotFound)
	requireInvalid(t, m2.SetMaxParallelism(h.ctx, "default", 0), "max_parallelism")
	require.ErrorIs(t, m2.SetMaxParallelism(h.ctx, "missing", 5), ErrPoolNotFound)
}

func TestNew_RejectsBadConfig(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, cfg := range []Config{
		{Pools: map[string]int{"default": 0}},
		{Pools: map[string]int{"Bad Name": 1}},
		{HeartbeatTimeout: time.Second, HeartbeatInterval: 2 * time.Second},
		{RecoveryPeriod: -time.Second},
		{HookTimeout: MaxHookTimeout + time.Second}, // (Postgres refuses a statement timeout past ~24 days)
	} {
		_, err := New(h.db, cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

func TestUpdatePool_AnInvalidFieldLeavesThePoolUnchanged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		u       PoolUpdate
		invalid []string
	}{
		{"valid limit, per-org cap 0", PoolUpdate{MaxParallelism: ptr(9), SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: ptr(0)},
			[]string{"max_parallelism_per_org"}},
		{"valid limit, per-org cap too high", PoolUpdate{MaxParallelism: ptr(9), SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: ptr(MaxParallelismLimit + 1)},
			[]string{"max_parallelism_per_org"}},
		{"invalid limit, valid per-org cap", PoolUpdate{MaxParallelism: ptr(0), SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: ptr(2)},
			[]string{"max_parallelism"}},
		{"both invalid: both named", PoolUpdate{MaxParallelism: ptr(-1), SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: ptr(-1)},
			[]string{"max_parallelism", "max_parallelism_per_org"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(7))
			require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", ptr(3)))

			err := h.m.UpdatePool(h.ctx, "default", tc.u)

			for _, f := range tc.invalid {
				requireInvalid(t, err, f)
			}
			info, err := h.m.Pool(h.ctx, "org-1", "default")
			require.NoError(t, err)
			require.Equal(t, 7, info.MaxParallelism)
			require.Equal(t, ptr(3), info.MaxParallelismPerOrg)
		})
	}
}

func TestUpdatePool_AppliesEveryFieldTogether(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(7))

	require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{MaxParallelism: ptr(9), SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: ptr(2)}))
	info, err := h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.Equal(t, 9, info.MaxParallelism)
	require.Equal(t, ptr(2), info.MaxParallelismPerOrg)

	require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{SetMaxParallelismPerOrg: true}))
	info, err = h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.Equal(t, 9, info.MaxParallelism, "an unset field keeps its value")
	require.Nil(t, info.MaxParallelismPerOrg, "a nil per-org cap removes it")
	require.ErrorIs(t, h.m.UpdatePool(h.ctx, "missing", PoolUpdate{MaxParallelism: ptr(3)}), ErrPoolNotFound)
}

// An enqueue queued in a caller's batch travels with the caller's own
// statements, which can name its items by the ids fixed in advance, and
// commits or rolls back with the caller's transaction.
func TestQueueEnqueue_TravelsWithTheCallersStatementsAndTransaction(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		pool     string
		commit   bool
		readErr  error
		enqueued int // items there afterwards
	}{
		{name: "committed", pool: "default", commit: true, enqueued: 2},
		{name: "rolled back", pool: "default"},
		{name: "an unknown pool", pool: "missing", commit: true, readErr: ErrNotEnqueued},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxPending(1))
			item := EnqueueParams{OrgID: "org-1", Pool: tt.pool, Handler: "test_handle", BypassPendingCap: true}
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			q, err := h.m.QueueEnqueue(b, []EnqueueParams{item, item})
			require.NoError(t, err)
			require.Len(t, q.IDs, 2)
			b.Queue(`SELECT count(*) FROM workpool_work WHERE org_id = 'org-1' AND id = ANY($1)`, q.IDs)
			br := h.db.SendBatch(h.ctx, b)
			tx := br.Tx()
			defer func() { _ = tx.Rollback(h.ctx) }()
			_, err = br.Exec()
			require.NoError(t, err)
			require.ErrorIs(t, q.Read(br), tt.readErr)
			var seen int
			require.NoError(t, br.QueryRow().Scan(&seen))
			require.NoError(t, br.Close())
			if tt.commit {
				require.NoError(t, tx.Commit(h.ctx))
			}

			if tt.readErr == nil {
				require.Equal(t, 2, seen, "the statement after the enqueue sees its items by their ids")
			}
			require.Equal(t, tt.enqueued, h.workCount())
			for _, id := range q.IDs[:tt.enqueued] {
				st, err := h.m.Status(h.ctx, "org-1", id)
				require.NoError(t, err)
				require.Equal(t, StatePending, st.State)
			}
			if tt.enqueued > 0 {
				require.EqualValues(t, 2, h.pendingBound("org-1"), "counted toward the cap, never refused by it")
			}
		})
	}
}

func TestQueueEnqueue_TakesOnlyOwedWorkWithoutKeysAndValidItems(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	owed := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", BypassPendingCap: true}
	keyed, capped, invalid := owed, owed, owed
	keyed.IdempotencyKey = "k"
	capped.BypassPendingCap = false
	invalid.Handler = "nope"
	for name, p := range map[string]EnqueueParams{"keyed": keyed, "capped": capped} {
		_, err := h.m.QueueEnqueue(&pgx.Batch{}, []EnqueueParams{owed, p})
		require.Error(t, err, name)
	}
	_, err := h.m.QueueEnqueue(&pgx.Batch{}, []EnqueueParams{owed, invalid})
	requireInvalid(t, err, "[1].handler")
}

// A second CancelAll while canceled work still runs (its attempt not yet
// reported) requests nothing more: that work's cancelation was processed,
// and counting it again told the caller it had canceled work it had not.
func TestCancelAll_CountsNoRunningWorkAlreadyCanceled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.enqueue()
	h.runMain() // it runs
	h.clock.Advance(time.Second)
	n, err := h.m.CancelAll(h.ctx, "org-1", "default", h.clock.Now())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h.runMain() // the cancelation is processed; the attempt still runs
	require.Empty(t, h.observe().pendingCancelation)

	n, err = h.m.CancelAll(h.ctx, "org-1", "default", h.clock.Now())

	require.NoError(t, err)
	require.Zero(t, n)
	require.Empty(t, h.observe().pendingCancelation)
}
