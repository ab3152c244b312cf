package api

import (
	"context"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/testkit"
)

// withApprovals adds the tool approvals service (its sweeper not started).
func withApprovals(t *testing.T) func(*Config, *Services) {
	return func(c *Config, sv *Services) {
		sv.Approvals = approvals.New(sv.DB, approvals.Config{Logger: testkit.Logger(t), Registry: c.Registry})
	}
}

// approvalsFixture is a server with the approvals service and the tokens
// the tests use: an unbound agent runtime, approvers alice and bob, an
// admin, and a token bound to agent-1.
type approvalsFixture struct {
	h                            http.Handler
	db                           *pgxpool.Pool
	agent, alice, bob, admin     string
	boundAgent1, boundApprover1  string
	otherOrgApprover, otherAgent string
}

func newApprovalsFixture(t *testing.T) approvalsFixture {
	t.Helper()
	s := newTestServer(t, withApprovals(t))
	return approvalsFixture{
		h: s.Handler(), db: s.svc.DB,
		agent:            subToken(t, "org-a", "runtime", "", RoleAgent),
		alice:            subToken(t, "org-a", "alice", "", RoleApprover),
		bob:              subToken(t, "org-a", "bob", "", RoleApprover, RoleAgent),
		admin:            subToken(t, "org-a", "root", "", RoleAdmin),
		boundAgent1:      subToken(t, "org-a", "agent-1-runtime", "agent-1", RoleAgent, RoleApprover, RoleAdmin),
		boundApprover1:   subToken(t, "org-a", "carol", "agent-1", RoleApprover),
		otherOrgApprover: subToken(t, "org-b", "mallory", "", RoleApprover, RoleAgent, RoleAdmin),
		otherAgent:       subToken(t, "org-b", "runtime", "", RoleAgent),
	}
}

func (f approvalsFixture) toolCall(t *testing.T, tok, session string, body map[string]any) map[string]any {
	t.Helper()
	r := do(t, f.h, http.MethodPost, "/v1/sessions/"+session+"/tool-calls", tok, body)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	return r.JSON(t)
}

func TestApprovalRoutesMatchTheirOpenAPIPart(t *testing.T) {
	s := newTestServer(t, withApprovals(t))
	raw, err := fs.ReadFile(openapiParts, "openapi/60-approvals.yaml")
	require.NoError(t, err)
	var part struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &part))
	var documented, registered []string
	for path, ops := range part.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, rt := range s.Echo().Routes() {
		if strings.HasPrefix(rt.Path, "/v1/sessions") || strings.HasPrefix(rt.Path, "/v1/tool-approvals") || strings.HasPrefix(rt.Path, "/v1/agents") {
			registered = append(registered, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
		}
	}
	sort.Strings(documented)
	sort.Strings(registered)
	require.Equal(t, documented, registered)
}

func TestAToolCallIsDecidedByPolicyOrAnsweredByAnApproverOverREST(t *testing.T) {
	f := newApprovalsFixture(t)

	r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/git", f.admin, map[string]any{"approval": "always", "match": map[string]any{"repo": "acme/docs"}})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	pol := r.JSON(t)
	require.NotEmpty(t, pol["id"])
	require.Equal(t, map[string]any{"id": pol["id"], "tool_name": "git", "approval": "always", "match": map[string]any{"repo": "acme/docs"},
		"updated_at": pol["updated_at"], "updated_by": "root"}, pol)

	t.Run("a matching policy approves at once", func(t *testing.T) {
		out := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "git", "input": map[string]any{"repo": "acme/docs", "op": "push"}})
		require.Equal(t, "approved", out["decision"])
		require.Equal(t, "policy", out["source"])
		require.Equal(t, pol, out["policy"])
		require.NotEmpty(t, out["approval_id"])
	})

	out := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "git", "input": map[string]any{"repo": "acme/prod"},
		"workflow_id": "org-a/wf-1"})
	require.Equal(t, "pending", out["decision"])
	require.Len(t, out, 3, "decision, approval_id, expires_at: %v", out)
	id := out["approval_id"].(string)

	r = do(t, f.h, http.MethodGet, "/v1/tool-approvals?status=pending", f.alice, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	inbox := r.JSON(t)
	require.Len(t, inbox["items"], 1)
	require.Nil(t, inbox["next_cursor"])
	a := inbox["items"].([]any)[0].(map[string]any)
	require.Equal(t, map[string]any{"id": id, "session_id": "s1", "agent_id": "agent-1", "tool_name": "git", "input": map[string]any{"repo": "acme/prod"},
		"status": "pending", "source": nil, "requested_by": "runtime", "resolved_by": nil, "note": nil, "workflow_id": "org-a/wf-1",
		"run_id": nil, "signal": "approval", "delivery": map[string]any{"state": "waiting", "attempts": float64(0)},
		"created_at": a["created_at"], "expires_at": out["expires_at"], "resolved_at": nil}, a)

	r = do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice, map[string]any{"approval_id": id, "decision": "denied", "update_policy": "never", "note": "not prod"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"resolved": []any{id}, "policy": "never"}, r.JSON(t))
	p := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.bob, map[string]any{"approval_id": id, "decision": "approved"}).requireProblem(t, http.StatusConflict)
	require.Equal(t, id, p["approval_id"], "the 409 says what became of the call")
	require.Equal(t, "denied", p["state"])
	require.Equal(t, "alice", p["resolved_by"])
	require.NotEmpty(t, p["resolved_at"])

	r = do(t, f.h, http.MethodGet, "/v1/tool-approvals/"+id, f.agent, nil)
	require.Equal(t, http.StatusOK, r.Status)
	got := r.JSON(t)
	require.Equal(t, "denied", got["status"])
	require.Equal(t, "human", got["source"])
	require.Equal(t, "alice", got["resolved_by"])
	require.Equal(t, "not prod", got["note"])
	require.NotNil(t, got["resolved_at"])
	r = do(t, f.h, http.MethodGet, "/v1/tool-approvals?status=resolved", f.alice, nil)
	require.Len(t, r.JSON(t)["items"], 2, "the policy's decision and the human's")

	r = do(t, f.h, http.MethodGet, "/v1/sessions/s1/events?after=1&limit=2", f.agent, nil)
	require.Equal(t, http.StatusOK, r.Status)
	page := r.JSON(t)
	require.Equal(t, "3", page["next_cursor"])
	evs := page["items"].([]any)
	require.Len(t, evs, 2)
	require.Equal(t, float64(2), evs[0].(map[string]any)["seq"])
	require.Equal(t, "tool.approval.requested", evs[0].(map[string]any)["name"])
	require.Equal(t, "tool.approval.resolved", evs[1].(map[string]any)["name"])
	require.Equal(t, map[string]any{"approval_id": id, "tool_name": "git", "decision": "denied", "source": "human", "updated_policy": "never"},
		evs[1].(map[string]any)["payload"])
	r = do(t, f.h, http.MethodGet, "/v1/sessions/s1/events?after=3", f.alice, nil)
	last := r.JSON(t)
	require.Nil(t, last["next_cursor"])
	require.Equal(t, "turn.tool_call.denied", last["items"].([]any)[0].(map[string]any)["name"])

	r = do(t, f.h, http.MethodGet, "/v1/agents/agent-1/tool-policies", f.alice, nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, r.JSON(t)["items"], 2)
	m := url.QueryEscape(`{"repo":"acme/docs"}`)
	require.Equal(t, http.StatusNoContent, do(t, f.h, http.MethodDelete, "/v1/agents/agent-1/tool-policies/git?match="+m, f.admin, nil).Status)
	do(t, f.h, http.MethodDelete, "/v1/agents/agent-1/tool-policies/git?match="+m, f.admin, nil).requireProblem(t, http.StatusNotFound)
	require.Equal(t, http.StatusNoContent, do(t, f.h, http.MethodDelete, "/v1/agents/agent-1/tool-policies/git", f.admin, nil).Status)
}

func TestARetriedToolCallWithItsIdempotencyKeyReturnsTheSameApproval(t *testing.T) {
	f := newApprovalsFixture(t)
	body := map[string]any{"agent_id": "agent-1", "tool_name": "shell"}
	first := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, body, "Idempotency-Key", "k1").JSON(t)
	// The HTTP record lost (a 5xx after the commit deletes it): the
	// domain's own key still finds the first call.
	_, err := f.db.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	again := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, body, "Idempotency-Key", "k1").JSON(t)
	require.Equal(t, first["approval_id"], again["approval_id"])
	require.Equal(t, 1, countRows(t, f.db, `SELECT count(*) FROM tool_approvals`))

	// Answered by a human since: the retry says so, with no policy (none
	// decided), not a null one.
	r := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice, map[string]any{"approval_id": first["approval_id"], "decision": "denied"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	_, err = f.db.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	answered := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, body, "Idempotency-Key", "k1").JSON(t)
	require.Equal(t, map[string]any{"approval_id": first["approval_id"], "decision": "denied", "source": "human"}, answered)
}

func TestSessionsAndRolesAreEnforcedOnEveryApprovalRoute(t *testing.T) {
	f := newApprovalsFixture(t)
	id := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "shell"})["approval_id"].(string)
	f.toolCall(t, f.agent, "s2", map[string]any{"agent_id": "agent-2", "tool_name": "shell"})
	respondBody := map[string]any{"tool_name": "shell", "decision": "approved"}
	noSub := subToken(t, "org-a", "", "", RoleApprover)

	cases := []struct {
		name         string
		method, path string
		tok          string
		body         any
		status       int
	}{
		{"a session is bound to its first agent", http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, map[string]any{"agent_id": "agent-2", "tool_name": "shell"}, http.StatusConflict},
		{"an agent cannot answer", http.MethodPost, "/v1/sessions/s1/tool-approvals", f.agent, respondBody, http.StatusForbidden},
		{"a token bound to an agent cannot answer, whatever its roles", http.MethodPost, "/v1/sessions/s1/tool-approvals", f.boundAgent1, respondBody, http.StatusForbidden},
		{"a token without sub cannot answer", http.MethodPost, "/v1/sessions/s1/tool-approvals", noSub, respondBody, http.StatusForbidden},
		{"the requester cannot answer its own call", http.MethodPost, "/v1/sessions/s1/tool-approvals", subToken(t, "org-a", "runtime", "", RoleApprover), respondBody, http.StatusForbidden},
		{"an approver cannot ask", http.MethodPost, "/v1/sessions/s1/tool-calls", f.alice, map[string]any{"agent_id": "agent-1", "tool_name": "shell"}, http.StatusForbidden},
		{"a bound token asks only as its agent", http.MethodPost, "/v1/sessions/s3/tool-calls", f.boundAgent1, map[string]any{"agent_id": "agent-2", "tool_name": "shell"}, http.StatusForbidden},
		{"the inbox is the approver's", http.MethodGet, "/v1/tool-approvals", f.agent, nil, http.StatusForbidden},
		{"an admin cannot read events", http.MethodGet, "/v1/sessions/s1/events", f.admin, nil, http.StatusForbidden},
		{"an agent cannot read policies", http.MethodGet, "/v1/agents/agent-1/tool-policies", f.agent, nil, http.StatusForbidden},
		{"an approver cannot set policies", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.alice, map[string]any{"approval": "always"}, http.StatusForbidden},
		{"a bound admin cannot set its own policies", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.boundAgent1, map[string]any{"approval": "always"}, http.StatusForbidden},
		{"a bound admin cannot delete its own policies", http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell", f.boundAgent1, nil, http.StatusForbidden},
		{"a bound token reads only its agent's policies", http.MethodGet, "/v1/agents/agent-2/tool-policies", f.boundApprover1, nil, http.StatusForbidden},
		{"a bound token's inbox filter names only its agent", http.MethodGet, "/v1/tool-approvals?agent_id=agent-2", f.boundApprover1, nil, http.StatusForbidden},
		{"another agent's session is absent to a bound token", http.MethodGet, "/v1/sessions/s2/events", f.boundApprover1, nil, http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			do(t, f.h, tc.method, tc.path, tc.tok, tc.body).requireProblem(t, tc.status)
		})
	}
	require.Equal(t, 2, countRows(t, f.db, `SELECT count(*) FROM tool_approvals WHERE status = 'pending'`), "nothing was answered")
	require.Zero(t, countRows(t, f.db, `SELECT count(*) FROM tool_policies`))

	t.Run("a bound token sees its own agent's calls only", func(t *testing.T) {
		r := do(t, f.h, http.MethodGet, "/v1/tool-approvals", f.boundApprover1, nil)
		require.Equal(t, http.StatusOK, r.Status)
		items := r.JSON(t)["items"].([]any)
		require.Len(t, items, 1)
		require.Equal(t, id, items[0].(map[string]any)["id"])
		require.Equal(t, http.StatusOK, do(t, f.h, http.MethodGet, "/v1/sessions/s1/events", f.boundApprover1, nil).Status)
		require.Equal(t, http.StatusOK, do(t, f.h, http.MethodGet, "/v1/agents/agent-1/tool-policies", f.boundApprover1, nil).Status)
	})
	t.Run("another agent's approval is absent to a bound token, with an absent one's body", func(t *testing.T) {
		other := f.toolCall(t, f.agent, "s2", map[string]any{"agent_id": "agent-2", "tool_name": "ls"})["approval_id"].(string)
		theirs := do(t, f.h, http.MethodGet, "/v1/tool-approvals/"+other, f.boundAgent1, nil)
		absent := do(t, f.h, http.MethodGet, "/v1/tool-approvals/0190a0a0-0000-7000-8000-000000000000", f.boundAgent1, nil)
		theirs.requireProblem(t, http.StatusNotFound)
		require.Equal(t, string(absent.Body), string(theirs.Body))
	})
}

// Another org's session, approval and policies behave exactly as absent
// ones: the same status and body.
func TestAnotherOrgsSessionsApprovalsAndPoliciesBehaveAsAbsent(t *testing.T) {
	f := newApprovalsFixture(t)
	id := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "shell"})["approval_id"].(string)
	r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/git", f.admin, map[string]any{"approval": "never"})
	require.Equal(t, http.StatusOK, r.Status)
	const absentID = "0190a0a0-0000-7000-8000-000000000000"

	pairs := []struct {
		name                 string
		method, theirs, none string
		body                 any
	}{
		{"events", http.MethodGet, "/v1/sessions/s1/events", "/v1/sessions/nope/events", nil},
		{"answer by tool", http.MethodPost, "/v1/sessions/s1/tool-approvals", "/v1/sessions/nope/tool-approvals", map[string]any{"tool_name": "shell", "decision": "approved"}},
		{"answer by id", http.MethodPost, "/v1/sessions/s1/tool-approvals", "/v1/sessions/nope/tool-approvals", map[string]any{"approval_id": id, "decision": "approved"}},
		{"get", http.MethodGet, "/v1/tool-approvals/" + id, "/v1/tool-approvals/" + absentID, nil},
		{"delete policy", http.MethodDelete, "/v1/agents/agent-1/tool-policies/git", "/v1/agents/agent-1/tool-policies/nope", nil},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			theirs := do(t, f.h, p.method, p.theirs, f.otherOrgApprover, p.body)
			absent := do(t, f.h, p.method, p.none, f.otherOrgApprover, p.body)
			theirs.requireProblem(t, http.StatusNotFound)
			require.Equal(t, string(absent.Body), string(theirs.Body))
		})
	}
	lists := []string{"/v1/tool-approvals", "/v1/tool-approvals?agent_id=agent-1", "/v1/tool-approvals?session_id=s1", "/v1/agents/agent-1/tool-policies"}
	for _, path := range lists {
		r := do(t, f.h, http.MethodGet, path, f.otherOrgApprover, nil)
		require.Equal(t, http.StatusOK, r.Status, path)
		want := map[string]any{"items": []any{}, "next_cursor": nil}
		if strings.HasPrefix(path, "/v1/tool-approvals") {
			want["events_seq"] = float64(0) // org B's own sequence: nothing yet
		}
		require.Equal(t, want, r.JSON(t), path)
	}

	// The same session id in org B is org B's own session, bound afresh.
	f.toolCall(t, f.otherAgent, "s1", map[string]any{"agent_id": "agent-9", "tool_name": "shell"})
	require.Equal(t, 1, countRows(t, f.db, `SELECT count(*) FROM tool_approvals WHERE org_id = 'org-a' AND status = 'pending'`), "org A's call untouched")
	require.Equal(t, 1, countRows(t, f.db, `SELECT count(*) FROM tool_policies WHERE org_id = 'org-a'`))
}

func TestBadApprovalInputIsA400NamingTheFieldAndWritesNothing(t *testing.T) {
	f := newApprovalsFixture(t)
	call := func(mut func(b map[string]any)) map[string]any {
		b := map[string]any{"agent_id": "agent-1", "tool_name": "shell", "input": map[string]any{"cmd": "ls"}}
		mut(b)
		return b
	}
	answer := func(mut func(b map[string]any)) map[string]any {
		b := map[string]any{"tool_name": "shell", "decision": "approved"}
		mut(b)
		return b
	}
	cases := []struct {
		name, method, path, field string
		body                      any
	}{
		{"empty tool name", http.MethodPost, "/v1/sessions/s1/tool-calls", "tool_name", call(func(b map[string]any) { b["tool_name"] = "" })},
		{"over-long tool name", http.MethodPost, "/v1/sessions/s1/tool-calls", "tool_name", call(func(b map[string]any) { b["tool_name"] = strings.Repeat("t", 129) })},
		{"tool name of the wrong type", http.MethodPost, "/v1/sessions/s1/tool-calls", "tool_name", call(func(b map[string]any) { b["tool_name"] = 7 })},
		{"missing agent", http.MethodPost, "/v1/sessions/s1/tool-calls", "agent_id", call(func(b map[string]any) { delete(b, "agent_id") })},
		{"oversize input", http.MethodPost, "/v1/sessions/s1/tool-calls", "input", call(func(b map[string]any) { b["input"] = strings.Repeat("x", approvals.MaxInput) })},
		{"another org's workflow", http.MethodPost, "/v1/sessions/s1/tool-calls", "workflow_id", call(func(b map[string]any) { b["workflow_id"] = "org-b/wf" })},
		{"expires_in_s too short", http.MethodPost, "/v1/sessions/s1/tool-calls", "expires_in_s", call(func(b map[string]any) { b["expires_in_s"] = 9 })},
		{"expires_in_s too long", http.MethodPost, "/v1/sessions/s1/tool-calls", "expires_in_s", call(func(b map[string]any) { b["expires_in_s"] = 7*24*3600 + 1 })},
		{"expires_in_s huge", http.MethodPost, "/v1/sessions/s1/tool-calls", "expires_in_s", call(func(b map[string]any) { b["expires_in_s"] = int64(1) << 62 })},
		{"unknown field", http.MethodPost, "/v1/sessions/s1/tool-calls", "tool", call(func(b map[string]any) { b["tool"] = "x" })},
		{"agent . in the body", http.MethodPost, "/v1/sessions/s1/tool-calls", "agent_id", call(func(b map[string]any) { b["agent_id"] = "." })},
		{"tool .. in the body", http.MethodPost, "/v1/sessions/s1/tool-calls", "tool_name", call(func(b map[string]any) { b["tool_name"] = ".." })},
		{"session .. (encoded)", http.MethodPost, "/v1/sessions/%2E%2E/tool-calls", "session_id", call(func(map[string]any) {})},
		{"session . answered", http.MethodPost, "/v1/sessions/./tool-approvals", "session_id", answer(func(map[string]any) {})},
		{"over-long session id", http.MethodPost, "/v1/sessions/" + strings.Repeat("s", 256) + "/tool-calls", "session_id", call(func(map[string]any) {})},
		{"unknown decision", http.MethodPost, "/v1/sessions/s1/tool-approvals", "decision", answer(func(b map[string]any) { b["decision"] = "maybe" })},
		{"missing decision", http.MethodPost, "/v1/sessions/s1/tool-approvals", "decision", answer(func(b map[string]any) { delete(b, "decision") })},
		{"unknown policy value", http.MethodPost, "/v1/sessions/s1/tool-approvals", "update_policy", answer(func(b map[string]any) { b["update_policy"] = "sometimes" })},
		{"both tool_name and approval_id", http.MethodPost, "/v1/sessions/s1/tool-approvals", "approval_id", answer(func(b map[string]any) { b["approval_id"] = "0190a0a0-0000-7000-8000-000000000000" })},
		{"neither tool_name nor approval_id", http.MethodPost, "/v1/sessions/s1/tool-approvals", "tool_name", answer(func(b map[string]any) { delete(b, "tool_name") })},
		{"a malformed approval_id", http.MethodPost, "/v1/sessions/s1/tool-approvals", "approval_id", map[string]any{"approval_id": "x", "decision": "approved"}},
		{"unknown approval value", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", "approval", map[string]any{"approval": "sometimes"}},
		{"missing approval", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", "approval", map[string]any{}},
		{"match not an object", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", "match", map[string]any{"approval": "always", "match": []any{"repo"}}},
		{"match a string", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", "match", map[string]any{"approval": "always", "match": "repo"}},
		{"match empty", http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", "match", map[string]any{"approval": "always", "match": map[string]any{}}},
		{"over-long tool name in the path", http.MethodPut, "/v1/agents/agent-1/tool-policies/" + strings.Repeat("t", 129), "tool_name", map[string]any{"approval": "always"}},
		{"delete with a malformed match", http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell?match=%7Bnope", "match", nil},
		{"delete with a match Postgres cannot store (a lone surrogate)", http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell?match=" + url.QueryEscape(`{"a":"\ud800"}`), "match", nil},
		{"delete with a match Postgres cannot store (a number out of range)", http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell?match=" + url.QueryEscape(`{"a":1e999999999}`), "match", nil},
		{"events after a negative seq", http.MethodGet, "/v1/sessions/s1/events?after=-1", "after", nil},
		{"inbox with an unknown status", http.MethodGet, "/v1/tool-approvals?status=maybe", "status", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := f.alice
			switch {
			case strings.HasSuffix(tc.path, "/tool-calls"):
				tok = f.agent
			case tc.method == http.MethodPut || tc.method == http.MethodDelete:
				tok = f.admin
			}
			do(t, f.h, tc.method, tc.path, tok, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
		})
	}
	for _, table := range []string{"approval_sessions", "session_events", "tool_policies", "tool_approvals"} {
		require.Zero(t, countRows(t, f.db, `SELECT count(*) FROM `+table), "nothing written to %s", table)
	}
}

func countRows(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Issue 10 item 3 on the tool-call route: past the HTTP layer's per-agent
// scope, the domain's key is the agent's own too, so a bound token sending
// another agent's key gets a call of its own (200), not a 422 that tells
// the key exists.
func TestABoundTokenSendingAnotherAgentsToolCallKeyGetsWhatItWouldWithout(t *testing.T) {
	f := newApprovalsFixture(t)
	bound2 := subToken(t, "org-a", "agent-2-runtime", "agent-2", RoleAgent)
	first := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.boundAgent1,
		map[string]any{"agent_id": "agent-1", "tool_name": "shell"}, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusOK, first.Status, "body: %s", first.Body)
	theirs := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", bound2,
		map[string]any{"agent_id": "agent-2", "tool_name": "shell"}, "Idempotency-Key", "k1")
	without := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", bound2,
		map[string]any{"agent_id": "agent-2", "tool_name": "shell"})
	require.Equal(t, without.Status, theirs.Status, "body: %s", theirs.Body)
	require.Equal(t, without.JSON(t)["type"], theirs.JSON(t)["type"])

	elsewhere := do(t, f.h, http.MethodPost, "/v1/sessions/s2/tool-calls", bound2,
		map[string]any{"agent_id": "agent-2", "tool_name": "shell"}, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusOK, elsewhere.Status, "body: %s", elsewhere.Body)
	require.NotEqual(t, first.JSON(t)["approval_id"], elsewhere.JSON(t)["approval_id"])
}

// A retry of a policy-decided call, answered from the domain's key (the
// HTTP record gone, or another caller), shows "the policy that decided":
// not the same policy as since replaced, whose approval contradicts the
// decision it is shown beside (it used to show the policy as it stands now).
func TestARetriedToolCallNeverShowsAPolicyThatContradictsItsDecision(t *testing.T) {
	f := newApprovalsFixture(t)
	r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.admin, map[string]any{"approval": "always"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	body := map[string]any{"agent_id": "agent-1", "tool_name": "shell"}
	first := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, body, "Idempotency-Key", "k1").JSON(t)
	require.Equal(t, "approved", first["decision"])
	require.Equal(t, "always", first["policy"].(map[string]any)["approval"])

	r = do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.admin, map[string]any{"approval": "never"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	_, err := f.db.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	again := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, body, "Idempotency-Key", "k1").JSON(t)
	require.Equal(t, first["approval_id"], again["approval_id"])
	require.Equal(t, "approved", again["decision"])
	require.Nil(t, again["policy"], "the policy that decided was replaced since: not shown, as a deleted one is not: %v", again)
}

// An answer naming the nil UUID as its approval_id, beside tool_name, is
// a 400 naming approval_id that resolves nothing: read as "no id given",
// it answered every pending call of the tool in the session, the ones
// the approver never saw among them.
func TestAnAnswerNamingTheNilApprovalIDResolvesNothing(t *testing.T) {
	f := newApprovalsFixture(t)
	for _, cmd := range []string{"ls", "rm -rf /"} {
		call := f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "shell", "input": map[string]any{"cmd": cmd}})
		require.Equal(t, "pending", call["decision"])
	}
	for _, body := range []map[string]any{
		{"tool_name": "shell", "approval_id": "00000000-0000-0000-0000-000000000000", "decision": "approved"},
		{"approval_id": "00000000-0000-0000-0000-000000000000", "decision": "approved"},
	} {
		do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice, body).requireProblem(t, http.StatusBadRequest, "approval_id")
	}
	r := do(t, f.h, http.MethodGet, "/v1/tool-approvals?status=pending", f.alice, nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, r.JSON(t)["items"], 2, "nothing was resolved")
}

// A standing policy carries its id (SPEC §2: resources carry id), which a
// put that replaces its approval keeps and the list shows.
func TestAToolPolicyCarriesItsIDAcrossPuts(t *testing.T) {
	f := newApprovalsFixture(t)
	put := func(approval string) map[string]any {
		r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.admin, map[string]any{"approval": approval})
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		return r.JSON(t)
	}
	first, again := put("never"), put("always")
	require.NotEmpty(t, first["id"])
	require.Equal(t, first["id"], again["id"])
	r := do(t, f.h, http.MethodGet, "/v1/agents/agent-1/tool-policies", f.admin, nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, first["id"], r.JSON(t)["items"].([]any)[0].(map[string]any)["id"])
}
