package api

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Under one Idempotency-Key a wake-up whose work.args is absent (the
// handler gets {}: openapi WakeupRequest "absent: {}") and one whose
// work.args is null (the handler gets null) ask for different work: the
// second is a different request under the key, 422 (SPEC §2), from
// whichever caller it comes. From another caller of the same agent (its
// own HTTP idempotency scope; the wake-up's own key decides) it is
// replayed the first wake-up (201): jsonb.Equal counted null and
// an empty text alike, but the workpool does not (absent → {}). Found by
// review.
func TestAWakeupKeyReusedWithArgsNullWhereTheyWereAbsentIs422(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	h := s.Handler()
	admin := token(t, "org-a", RoleAdmin)
	first, second := subToken(t, "org-a", "rt-1", "", RoleAgent), subToken(t, "org-a", "rt-2", "", RoleAgent)
	createMandate(t, h, admin, "a1", "llm", 100)

	absent := `{"agent_id":"a1","workflow_id":"org-a/wf","signal":"s","scope":"llm","cost":1,"work":{"handler":"echo"}}`
	null := `{"agent_id":"a1","workflow_id":"org-a/wf","signal":"s","scope":"llm","cost":1,"work":{"handler":"echo","args":null}}`

	r := do(t, h, http.MethodPost, "/v1/wakeups", first, absent, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	var args string
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT args::text FROM workpool_work`).Scan(&args))
	require.Equal(t, "{}", args, "absent args: the handler gets {}")
	// (under another key, args null is work whose handler gets null)
	r = do(t, h, http.MethodPost, "/v1/wakeups", first, null, "Idempotency-Key", "k-other")
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	require.NoError(t, s.svc.DB.QueryRow(context.Background(),
		`SELECT w.args::text FROM workpool_work w JOIN wakeups u ON u.work_id = w.id WHERE u.idempotency_key = 'k-other'`).Scan(&args))
	require.Equal(t, "null", args, "args null: the handler gets null")

	// (the same caller: the HTTP layer compares the bodies and says 422)
	do(t, h, http.MethodPost, "/v1/wakeups", first, null, "Idempotency-Key", "k1").requireProblem(t, http.StatusUnprocessableEntity)
	// another caller of the same agent: the wake-up's own key decides
	do(t, h, http.MethodPost, "/v1/wakeups", second, null, "Idempotency-Key", "k1").requireProblem(t, http.StatusUnprocessableEntity)
}
