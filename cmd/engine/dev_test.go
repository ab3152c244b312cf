package main

import (
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
)

// engine dev's inbox link opens the page signed in as an approver that is
// not the dev user, with the token in the fragment (never sent to a server).
func TestDevInboxLinkCarriesAnApproverTokenInItsFragment(t *testing.T) {
	for _, tc := range []struct{ addr, prefix string }{
		{":8080", "http://localhost:8080/inbox#token="},
		{"127.0.0.1:9090", "http://127.0.0.1:9090/inbox#token="},
	} {
		s := settings{Addr: tc.addr, JWTSecrets: []string{firstSecret}, JWTIssuer: "iss", JWTAudience: "aud"}

		link, err := devInboxLink(s)

		require.NoError(t, err)
		require.True(t, strings.HasPrefix(link, tc.prefix), link)
		var claims api.Claims
		_, err = jwt.ParseWithClaims(strings.TrimPrefix(link, tc.prefix), &claims, func(*jwt.Token) (any, error) { return []byte(firstSecret), nil },
			jwt.WithIssuer("iss"), jwt.WithAudience("aud"), jwt.WithValidMethods([]string{"HS256"}))
		require.NoError(t, err)
		require.Equal(t, devOrg, claims.OrgID)
		require.Equal(t, devApprover, claims.Subject)
		require.NotEqual(t, "dev-user", claims.Subject, "the dev user's own requests stay answerable")
		require.Equal(t, []string{api.RoleApprover}, claims.Roles)
	}
}
