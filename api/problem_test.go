package api

import (
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
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x"`).requireProblem(t, http.StatusBadRequest)
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x", "extra": 1}`).requireProblem(t, http.StatusBadRequest, "extra")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": "seven"}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": 1e40}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"inner": {"flag": "yes"}}`).requireProblem(t, http.StatusBadRequest, "inner.flag")
	do(t, h, "POST", "/v1/test/bind", tok, `{} {}`).requireProblem(t, http.StatusBadRequest)
	do(t, h, "POST", "/v1/test/bind", tok, `[1]`).requireProblem(t, http.StatusBadRequest)
	big := `{"name": "` + strings.Repeat("x", 2<<20) + `"}`
	do(t, h, "POST", "/v1/test/bind", tok, big).requireProblem(t, http.StatusRequestEntityTooLarge)

	r := do(t, h, "POST", "/v1/test/bind", tok, `{"name": "ok", "count": 3}`)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
}

func TestProblemExtensionsAreTopLevel(t *testing.T) {
	p := NewProblem(http.StatusPaymentRequired, "spend-refused", "no authority").With("approval_id", "a1")
	raw, err := p.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"https://reveille.dev/problems/spend-refused","title":"Payment Required","status":402,"detail":"no authority","approval_id":"a1"}`, string(raw))
}
