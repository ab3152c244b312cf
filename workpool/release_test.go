package workpool

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func (h *harness) release(id uuid.UUID, kind string, attempt int) {
	h.t.Helper()
	r := attemptResult{id: id, pool: "default", attempt: attempt, retryable: true, succeeded: kind == "success"}
	if kind == "final" {
		r.retryable = false
	}
	require.NoError(h.t, h.m.releaseSlots(h.ctx, []attemptResult{r}))
}

func (h *harness) completions(id uuid.UUID) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM workpool_completions WHERE work_id = $1`, id).Scan(&n))
	return n
}

// The slot of an attempt whose handler returned is handed back before its
// result is recorded: the next work starts while the first still finishes.
func TestRelease_AReturnedHandlersSlotIsRefilledBeforeItsResultIsRecorded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	first, second := h.enqueue(), h.enqueue()
	h.runMain()
	require.Equal(t, []uuid.UUID{first}, h.observe().running)

	h.release(first, "success", 1)
	require.Equal(t, StateRunning, h.status(first).State, "not finished until recorded")
	require.NotNil(t, h.observe().completionOf(first), "the slot goes back through a pending completion")
	h.runMain()

	o := h.observe()
	require.Equal(t, []uuid.UUID{second}, o.running, "still one slot in use")
	h.complete(first, "success", 1)
	require.Equal(t, OutcomeSucceeded, h.status(first).Outcome)
	require.Zero(t, h.completions(first), "recording the result frees no slot twice")
	require.Equal(t, []uuid.UUID{second}, h.observe().running)
}

func TestRelease_AnAttemptThatWillBeRetriedKeepsItsSlotUntilRecorded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	id := h.enqueue(withRetry(3, 10, 2))
	h.enqueue()
	h.runMain()

	h.release(id, "failed", 1)

	require.Zero(t, h.completions(id))
	h.runMain()
	require.Equal(t, []uuid.UUID{id}, h.observe().running, "nothing else started")
	h.complete(id, "failed", 1)
	require.True(t, h.observe().completionOf(id).retry)
}

func TestRelease_IsIdempotentAndIgnoresStaleAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()

	h.release(id, "success", 1)
	h.release(id, "success", 1)
	h.release(id, "success", 7)

	require.Equal(t, 1, h.completions(id))
}

// An executor that dies after releasing a slot and before recording the
// result: the attempt is recovered as failed, its hook fires once, and the
// pool's slot count stays right.
func TestRelease_AnAttemptReleasedButNeverRecordedIsRecovered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	var calls int
	h.m.RegisterHook("count", func(context.Context, pgx.Tx, Completion) error { calls++; return nil })
	id := h.enqueue(withHook("count", `{}`))
	next := h.enqueue()
	h.runMain()
	h.claimAll()
	h.release(id, "success", 1)
	h.runMain() // the released slot goes to the next item
	h.pastRecovery()
	h.exec(`UPDATE workpool_work SET heartbeat_at = $2 WHERE id = $1`, next, h.clock.Now())

	h.runMain() // recovery: the first attempt's result is lost with its executor

	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeFailed, s.Outcome)
	require.Contains(t, s.Error, "stopped heartbeating")
	require.Equal(t, 1, calls)
	h.runMain()
	require.Equal(t, []uuid.UUID{next}, h.observe().running, "the slot count is back to the one running item")
}

// An attempt released as final whose result is then lost (its executor
// died before recording it) is recovered as a retryable failure: with
// attempts left it is retried, not left waiting for a retry nobody
// schedules.
func TestRelease_AReleasedAttemptRecoveredAsARetryableFailureIsRetried(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	id := h.enqueue(withRetry(3, 0, 2))
	h.runMain()
	h.claimAll()
	h.release(id, "success", 1)
	h.pastRecovery()

	h.runMain() // recovery: the attempt's result is lost with its executor
	h.runMain() // its retry is scheduled, and started

	var state string
	var attempts int
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT state, attempts FROM workpool_work WHERE id = $1`, id).Scan(&state, &attempts))
	require.Equal(t, "running", state, "retried")
	require.Equal(t, 1, attempts)
	require.Equal(t, []uuid.UUID{id}, h.observe().running, "holding its slot again")
	require.Zero(t, h.completions(id))
}

// Once a term ends, the loop takes no more releases (the executor's
// release stage frees those slots) and hands back every one it queued.
func TestRelease_AtTheEndOfATermQueuedReleasesAreHandedBackAndNewOnesRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.l.leading.Store(true)
	queued := attemptResult{id: newID(), pool: "default", attempt: 1, succeeded: true}
	require.True(t, h.l.release(queued))

	require.Equal(t, []attemptResult{queued}, h.l.stopReleases())
	require.False(t, h.l.release(attemptResult{id: newID(), pool: "default", attempt: 1}))
	require.Empty(t, h.l.takeReleases())
}

func TestRelease_ExecutorsReleaseBeforeRecording(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 1}})
	hookTable(t, db)
	release := make(chan struct{})
	released := make(chan uuid.UUID, 1)
	// The hook of the first item blocks its recording; the second item can
	// only start if the first's slot came back before that.
	m.RegisterHook("slow", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		released <- c.WorkID
		<-release
		return recordHook(ctx, tx, c)
	})
	first, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		OnComplete: &OnComplete{Hook: "slow"}})
	require.NoError(t, err)
	require.Equal(t, first, <-released)
	ran := make(chan struct{})
	m.Register("second", func(context.Context, Job) (json.RawMessage, error) { close(ran); return nil, nil })
	second, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "second"})
	require.NoError(t, err)

	<-ran
	require.Equal(t, StateRunning, requireState(t, m, first), "the first is still being recorded")
	close(release)
	requireFinished(t, m, "org-1", first, OutcomeSucceeded)
	requireFinished(t, m, "org-1", second, OutcomeSucceeded)
	n, _ := hookCallsOf(t, db, first)
	require.Equal(t, 1, n)
}

func requireState(t *testing.T, m *Manager, id uuid.UUID) State {
	t.Helper()
	s, err := m.Status(context.Background(), "org-1", id)
	require.NoError(t, err)
	return s.State
}
