package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

func signHS(t *testing.T, secret []byte, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	require.NoError(t, err)
	return s
}

func validClaims() jwt.MapClaims {
	return jwt.MapClaims{"org_id": "org-a", "sub": "alice", "roles": []string{"admin"}, "exp": time.Now().Add(time.Hour).Unix()}
}

func with(c jwt.MapClaims, kv ...any) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

func unsigned(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	return s
}

func TestTokensThatAreRejected(t *testing.T) {
	s := newTestServer(t, func(c *Config, _ *Services) { c.Auth.Issuer, c.Auth.Audience = "https://issuer", "reveille" })
	good := with(validClaims(), "iss", "https://issuer", "aud", "reveille")
	cases := []struct {
		name, token string
		detail      string // what the 401 says (when set)
	}{
		{"no token", "", ""},
		{"alg none", unsigned(t, good), "invalid token: token's algorithm (alg) is not allowed"},
		{"bad signature", signHS(t, []byte("another-secret-another-secret-0123456"), good), "invalid token: signature is invalid"},
		{"roles not a list", signHS(t, testSecret, with(good, "roles", "admin")), "invalid token: the roles claim has the wrong type"},
		{"org_id a number", signHS(t, testSecret, with(good, "org_id", 7)), "invalid token: the org_id claim has the wrong type"},
		{"expired", signHS(t, testSecret, with(good, "exp", time.Now().Add(-time.Hour).Unix())), ""},
		{"no exp", signHS(t, testSecret, with(good, "exp", nil)), ""},
		{"nbf in the future", signHS(t, testSecret, with(good, "nbf", time.Now().Add(time.Hour).Unix())), ""},
		{"missing org_id", signHS(t, testSecret, with(good, "org_id", nil)), ""},
		{"wrong iss", signHS(t, testSecret, with(good, "iss", "https://evil")), ""},
		{"wrong aud", signHS(t, testSecret, with(good, "aud", "someone-else")), ""},
		{"garbage", "not.a.jwt", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tc.token, nil)
			p := r.requireProblem(t, http.StatusUnauthorized)
			if tc.detail != "" {
				require.Equal(t, tc.detail, p["detail"])
			}
			// RFC 6750 §3: the scheme to use, and whether the token sent was at fault
			want := `Bearer realm="reveille", error="invalid_token"`
			if tc.token == "" {
				want = `Bearer realm="reveille"`
			}
			require.Equal(t, want, r.Header.Get("WWW-Authenticate"))
		})
	}
	t.Run("valid token returns the principal", func(t *testing.T) {
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", signHS(t, testSecret, with(good, "agent_id", "agent-7")), nil)
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		require.JSONEq(t, `{"org_id":"org-a","sub":"alice","roles":["admin"],"agent_id":"agent-7"}`, string(r.Body))
	})
}

// The identity claims ride in every query, key and NOTIFY payload (a
// stream's carries the org id, and Postgres refuses one over 8000 bytes):
// a token whose org_id, sub or agent_id is blank, longer than 255 bytes or
// holds NUL is refused as the other bad tokens are, naming the claim.
func TestATokenWithABlankOrOverlongIdentityClaimIs401NamingIt(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	agent := with(validClaims(), "roles", []string{RoleAgent})
	cases := []struct {
		name   string
		claims jwt.MapClaims
		detail string
	}{
		{"an 8 KB org_id", with(agent, "org_id", strings.Repeat("o", 8000)), "the org_id claim is 8000 bytes long; at most 255 are allowed"},
		{"a 256-byte org_id", with(agent, "org_id", strings.Repeat("o", 256)), "the org_id claim is 256 bytes long; at most 255 are allowed"},
		{"an empty org_id", with(agent, "org_id", ""), "token has no org_id claim"},
		{"a whitespace-only org_id", with(agent, "org_id", " \t "), "the org_id claim is blank"},
		{"an org_id with NUL", with(agent, "org_id", "org\x00a"), "the org_id claim holds NUL"},
		{"an org_id with DEL", with(agent, "org_id", "acme\x7f"), "the org_id claim holds a control character"},
		{"a sub with a newline", with(agent, "sub", "alice\nadmin"), "the sub claim holds a control character"},
		{"a 256-byte sub", with(agent, "sub", strings.Repeat("s", 256)), "the sub claim is 256 bytes long; at most 255 are allowed"},
		{"a whitespace-only sub", with(agent, "sub", "  "), "the sub claim is blank"},
		{"a 256-byte agent_id", with(agent, "agent_id", strings.Repeat("a", 256)), "the agent_id claim is 256 bytes long; at most 255 are allowed"},
		{"a whitespace-only agent_id", with(agent, "agent_id", "\n"), "the agent_id claim is blank"},
		// (read as absent, it bound the token to no agent: the whole org)
		{"an empty agent_id", with(agent, "agent_id", ""), "the agent_id claim is empty (a token bound to no agent leaves it out)"},
		{"an agent_id of ..", with(agent, "agent_id", ".."), `the agent_id claim is "..": it must not be "." or ".." (URL clients remove them as path segments)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := signHS(t, testSecret, tc.claims)
			for _, route := range []struct{ method, path string }{
				{http.MethodGet, "/v1/whoami"},
				{http.MethodPost, streamBase + "out/close"}, // an 8 KB org_id was a 500 here (NOTIFY)
			} {
				r := do(t, s.Handler(), route.method, route.path, tok, nil)
				p := r.requireProblem(t, http.StatusUnauthorized)
				require.Equal(t, "invalid token: "+tc.detail, p["detail"])
				require.Equal(t, `Bearer realm="reveille", error="invalid_token"`, r.Header.Get("WWW-Authenticate"))
			}
		})
	}
	t.Run("255 bytes each is a principal, whose streams close", func(t *testing.T) {
		org, sub, agentID := strings.Repeat("o", 255), strings.Repeat("s", 255), strings.Repeat("a", 255)
		tok := signHS(t, testSecret, with(agent, "org_id", org, "sub", sub, "agent_id", agentID))
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, map[string]any{"org_id": org, "sub": sub, "roles": []any{RoleAgent}, "agent_id": agentID}, r.JSON(t))
		require.Equal(t, http.StatusCreated, s.post(t, tok, "out", []byte("x")).Status)
		s.closeStream(t, tok, "out")
		require.Equal(t, map[string]any{"tail_index": 0.0, "done": true}, s.info(t, tok, "out"))
	})
}

// SignToken (behind `engine token`) refuses what the server would refuse,
// naming the claim, so a bad token shows where it is minted.
func TestSignTokenRefusesATokenTheServerWouldRefuse(t *testing.T) {
	ok := TokenSpec{OrgID: "org-a", Sub: "alice", Roles: []string{RoleAgent}, TTL: time.Hour}
	cases := []struct {
		name string
		edit func(*TokenSpec)
		want string
	}{
		{"no org", func(s *TokenSpec) { s.OrgID = "" }, "token has no org_id claim"},
		{"a 256-byte org", func(s *TokenSpec) { s.OrgID = strings.Repeat("o", 256) }, "the org_id claim is 256 bytes long; at most 255 are allowed"},
		{"a blank sub", func(s *TokenSpec) { s.Sub = " " }, "the sub claim is blank"},
		{"an agent with NUL", func(s *TokenSpec) { s.AgentID = "a\x00" }, "the agent_id claim holds NUL"},
		{"an agent of .", func(s *TokenSpec) { s.AgentID = "." }, `the agent_id claim is ".": it must not be "." or ".." (URL clients remove them as path segments)`},
		{"a zero lifetime", func(s *TokenSpec) { s.TTL = 0 }, "the token's lifetime is 0s; it must be positive"},
		{"a negative lifetime", func(s *TokenSpec) { s.TTL = -time.Minute }, "the token's lifetime is -1m0s; it must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := ok
			tc.edit(&spec)
			tok, err := SignToken(testSecret, spec)
			require.EqualError(t, err, tc.want)
			require.Empty(t, tok)
		})
	}
	tok, err := SignToken(testSecret, ok)
	require.NoError(t, err)
	s := newTestServer(t)
	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).Status)
}

func TestHS256TokenIsRejectedWhenOnlyJWKSIsConfigured(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	jwks := jwksServer(t, &key.PublicKey)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: jwks, Issuer: "https://idp", Audience: "reveille"}
	})
	claims := with(validClaims(), "iss", "https://idp", "aud", "reveille")

	r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", signES(t, key, claims), nil)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))

	// Algorithm confusion: an HS256 token "signed" with the public key bytes.
	pub, err := key.PublicKey.Bytes() // bytes an attacker could know
	require.NoError(t, err)
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	hs.Header["kid"] = "k1"
	forged, err := hs.SignedString(pub)
	require.NoError(t, err)
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", forged, nil).requireProblem(t, http.StatusUnauthorized)
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", unsigned(t, claims), nil).requireProblem(t, http.StatusUnauthorized)
}

func signES(t *testing.T, key *ecdsa.PrivateKey, claims jwt.MapClaims) string {
	t.Helper()
	es := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	es.Header["kid"] = "k1"
	tok, err := es.SignedString(key)
	require.NoError(t, err)
	return tok
}

// The identity provider's keys sign tokens for its other services too:
// only our issuer and audience get in.
func TestJWKSAcceptsOnlyTokensForItsIssuerAndAudience(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	jwks := jwksServer(t, &key.PublicKey)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: jwks, Issuer: "https://idp", Audience: "reveille"}
	})
	ours := with(validClaims(), "iss", "https://idp", "aud", "reveille")
	for name, claims := range map[string]jwt.MapClaims{
		"another service's audience": with(ours, "aud", "billing"),
		"no audience":                with(ours, "aud", nil),
		"another issuer":             with(ours, "iss", "https://other-idp"),
		"no issuer":                  with(ours, "iss", nil),
	} {
		t.Run(name, func(t *testing.T) {
			do(t, s.Handler(), http.MethodGet, "/v1/whoami", signES(t, key, claims), nil).requireProblem(t, http.StatusUnauthorized)
		})
	}
	r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", signES(t, key, with(ours, "aud", []string{"billing", "reveille"})), nil)
	require.Equal(t, http.StatusOK, r.Status, "a token for several audiences, ours among them: %s", r.Body)
}

func TestJWKSWithoutIssuerOrAudienceIsRefused(t *testing.T) {
	for _, cfg := range []AuthConfig{
		{JWKSURL: "http://127.0.0.1:1/jwks"},
		{JWKSURL: "http://127.0.0.1:1/jwks", Issuer: "https://idp"},
		{JWKSURL: "http://127.0.0.1:1/jwks", Audience: "reveille"},
	} {
		_, err := newAuthenticator(context.Background(), cfg)
		require.ErrorContains(t, err, "REVEILLE_JWKS_URL needs")
		if cfg.Issuer == "" {
			require.ErrorContains(t, err, "REVEILLE_JWT_ISSUER")
		}
		if cfg.Audience == "" {
			require.ErrorContains(t, err, "REVEILLE_JWT_AUDIENCE")
		}
	}
}

// Rotation: while two secrets are configured, tokens signed with either
// verify; once the old one is dropped, its tokens do not.
func TestEverySecretVerifiesSoASecretRotatesWithoutDowntime(t *testing.T) {
	oldSecret, newSecret := testSecret, []byte("the-new-secret-the-new-secret-0123456789")
	signedWith := func(secret []byte) string { return signHS(t, secret, validClaims()) }
	both := newTestServer(t, func(c *Config, _ *Services) { c.Auth.Secrets = [][]byte{newSecret, oldSecret} })
	for name, tok := range map[string]string{"old": signedWith(oldSecret), "new": signedWith(newSecret)} {
		r := do(t, both.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s secret: %s", name, r.Body)
	}
	do(t, both.Handler(), http.MethodGet, "/v1/whoami", signedWith([]byte("neither-secret-neither-secret-0123456789")), nil).
		requireProblem(t, http.StatusUnauthorized)

	rotated := newTestServer(t, func(c *Config, _ *Services) { c.Auth.Secrets = [][]byte{newSecret} })
	require.Equal(t, http.StatusOK, do(t, rotated.Handler(), http.MethodGet, "/v1/whoami", signedWith(newSecret), nil).Status)
	do(t, rotated.Handler(), http.MethodGet, "/v1/whoami", signedWith(oldSecret), nil).requireProblem(t, http.StatusUnauthorized)
}

func jwksServer(t *testing.T, pub *ecdsa.PublicKey) string {
	t.Helper()
	point, err := pub.Bytes() // 0x04 || X || Y
	require.NoError(t, err)
	b64 := base64.RawURLEncoding.EncodeToString
	body, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig", "x": b64(point[1:33]), "y": b64(point[33:65]),
	}}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRolesAndAgentBinding(t *testing.T) {
	s := newTestServer(t)
	e := s.Echo()
	g := e.Group("/v1/test", s.auth.middleware)
	g.POST("/admin-only", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) }, requireRole(RoleAdmin))
	g.POST("/as-agent", func(c echo.Context) error {
		var in struct {
			AgentID string `json:"agent_id"`
		}
		if err := bind(c, &in); err != nil {
			return err
		}
		if err := checkAgent(c, "agent_id", in.AgentID); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	}, requireRole(RoleAgent))
	g.PATCH("/operator", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) }, requireRole(RoleOperator))

	agentTok := signHS(t, testSecret, with(validClaims(), "roles", []string{"agent"}, "agent_id", "a1"))
	require.Equal(t, http.StatusNoContent, do(t, s.Handler(), "POST", "/v1/test/admin-only", token(t, "o", "admin"), nil).Status)
	do(t, s.Handler(), "POST", "/v1/test/admin-only", token(t, "o", "agent", "approver"), nil).requireProblem(t, http.StatusForbidden)
	require.Equal(t, http.StatusNoContent, do(t, s.Handler(), "POST", "/v1/test/as-agent", agentTok, map[string]string{"agent_id": "a1"}).Status)
	do(t, s.Handler(), "POST", "/v1/test/as-agent", agentTok, map[string]string{"agent_id": "a2"}).requireProblem(t, http.StatusForbidden)
	require.Equal(t, http.StatusNoContent, do(t, s.Handler(), "POST", "/v1/test/as-agent", token(t, "o", "agent"), map[string]string{"agent_id": "any"}).Status,
		"a token without agent_id may act as any agent of its org")

	// operator counts only for operator orgs, and a 403 says so to a token
	// that claims it elsewhere.
	require.Equal(t, http.StatusNoContent, do(t, s.Handler(), "PATCH", "/v1/test/operator", token(t, "ops-org", "operator"), nil).Status)
	p := do(t, s.Handler(), "PATCH", "/v1/test/operator", token(t, "org-a", "operator"), nil).requireProblem(t, http.StatusForbidden)
	require.Equal(t, `this route needs the role operator; the token's operator role counts only in an operator org (REVEILLE_OPERATOR_ORGS), and "org-a" is not one`, p["detail"])
	p = do(t, s.Handler(), "PATCH", "/v1/test/operator", token(t, "org-a", "admin"), nil).requireProblem(t, http.StatusForbidden)
	require.Equal(t, "this route needs the role operator", p["detail"])
}

func TestAuthConfigIsValidated(t *testing.T) {
	ctx := context.Background()
	_, err := newAuthenticator(ctx, AuthConfig{})
	require.ErrorContains(t, err, "REVEILLE_JWT_SECRET")
	_, err = newAuthenticator(ctx, AuthConfig{Secrets: [][]byte{[]byte("short")}})
	require.ErrorContains(t, err, "32 bytes")
	_, err = newAuthenticator(ctx, AuthConfig{Secrets: [][]byte{testSecret, []byte("short")}})
	require.ErrorContains(t, err, "secret 2 of 2 has 5", "every secret, not only the first, is long enough")
	_, err = newAuthenticator(ctx, AuthConfig{Secrets: [][]byte{testSecret}, JWKSURL: "http://x"})
	require.ErrorContains(t, err, "not both")
}

// In JWKS mode only the served keys sign: a token from another key is
// refused whether it claims the served key's kid or a kid the set lacks.
func TestJWKSRefusesATokenSignedByAKeyItDoesNotServe(t *testing.T) {
	served, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	stranger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.Auth = AuthConfig{JWKSURL: jwksServer(t, &served.PublicKey), Issuer: "https://idp", Audience: "reveille"}
	})
	claims := with(validClaims(), "iss", "https://idp", "aud", "reveille")
	signedAs := func(key *ecdsa.PrivateKey, kid string) string {
		es := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
		es.Header["kid"] = kid
		tok, err := es.SignedString(key)
		require.NoError(t, err)
		return tok
	}
	for name, tok := range map[string]string{
		"the served kid":              signedAs(stranger, "k1"),
		"an unknown kid":              signedAs(stranger, "k2"),
		"no kid":                      signedAs(stranger, ""),
		"the served key, another kid": signedAs(served, "k2"),
	} {
		t.Run(name, func(t *testing.T) {
			do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).requireProblem(t, http.StatusUnauthorized)
		})
	}
	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/whoami", signedAs(served, "k1"), nil).Status)
}

// A JWKS endpoint that does not answer holds the start (the first fetch,
// before the API listens) for one fetch timeout, not the library's
// default minute with nothing listening; the authenticator then refuses
// tokens until a refresh gets the keys.
func TestAJWKSThatDoesNotAnswerHoldsTheStartOneFetchTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	made := make(chan error, 1)
	go func() {
		_, err := newAuthenticator(ctx, AuthConfig{JWKSURL: "http://" + ln.Addr().String() + "/jwks", Issuer: "https://idp", Audience: "reveille"})
		made <- err
	}()
	select {
	case err := <-made:
		require.NoError(t, err, "the start goes on; tokens are refused until a refresh succeeds")
	case <-time.After(6 * jwksFetchTimeout):
		t.Fatalf("the start still waits for the JWKS after %s", 6*jwksFetchTimeout)
	}
}
