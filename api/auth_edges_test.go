package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

// doWithAuthorization sends one request with each given Authorization
// header, as given.
func doWithAuthorization(t *testing.T, h http.Handler, method, path string, authorization ...string) response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for _, v := range authorization {
		req.Header.Add("Authorization", v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

// Found by review, each: the request a proxy in front may have judged by
// another header than the one served, a token carrying a restriction it
// says must not be ignored, a 403 that did not say it was the access too
// little (RFC 6750 §3.1), and a weight for an org no token can name.
func TestAuthorizationEdges(t *testing.T) {
	t.Run("two Authorization headers are a 401, not the first one served", func(t *testing.T) {
		s := newTestServer(t)
		a, b := token(t, "org-a", "admin"), token(t, "org-b", "admin")
		r := doWithAuthorization(t, s.Handler(), http.MethodGet, "/v1/whoami", "Bearer "+a, "Bearer "+b)
		r.requireProblem(t, http.StatusUnauthorized)
		require.Contains(t, string(r.Body), "two Authorization headers")
		require.Equal(t, `Bearer realm="reveille", error="invalid_request"`, r.Header.Get("WWW-Authenticate"))
	})
	t.Run("a token naming critical header extensions is a 401 (RFC 7515 §4.1.11)", func(t *testing.T) {
		s := newTestServer(t)
		tk := jwt.NewWithClaims(jwt.SigningMethodHS256, validClaims())
		tk.Header["crit"] = []string{"https://issuer.example/bound-to-mtls-cert"}
		tk.Header["https://issuer.example/bound-to-mtls-cert"] = "x5t#S256-of-a-client-cert"
		raw, err := tk.SignedString(testSecret)
		require.NoError(t, err)
		r := doWithAuthorization(t, s.Handler(), http.MethodGet, "/v1/whoami", "Bearer "+raw)
		r.requireProblem(t, http.StatusUnauthorized)
		require.Contains(t, string(r.Body), "crit")
	})
	t.Run("a 403 for a missing role says insufficient_scope", func(t *testing.T) {
		f := newPoolsFixture(t)
		r := do(t, f.h, http.MethodGet, "/v1/pools", token(t, "org-a", "agent"), nil)
		r.requireProblem(t, http.StatusForbidden)
		require.Equal(t, `Bearer realm="reveille", error="insufficient_scope"`, r.Header.Get("WWW-Authenticate"))
	})
	t.Run("org_weights naming an org with a control character is a 400 naming it", func(t *testing.T) {
		f := newPoolsFixture(t)
		key := "org-a\u0007"
		do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"org_weights": map[string]any{key: 3}}).
			requireProblem(t, http.StatusBadRequest, "org_weights."+key)
	})
	// (a review of the fix found the weight's removal refused too)
	t.Run("a weight stored for such an org before they were refused can still be removed alone", func(t *testing.T) {
		f := newPoolsFixture(t)
		legacy := "org-a\u0007"
		_, err := f.s.svc.DB.Exec(context.Background(),
			`INSERT INTO workpool_org_weights (pool, org_id, weight) VALUES ('default', $1, 3), ('default', 'org-keep', 5)`, legacy)
		require.NoError(t, err)
		r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"org_weights": map[string]any{}})
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		require.Contains(t, r.JSON(t)["org_weights"], legacy, "the stored weight is shown to the operator")
		for _, remove := range []any{nil, 1} {
			r = do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"org_weights": map[string]any{legacy: remove}})
			require.Equal(t, http.StatusOK, r.Status, "removing the shown weight with %v: %s", remove, r.Body)
			require.Equal(t, map[string]any{"org-keep": 5.0}, r.JSON(t)["org_weights"])
		}
	})
}
