package workpool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lockWaitHook is a stuck hook that honours its context: while its call's
// context lasts it tries again a statement that waits on a row lock the
// test holds (each try ended by the server at the hook statement timeout,
// HookTimeout, in a nested transaction it rolls back). Its last try, begun
// before the call's context ended, runs to its statement timeout (hookTx:
// "one begun in time runs to its end"), so the call lasts about
// 2 × HookTimeout, and fails with errHookTimeout — which docs/workpool.md
// promises fails the call alone: "rolled back to the savepoint, retried with
// the hook backoff — and the completion commits".
func lockWaitHook(calls *atomic.Int64) Hook {
	return func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		var err error
		for ctx.Err() == nil {
			err = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT 1 FROM stuck_hook_lock WHERE id = 1 FOR UPDATE`)
				return err
			})
		}
		return err
	}
}

func (h *harness) holdStuckHookLock() {
	h.t.Helper()
	h.exec(`CREATE TABLE stuck_hook_lock (id int PRIMARY KEY)`)
	h.exec(`INSERT INTO stuck_hook_lock VALUES (1)`)
	lock, err := h.db.Begin(h.ctx)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM stuck_hook_lock WHERE id = 1 FOR UPDATE`)
	require.NoError(h.t, err)
}

// A record of results whose hooks are stuck takes as long as their calls
// do (each up to 2 × HookTimeout + 1 s), far past StatementTimeout: each
// call fails alone and the batch commits. A deadline on the record as a
// whole cut it mid-statement, and the retry was cut at the same place, the
// same hooks called again, for good.
func TestARecordWhoseStuckHooksFailAloneCommitsPastTheStatementTimeout(t *testing.T) {
	const hookTimeout = 3 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	var calls atomic.Int64
	h.m.RegisterHook("stuck", lockWaitHook(&calls))
	var batch []attemptResult
	for range 2 {
		id := h.enqueue(withHook("stuck", `{}`))
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
	}
	h.runMain()
	h.holdStuckHookLock()

	ctx, cancel := context.WithTimeout(h.ctx, 40*time.Second)
	defer cancel()
	err := h.m.exec.completer.record(ctx, batch, nil)

	require.NoError(t, err, "the stuck hooks fail alone and the batch commits")
	for _, r := range batch {
		w := h.work(r.id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "retry", *w.hook)
	}
}

// The hooks of canceled pending work run in the loop's iteration. The
// first call takes 0.9 × HookTimeout; the second begins within the hook
// budget and is stuck (it fails after about 2 × HookTimeout): the
// iteration commits. A deadline on the iteration as a whole cut it there,
// and every next iteration the same way — nothing of the pool started.
func TestAnIterationWhoseLastHookCallIsStuckCommitsPastTheStatementTimeout(t *testing.T) {
	const hookTimeout = 5 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	var calls, stuckCalls atomic.Int64
	stuck := lockWaitHook(&stuckCalls)
	h.m.RegisterHook("h", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(hookTimeout * 9 / 10):
				return nil
			}
		}
		return stuck(ctx, tx, c)
	})
	ids := h.canceledWithHook("h", 2)
	h.holdStuckHookLock()

	_, err := h.l.iterateFull(h.ctx)

	require.NoError(t, err, "the stuck call fails alone; the iteration commits")
	for _, id := range ids {
		require.Equal(t, "finished", h.work(id).state)
	}
}
