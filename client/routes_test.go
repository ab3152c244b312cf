package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// collect drains an iterator, failing the test on an error.
func collect[T any](t *testing.T, seq func(func(T, error) bool)) []T {
	t.Helper()
	var out []T
	for item, err := range seq {
		require.NoError(t, err)
		out = append(out, item)
	}
	return out
}

// documentedRoutes are the "METHOD /path/{param}" of every operation of the
// served OpenAPI document, which api's own test keeps equal to the routes.
func documentedRoutes(t *testing.T, c *client.Client) []string {
	t.Helper()
	raw, err := c.OpenAPI(context.Background())
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	var routes []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				routes = append(routes, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(routes)
	return routes
}

// routeAnswered reports whether one of reqs reached route's handler: its
// method and path match, and the answer is not the router's 404 or 405.
func routeAnswered(route string, reqs []recorded) bool {
	method, path, _ := strings.Cut(route, " ")
	segments := strings.Split(path, "/")
	for i, s := range segments {
		if strings.HasPrefix(s, "{") {
			segments[i] = "[^/]+"
		} else {
			segments[i] = regexp.QuoteMeta(s)
		}
	}
	re := regexp.MustCompile("^" + strings.Join(segments, "/") + "$")
	return slices.ContainsFunc(reqs, func(r recorded) bool {
		return r.method == method && re.MatchString(r.path) && r.status != 0 &&
			r.status != http.StatusNotFound && r.status != http.StatusMethodNotAllowed
	})
}

// Every route of the API has a client method, and each call below gets its
// route's answer (decoded into its type) or the typed error the state
// calls for.
func TestEveryRouteIsReachableThroughTheClient(t *testing.T) {
	e := startEngine(t, allowLocalHTTP)
	ctx := context.Background()
	rec := &recorder{}
	asAdmin, asAgent := newClient(t, e.url, admin, rec), newClient(t, e.url, agent, rec)
	asApprover, asOperator := newClient(t, e.url, approver, rec), newClient(t, e.url, operator, rec)

	// Service routes.
	require.NoError(t, asAdmin.Healthz(ctx))
	// Temporal is absent here: the replica may say it is not ready, but
	// Postgres answers either way.
	ready, err := asAdmin.Readyz(ctx)
	var notReady *client.Error
	if errors.As(err, &notReady) {
		require.Equal(t, http.StatusServiceUnavailable, notReady.Status)
		require.NoError(t, json.Unmarshal(notReady.Extensions["checks"], &ready.Checks))
	} else {
		require.NoError(t, err)
	}
	require.Equal(t, "ok", ready.Checks["postgres"])
	require.Len(t, rec.requests(http.MethodGet, "/readyz"), 1, "a probe is not retried")
	metrics, err := asAdmin.Metrics(ctx)
	require.NoError(t, err)
	require.Contains(t, string(metrics), "reveille_http_requests_total")
	me, err := asAgent.Whoami(ctx)
	require.NoError(t, err)
	require.Equal(t, client.Principal{OrgID: orgA, Sub: "runtime", Roles: []string{"agent"}}, me)

	// Mandates, spends and overrun approvals.
	m, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "agent-1", Scope: "llm", Budget: 10})
	require.NoError(t, err)
	require.Equal(t, int64(10), m.Remaining)
	budget := int64(12)
	m, err = asAdmin.Mandates.Update(ctx, m.ID, client.MandateUpdate{Budget: &budget})
	require.NoError(t, err)
	require.Equal(t, int64(12), m.Budget)
	got, err := asAdmin.Mandates.Get(ctx, m.ID)
	require.NoError(t, err)
	require.Equal(t, m.ID, got.ID)
	require.Equal(t, []string{m.ID}, ids(collect(t, asAdmin.Mandates.List(ctx, client.MandateListParams{AgentID: "agent-1"})), func(m client.Mandate) string { return m.ID }))
	spent, err := asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: "agent-1", Scope: "llm", Cost: 5, Reason: "a call"})
	require.NoError(t, err)
	require.Equal(t, client.SpendResult{OK: true, Remaining: 7}, spent)
	ledger := collect(t, asAdmin.Mandates.Ledger(ctx, m.ID, client.PageParams{}))
	require.Len(t, ledger, 1)
	require.Equal(t, int64(5), ledger[0].Amount)

	approvalIDs := make([]string, 2)
	for i := range approvalIDs {
		_, err = asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: "agent-1", Scope: "llm", Cost: 100})
		var refused *client.Error
		require.ErrorAs(t, err, &refused)
		require.Equal(t, http.StatusPaymentRequired, refused.Status)
		approvalIDs[i] = refused.ApprovalID
	}
	pending := collect(t, asApprover.MandateApprovals.List(ctx, client.MandateApprovalListParams{Status: "pending"}))
	require.Len(t, pending, 2)
	require.Equal(t, approvalIDs[0], pending[0].ID)
	newest := collect(t, asApprover.MandateApprovals.List(ctx, client.MandateApprovalListParams{Status: "pending", Order: "newest", PageParams: client.PageParams{Limit: 1}}))
	require.Equal(t, []string{approvalIDs[1], approvalIDs[0]}, []string{newest[0].ID, newest[1].ID})
	a, err := asApprover.MandateApprovals.Get(ctx, approvalIDs[0])
	require.NoError(t, err)
	require.Equal(t, "insufficient", a.Refusal)
	a, err = asApprover.MandateApprovals.Approve(ctx, approvalIDs[0], client.Resolution{Note: "fine"})
	require.NoError(t, err)
	require.Equal(t, "approved", a.State)
	a, err = asApprover.MandateApprovals.Deny(ctx, approvalIDs[1], client.Resolution{})
	require.NoError(t, err)
	require.Equal(t, "denied", a.State)

	// Wake-ups.
	_, err = asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "agent-2", Scope: "wake", Budget: 100})
	require.NoError(t, err)
	created, err := asAgent.Wakeups.Create(ctx, wakeupRequest("agent-2", 1))
	require.NoError(t, err)
	require.Equal(t, "pending", created.Status)
	w, err := asAgent.Wakeups.Get(ctx, created.ID)
	require.NoError(t, err)
	require.Equal(t, "parked", w.Pool)
	require.Equal(t, []string{created.ID}, ids(collect(t, asAdmin.Wakeups.List(ctx, client.WakeupListParams{AgentID: "agent-2"})), func(w client.Wakeup) string { return w.ID }))
	_, err = asAdmin.Wakeups.Redeliver(ctx, created.ID)
	require.True(t, client.IsConflict(err), "only an undeliverable signal is redelivered: %v", err)
	w, err = asAgent.Wakeups.Cancel(ctx, created.ID)
	require.NoError(t, err)
	require.Equal(t, created.ID, w.ID)

	// Pools and plain work.
	pools := collect(t, asAdmin.Pools.List(ctx))
	require.ElementsMatch(t, []string{"default", "parked", "wakeup"}, ids(pools, func(p client.Pool) string { return p.Name }))
	five := 5
	p, err := asOperator.Pools.Update(ctx, "default", client.PoolUpdate{MaxParallelism: &five, MaxParallelismPerOrg: client.Set(2)})
	require.NoError(t, err)
	require.Equal(t, 5, p.MaxParallelism)
	require.Equal(t, 2, *p.MaxParallelismPerOrg)
	p, err = asOperator.Pools.Update(ctx, "default", client.PoolUpdate{MaxParallelismPerOrg: client.Null[int]()})
	require.NoError(t, err)
	require.Nil(t, p.MaxParallelismPerOrg, "null removes the per-org cap")
	p, err = asAdmin.Pools.Get(ctx, "default")
	require.NoError(t, err)
	require.Equal(t, 5, p.MaxParallelism)
	p, err = asOperator.Pools.Pause(ctx, "default")
	require.NoError(t, err)
	require.True(t, p.Paused)
	p, err = asOperator.Pools.Resume(ctx, "default")
	require.NoError(t, err)
	require.False(t, p.Paused)
	three := 3
	p, err = asOperator.Pools.Update(ctx, "default", client.PoolUpdate{OrgWeights: client.Set(map[string]*int{"org-w": &three})})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"org-w": 3}, p.OrgWeights)
	work, err := asAdmin.Pools.Enqueue(ctx, "parked", client.WorkRequest{Handler: "block", Args: map[string]int{"n": 1}})
	require.NoError(t, err)
	require.Equal(t, "parked", work.Pool)
	work, err = asAdmin.Work.Get(ctx, work.ID)
	require.NoError(t, err)
	require.Equal(t, "block", work.Handler)
	_, err = asAdmin.Work.Cancel(ctx, work.ID)
	require.NoError(t, err)

	// Streams. The run id and name need escaping.
	run, name := "run 1?#%", "out:ü"
	r, err := asAgent.Streams.Append(ctx, run, name, []byte("first"))
	require.NoError(t, err)
	require.Equal(t, client.StreamRange{FirstIndex: 0, LastIndex: 0}, r)
	r, err = asAgent.Streams.AppendBatch(ctx, run, name, [][]byte{[]byte("second"), []byte("third")})
	require.NoError(t, err)
	require.Equal(t, client.StreamRange{FirstIndex: 1, LastIndex: 2}, r)
	require.NoError(t, asAgent.Streams.Close(ctx, run, name))
	info, err := asApprover.Streams.Info(ctx, run, name)
	require.NoError(t, err)
	require.Equal(t, client.StreamInfo{TailIndex: 2, Done: true}, info)
	require.Equal(t, []string{name}, collect(t, asApprover.Streams.Names(ctx, run, client.PageParams{})))
	require.Equal(t, []string{"first", "second", "third"}, chunkData(collect(t, asApprover.Streams.Chunks(ctx, run, name, client.ChunkParams{Limit: 2}))))
	require.Equal(t, []string{"second", "third"}, chunkData(collect(t, asApprover.Streams.Tail(ctx, run, name, client.TailParams{StartIndex: 1}))))

	// Tool approvals and standing policies.
	ans, err := asAgent.ToolApprovals.Request(ctx, "session/1", client.ToolCallRequest{AgentID: "agent-1", ToolName: "shell", Input: map[string]string{"cmd": "ls"}})
	require.NoError(t, err)
	require.Equal(t, "pending", ans.Decision)
	inbox := collect(t, asApprover.ToolApprovals.List(ctx, client.ToolApprovalListParams{Status: "pending"}))
	require.Equal(t, []string{ans.ApprovalID}, ids(inbox, func(a client.ToolApproval) string { return a.ID }))
	ta, err := asAgent.ToolApprovals.Get(ctx, ans.ApprovalID)
	require.NoError(t, err)
	require.JSONEq(t, `{"cmd": "ls"}`, string(ta.Input))
	var fromStart int64
	for ev, err := range asApprover.Approvals.Events(ctx, client.ApprovalEventsParams{After: &fromStart}) {
		require.NoError(t, err)
		if ev.ApprovalID == ans.ApprovalID { // the pending call is in the approvals inbox
			break
		}
	}
	res, err := asApprover.ToolApprovals.Respond(ctx, "session/1", client.ToolCallResponse{ToolName: "shell", Decision: "approved", UpdatePolicy: "always"})
	require.NoError(t, err)
	require.Equal(t, []string{ans.ApprovalID}, res.Resolved)
	require.Empty(t, collect(t, asApprover.ToolApprovals.List(ctx, client.ToolApprovalListParams{Delivery: "undeliverable"})))
	_, err = asAdmin.ToolApprovals.Redeliver(ctx, ans.ApprovalID)
	require.True(t, client.IsConflict(err), "only an undeliverable signal is redelivered: %v", err)
	events := collect(t, asAgent.ToolApprovals.Events(ctx, "session/1", client.SessionEventParams{Limit: 1}))
	require.Equal(t, []string{"tool.approval.requested", "tool.approval.resolved"}, ids(events, func(e client.SessionEvent) string { return e.Name }))
	pol, err := asAdmin.ToolPolicies.Put(ctx, "agent-1", "shell", client.ToolPolicyRequest{Approval: "never", Match: map[string]string{"cmd": "rm"}})
	require.NoError(t, err)
	require.JSONEq(t, `{"cmd": "rm"}`, string(pol.Match))
	policies := collect(t, asApprover.ToolPolicies.List(ctx, "agent-1", client.PageParams{}))
	require.Len(t, policies, 2, "the unconditional policy the answer set, and the conditional one")
	require.NoError(t, asAdmin.ToolPolicies.Delete(ctx, "agent-1", "shell", map[string]string{"cmd": "rm"}))
	require.Len(t, collect(t, asApprover.ToolPolicies.List(ctx, "agent-1", client.PageParams{})), 1)

	// Approval webhooks.
	hook, err := asAdmin.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: "http://127.0.0.1:9/hook", Format: "json"})
	require.NoError(t, err)
	require.NotEmpty(t, hook.Secret, "shown at creation")
	hook, err = asAdmin.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: "http://127.0.0.1:9/v2", Format: "slack"})
	require.NoError(t, err)
	require.Empty(t, hook.Secret, "kept, not shown, on a replace")
	hook, err = asAdmin.ApprovalWebhooks.Get(ctx, "ops")
	require.NoError(t, err)
	require.Equal(t, "slack", hook.Format)
	hooks, err := asAdmin.ApprovalWebhooks.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"ops"}, ids(hooks, func(w client.ApprovalWebhook) string { return w.Name }))
	require.NoError(t, asAdmin.ApprovalWebhooks.Delete(ctx, "ops"))
	_, err = asAdmin.ApprovalWebhooks.Get(ctx, "ops")
	require.True(t, client.IsNotFound(err), "%v", err)

	var unreached []string
	for _, route := range documentedRoutes(t, asAdmin) {
		if route == "GET /inbox" || route == "GET /inbox/{asset}" {
			continue // a web page and its files, for browsers, not an API (internal/e2e's inbox tests drive it)
		}
		if !routeAnswered(route, rec.all()) {
			unreached = append(unreached, route)
		}
	}
	require.Empty(t, unreached, "routes no client call reached")
}

func ids[T, U any](items []T, id func(T) U) []U {
	out := make([]U, len(items))
	for i, it := range items {
		out[i] = id(it)
	}
	return out
}

func chunkData(chunks []client.StreamChunk) []string {
	return ids(chunks, func(c client.StreamChunk) string { return string(c.Data) })
}

// wakeupRequest asks for a wake-up of agent in the parked pool, where it
// stays pending.
func wakeupRequest(agent string, n int) client.WakeupRequest {
	return client.WakeupRequest{AgentID: agent, WorkflowID: orgA + "/wf-" + agent, Signal: "wake", Scope: "wake", Cost: 1,
		Pool: "parked", Reason: fmt.Sprint("wake-up ", n), Work: client.WakeupWork{Handler: "block", Args: map[string]int{"n": n}}}
}

// A non-2xx answer is an *Error with the problem's members: status, type,
// title, detail, the fields at fault and the extensions.
func TestErrorsAreTypedProblems(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	asAdmin, asAgent := newClient(t, e.url, admin, nil), newClient(t, e.url, agent, nil)
	_, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "funded", Scope: "wake", Budget: 100})
	require.NoError(t, err)
	badToken, err := client.New(e.url, client.WithToken("not-a-jwt"))
	require.NoError(t, err)
	unknownHandler := wakeupRequest("funded", 1)
	unknownHandler.Work.Handler = "nope"

	cases := []struct {
		name   string
		call   func() error
		status int
		kind   string
		is     func(error) bool
		check  func(t *testing.T, e *client.Error)
	}{
		{
			name: "a bad field is a 400 naming it", status: http.StatusBadRequest, kind: "invalid-request", is: client.IsInvalid,
			call: func() error { _, err := asAgent.Wakeups.Create(ctx, unknownHandler); return err },
			check: func(t *testing.T, e *client.Error) {
				detail, ok := e.Field("work.handler")
				require.True(t, ok, "names work.handler: %+v", e.Errors)
				require.NotEmpty(t, detail)
			},
		},
		{
			name: "a refused spend is a 402 naming its approval request", status: http.StatusPaymentRequired, kind: "spend-refused", is: client.IsSpendRefused,
			call: func() error {
				_, err := asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: "unfunded", Scope: "llm", Cost: 1})
				return err
			},
			check: func(t *testing.T, e *client.Error) {
				require.NotEmpty(t, e.ApprovalID)
				require.Equal(t, "no_mandate", e.Refusal)
				require.Contains(t, e.Extensions, "approval_id")
			},
		},
		{
			name: "a refused wake-up is a 402 naming its approval request and intent", status: http.StatusPaymentRequired, kind: "spend-refused", is: client.IsSpendRefused,
			call: func() error { _, err := asAgent.Wakeups.Create(ctx, wakeupRequest("unfunded", 1)); return err },
			check: func(t *testing.T, e *client.Error) {
				require.NotEmpty(t, e.ApprovalID)
				w, err := asAgent.Wakeups.Get(ctx, e.WakeupID)
				require.NoError(t, err)
				require.Equal(t, e.ApprovalID, w.Approval.ID)
			},
		},
		{
			name: "a bad token is a 401", status: http.StatusUnauthorized, is: client.IsUnauthorized,
			call: func() error { _, err := badToken.Whoami(ctx); return err },
		},
		{
			name: "a missing role is a 403", status: http.StatusForbidden, kind: "forbidden", is: client.IsForbidden,
			call: func() error { _, err := asAgent.Mandates.Get(ctx, "0190f0f0-0000-7000-8000-000000000000"); return err },
		},
		{
			name: "an absent object is a 404", status: http.StatusNotFound, kind: "not-found", is: client.IsNotFound,
			call: func() error { _, err := asAdmin.Mandates.Get(ctx, "0190f0f0-0000-7000-8000-000000000000"); return err },
		},
		{
			name: "a key reused with another body is a 422", status: http.StatusUnprocessableEntity, kind: "idempotency-key-reused",
			is: func(err error) bool { return client.StatusOf(err) == http.StatusUnprocessableEntity },
			call: func() error {
				key := client.WithIdempotencyKey("reused")
				if _, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "x", Scope: "s", Budget: 1}, key); err != nil {
					return err
				}
				_, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "x", Scope: "s", Budget: 2}, key)
				return err
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var apiErr *client.Error
			require.ErrorAs(t, err, &apiErr)
			require.Equal(t, tc.status, apiErr.Status)
			require.Equal(t, http.StatusText(tc.status), apiErr.Title)
			require.NotEmpty(t, apiErr.Detail)
			require.NotEmpty(t, apiErr.RequestID, "the X-Request-Id names the request in the server's logs")
			if tc.kind != "" {
				require.Equal(t, client.ProblemTypeBase+tc.kind, apiErr.Type)
				require.Equal(t, tc.kind, apiErr.Kind())
			}
			require.True(t, tc.is(err))
			require.True(t, tc.is(fmt.Errorf("wrapped: %w", err)), "the helpers see through wrapping")
			require.False(t, client.IsConflict(err))
			if tc.check != nil {
				tc.check(t, apiErr)
			}
		})
	}
	require.False(t, client.IsNotFound(errors.New("not an API error")))
}
