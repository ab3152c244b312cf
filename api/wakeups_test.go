package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// withWakeups adds the wake-up service with its own pool manager (handler
// "echo"; loops not started) and the mandates service if missing.
func withWakeups(t *testing.T) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		pool, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t)})
		require.NoError(t, err)
		pool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		if sv.Mandates == nil {
			sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t)})
		}
		sv.Wakeups = wakeup.New(sv.DB, pool, sv.Mandates, wakeup.Config{Logger: testkit.Logger(t)})
	}
}

// The round trip through Temporal is tested in internal/e2e; here, the
// HTTP contract at the gate.
func TestWakeupRefusalIsA402NamingBothIDs(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	body := map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "reason": "r", "cost": 5,
		"work": map[string]any{"handler": "echo", "args": map[string]any{"k": "v"}},
	}
	p := do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body).requireProblem(t, http.StatusPaymentRequired)
	wakeupID, approvalID := p["wakeup_id"].(string), p["approval_id"].(string)
	require.NotEmpty(t, approvalID)

	r := do(t, s.Handler(), http.MethodGet, "/v1/wakeups/"+wakeupID, token(t, "org-a", "agent"), nil)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	w := r.JSON(t)
	require.Equal(t, "pending", w["status"])
	require.Nil(t, w["outcome"])
	require.Equal(t, map[string]any{"id": approvalID, "state": "pending"}, w["approval"])
	require.Equal(t, map[string]any{"state": "waiting", "attempts": float64(0)}, w["delivery"])

	body["work"].(map[string]any)["handler"] = "nope"
	do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body).requireProblem(t, http.StatusBadRequest, "work.handler")
}
