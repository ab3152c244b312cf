package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workflows"
)

// A signal Temporal accepted whose "delivered" record was lost (Postgres
// went away before it committed) is sent again after its lease; by then its
// workflow, woken by the first send, has completed and answers "workflow
// execution already completed". The workflow's history settles it.
func TestASignalResentToAWorkflowItAlreadyWokeIsDelivered(t *testing.T) {
	s := newStack(t, func(o *stackOptions) { o.notFoundGrace = 10 * time.Minute })
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{"n": 1}))
	require.Equal(t, id, s.wakesOf(run)[0].WakeupID, "the workflow is woken and completes")
	s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })

	// As if the delivered write had never committed: pending and due.
	ctx := context.Background()
	_, err := s.db.Exec(ctx, `UPDATE queue_messages SET status = 'pending', delivered_at = NULL, next_attempt_at = now(), updated_at = now()
		WHERE org_id = $1 AND queue = 'wakeup' AND idempotency_key = $2`, org, id)
	require.NoError(t, err)
	_, err = s.db.Exec(ctx, `SELECT pg_notify('reveille_queue', '')`)
	require.NoError(t, err)

	w := s.eventually(id, "settled again", func(w map[string]any) bool {
		return w["status"] != "pending" && delivery(w)["attempts"].(float64) >= 2
	})
	require.Equal(t, "delivered", w["status"], "the re-send found the workflow closed with the signal in its history: %v", w)
	require.Equal(t, "sent", delivery(w)["state"])
	require.Empty(t, delivery(w)["last_error"])
}

// A workflow that closed without the signal never takes it: the message is
// undeliverable at once, not after the NotFound grace (ten minutes here,
// far beyond the test's wait).
func TestASignalToAWorkflowThatClosedWithoutItIsUndeliverableAtOnce(t *testing.T) {
	s := newStack(t, func(o *stackOptions) { o.notFoundGrace = 10 * time.Minute })
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	other := workflows.Wake{OrgID: org, WakeupID: "another-wakeup", Outcome: "succeeded"}
	require.NoError(t, s.tc.SignalWorkflow(context.Background(), wf, "", "wake", other))
	require.Equal(t, "another-wakeup", s.wakesOf(run)[0].WakeupID, "the workflow completes on another wake")

	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{"n": 1}))
	w := s.eventually(id, "undeliverable", func(w map[string]any) bool { return w["status"] == "failed" })
	require.Equal(t, "undeliverable", delivery(w)["state"])
	require.Contains(t, delivery(w)["last_error"], "workflow closed without this signal")
}
