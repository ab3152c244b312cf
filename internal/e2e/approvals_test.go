package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
)

type awaitApprovalsInput struct {
	ApprovalIDs []string
	Timeout     time.Duration
}

// awaitApprovals is a test workflow: it awaits the decision on each of
// ApprovalIDs in turn (with dedupe) on the default signal and returns them.
func awaitApprovals(ctx workflow.Context, in awaitApprovalsInput) ([]workflows.Decision, error) {
	ctx = workflows.WithWakeDedupe(ctx)
	var out []workflows.Decision
	for _, id := range in.ApprovalIDs {
		d, err := workflows.AwaitApproval(ctx, "", id, in.Timeout)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// parkOnApprovals starts awaitApprovals as workflow id.
func (s *stack) parkOnApprovals(id string, ids ...string) client.WorkflowRun {
	s.t.Helper()
	run, err := s.tc.ExecuteWorkflow(context.Background(), clientOptions(s, id), "awaitApprovals", awaitApprovalsInput{ApprovalIDs: ids, Timeout: wait})
	require.NoError(s.t, err)
	return run
}

func (s *stack) decisionsOf(run client.WorkflowRun) []workflows.Decision {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var out []workflows.Decision
	require.NoError(s.t, run.Get(ctx, &out))
	return out
}

// askTool posts a tool call for the test agent in session (naming workflow
// wf when set) and returns the answer.
func (s *stack) askTool(session, tool, wf string, extra map[string]any) map[string]any {
	s.t.Helper()
	body := map[string]any{"agent_id": agent, "tool_name": tool}
	if wf != "" {
		body["workflow_id"] = wf
	}
	for k, v := range extra {
		body[k] = v
	}
	r := s.call(http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/tool-calls", token(s.t, org, "agent"), body)
	require.Equal(s.t, http.StatusOK, r.status, string(r.raw))
	return r.body
}

func (s *stack) answerTool(session string, body map[string]any) {
	s.t.Helper()
	r := s.call(http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/tool-approvals", token(s.t, org, "approver"), body)
	require.Equal(s.t, http.StatusOK, r.status, string(r.raw))
}

func (s *stack) toolApproval(id string) map[string]any {
	s.t.Helper()
	r := s.call(http.MethodGet, "/v1/tool-approvals/"+id, token(s.t, org, "approver"), nil)
	require.Equal(s.t, http.StatusOK, r.status, string(r.raw))
	return r.body
}

func TestAWorkflowParkedOnAwaitApprovalWakesWithTheHumansDecision(t *testing.T) {
	s := newStack(t)
	wf := s.workflowID()
	id := s.askTool("s1", "shell", wf, map[string]any{"input": map[string]any{"cmd": "rm -rf /tmp/x"}})["approval_id"].(string)
	run := s.parkOnApprovals(wf, id)

	s.answerTool("s1", map[string]any{"tool_name": "shell", "decision": "approved", "note": "ok"})
	require.Equal(t, []workflows.Decision{{OrgID: org, ApprovalID: id, ToolName: "shell", Decision: "approved", Source: "human", Reason: "ok"}}, s.decisionsOf(run))
	require.True(t, assertEventually(func() bool {
		d, _ := s.toolApproval(id)["delivery"].(map[string]any)
		return d["state"] == "sent"
	}), "the approval shows its signal delivered")
}

func TestAwaitApprovalIgnoresRepeatsOtherApprovalsAndOtherOrgs(t *testing.T) {
	s := newStack(t)
	wf := s.workflowID()
	run := s.parkOnApprovals(wf, "a1", "a2")
	ctx := context.Background()
	for _, sig := range []any{
		workflows.Decision{OrgID: org, ApprovalID: "a1", ToolName: "shell", Decision: "approved"},
		workflows.Decision{OrgID: org, ApprovalID: "a1", ToolName: "shell", Decision: "approved"}, // a repeated delivery
		workflows.Decision{OrgID: org, ApprovalID: "a9", ToolName: "shell", Decision: "approved"}, // another approval's
		workflows.Decision{OrgID: otherOrg, ApprovalID: "a2", ToolName: "shell", Decision: "approved"},
		"not a decision",
		workflows.Decision{OrgID: org, ApprovalID: "a2", ToolName: "shell", Decision: "denied"},
	} {
		require.NoError(t, s.tc.SignalWorkflow(ctx, wf, "", workflows.ApprovalSignal, sig))
	}
	got := s.decisionsOf(run)
	require.Len(t, got, 2)
	require.Equal(t, workflows.Decision{OrgID: org, ApprovalID: "a1", ToolName: "shell", Decision: "approved"}, got[0])
	require.Equal(t, workflows.Decision{OrgID: org, ApprovalID: "a2", ToolName: "shell", Decision: "denied"}, got[1])
}

func TestAnExpiredToolCallWakesItsWorkflowWithADenial(t *testing.T) {
	s := newStack(t)
	wf := s.workflowID()
	id := s.askTool("s1", "shell", wf, map[string]any{"expires_in_s": 10})["approval_id"].(string)
	run := s.parkOnApprovals(wf, id)
	// The clock moved on: the request is due (the sweeper runs every 50 ms).
	_, err := s.db.Exec(context.Background(), `UPDATE tool_approvals SET expires_at = now() WHERE id = $1`, id)
	require.NoError(t, err)
	require.Equal(t, []workflows.Decision{{OrgID: org, ApprovalID: id, ToolName: "shell", Decision: "denied", Source: "expired", Reason: "expired"}}, s.decisionsOf(run))
	a := s.toolApproval(id)
	require.Equal(t, "expired", a["status"])
	require.Equal(t, "expired", a["source"])
}

func TestReferenceWorkflowAsksForItsToolCallBeforeItsWakeUp(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	in := reference.Input{AgentID: agent, Signal: "wake", Scope: scope, Reason: "deploy", Cost: 1,
		Work: wakeupWork("echo", `{"deployed":true}`), Timeout: wait,
		Tool: &reference.ToolStep{ToolName: "deploy", Input: json.RawMessage(`{"env":"staging"}`), Timeout: wait}}
	start := func() (string, client.WorkflowRun) {
		wf := s.workflowID()
		run, err := s.tc.ExecuteWorkflow(context.Background(), clientOptions(s, wf), reference.WorkflowName, in)
		require.NoError(t, err)
		return wf, run
	}
	result := func(run client.WorkflowRun) reference.Result {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		var res reference.Result
		require.NoError(t, run.Get(ctx, &res))
		return res
	}
	pendingIn := func(session string) string {
		var id string
		require.True(t, assertEventually(func() bool {
			r := s.call(http.MethodGet, "/v1/tool-approvals?status=pending&session_id="+url.QueryEscape(session), token(t, org, "approver"), nil)
			items, _ := r.body["items"].([]any)
			if len(items) == 1 {
				id = items[0].(map[string]any)["id"].(string)
			}
			return id != ""
		}), "the workflow's tool call reaches the inbox")
		return id
	}

	t.Run("approved by a human, then its wake-up runs", func(t *testing.T) {
		wf, run := start()
		id := pendingIn(wf)
		s.answerTool(wf, map[string]any{"approval_id": id, "decision": "approved"})
		res := result(run)
		require.Equal(t, &reference.ToolResult{ApprovalID: id, Decision: "approved", Source: "human"}, res.Tool)
		require.Equal(t, "succeeded", res.Outcome)
		require.JSONEq(t, `{"deployed":true}`, string(res.Wake.Result))
	})
	t.Run("denied by a human, it ends denied without a wake-up", func(t *testing.T) {
		wf, run := start()
		id := pendingIn(wf)
		s.answerTool(wf, map[string]any{"tool_name": "deploy", "decision": "denied"})
		res := result(run)
		require.Equal(t, &reference.ToolResult{ApprovalID: id, Decision: "denied", Source: "human"}, res.Tool)
		require.Equal(t, "denied", res.Outcome)
		require.Empty(t, res.WakeupID)
	})
	t.Run("a standing policy answers without a human", func(t *testing.T) {
		r := s.call(http.MethodPut, "/v1/agents/"+agent+"/tool-policies/deploy", token(t, org, "admin"), map[string]any{"approval": "always", "match": map[string]any{"env": "staging"}})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		_, run := start()
		res := result(run)
		require.Equal(t, "approved", res.Tool.Decision)
		require.Equal(t, "policy", res.Tool.Source)
		require.Equal(t, "succeeded", res.Outcome)
	})
	spent, _ := s.spent()
	require.EqualValues(t, 2, spent, "only the approved calls' wake-ups spent")
}
