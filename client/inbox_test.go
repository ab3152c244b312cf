package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
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

// Approvals.Events knows where it stands from its first connection on —
// the server says so before any event — so that a connection cut before
// the next event is resumed from there and an event created meanwhile is
// yielded, not skipped: started at the current end (no After), or reset
// (an After past the log's end).
func TestApprovalEventsResumeFromWhereTheyStartedWhenCutBeforeAnEvent(t *testing.T) {
	e := startEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	asAgent := newClient(t, e.url, agent, nil)
	proxy := newFaultProxy(t, e.url[len("http://"):])
	refuse := func(agentID string) string {
		_, err := asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: agentID, Scope: "s", Cost: 1})
		var apiErr *client.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusPaymentRequired, apiErr.Status)
		return apiErr.ApprovalID
	}
	refuse("before") // seq 1: the log is not empty
	// (the event's id line passes, the rest of it does not)
	cutInEvent := cut{pattern: []byte("event: requested")}

	pastTheEnd := int64(1 << 40)
	for _, tc := range []struct {
		name  string
		after *int64
	}{
		{"started at the current end", nil},
		{"reset", &pastTheEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			c := newClient(t, proxy.URL(), approver, rec)
			events := make(chan client.ApprovalEvent)
			ectx, stop := context.WithCancel(ctx)
			defer stop()
			go func() {
				for ev, err := range c.Approvals.Events(ectx, client.ApprovalEventsParams{After: tc.after}) {
					if err != nil {
						return
					}
					select {
					case events <- ev:
					case <-ectx.Done():
						return
					}
				}
			}()
			next := func() client.ApprovalEvent {
				select {
				case ev := <-events:
					return ev
				case <-ctx.Done():
					require.FailNow(t, "no event")
					return client.ApprovalEvent{}
				}
			}
			connections := func() []recorded { return rec.requests(http.MethodGet, "/v1/approvals/events") }
			if tc.after != nil {
				require.Equal(t, client.ApprovalReset, next().Type)
			} else {
				require.Eventually(t, func() bool { return len(connections()) == 1 }, 10*time.Second, 5*time.Millisecond, "connected")
			}
			proxy.cutAnswers(cutInEvent)
			lost := refuse("meanwhile-" + tc.name)
			require.Eventually(t, func() bool { return len(connections()) == 2 }, 10*time.Second, 5*time.Millisecond, "reconnected")
			after := refuse("after-" + tc.name)

			got := next()
			require.Equal(t, client.ApprovalRequested, got.Type)
			require.Equal(t, lost, got.ApprovalID, "the event cut off is yielded after the reconnect")
			require.Equal(t, after, next().ApprovalID)
			require.Equal(t, strconv.FormatInt(got.Seq-1, 10), connections()[1].header.Get("Last-Event-ID"),
				"resumed from where it stood")
		})
	}
}
