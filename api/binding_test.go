package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Idempotency-Key replay runs before the handler: a key shared across
// agents would hand agent-a2 agent-a1's answer (here: what its mandate has
// left) and a success the handler refuses it.
func TestAnotherAgentsIdempotencyKeyReplaysNothingToABoundToken(t *testing.T) {
	s := newTestServer(t, withMandates(t), withWakeups(t))
	h := s.Handler()
	createMandate(t, h, token(t, "org-a", "admin"), "agent-a1", "llm", 100)
	a1 := subToken(t, "org-a", "a1-runtime", "agent-a1", RoleAgent)
	a2 := subToken(t, "org-a", "a2-runtime", "agent-a2", RoleAgent)
	spendA1 := `{"agent_id":"agent-a1","scope":"llm","cost":5}`
	wakeA1 := map[string]any{"agent_id": "agent-a1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "cost": 1,
		"work": map[string]any{"handler": "echo"}}

	first := do(t, h, http.MethodPost, "/v1/mandates/spend", a1, spendA1, "Idempotency-Key", "k-spend")
	require.Equal(t, http.StatusOK, first.Status, "body: %s", first.Body)
	created := do(t, h, http.MethodPost, "/v1/wakeups", a1, wakeA1, "Idempotency-Key", "k-wake")
	require.Equal(t, http.StatusCreated, created.Status, "body: %s", created.Body)

	for _, tc := range []struct {
		path, key string
		body      any
	}{
		{"/v1/mandates/spend", "k-spend", spendA1},
		{"/v1/wakeups", "k-wake", wakeA1},
	} {
		withKey := do(t, h, http.MethodPost, tc.path, a2, tc.body, "Idempotency-Key", tc.key)
		without := do(t, h, http.MethodPost, tc.path, a2, tc.body)
		withKey.requireProblem(t, http.StatusForbidden)
		require.Equal(t, without.Status, withKey.Status, "the key changes nothing: %s", withKey.Body)
		require.JSONEq(t, string(without.Body), string(withKey.Body))
		require.Empty(t, withKey.Header.Get("Idempotent-Replayed"))
	}

	t.Run("the agent's own retry is still replayed", func(t *testing.T) {
		again := do(t, h, http.MethodPost, "/v1/mandates/spend", a1, spendA1, "Idempotency-Key", "k-spend")
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		require.JSONEq(t, string(first.Body), string(again.Body))
	})
	t.Run("the key with the agent's own request acts as if it were new", func(t *testing.T) {
		// Domain keys (the spend's, the wake-up's) are per (org, agent, key):
		// another agent's key is fresh to this agent, so the answer is the
		// one it would get without the key — nothing of the first leaks, not
		// even that the key exists.
		createMandate(t, h, token(t, "org-a", "admin"), "agent-a2", "llm", 100)
		// Keys agent-a1 used and agent-a2 never did (a2's own earlier use of
		// a key with another body would rightly be its own 422).
		require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/mandates/spend", a1, spendA1, "Idempotency-Key", "k-spend-2").Status)
		wakeOfA1 := do(t, h, http.MethodPost, "/v1/wakeups", a1, wakeA1, "Idempotency-Key", "k-wake-2")
		require.Equal(t, http.StatusCreated, wakeOfA1.Status, "body: %s", wakeOfA1.Body)
		spendA2 := `{"agent_id":"agent-a2","scope":"llm","cost":5}`
		r := do(t, h, http.MethodPost, "/v1/mandates/spend", a2, spendA2, "Idempotency-Key", "k-spend-2")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, true, r.JSON(t)["ok"])
		require.EqualValues(t, 95, r.JSON(t)["remaining"])
		require.Empty(t, r.Header.Get("Idempotent-Replayed"))

		wakeA2 := map[string]any{"agent_id": "agent-a2", "workflow_id": "org-a/wf2", "signal": "wake", "scope": "llm", "cost": 1,
			"work": map[string]any{"handler": "echo"}}
		w := do(t, h, http.MethodPost, "/v1/wakeups", a2, wakeA2, "Idempotency-Key", "k-wake-2")
		require.Equal(t, http.StatusCreated, w.Status, "body: %s", w.Body)
		require.NotEqual(t, wakeOfA1.JSON(t)["id"], w.JSON(t)["id"], "a wake-up of its own, not agent-a1's")
		own := do(t, h, http.MethodGet, "/v1/wakeups/"+w.JSON(t)["id"].(string), a2, nil)
		require.Equal(t, http.StatusOK, own.Status, "body: %s", own.Body)
		require.Equal(t, "agent-a2", own.JSON(t)["agent_id"])
	})
	m := do(t, h, http.MethodGet, "/v1/mandates?agent_id=agent-a1", token(t, "org-a", "admin"), nil).JSON(t)["items"].([]any)[0].(map[string]any)
	require.EqualValues(t, 12, m["spent"], "two spends and two wake-ups of agent-a1, nothing else")
}

// Work has an agent only through the wake-up that enqueued it: plain work,
// which an admin enqueues outside the mandate gate, is nobody's, so a token
// bound to an agent sees it as absent — and cannot enqueue it or read the
// org's pools.
func TestATokenBoundToAnAgentSeesPlainWorkAsAbsent(t *testing.T) {
	f := newIsoFixture(t)
	h, a1 := f.s.Handler(), f.tokens["a1"] // bound to the agent whose wake-up enqueued f.a.ids["work"]

	for _, suffix := range []string{"", "/cancel"} {
		method := map[string]string{"": http.MethodGet, "/cancel": http.MethodPost}[suffix]
		plain := do(t, h, method, "/v1/work/"+f.a.ids["plainWork"]+suffix, a1, nil)
		absent := do(t, h, method, "/v1/work/"+f.absent.ids["plainWork"]+suffix, a1, nil)
		plain.requireProblem(t, http.StatusNotFound)
		require.JSONEq(t, string(absent.Body), string(plain.Body))
	}
	require.Equal(t, http.StatusOK, do(t, h, http.MethodGet, "/v1/work/"+f.a.ids["work"], a1, nil).Status, "its own wake-up's work")
	require.Equal(t, http.StatusOK, do(t, h, http.MethodGet, "/v1/work/"+f.a.ids["plainWork"], f.tokens["adminA"], nil).Status,
		"an unbound admin sees plain work")
	p := do(t, h, http.MethodPost, "/v1/pools/default/work", a1, map[string]any{"handler": "echo"}).requireProblem(t, http.StatusForbidden)
	require.Contains(t, p["detail"], "bound to agent")
	do(t, h, http.MethodGet, "/v1/pools", a1, nil).requireProblem(t, http.StatusForbidden)
	st := do(t, h, http.MethodGet, "/v1/work/"+f.a.ids["plainWork"], f.tokens["adminA"], nil).JSON(t)
	require.Equal(t, "pending", st["state"], "the bound token's cancel did nothing")
}

// Approvers are people: an approver role on a token bound to an agent
// resolves nothing, its agent's own requests included.
func TestATokenBoundToAnAgentNeverResolvesAnApproval(t *testing.T) {
	f := newIsoFixture(t)
	h := f.s.Handler()
	for _, action := range []string{"approve", "deny"} {
		p := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+f.a.ids["approval"]+"/"+action, f.tokens["a1"], `{}`).
			requireProblem(t, http.StatusForbidden)
		require.Contains(t, p["detail"], "approvers are people")
	}
	a := do(t, h, http.MethodGet, "/v1/mandate-approvals/"+f.a.ids["approval"], f.tokens["allA"], nil).JSON(t)
	require.Equal(t, "pending", a["state"])
}
