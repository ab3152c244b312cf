package api

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

var fuzzSecrets = [][]byte{
	[]byte("fuzz-secret-one-fuzz-secret-one-0123456"),
	[]byte("fuzz-secret-two-fuzz-secret-two-0123456"),
}

// FuzzTokenParse feeds the token parser arbitrary strings, and tokens whose
// claims are arbitrary bytes signed with one of the configured secrets (so
// that the fuzzer reaches the claim checks, not only the signature check).
// Whatever it is fed, verify never panics, never accepts a token whose
// signature does not verify under one of the secrets (checked here with
// crypto/hmac, independently of the JWT library), and never yields a
// principal without an org_id, with an identity claim (org_id, sub,
// agent_id) that is blank, longer than maxIdentityClaim bytes or holds NUL,
// or with a role it may not hold.
//
// It needs no database: run it with REVEILLE_TEST_DATABASE_URL set to any
// value, e.g.
//
//	REVEILLE_TEST_DATABASE_URL=unused go test ./api -run '^$' -fuzz FuzzTokenParse
func FuzzTokenParse(f *testing.F) {
	a, err := newAuthenticator(context.Background(), AuthConfig{Secrets: fuzzSecrets, OperatorOrgs: []string{"ops-org"}})
	require.NoError(f, err)
	far := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	claims := []string{
		`{"org_id":"org-a","sub":"alice","roles":["admin","agent"],"exp":` + itoa(far) + `}`,
		`{"org_id":"ops-org","sub":"ops","roles":["operator","operator","bogus"],"agent_id":"a1","exp":` + itoa(far) + `}`,
		`{"org_id":"org-a","roles":["operator"],"exp":` + itoa(far) + `}`,
		`{"org_id":"","exp":` + itoa(far) + `}`,
		`{"org_id":7,"exp":` + itoa(far) + `}`,
		`{"org_id":"org-a","roles":"admin","exp":` + itoa(far) + `}`,
		`{"org_id":"org-a","exp":"tomorrow"}`,
		`{"org_id":"org-a","exp":1}`,
		`{"org_id":"org-a","exp":` + itoa(far) + `,"nbf":` + itoa(far) + `}`,
		`{"org_id":"org-a"}`,
		`{"org_id":"` + strings.Repeat("o", 256) + `","exp":` + itoa(far) + `}`,
		`{"org_id":"org-a","sub":" ","agent_id":"a\u0000","exp":` + itoa(far) + `}`,
		`[]`, `null`, ``,
	}
	for i, c := range claims {
		tok := signPayload(fuzzSecrets[i%2], []byte(c))
		f.Add(tok, []byte(c), uint8(i))
		// Mutations of a signed token: another secret, no signature, a
		// flipped byte, alg none, a header that asks for another algorithm.
		head, rest, _ := strings.Cut(tok, ".")
		f.Add(head+"."+rest[:strings.LastIndex(rest, ".")]+".", []byte(c), uint8(i))
		f.Add(tok[:len(tok)-2]+"A"+tok[len(tok)-1:], []byte(c), uint8(i))
		f.Add(segment(`{"alg":"none","typ":"JWT"}`)+"."+rest[:strings.LastIndex(rest, ".")]+".", []byte(c), uint8(i))
		f.Add(segment(`{"alg":"HS384","typ":"JWT"}`)+"."+rest, []byte(c), uint8(i))
	}
	f.Add("", []byte(nil), uint8(0))
	f.Add("a.b.c", []byte("{}"), uint8(1))
	f.Add("....", []byte("{"), uint8(2))

	f.Fuzz(func(t *testing.T, raw string, payload []byte, secret uint8) {
		checkVerify(t, a, raw)
		checkVerify(t, a, signPayload(fuzzSecrets[int(secret)%len(fuzzSecrets)], payload))
	})
}

// checkVerify asserts the parser's guarantees for one input.
func checkVerify(t *testing.T, a *authenticator, raw string) {
	p, err := a.verify(raw)
	if err != nil {
		require.Equal(t, Principal{}, p, "a refused token yields no principal")
		return
	}
	parts := strings.Split(raw, ".")
	require.Len(t, parts, 3, "accepted %q", raw)
	header, err := base64.RawURLEncoding.DecodeString(parts[0])
	require.NoError(t, err)
	var h struct {
		Alg string `json:"alg"`
	}
	require.NoError(t, json.Unmarshal(header, &h))
	require.Equal(t, "HS256", h.Alg, "accepted %q", raw)
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	require.NoError(t, err, "accepted %q", raw)
	require.True(t, slices.ContainsFunc(fuzzSecrets, func(secret []byte) bool {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(parts[0] + "." + parts[1]))
		return hmac.Equal(mac.Sum(nil), sig)
	}), "accepted a token no secret signed: %q", raw)

	require.NotEmpty(t, p.OrgID, "accepted %q", raw)
	for _, v := range []string{p.OrgID, p.Sub, p.AgentID} {
		require.LessOrEqual(t, len(v), maxIdentityClaim, "accepted %q", raw)
		require.False(t, v != "" && strings.TrimSpace(v) == "", "a blank identity claim: accepted %q", raw)
		require.NotContains(t, v, "\x00", "accepted %q", raw)
	}
	for i, r := range p.Roles {
		require.Contains(t, AllRoles, r)
		require.NotContains(t, p.Roles[:i], r, "a role twice")
		if r == RoleOperator {
			require.Equal(t, "ops-org", p.OrgID, "operator counts only for operator orgs")
		}
	}
}

// signPayload makes an HS256 token of arbitrary claim bytes.
func signPayload(secret, payload []byte) string {
	text := segment(`{"alg":"HS256","typ":"JWT"}`) + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig, err := jwt.SigningMethodHS256.Sign(text, secret)
	if err != nil {
		panic(err) // HMAC signing of bytes cannot fail
	}
	return text + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// segment is s as a JWT segment (base64url, unpadded).
func segment(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
