package api

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A mandate or spend body that lacks agent_id is a 400 naming agent_id
// (and scope, when it lacks that too), whatever else it carries and
// whoever sends it — as it is for `{}` (missingWith) and for POST
// /v1/wakeups. A token bound to an agent (an agent runtime's) got a 403
// "may act only as agent" for the same missing field once the amount was
// given, and scope went unnamed.
func TestAMandateOrSpendLackingAgentIDIsA400ForABoundTokenToo(t *testing.T) {
	s, _ := newMandateServer(t)
	agent := subToken(t, "org-a", "runtime", "a1", RoleAgent)
	admin := subToken(t, "org-a", "root", "a1", RoleAdmin)

	r := do(t, s.Handler(), http.MethodPost, "/v1/mandates/spend", agent, map[string]any{})
	r.requireProblem(t, http.StatusBadRequest, "cost", "agent_id", "scope")
	r = do(t, s.Handler(), http.MethodPost, "/v1/mandates/spend", agent, map[string]any{"cost": 1})
	r.requireProblem(t, http.StatusBadRequest, "agent_id", "scope")

	r = do(t, s.Handler(), http.MethodPost, "/v1/mandates", admin, map[string]any{"budget": 5})
	r.requireProblem(t, http.StatusBadRequest, "agent_id", "scope")
}

// The same for POST /v1/wakeups, the route agent runtimes (bound tokens)
// call most: a body lacking agent_id, or giving it empty, is the 400
// naming it and every other empty field, never a 403 "may act only as
// agent". Found by review (the comment above said it already was).
func TestAWakeupLackingAgentIDIsA400ForABoundTokenToo(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	h := s.Handler()
	bound := subToken(t, "org-a", "runtime", "a1", RoleAgent)
	unbound := subToken(t, "org-a", "runtime", "", RoleAgent)
	missing := `{"workflow_id":"org-a/wf","signal":"s","scope":"llm","cost":3,"work":{"handler":"echo"}}`
	empty := `{"agent_id":"","workflow_id":"org-a/wf","signal":"s","scope":"","cost":3,"work":{"handler":"echo"}}`
	for _, token := range []string{unbound, bound} {
		do(t, h, http.MethodPost, "/v1/wakeups", token, missing).requireProblem(t, http.StatusBadRequest, "agent_id")
		do(t, h, http.MethodPost, "/v1/wakeups", token, empty).requireProblem(t, http.StatusBadRequest, "agent_id", "scope")
	}
	var n int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT count(*) FROM wakeups`).Scan(&n))
	require.Zero(t, n, "nothing written")
}
