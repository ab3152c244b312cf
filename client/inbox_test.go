package client_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A client lists the approvals, then follows the events from the list's
// EventsSeq: it sees what comes after, with the approval object.
func TestApprovalEventsFollowFromTheListsEventsSeq(t *testing.T) {
	e := startEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	asAgent, asApprover := newClient(t, e.url, agent, nil), newClient(t, e.url, approver, nil)

	_, err := asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: "agent-1", Scope: "llm", Cost: 3})
	require.True(t, client.IsSpendRefused(err), "%v", err)
	page, err := asApprover.MandateApprovals.ListPage(ctx, client.MandateApprovalListParams{})
	require.NoError(t, err)
	require.EqualValues(t, 1, page.EventsSeq)
	require.Len(t, page.Items, 1)
	require.Equal(t, "runtime", page.Items[0].RequestedBy)
	require.Nil(t, page.Items[0].Budget, "no mandate")

	ans, err := asAgent.ToolApprovals.Request(ctx, "s1", client.ToolCallRequest{AgentID: "agent-1", ToolName: "shell"})
	require.NoError(t, err)
	for ev, err := range asApprover.Approvals.Events(ctx, client.ApprovalEventsParams{After: &page.EventsSeq}) {
		require.NoError(t, err)
		require.EqualValues(t, 2, ev.Seq)
		require.Equal(t, client.ApprovalRequested, ev.Type)
		require.Equal(t, "tool_call", ev.Kind)
		require.Equal(t, ans.ApprovalID, ev.ApprovalID)
		var ta client.ToolApproval
		require.NoError(t, json.Unmarshal(ev.Approval, &ta))
		require.Equal(t, "pending", ta.Status)
		break
	}
}
