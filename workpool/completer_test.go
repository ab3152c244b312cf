package workpool

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// TestCompleter_HoldsABatchsKickUntilTheNextQueuedBatchCommits pins when
// the completer wakes the loops to fill the slots a batch freed: at once
// for a batch with nothing queued behind it, with the next batch when one
// is queued, and never more than one batch late. (The results are of work
// that does not exist: the statement records nothing, which is all the
// same to the kicks.)
func TestCompleter_HoldsABatchsKickUntilTheNextQueuedBatchCommits(t *testing.T) {
	for _, tc := range []struct {
		name string
		// queuedBehind[i]: the pool of a result that arrives while batch
		// i is being recorded ("": none)
		queuedBehind []string
		want         [][]string
	}{
		{"a lone result kicks at once", nil, [][]string{{"a"}}},
		{"a batch with the next queued behind it kicks with that one", []string{"b"}, [][]string{{"a", "b"}}},
		{"a kick is never more than one batch late", []string{"b", "c"}, [][]string{{"a", "b"}, {"c"}}},
		{"the batch after a late kick may hold its own", []string{"b", "c", "d"}, [][]string{{"a", "b"}, {"c", "d"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			var (
				c       *completer
				batches int
				kicks   [][]string
			)
			c = newCompleter(h.m, func([]attemptResult) {
				if batches < len(tc.queuedBehind) && tc.queuedBehind[batches] != "" {
					c.add(resultIn(tc.queuedBehind[batches]))
				}
				batches++
			}, func() bool { return false })
			c.kickLoops = recordKicks(&kicks)

			c.add(resultIn("a"))
			require.NoError(t, c.drain(h.ctx))
			require.Equal(t, tc.want, kicks)
			require.Equal(t, len(tc.queuedBehind)+1, batches, "one batch per result: each arrived while the one before was recorded")
		})
	}
}

// TestCompleter_AResultAfterTheLastFlushKicksAtOnce: a result recorded on
// the spot after the stop's last flush wakes its loop itself.
func TestCompleter_AResultAfterTheLastFlushKicksAtOnce(t *testing.T) {
	h := newHarness(t)
	c := newCompleter(h.m, func([]attemptResult) {}, func() bool { return false })
	var kicks [][]string
	c.kickLoops = recordKicks(&kicks)
	c.flushed = true
	c.add(resultIn("a"))
	require.Equal(t, [][]string{{"a"}}, kicks)
}

// TestCompleter_AHeldKickGoesOutWhenTheNextBatchCannotCommit: a kick held
// for the next batch does not wait for that batch when it cannot commit —
// the database went away (the kick goes before the first retry: the slots
// must not wait for the database to come back), the drain's context ended
// (a stop out of time: the kick goes under a bound of its own) — unless
// the process crashed.
func TestCompleter_AHeldKickGoesOutWhenTheNextBatchCannotCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// afterFirst runs once the first batch committed, with the
		// drain's cancel and the completer's database
		afterFirst func(cancel context.CancelFunc, db *pgxpool.Pool, crash *atomic.Bool)
		want       [][]string
	}{
		{"the database goes away", func(_ context.CancelFunc, db *pgxpool.Pool, _ *atomic.Bool) { db.Close() }, [][]string{{"a"}}},
		{"the drain's context ends", func(cancel context.CancelFunc, _ *pgxpool.Pool, _ *atomic.Bool) { cancel() }, [][]string{{"a"}}},
		{"the process crashes", func(_ context.CancelFunc, _ *pgxpool.Pool, crash *atomic.Bool) { crash.Store(true) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			// the completer's own pool, which the test may close
			db, err := pgxpool.New(h.ctx, h.db.Config().ConnString())
			require.NoError(t, err)
			t.Cleanup(db.Close)
			m, err := New(db, Config{Pools: map[string]int{"default": 10}, Logger: testkit.Logger(t)})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			var (
				c       *completer
				crashed atomic.Bool
				mu      sync.Mutex
				kicks   [][]string
			)
			c = newCompleter(m, func(batch []attemptResult) {
				if batch[0].pool == "a" {
					c.add(resultIn("b"))
					tc.afterFirst(cancel, db, &crashed)
				}
			}, crashed.Load)
			kicked := make(chan struct{}, 1)
			c.kickLoops = func(kctx context.Context, pools map[string]bool) {
				assert.NoError(t, kctx.Err(), "a kick goes out under a live context")
				mu.Lock()
				kicks = append(kicks, slices.Sorted(maps.Keys(pools)))
				mu.Unlock()
				kicked <- struct{}{}
			}

			c.add(resultIn("a"))
			done := make(chan error, 1)
			go func() { done <- c.drain(ctx) }()
			if tc.want != nil {
				select {
				case <-kicked:
				case <-time.After(testWait):
					t.Fatal("the held kick never went out")
				}
				cancel() // (the database that went away is retried until the drain's context ends)
			}
			require.Error(t, <-done, "the second batch is never recorded")
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, tc.want, kicks)
		})
	}
}

// TestCompleter_ACompletionWakesTheLoopToStartTheWorkWaitingForItsSlot: in
// a pool of one slot, the second item starts once the first one's result
// is recorded, the loop woken by the completer — its own timers (the
// cooldown's end, the recovery period) are an hour away, and nothing else
// is enqueued.
func TestCompleter_ACompletionWakesTheLoopToStartTheWorkWaitingForItsSlot(t *testing.T) {
	db := testkit.NewPool(t)
	m, err := New(db, liveConfig(t, Config{Pools: map[string]int{"default": 1}, Cooldown: time.Hour, RecoveryPeriod: time.Hour}))
	require.NoError(t, err)
	release := make(chan struct{})
	var ran atomic.Int32
	m.Register("gate", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		if ran.Add(1) == 1 {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, nil
	})
	for range 2 {
		_, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org", Pool: "default", Handler: "gate"})
		require.NoError(t, err)
	}
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(ctx)
	})
	require.Eventually(t, func() bool { return ran.Load() == 1 }, testWait, testTick, "the first item never started")
	close(release)
	require.Eventually(t, func() bool { return ran.Load() == 2 }, testWait, testTick, "the second item never started: nothing woke the loop")
}

// recordKicks is a completer's kickLoops that appends each kick's pools,
// sorted, to kicks (for a drain on the test's goroutine).
func recordKicks(kicks *[][]string) func(context.Context, map[string]bool) {
	return func(_ context.Context, pools map[string]bool) {
		*kicks = append(*kicks, slices.Sorted(maps.Keys(pools)))
	}
}

// resultIn is a success of an attempt of work that does not exist, in pool.
func resultIn(pool string) attemptResult {
	return attemptResult{id: uuid.New(), pool: pool, attempt: 1, kind: kindSucceeded}
}
