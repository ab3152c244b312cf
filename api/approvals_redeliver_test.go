package api

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// giveUpOn marks a tool approval's decision signal undeliverable, as the
// dispatcher does once its workflow is not found past the grace period.
func (f approvalsFixture) giveUpOn(t *testing.T, id string) {
	t.Helper()
	tag, err := f.db.Exec(context.Background(), `UPDATE queue_messages SET status = 'failed', last_error = 'workflow not found'
		WHERE queue = 'tool_approval' AND idempotency_key = $1`, id)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func listedIDs(t *testing.T, r response) []string {
	t.Helper()
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var ids []string
	for _, it := range r.JSON(t)["items"].([]any) {
		ids = append(ids, it.(map[string]any)["id"].(string))
	}
	return ids
}

// The runbook's undeliverable signals include tool approvals' decisions
// (reveille_signal_outbox_messages counts every queue): an admin lists
// them by their delivery and queues each again, as for a wake-up.
func TestAnUndeliverableToolApprovalDecisionIsListedAndRedeliveredByAnAdmin(t *testing.T) {
	f := newApprovalsFixture(t)
	call := func(session, wf string) string {
		body := map[string]any{"agent_id": "a1", "tool_name": "shell"}
		if wf != "" {
			body["workflow_id"] = wf
		}
		return f.toolCall(t, f.agent, session, body)["approval_id"].(string)
	}
	answer := func(session, id string) {
		r := do(t, f.h, http.MethodPost, "/v1/sessions/"+session+"/tool-approvals", f.alice, map[string]any{"approval_id": id, "decision": "approved"})
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	}
	lost, sent, waiting, noWorkflow := call("s1", "org-a/wf-1"), call("s2", "org-a/wf-2"), call("s3", "org-a/wf-3"), call("s4", "")
	answer("s1", lost)
	answer("s2", sent)
	answer("s4", noWorkflow)
	f.giveUpOn(t, lost)
	_, err := f.db.Exec(context.Background(), `UPDATE queue_messages SET status = 'delivered', delivered_at = now() WHERE idempotency_key = $1`, sent)
	require.NoError(t, err)

	for delivery, want := range map[string][]string{
		"undeliverable": {lost}, "sent": {sent}, "waiting": {waiting}, "queued": nil,
	} {
		require.Equal(t, want, listedIDs(t, do(t, f.h, http.MethodGet, "/v1/tool-approvals?delivery="+delivery, f.alice, nil)), delivery)
	}

	r := do(t, f.h, http.MethodPost, "/v1/tool-approvals/"+lost+"/redeliver", f.admin, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, "queued", r.JSON(t)["delivery"].(map[string]any)["state"])
	require.Equal(t, []string{lost}, listedIDs(t, do(t, f.h, http.MethodGet, "/v1/tool-approvals?delivery=queued", f.alice, nil)))
	require.Empty(t, listedIDs(t, do(t, f.h, http.MethodGet, "/v1/tool-approvals?delivery=undeliverable", f.alice, nil)))
}

func TestRedeliveringAToolApprovalRefusesWhatIsNotUndeliverable(t *testing.T) {
	f := newApprovalsFixture(t)
	lost := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "a1", "tool_name": "shell", "workflow_id": "org-a/wf-1"})["approval_id"].(string)
	pending := f.toolCall(t, f.agent, "s2", map[string]any{"agent_id": "a1", "tool_name": "shell", "workflow_id": "org-a/wf-2"})["approval_id"].(string)
	r := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice, map[string]any{"approval_id": lost, "decision": "denied"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	// queued, not given up on
	do(t, f.h, http.MethodPost, "/v1/tool-approvals/"+lost+"/redeliver", f.admin, nil).requireProblem(t, http.StatusConflict)
	f.giveUpOn(t, lost)
	for name, tc := range map[string]struct {
		tok, id string
		status  int
	}{
		"a call still pending has no signal to redeliver": {f.admin, pending, http.StatusConflict},
		"an approver is not an admin":                     {f.alice, lost, http.StatusForbidden},
		"another org's approval is absent":                {f.otherOrgApprover, lost, http.StatusNotFound},
		"another agent's, to a bound token, is absent":    {f.boundAgent1, lost, http.StatusNotFound},
		"an unknown id is absent":                         {f.admin, "0190f0f0-0000-7000-8000-000000000000", http.StatusNotFound},
		"an id that is not one":                           {f.admin, "nope", http.StatusNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			do(t, f.h, http.MethodPost, "/v1/tool-approvals/"+tc.id+"/redeliver", tc.tok, nil).requireProblem(t, tc.status)
		})
	}
	var status string
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT status FROM queue_messages WHERE idempotency_key = $1`, lost).Scan(&status))
	require.Equal(t, "failed", status, "a refused redeliver changed nothing")
	r = do(t, f.h, http.MethodPost, "/v1/tool-approvals/"+lost+"/redeliver", f.admin, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
}

func TestAToolApprovalListRefusesAnUnknownDelivery(t *testing.T) {
	f := newApprovalsFixture(t)
	do(t, f.h, http.MethodGet, "/v1/tool-approvals?delivery=lost", f.alice, nil).requireProblem(t, http.StatusBadRequest, "delivery")
}
