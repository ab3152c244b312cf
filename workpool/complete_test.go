package workpool

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// One bad item fails alone: a result Postgres refuses (here JSON with \u0000,
// which jsonb cannot hold — the executor screens for it, so the test reports
// it directly, as a result that slipped past would arrive) fails the batch
// statement; the item is then finished as failed with the error recorded,
// and every other result of the batch is recorded as reported.
func TestComplete_AResultPostgresRefusesFailsItsOwnItemAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		hook bool
		// record the batch as the completer would, or in the caller's
		// transaction as recovery and tests do
		viaCompleter bool
	}{
		{"completer, no hooks (one implicit transaction)", false, true},
		{"completer, with hooks (one explicit transaction)", true, true},
		{"in the caller's transaction", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			hookTable(t, h.db)
			h.m.RegisterHook("count", recordHook)
			var opts []workOpt
			if tc.hook {
				opts = append(opts, withHook("count", `{}`))
			}
			var ids []uuid.UUID
			for range 5 {
				ids = append(ids, h.enqueue(opts...))
			}
			h.runMain()
			bad := ids[2]
			var batch []attemptResult
			for _, id := range ids {
				r := attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, result: json.RawMessage(`{"ok":1}`), hook: tc.hook}
				if id == bad {
					r.result = json.RawMessage(`{"bad":"\u0000"}`)
				}
				batch = append(batch, r)
			}

			if tc.viaCompleter {
				_, err := h.m.recordResults(h.ctx, batch)
				require.NoError(t, err)
			} else {
				require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
					_, err := h.m.completeTx(h.ctx, tx, batch)
					return err
				}))
			}

			for _, id := range ids {
				s := h.status(id)
				require.Equal(t, StateFinished, s.State)
				if id == bad {
					require.Equal(t, OutcomeFailed, s.Outcome)
					require.Contains(t, s.Error, "could not be recorded")
				} else {
					require.Equal(t, OutcomeSucceeded, s.Outcome, "a sibling of the bad item")
					require.JSONEq(t, `{"ok":1}`, string(s.Result))
				}
				if tc.hook {
					n, _ := hookCallsOf(t, h.db, id)
					require.Equal(t, 1, n, "one hook call, the bad item's included")
				}
			}
			require.Empty(t, h.observe().running, "every slot was freed")
		})
	}
}

// A hand-back does not count an attempt, so the attempt number cannot tell
// two runs apart: it must come from the executor that holds the run. A
// repeated hand-back (a batch retried after a commit of unknown outcome),
// arriving after the work was started again elsewhere, changes nothing.
func TestComplete_AHandBackCountsOnlyFromTheExecutorHoldingTheRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	elsewhere := newID()
	h.exec(`UPDATE workpool_work SET claimed_by = $2 WHERE id = $1`, id, elsewhere)
	handBack := attemptResult{id: id, pool: "default", attempt: 1, kind: kindHandBack, err: "interrupted"}
	complete := func() []finishedRow {
		var done []finishedRow
		require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
			var err error
			done, err = h.m.completeTx(h.ctx, tx, []attemptResult{handBack})
			return err
		}))
		return done
	}

	require.Empty(t, complete(), "another executor's run is not this executor's to hand back")
	require.Equal(t, "running", h.work(id).state)

	h.exec(`UPDATE workpool_work SET claimed_by = $2 WHERE id = $1`, id, h.m.exec.id)
	require.Len(t, complete(), 1)
	w := h.work(id)
	require.Equal(t, "pending", w.state, "handed back")
	require.Equal(t, 0, w.attempts, "uncounted")
}

// Cancelations go before starts: an iteration that took a full batch of
// cancelations starts nothing, so that it never starts work whose
// cancelation is already committed and waits in the next batch.
func TestIteration_StartsNothingWhileCancelationsRemain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(5))
	for range cancelationBatch + 50 {
		h.enqueue()
	}
	n, err := h.m.CancelAll(h.ctx, "org-1", "default", h.clock.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, cancelationBatch+50, n)

	h.runMain()

	require.Empty(t, h.observe().running, "nothing started with cancelations left")
	h.runMain()
	o := h.observe()
	require.Empty(t, o.running)
	require.Empty(t, o.pending)
	require.Empty(t, o.pendingCancelation)
}
