package workpool

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
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

// Work that fails for good is one info line naming it, its org, handler,
// attempts and error — the line an operator finds a failure by; a failed
// attempt that is retried is not.
func TestWorkThatFailsForGoodIsALogLineNamingIt(t *testing.T) {
	t.Parallel()
	var logs testkit.LogBuffer
	h := newHarness(t, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	retried := h.enqueue(withRetry(2, 1, 1))
	final := h.enqueue(withOrg("org-f"))
	h.runMain()
	h.complete(retried, "failed", 1)
	h.complete(final, "final", 1)

	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(logs.String())), []byte("\n")) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(l, &rec))
		if rec["msg"] == "work failed for good" {
			lines = append(lines, rec)
		}
	}
	require.Len(t, lines, 1, logs.String())
	require.Equal(t, final.String(), lines[0]["work_id"])
	require.Equal(t, "org-f", lines[0]["org_id"])
	require.Equal(t, "test_handle", lines[0]["handler"])
	require.Equal(t, "boom", lines[0]["error"])
	require.Equal(t, "INFO", lines[0]["level"])
}

// Work handed back at a stop is one info line naming it: a drain's log
// says what it left for other replicas.
func TestWorkHandedBackAtStopIsALogLineNamingIt(t *testing.T) {
	t.Parallel()
	var logs testkit.LogBuffer
	h := newHarness(t, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	id := h.enqueue()
	h.runMain()
	h.claimAll()
	err := pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		done, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: id, pool: "default", attempt: 1, kind: kindHandBack, err: "interrupted"}})
		h.m.countRecorded(done)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, StatePending, h.status(id).State)
	require.Contains(t, logs.String(), `"msg":"handed work back at stop`)
	require.Contains(t, logs.String(), id.String())
}
