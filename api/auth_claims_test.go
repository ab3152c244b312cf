package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

// signRawHS signs payload, a JSON object written by hand (so that its keys
// and their order are exactly as given), with HS256.
func signRawHS(t *testing.T, secret []byte, payload string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	signing := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(payload))
	sig, err := jwt.SigningMethodHS256.Sign(signing, secret)
	require.NoError(t, err)
	return signing + "." + enc(sig)
}

// SPEC §2 names the claims Reveille reads — org_id, sub, roles, agent_id —
// and a token without org_id is a 401. Claim names are exact: a claim that
// is spelt otherwise (ORG_ID, Roles, Agent_Id — an identity provider's
// claim for another service, or a user-editable attribute it maps into the
// token) is not one of them. Go's encoding/json matches struct fields
// case-insensitively, so such a claim is read as org_id, roles or
// agent_id, and one that comes after the real claim replaces it.
func TestClaimNamesAreExact(t *testing.T) {
	s := newTestServer(t)
	exp := time.Now().Add(time.Hour).Unix()
	t.Run("ORG_ID is not org_id", func(t *testing.T) {
		tok := signRawHS(t, testSecret, fmt.Sprintf(`{"ORG_ID":"org-b","sub":"alice","roles":["admin"],"exp":%d}`, exp))
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
		require.Equal(t, http.StatusUnauthorized, r.Status, "a token without an org_id claim was taken as: %s", r.Body)
	})
	t.Run("Roles does not replace roles", func(t *testing.T) {
		tok := signRawHS(t, testSecret, fmt.Sprintf(`{"org_id":"org-a","sub":"alice","roles":["approver"],"Roles":["admin","operator"],"exp":%d}`, exp))
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, []any{RoleApprover}, r.JSON(t)["roles"], "the token's roles claim is [approver]")
	})
	t.Run("Agent_Id does not unbind agent_id", func(t *testing.T) {
		tok := signRawHS(t, testSecret, fmt.Sprintf(`{"org_id":"org-a","sub":"alice","roles":["agent"],"agent_id":"a1","Agent_Id":"","exp":%d}`, exp))
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, "a1", r.JSON(t)["agent_id"], "the token is bound to agent a1")
	})
}
