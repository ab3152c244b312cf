package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"
)

// Roles a token may carry (SPEC §2). They are not hierarchical.
const (
	RoleAdmin    = "admin"
	RoleAgent    = "agent"
	RoleApprover = "approver"
	RoleOperator = "operator"
)

// AllRoles lists every role, in a stable order.
var AllRoles = []string{RoleAdmin, RoleAgent, RoleApprover, RoleOperator}

// AuthConfig says how bearer tokens are verified: with Secrets or with
// JWKSURL, not both.
type AuthConfig struct {
	// Secrets are the HS256 keys, each at least 32 bytes
	// (REVEILLE_JWT_SECRET, comma-separated). A token signed with any of them
	// verifies, so a secret is rotated without downtime: add the new one
	// second, then move it first (it signs from then on), then drop the old
	// one once the tokens it signed have expired.
	Secrets [][]byte
	// JWKSURL serves the public keys for RS256, ES256 and EdDSA tokens. It
	// needs Issuer and Audience: an identity provider signs tokens for other
	// services with the same keys, and only iss and aud tell ours apart.
	JWKSURL string
	// Issuer and Audience must match the token's iss and aud (with Secrets:
	// when set).
	Issuer   string
	Audience string
	// OperatorOrgs are the orgs whose operator role counts.
	OperatorOrgs []string

	// unknownKIDRefetchEvery is the least time between the JWKS refetches
	// that tokens with an unknown kid cause (0: jwksUnknownKIDRefetchEvery;
	// tests shorten it).
	unknownKIDRefetchEvery time.Duration
}

// minSecret is the shortest HS256 key accepted: HMAC-SHA256's block of
// strength, so that a secret cannot be guessed offline from one token.
const minSecret = 32

// Validate reports a configuration that cannot verify tokens safely.
func (c AuthConfig) Validate() error {
	switch {
	case len(c.Secrets) > 0 && c.JWKSURL != "":
		return errors.New("auth: set either REVEILLE_JWT_SECRET or REVEILLE_JWKS_URL, not both")
	case len(c.Secrets) > 0:
		for i, secret := range c.Secrets {
			if len(secret) < minSecret {
				return fmt.Errorf("auth: REVEILLE_JWT_SECRET must be at least %d bytes: secret %d of %d has %d", minSecret, i+1, len(c.Secrets), len(secret))
			}
		}
	case c.JWKSURL != "":
		var missing []string
		if c.Issuer == "" {
			missing = append(missing, "REVEILLE_JWT_ISSUER")
		}
		if c.Audience == "" {
			missing = append(missing, "REVEILLE_JWT_AUDIENCE")
		}
		if len(missing) > 0 {
			return fmt.Errorf("auth: REVEILLE_JWKS_URL needs %s: an identity provider's keys sign tokens for other services too, "+
				"and only the issuer and audience keep those out", strings.Join(missing, " and "))
		}
	default:
		return errors.New("auth: no token verification configured: set REVEILLE_JWT_SECRET (HS256, ≥32 bytes) or REVEILLE_JWKS_URL")
	}
	return nil
}

// Principal is who a request acts for, taken from its verified token.
type Principal struct {
	OrgID   string   `json:"org_id"`
	Sub     string   `json:"sub"`
	Roles   []string `json:"roles"`
	AgentID string   `json:"agent_id,omitempty"`
	// Expires is when the token stops being accepted, its exp plus the
	// leeway (zero: no exp): a live stream ends then (tokenExpiry), since
	// the token is checked only when it opens.
	Expires time.Time `json:"-"`
	// operatorNotCounted: the token claims the operator role in an org
	// that is not an operator org, so the role was dropped (a 403 says so).
	operatorNotCounted bool
}

// HasRole reports whether the principal holds role. Operator counts only for
// the configured operator orgs, and that is decided when the token is read.
func (p Principal) HasRole(role string) bool { return slices.Contains(p.Roles, role) }

// Claims are the JWT claims Reveille reads.
type Claims struct {
	OrgID   string   `json:"org_id"`
	Roles   []string `json:"roles"`
	AgentID string   `json:"agent_id,omitempty"`
	jwt.RegisteredClaims
	// agentIDGiven: the token holds an agent_id claim. An empty one is
	// refused, not read as absent: absent unbinds the token from every
	// agent, so a claim its issuer meant to set (an unmapped attribute
	// sent as "") would widen the token to the whole org.
	agentIDGiven bool
}

// UnmarshalJSON reads the claims by their exact names: encoding/json
// matches struct fields case-insensitively, so "ORG_ID", "Roles" or
// "Agent_Id" (another service's claims in the same token) were read as
// org_id, roles or agent_id, the last one replacing the real claim.
func (c *Claims) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	if m == nil {
		return errors.New("the claims are not a JSON object")
	}
	*c = Claims{}
	var errs []error
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"org_id", &c.OrgID}, {"roles", &c.Roles}, {"agent_id", &c.AgentID},
		{"iss", &c.Issuer}, {"sub", &c.Subject}, {"aud", &c.Audience}, {"exp", &c.ExpiresAt},
		{"nbf", &c.NotBefore}, {"iat", &c.IssuedAt}, {"jti", &c.ID},
	} {
		if raw, ok := m[f.name]; ok {
			if err := json.Unmarshal(raw, f.dst); err != nil {
				errs = append(errs, &claimTypeError{claim: f.name, err: err})
			}
		}
	}
	if raw, ok := m["agent_id"]; ok && string(raw) != "null" {
		c.agentIDGiven = true
	}
	return errors.Join(errs...)
}

// claimTypeError is a claim read whose value has the wrong JSON type.
type claimTypeError struct {
	claim string
	err   error
}

func (e *claimTypeError) Error() string { return "the " + e.claim + " claim: " + e.err.Error() }
func (e *claimTypeError) Unwrap() error { return e.err }

type principalKey struct{}

// PrincipalFrom returns the request's principal (set by the auth middleware).
func PrincipalFrom(c echo.Context) Principal {
	p, _ := c.Get("principal").(Principal)
	return p
}

// ContextWithPrincipal / PrincipalFromContext carry the principal in a
// context for code below the HTTP layer that logs it.
func ContextWithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// authenticator verifies bearer tokens.
type authenticator struct {
	parser       *jwt.Parser
	keyfunc      jwt.Keyfunc
	operatorOrgs []string
}

// jwksFetchTimeout bounds each fetch of the JWKS. The first is made at
// start, before the API listens: with the library's default (a minute), a
// JWKS endpoint that does not answer held the start that long, nothing
// listening and no line saying why. A start past a failed first fetch
// refuses every token until a fetch succeeds (failures logged at ERROR):
// the hourly refresh, or the refetch a token makes — with or without a kid —
// at most every jwksUnknownKIDRefetchEvery.
const jwksFetchTimeout = 5 * time.Second

// jwksUnknownKIDRefetchEvery is the least time between JWKS refetches for
// tokens with an unknown kid (the library's default): anyone can send such
// tokens, and each must not cost the identity provider a request.
const jwksUnknownKIDRefetchEvery = 5 * time.Minute

func newAuthenticator(ctx context.Context, cfg AuthConfig) (*authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []jwt.ParserOption{jwt.WithExpirationRequired(), jwt.WithLeeway(tokenLeeway)}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	a := &authenticator{operatorOrgs: cfg.OperatorOrgs}
	if len(cfg.Secrets) > 0 {
		keys := jwt.VerificationKeySet{}
		for _, secret := range cfg.Secrets {
			keys.Keys = append(keys.Keys, secret)
		}
		opts = append(opts, jwt.WithValidMethods([]string{"HS256"}))
		a.keyfunc = func(*jwt.Token) (any, error) { return keys, nil }
	} else {
		noErr := true
		// A token with an unknown kid refetches the set (a key rotated in),
		// at most every unknownKIDRefetchEvery; one that comes sooner waits
		// for the limiter at most jwksFetchTimeout, then is refused with the
		// keys at hand (the library's default held it up to a minute).
		kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL},
			keyfunc.Override{NoErrorReturnFirstHTTPReq: &noErr, HTTPTimeout: jwksFetchTimeout, RateLimitWaitMax: jwksFetchTimeout,
				RefreshUnknownKID: rate.NewLimiter(rate.Every(cmp.Or(cfg.unknownKIDRefetchEvery, jwksUnknownKIDRefetchEvery)), 1)})
		if err != nil {
			return nil, fmt.Errorf("auth: JWKS %s: %w", cfg.JWKSURL, err)
		}
		opts = append(opts, jwt.WithValidMethods([]string{"RS256", "ES256", "EdDSA"}))
		a.keyfunc = func(t *jwt.Token) (any, error) {
			if _, hasKid := t.Header["kid"]; !hasKid {
				// A token without a kid is checked against every key: with
				// none (a failed first fetch), read an absent kid, which
				// refetches the set as an unknown kid does (rate-limited).
				if keys, err := kf.Storage().KeyReadAll(ctx); err == nil && len(keys) == 0 {
					_, _ = kf.Storage().KeyRead(ctx, "")
				}
			}
			return kf.Keyfunc(t)
		}
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// verify parses and checks a token and returns its principal.
func (a *authenticator) verify(raw string) (Principal, error) {
	var claims Claims
	token, err := a.parser.ParseWithClaims(raw, &claims, a.keyfunc)
	if err != nil {
		return Principal{}, err
	}
	if crit, ok := token.Header["crit"]; ok {
		// (RFC 7515 §4.1.11: a token whose critical extensions the
		// recipient does not implement is invalid — an identity provider's
		// restriction marked critical would be ignored; Reveille implements
		// none)
		return Principal{}, fmt.Errorf("token names critical header extensions (crit: %v) this server does not implement", crit)
	}
	if err := checkIdentityClaims(claims); err != nil {
		return Principal{}, err
	}
	roles := make([]string, 0, len(claims.Roles))
	operatorNotCounted := false
	for _, r := range claims.Roles {
		if !slices.Contains(AllRoles, r) || slices.Contains(roles, r) {
			continue // unknown roles grant nothing
		}
		if r == RoleOperator && !slices.Contains(a.operatorOrgs, claims.OrgID) {
			operatorNotCounted = true
			continue
		}
		roles = append(roles, r)
	}
	p := Principal{OrgID: claims.OrgID, Sub: claims.Subject, Roles: roles, AgentID: claims.AgentID, operatorNotCounted: operatorNotCounted}
	if claims.ExpiresAt != nil {
		// (when the parser would refuse it: a stream ended sooner would be
		// reopened with it at once)
		p.Expires = claims.ExpiresAt.Add(tokenLeeway)
	}
	return p, nil
}

// tokenLeeway is the clock skew allowed on exp and nbf.
const tokenLeeway = 5 * time.Second

// maxIdentityClaim bounds the identity claims, in bytes. The org id rides
// in every Postgres NOTIFY payload of the streams (at most 8000 bytes, with
// a run id and a stream name of up to 200 characters each), and the streams
// notifier sends payloads in batches, so one org's oversized payload would
// fail its stream's close and a whole batch — stalling other orgs' live
// tails on other replicas. sub and agent_id are keys and log fields too.
const maxIdentityClaim = 255

// checkIdentityClaims refuses a token whose org_id is missing, or whose
// org_id, sub or agent_id (each optional but org_id) is blank, longer than
// maxIdentityClaim bytes, holds NUL (which Postgres text cannot store) or
// another control character:
// every query and key carries them. An agent_id of "." or ".." is refused
// too: it is a path segment of /v1/agents/{agent_id}/….
func checkIdentityClaims(claims Claims) error {
	if claims.OrgID == "" {
		return errors.New("token has no org_id claim")
	}
	if claims.agentIDGiven && claims.AgentID == "" {
		return errors.New("the agent_id claim is empty (a token bound to no agent leaves it out)")
	}
	for _, claim := range []struct{ name, value string }{
		{"org_id", claims.OrgID}, {"sub", claims.Subject}, {"agent_id", claims.AgentID},
	} {
		switch v := claim.value; {
		case v == "":
			// absent (org_id is checked above)
		case strings.TrimSpace(v) == "":
			return fmt.Errorf("the %s claim is blank", claim.name)
		case len(v) > maxIdentityClaim:
			return fmt.Errorf("the %s claim is %d bytes long; at most %d are allowed", claim.name, len(v), maxIdentityClaim)
		case strings.ContainsRune(v, 0):
			return fmt.Errorf("the %s claim holds NUL", claim.name)
		case strings.ContainsFunc(v, unicode.IsControl):
			// (the org id goes into webhook deliveries' X-Reveille-Delivery
			// header, which no control character may be in: every delivery
			// of such an org failed; and each is a log field)
			return fmt.Errorf("the %s claim holds a control character", claim.name)
		case claim.name == "agent_id" && isDotSegment(v):
			// (a path segment of the policy routes, and the tool calls' agent)
			return fmt.Errorf("the agent_id claim is %q: it %s", v, dotSegmentDetail)
		}
	}
	return nil
}

// middleware rejects requests without a valid bearer token (401) and stores
// the principal.
func (a *authenticator) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if len(c.Request().Header.Values(echo.HeaderAuthorization)) > 1 {
			// (one credential a request, RFC 9110: a proxy in front may have
			// checked, or added, the other — served as the first, the
			// request ran as an org the proxy never let through)
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="reveille", error="invalid_request"`)
			return unauthorized("two Authorization headers: send one bearer token")
		}
		header := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, raw, ok := strings.Cut(header, " ")
		// (RFC 6750 §3: a 401 says which scheme to use, and for a token
		// sent, that it was the token at fault)
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(raw) == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="reveille"`)
			return unauthorized("missing bearer token: send Authorization: Bearer <JWT>")
		}
		p, err := a.verify(strings.TrimSpace(raw))
		if err != nil {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="reveille", error="invalid_token"`)
			return unauthorized("invalid token: " + tokenErrorDetail(err))
		}
		c.Set("principal", p)
		c.SetRequest(c.Request().WithContext(ContextWithPrincipal(c.Request().Context(), p)))
		return next(c)
	}
}

func unauthorized(detail string) *Problem {
	return NewProblem(http.StatusUnauthorized, "unauthorized", detail)
}

func tokenErrorDetail(err error) string {
	var typeErr *claimTypeError
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token has expired"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		// (exp always; iss and aud when configured: the parser says which
		// only in its message, "<claim> claim is required")
		var missing []string
		for _, claim := range []string{"exp", "iss", "aud"} {
			if strings.Contains(err.Error(), claim+" claim is required") {
				missing = append(missing, claim)
			}
		}
		if len(missing) == 0 {
			return "token lacks a required claim"
		}
		return "token has no " + strings.Join(missing, " and ") + " claim"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token is not valid yet (nbf)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid) && strings.Contains(err.Error(), "signing method"):
		// (the parser's word for an alg outside the allowed ones, none included)
		return "token's algorithm (alg) is not allowed"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "signature is invalid"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "wrong audience"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token cannot be verified (algorithm not allowed or unknown key)"
	case errors.As(err, &typeErr):
		return "the " + typeErr.claim + " claim has the wrong type"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "token is malformed"
	}
	return err.Error()
}

// requireRole lets a request through when its principal holds any of roles,
// else 403.
func requireRole(roles ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p := PrincipalFrom(c)
			for _, r := range roles {
				if p.HasRole(r) {
					return next(c)
				}
			}
			detail := "this route needs the role " + strings.Join(roles, " or ")
			if p.operatorNotCounted && slices.Contains(roles, RoleOperator) {
				// (the token says operator: say why it does not count)
				detail += fmt.Sprintf("; the token's operator role counts only in an operator org (REVEILLE_OPERATOR_ORGS), and %q is not one", p.OrgID)
			}
			// (RFC 6750 §3.1: the token is good, its access too little)
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="reveille", error="insufficient_scope"`)
			return NewProblem(http.StatusForbidden, "forbidden", detail)
		}
	}
}

// checkAgent enforces that a token bound to an agent acts only as that agent.
// field names the request field carrying agentID.
func checkAgent(c echo.Context, field, agentID string) error {
	p := PrincipalFrom(c)
	if p.AgentID != "" && agentID != p.AgentID {
		return NewProblem(http.StatusForbidden, "forbidden", fmt.Sprintf("the token may act only as agent %q, not %q (%s)", p.AgentID, agentID, field))
	}
	return nil
}

// checkBodyAgent is checkAgent for a body's required agent_id: one left
// out or empty passes here, for the service's 400 to name it with the
// body's other missing fields, not a 403 for the token's agent. (A list's
// agent filter keeps checkAgent: there "" means every agent.)
func checkBodyAgent(c echo.Context, agentID string) error {
	if agentID == "" {
		return nil
	}
	return checkAgent(c, "agent_id", agentID)
}

// TokenSpec describes a token for SignToken.
type TokenSpec struct {
	OrgID, Sub, AgentID string
	Roles               []string
	TTL                 time.Duration
	Issuer, Audience    string // set when the server checks them
}

// SignToken makes an HS256 token (the `engine token` command and tests use it).
// It refuses to sign what the server would refuse — identity claims that
// are blank, longer than 255 bytes or hold NUL, and a token already expired
// — so that a minted token's fault shows where it is minted, not as a 401
// later.
func SignToken(secret []byte, spec TokenSpec) (string, error) {
	if spec.TTL <= 0 {
		return "", fmt.Errorf("the token's lifetime is %s; it must be positive", spec.TTL)
	}
	now := time.Now()
	claims := Claims{OrgID: spec.OrgID, Roles: spec.Roles, AgentID: spec.AgentID, RegisteredClaims: jwt.RegisteredClaims{
		Subject: spec.Sub, Issuer: spec.Issuer, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(spec.TTL)),
	}}
	if err := checkIdentityClaims(claims); err != nil {
		return "", err
	}
	if spec.Audience != "" {
		claims.Audience = jwt.ClaimStrings{spec.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// tokenExpiry fires when the request's token expires (never without an
// exp): a Server-Sent Events stream ends then, with a comment saying why,
// so that a token past its exp — or one withdrawn by letting it expire —
// stops receiving data; the client reconnects with a fresh token. stop
// releases the timer.
func tokenExpiry(c echo.Context) (expired <-chan time.Time, stop func()) {
	exp := PrincipalFrom(c).Expires
	if exp.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(exp))
	return t.C, func() { t.Stop() }
}

// tokenExpiredComment ends a Server-Sent Events stream at its token's exp.
const tokenExpiredComment = ": the token expired; reconnect with a fresh one\n\n"

// tokenExpiredNow reports, for a stream with more to send at once, whether
// its token's expiry fired, and ends the stream with the comment if so.
func (s *Server) tokenExpiredNow(c echo.Context, expired <-chan time.Time) bool {
	select {
	case <-expired:
		_ = s.sseSend(c, []byte(tokenExpiredComment))
		return true
	default:
		return false
	}
}
