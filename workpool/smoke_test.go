package workpool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWorkMovesFromPendingThroughRunningToFinished(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	require.Equal(t, StatePending, h.status(id).State)

	h.runMain()
	require.Equal(t, StateRunning, h.status(id).State)

	h.complete(id, "success", 1)
	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeSucceeded, s.Outcome)
	require.Equal(t, 1, s.Attempts)
	require.False(t, h.observe().isRunning(id), "recording the attempt freed its slot")
}
