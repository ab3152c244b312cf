package api

import (
	"net/http"
	"testing"
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
