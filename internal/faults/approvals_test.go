//go:build faults

package faults

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"

	"github.com/reveille/reveille/client"
)

// Tool approvals under the same kills: humans answer half the pending
// calls while the replica they answer through is killed, and both replicas
// are killed around the moment the other half expires, then restarted; the
// sweeper of whichever replica leads then expires them. Every request ends
// decided once — one resolution event — and its workflow is woken with
// that decision.
func TestToolApprovalsAreDecidedOnceUnderKills(t *testing.T) {
	e := newEnv(t)
	clients := []*client.Client{e.client(0), e.client(1)}
	approvers := []*client.Client{e.clientAs(0, "approver"), e.clientAs(1, "approver")}
	ctx := context.Background()
	const session = "session-1"
	const n = 8
	expiresIn := int64(10) // the least a request may ask for
	type call struct {
		id, workflowID string
		run            tclient.WorkflowRun
		human          bool
	}
	calls := make([]call, n)
	requested := time.Now()
	for i := range calls {
		c := &calls[i]
		c.human = i%2 == 0
		c.workflowID = org + "/wf-" + uuid.NewString()
		req := client.ToolCallRequest{AgentID: agent, ToolName: "deploy", Input: map[string]any{"i": i}, WorkflowID: c.workflowID}
		if !c.human {
			req.ExpiresInS = &expiresIn
		}
		ans, err := clients[i%2].ToolApprovals.Request(ctx, session, req)
		require.NoError(t, err)
		require.Equal(t, "pending", ans.Decision)
		c.id = ans.ApprovalID
		c.run, err = e.tc.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{ID: c.workflowID, TaskQueue: e.taskQueue},
			"faults.awaitApproval", approvalInput{ApprovalID: c.id, Timeout: 5 * time.Minute, Repeat: 2 * time.Second})
		require.NoError(t, err)
	}

	// Humans answer through replica a, which is killed meanwhile; what did
	// not get through is answered again through replica b.
	answer := func(c *client.Client, id string) error {
		_, err := c.ToolApprovals.Respond(ctx, session, client.ToolCallResponse{ApprovalID: id, Decision: "approved"})
		return err
	}
	failed := make([]bool, n)
	var wg sync.WaitGroup
	for i, c := range calls {
		if c.human {
			wg.Go(func() { failed[i] = answer(approvers[0], c.id) != nil })
		}
	}
	time.Sleep(5 * time.Millisecond)
	e.replicas[0].kill()
	wg.Wait()
	for i, c := range calls {
		if c.human && failed[i] {
			if err := answer(approvers[1], c.id); err != nil {
				require.True(t, client.IsConflict(err), "answered already, or now: %v", err)
			}
		}
	}

	// Both killed as the other half comes due, and restarted after it.
	time.Sleep(time.Until(requested.Add(time.Duration(expiresIn)*time.Second - time.Second)))
	e.replicas[1].kill()
	time.Sleep(3 * time.Second)
	e.replicas[0].start()
	e.replicas[1].start()

	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM tool_approvals a JOIN queue_messages m ON m.org_id = a.org_id AND m.idempotency_key = a.id::text
			WHERE a.org_id = $1 AND a.status <> 'pending' AND m.status = 'delivered'`, org) == n
	}, settleWait, 100*time.Millisecond, "every call is decided and its decision delivered")
	for _, c := range calls {
		var status string
		require.NoError(t, e.db.QueryRow(ctx, `SELECT status FROM tool_approvals WHERE org_id = $1 AND id = $2`, org, c.id).Scan(&status))
		want := "approved"
		if !c.human {
			want = "expired"
		}
		require.Equal(t, want, status, "call %s", c.id)
		require.EqualValues(t, 1, e.count(`SELECT count(*) FROM session_events WHERE org_id = $1 AND session_id = $2
			AND name = 'tool.approval.resolved' AND payload->>'approval_id' = $3`, org, session, c.id), "call %s is resolved once", c.id)

		rctx, cancel := context.WithTimeout(ctx, settleWait)
		var res approvalResult
		err := c.run.Get(rctx, &res)
		cancel()
		require.NoError(t, err)
		require.Len(t, res.Decisions, 1, "the workflow is woken once")
		d := res.Decisions[0]
		require.Equal(t, c.id, d.ApprovalID)
		if c.human {
			require.True(t, d.Approved())
		} else {
			require.False(t, d.Approved())
			require.True(t, d.Expired(), "denied as expired by the sweeper")
		}
	}
}
