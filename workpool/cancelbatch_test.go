package workpool

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// cancelAllBesideAnotherOrg runs an iteration, then has org-a enqueue
// three batches' worth of ready work and cancel it all (CancelAll), and
// org-b enqueue one item, whose id it returns.
func (h *harness) cancelAllBesideAnotherOrg(t *testing.T) uuid.UUID {
	t.Helper()
	h.runMain()
	ps := make([]EnqueueParams, 3*cancelationBatch)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: "org-a", Pool: "default", Handler: "test_handle"}
	}
	_, err := h.m.EnqueueMany(h.ctx, ps)
	require.NoError(t, err)
	n, err := h.m.CancelAll(h.ctx, "org-a", "default", h.clock.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, len(ps), n)
	return h.enqueue(withOrg("org-b"))
}

// One org's CancelAll of a backlog fills batch after batch of
// cancelations; each iteration takes one batch and still starts other
// orgs' ready work (SPEC §3: cancelations, then recovery, then starts; the
// reference starts in the same pass, less the work it cancels), never the
// work whose cancelation waits in a later batch.
func TestAFullBatchOfCancelationsDoesNotHoldBackStarts(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		b := h.cancelAllBesideAnotherOrg(t)

		h.runMain()

		o := h.observe()
		require.True(t, o.isRunning(b), "org-b's ready work waits for org-a's cancelations")
		require.Len(t, o.running, 1, "none of org-a's work starts")
		require.Len(t, o.pendingCancelation, 2*cancelationBatch, "one batch taken")
	})
}

// A start beside a full batch of cancelations never starts work whose
// cancelation waits in a later batch, on the plain and the fair start.
func TestAStartBesideAFullBatchOfCancelationsPassesOverWorkBeingCanceled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		orgs int
	}{{"one org (plain start)", 1}, {"several orgs (fair start)", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(1000))
			ps := make([]EnqueueParams, 3*cancelationBatch)
			for i := range ps {
				ps[i] = EnqueueParams{OrgID: fmt.Sprintf("org-%d", i%tc.orgs), Pool: "default", Handler: "test_handle"}
			}
			_, err := h.m.EnqueueMany(h.ctx, ps)
			require.NoError(t, err)
			for o := range tc.orgs {
				_, err := h.m.CancelAll(h.ctx, fmt.Sprintf("org-%d", o), "default", h.clock.Now().Add(time.Minute))
				require.NoError(t, err)
			}
			for range 5 {
				h.runMain()
			}
			o := h.observe()
			require.Empty(t, o.running)
			require.Empty(t, o.pending)
			require.Empty(t, o.pendingCancelation)
		})
	}
}

// With one slot free, the fair pick hands it to the org whose turn comes
// first: the org whose backlog is being canceled, every time, were its
// passed-over pick not charged. It is, so the next iteration's slot goes
// to the other org.
func TestOneFreeSlotBesideAFullBatchOfCancelationsGoesToAnotherOrg(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		b := h.cancelAllBesideAnotherOrg(t)

		h.runMain()
		h.runMain()

		o := h.observe()
		require.True(t, o.isRunning(b), "org-b's ready work waits for org-a's cancelations")
		require.Len(t, o.running, 1)
		require.Len(t, o.pendingCancelation, cancelationBatch, "two batches taken")
	}, withMaxParallelism(1))
}
