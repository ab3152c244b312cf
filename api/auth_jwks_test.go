package api

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// relayedJWKS serves the JWKS at url while up, counting the fetches it
// answers; a 503 otherwise (an identity provider having a blip).
func relayedJWKS(t *testing.T, url string, up *atomic.Bool, fetches *atomic.Int32) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fetches.Add(1)
		resp, err := http.Get(url)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A token that lacks the configured iss or aud (an identity provider whose
// audience mapping is missing: the first thing an operator wiring JWKS
// meets) is refused, and the 401 says which claim is missing, not that the
// token has no exp, which it has.
func TestAMissingIssuerOrAudienceIsNamedInThe401(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: jwksServer(t, &key.PublicKey), Issuer: "https://idp", Audience: "reveille"}
	})
	ours := with(validClaims(), "iss", "https://idp", "aud", "reveille")
	for _, tc := range []struct {
		name   string
		claims jwt.MapClaims
		detail string
	}{
		{"no aud", with(ours, "aud", nil), "token has no aud claim"},
		{"no iss", with(ours, "iss", nil), "token has no iss claim"},
		{"neither", with(ours, "iss", nil, "aud", nil), "token has no iss and aud claim"},
		{"no exp", with(ours, "exp", nil), "token has no exp claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := do(t, s.Handler(), http.MethodGet, "/v1/whoami", signES(t, key, tc.claims), nil).requireProblem(t, http.StatusUnauthorized)
			require.Equal(t, "invalid token: "+tc.detail, p["detail"])
		})
	}
}

// A failed first fetch of the JWKS (a blip while the replica started) does
// not keep tokens out once the JWKS answers: a token without a kid (an
// identity provider with one key need not send one) fetches the set as one
// with an unknown kid does. It waited for the hourly refresh.
func TestAfterAFailedFirstJWKSFetchATokenWithoutKidIsAcceptedOnceTheJWKSAnswers(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	var up atomic.Bool
	var fetches atomic.Int32
	url := relayedJWKS(t, jwksServer(t, &key.PublicKey), &up, &fetches)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: url, Issuer: "https://idp", Audience: "reveille"}
	})
	require.Zero(t, fetches.Load(), "the first fetch failed")
	up.Store(true) // the identity provider answers again

	es := jwt.NewWithClaims(jwt.SigningMethodES256, with(validClaims(), "iss", "https://idp", "aud", "reveille"))
	noKid, err := es.SignedString(key) // no kid header
	require.NoError(t, err)
	var last response
	ok := assert.Eventually(t, func() bool {
		last = do(t, s.Handler(), http.MethodGet, "/v1/whoami", noKid, nil)
		return last.Status == http.StatusOK
	}, 20*time.Second, 200*time.Millisecond)
	require.True(t, ok, "a token of the JWKS's key is still refused: %d %s", last.Status, last.Body)
}

// A token naming a kid the JWKS does not serve refetches the set at most
// every unknownKIDRefetchEvery; one that comes sooner is refused with the
// keys at hand, not held for the limiter (the library's default held it up
// to a minute, on the server's context, past the client's own timeout).
func TestATokenWithAnUnknownKidIsNotHeldForTheRefetchLimiter(t *testing.T) {
	served, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	var up atomic.Bool
	up.Store(true)
	var fetches atomic.Int32
	url := relayedJWKS(t, jwksServer(t, &served.PublicKey), &up, &fetches)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: url, Issuer: "https://idp", Audience: "reveille", unknownKIDRefetchEvery: 30 * time.Second}
	})
	require.EqualValues(t, 1, fetches.Load(), "the first fetch")
	unknownKid := func(kid string) string {
		es := jwt.NewWithClaims(jwt.SigningMethodES256, with(validClaims(), "iss", "https://idp", "aud", "reveille"))
		es.Header["kid"] = kid
		tok, err := es.SignedString(served)
		require.NoError(t, err)
		return tok
	}
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", unknownKid("gone-1"), nil).requireProblem(t, http.StatusUnauthorized)
	require.EqualValues(t, 2, fetches.Load(), "an unknown kid refetches the set")
	// The next refetch is 30 s away: past the wait a token is given, so
	// this one is refused at once, without one (held for the limiter, it
	// would have refetched when the 30 s were up).
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", unknownKid("gone-2"), nil).requireProblem(t, http.StatusUnauthorized)
	require.EqualValues(t, 2, fetches.Load(), "no refetch: the token was not held for the limiter")
}
