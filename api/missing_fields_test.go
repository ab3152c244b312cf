package api

import (
	"net/http"
	"testing"
)

// An empty body names every missing required field in one answer, as
// POST /v1/wakeups does ("Every problem in one answer"): a client fixing
// its request should not learn of agent_id and scope only after it has
// added budget (or cost).
func TestAnEmptyMandateOrSpendBodyNamesEveryMissingField(t *testing.T) {
	s, _ := newMandateServer(t)
	admin := subToken(t, "org-a", "root", "", RoleAdmin)
	agent := subToken(t, "org-a", "runtime", "", RoleAgent)

	t.Run("create", func(t *testing.T) {
		r := do(t, s.Handler(), http.MethodPost, "/v1/mandates", admin, map[string]any{})
		r.requireProblem(t, http.StatusBadRequest, "budget", "agent_id", "scope")
	})
	t.Run("spend", func(t *testing.T) {
		r := do(t, s.Handler(), http.MethodPost, "/v1/mandates/spend", agent, map[string]any{})
		r.requireProblem(t, http.StatusBadRequest, "cost", "agent_id", "scope")
	})
}
