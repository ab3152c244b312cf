package client_test

import (
	"context"
	"iter"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// firstErr is the first error an iteration yields.
func firstErr[T any](seq iter.Seq2[T, error]) error {
	for _, err := range seq {
		if err != nil {
			return err
		}
	}
	return nil
}

// An empty id or name in a route's path is refused before anything is
// sent, naming the method and the argument: sent, it came back a 404 ("no
// such route", or "not found") that said nothing of the mistake. (Nothing
// may reach a server here, so a fake one counts what does.)
func TestAnEmptyPathArgumentIsRefusedWithoutARequest(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL, admin, nil)
	ctx := context.Background()
	const id = "0190f0f0-0000-7000-8000-000000000000"

	cases := []struct {
		method, arg string
		call        func() error
	}{
		{"Wakeups.Get", "id", func() error { _, err := c.Wakeups.Get(ctx, ""); return err }},
		{"Wakeups.Cancel", "id", func() error { _, err := c.Wakeups.Cancel(ctx, ""); return err }},
		{"Wakeups.Redeliver", "id", func() error { _, err := c.Wakeups.Redeliver(ctx, ""); return err }},
		{"Mandates.Get", "id", func() error { _, err := c.Mandates.Get(ctx, ""); return err }},
		{"Mandates.Update", "id", func() error { _, err := c.Mandates.Update(ctx, "", client.MandateUpdate{}); return err }},
		{"Mandates.LedgerPage", "id", func() error { _, err := c.Mandates.LedgerPage(ctx, "", client.PageParams{}); return err }},
		{"Mandates.LedgerPage", "id", func() error { return firstErr(c.Mandates.Ledger(ctx, "", client.PageParams{})) }},
		{"MandateApprovals.Get", "id", func() error { _, err := c.MandateApprovals.Get(ctx, ""); return err }},
		{"MandateApprovals.Approve", "id", func() error { _, err := c.MandateApprovals.Approve(ctx, "", client.Resolution{}); return err }},
		{"MandateApprovals.Deny", "id", func() error { _, err := c.MandateApprovals.Deny(ctx, "", client.Resolution{}); return err }},
		{"Pools.Get", "pool", func() error { _, err := c.Pools.Get(ctx, ""); return err }},
		{"Pools.Update", "pool", func() error { _, err := c.Pools.Update(ctx, "", client.PoolUpdate{}); return err }},
		{"Pools.Pause", "pool", func() error { _, err := c.Pools.Pause(ctx, ""); return err }},
		{"Pools.Resume", "pool", func() error { _, err := c.Pools.Resume(ctx, ""); return err }},
		{"Pools.Enqueue", "pool", func() error { _, err := c.Pools.Enqueue(ctx, "", client.WorkRequest{}); return err }},
		{"Work.Get", "id", func() error { _, err := c.Work.Get(ctx, ""); return err }},
		{"Work.Cancel", "id", func() error { _, err := c.Work.Cancel(ctx, ""); return err }},
		{"Streams.Append", "runID", func() error { _, err := c.Streams.Append(ctx, "", "out", []byte("x")); return err }},
		{"Streams.Append", "name", func() error { _, err := c.Streams.Append(ctx, "run", "", []byte("x")); return err }},
		{"Streams.AppendBatch", "runID", func() error { _, err := c.Streams.AppendBatch(ctx, "", "out", nil); return err }},
		{"Streams.AppendBatch", "name", func() error { _, err := c.Streams.AppendBatch(ctx, "run", "", nil); return err }},
		{"Streams.Close", "runID", func() error { return c.Streams.Close(ctx, "", "out") }},
		{"Streams.Close", "name", func() error { return c.Streams.Close(ctx, "run", "") }},
		{"Streams.Info", "runID", func() error { _, err := c.Streams.Info(ctx, "", "out"); return err }},
		{"Streams.Info", "name", func() error { _, err := c.Streams.Info(ctx, "run", ""); return err }},
		{"Streams.NamesPage", "runID", func() error { return firstErr(c.Streams.Names(ctx, "", client.PageParams{})) }},
		{"Streams.ChunksPage", "runID", func() error { return firstErr(c.Streams.Chunks(ctx, "", "out", client.ChunkParams{})) }},
		{"Streams.ChunksPage", "name", func() error { _, err := c.Streams.ChunksPage(ctx, "run", "", client.ChunkParams{}); return err }},
		{"Streams.Tail", "runID", func() error { return firstErr(c.Streams.Tail(ctx, "", "out", client.TailParams{})) }},
		{"Streams.Tail", "name", func() error { return firstErr(c.Streams.Tail(ctx, "run", "", client.TailParams{})) }},
		{"ToolApprovals.Request", "sessionID", func() error { _, err := c.ToolApprovals.Request(ctx, "", client.ToolCallRequest{}); return err }},
		{"ToolApprovals.Respond", "sessionID", func() error { _, err := c.ToolApprovals.Respond(ctx, "", client.ToolCallResponse{}); return err }},
		{"ToolApprovals.EventsPage", "sessionID", func() error {
			return firstErr(c.ToolApprovals.Events(ctx, "", client.SessionEventParams{}))
		}},
		{"ToolApprovals.Get", "id", func() error { _, err := c.ToolApprovals.Get(ctx, ""); return err }},
		{"ToolApprovals.Redeliver", "id", func() error { _, err := c.ToolApprovals.Redeliver(ctx, ""); return err }},
		{"ToolPolicies.ListPage", "agentID", func() error { return firstErr(c.ToolPolicies.List(ctx, "", client.PageParams{})) }},
		{"ToolPolicies.Put", "agentID", func() error { _, err := c.ToolPolicies.Put(ctx, "", "git", client.ToolPolicyRequest{}); return err }},
		{"ToolPolicies.Put", "toolName", func() error { _, err := c.ToolPolicies.Put(ctx, "agent-1", "", client.ToolPolicyRequest{}); return err }},
		{"ToolPolicies.Delete", "agentID", func() error { return c.ToolPolicies.Delete(ctx, "", "git", nil) }},
		{"ToolPolicies.Delete", "toolName", func() error { return c.ToolPolicies.Delete(ctx, "agent-1", "", nil) }},
		{"ApprovalWebhooks.Put", "name", func() error {
			_, err := c.ApprovalWebhooks.Put(ctx, "", client.ApprovalWebhookRequest{})
			return err
		}},
		{"ApprovalWebhooks.Get", "name", func() error { _, err := c.ApprovalWebhooks.Get(ctx, ""); return err }},
		{"ApprovalWebhooks.Delete", "name", func() error { return c.ApprovalWebhooks.Delete(ctx, "") }},
	}
	for _, tc := range cases {
		t.Run(tc.method+" without "+tc.arg, func(t *testing.T) {
			err := tc.call()
			var argErr *client.ArgumentError
			require.ErrorAs(t, err, &argErr)
			require.Equal(t, client.ArgumentError{Method: tc.method, Arg: tc.arg}, *argErr)
			require.EqualError(t, err, "client: "+tc.method+": the "+tc.arg+" argument is empty (nothing was sent)")
			require.Zero(t, client.StatusOf(err), "not an answer")
			require.Zero(t, requests.Load(), "nothing was sent")
		})
	}

	// (the server is there: the same calls with their arguments reach it)
	_, err := c.Wakeups.Get(ctx, id)
	require.True(t, client.IsNotFound(err), "%v", err)
	require.EqualValues(t, 1, requests.Load())
}
