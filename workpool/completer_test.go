package workpool

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestCompleter_KicksTheLoopsOfABatchWithTheNextOneQueuedBehindIt pins when
// the completer wakes the loops to fill the slots a batch freed: at once
// for a batch with nothing queued behind it, with the next batch when one
// is queued, and never more than one batch late. (The results are of work
// that does not exist: the statement records nothing, which is all the
// same to the kicks.)
func TestCompleter_KicksTheLoopsOfABatchWithTheNextOneQueuedBehindIt(t *testing.T) {
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
			c.kickLoops = func(_ context.Context, pools map[string]bool) {
				kicks = append(kicks, slices.Sorted(maps.Keys(pools)))
			}

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
	c.kickLoops = func(_ context.Context, pools map[string]bool) {
		kicks = append(kicks, slices.Sorted(maps.Keys(pools)))
	}
	c.flushed = true
	c.add(resultIn("a"))
	require.Equal(t, [][]string{{"a"}}, kicks)
}

// resultIn is a success of an attempt of work that does not exist, in pool.
func resultIn(pool string) attemptResult {
	return attemptResult{id: uuid.New(), pool: pool, attempt: 1, kind: kindSucceeded}
}
