package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"
)

func TestEveryErrorIsProblemJSON(t *testing.T) {
	s := newTestServer(t)
	type input struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
		Inner struct {
			Flag bool `json:"flag"`
		} `json:"inner"`
	}
	s.Echo().POST("/v1/test/bind", func(c echo.Context) error {
		var in input
		if err := bind(c, &in); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, in)
	}, s.auth.middleware)
	tok := token(t, "org-a", "admin")
	h := s.Handler()

	do(t, h, "GET", "/no/such/route", "", nil).requireProblem(t, http.StatusNotFound)
	do(t, h, "DELETE", "/v1/whoami", tok, nil).requireProblem(t, http.StatusMethodNotAllowed)
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x"`).requireProblem(t, http.StatusBadRequest, "body")
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x", "extra": 1}`).requireProblem(t, http.StatusBadRequest, "extra")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": "seven"}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": 1e40}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"inner": {"flag": "yes"}}`).requireProblem(t, http.StatusBadRequest, "inner.flag")
	do(t, h, "POST", "/v1/test/bind", tok, `{} {}`).requireProblem(t, http.StatusBadRequest, "body")
	do(t, h, "POST", "/v1/test/bind", tok, `[1]`).requireProblem(t, http.StatusBadRequest, "body")
	big := `{"name": "` + strings.Repeat("x", 2<<20) + `"}`
	do(t, h, "POST", "/v1/test/bind", tok, big).requireProblem(t, http.StatusRequestEntityTooLarge, "body")

	r := do(t, h, "POST", "/v1/test/bind", tok, `{"name": "ok", "count": 3}`)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
}

// Postgres text and jsonb hold neither NUL nor invalid UTF-8, jsonb no
// unpaired surrogate escapes and no number out of numeric's range: such
// bodies are 400s naming the field (they were 500s, or silently altered),
// and nothing is stored.
func TestBodyTextPostgresCannotStoreIs400NamingTheField(t *testing.T) {
	s := newTestServer(t, withMandates(t), withWakeups(t), withWorkpool(t))
	admin, agent := token(t, "org-a", RoleAdmin), token(t, "org-a", RoleAgent)
	wakeup := func(pool, args string) string {
		return `{"agent_id": "a1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "cost": 0,
			"pool": "` + pool + `", "work": {"handler": "echo", "args": ` + args + `}}`
	}
	cases := []struct {
		path, tok, body, field string
	}{
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"k": "a\u0000b"}}`, "args.k"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": [1, {"k": ["\u0000"]}]}`, "args[1].k[0]"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": "\u0000"}`, "args"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"s": "\ud800"}}`, "args.s"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"n": 1e131072}}`, "args.n"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"n": 1e-16384}}`, "args.n"},
		{"/v1/pools/default/work", admin, "{\"handler\": \"echo\", \"args\": {\"k\": \"a\xffb\"}}", "body"},
		{"/v1/wakeups", agent, wakeup("default", `{"k": "\u0000"}`), "work.args.k"},
		{"/v1/wakeups", agent, wakeup(`a\u0000`, `{}`), "pool"},
		{"/v1/mandates", admin, "{\"agent_id\": \"a\xff\", \"scope\": \"llm\", \"budget\": 1}", "body"},
		{"/v1/mandates/spend", agent, `{"agent_id": "a1", "scope": "llm", "cost": 1, "reason": "\u0000"}`, "reason"},
	}
	for _, tc := range cases {
		do(t, s.Handler(), http.MethodPost, tc.path, tc.tok, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
	}
	for _, table := range []string{"workpool_work", "wakeups", "mandates", "mandate_approvals"} {
		var n int
		require.NoError(t, s.svc.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		require.Zero(t, n, table)
	}
}

func TestProblemExtensionsAreTopLevel(t *testing.T) {
	p := NewProblem(http.StatusPaymentRequired, "spend-refused", "no authority").With("approval_id", "a1")
	raw, err := p.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"https://reveille.dev/problems/spend-refused","title":"Payment Required","status":402,"detail":"no authority","approval_id":"a1"}`, string(raw))
}
