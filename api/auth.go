package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
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

// AuthConfig says how bearer tokens are verified. Exactly one of Secret and
// JWKSURL must be set.
type AuthConfig struct {
	// Secret is the HS256 key (at least 32 bytes).
	Secret []byte
	// JWKSURL serves the public keys for RS256, ES256 and EdDSA tokens.
	JWKSURL string
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string
	Audience string
	// OperatorOrgs are the orgs whose operator role counts.
	OperatorOrgs []string
}

// Principal is who a request acts for, taken from its verified token.
type Principal struct {
	OrgID   string   `json:"org_id"`
	Sub     string   `json:"sub"`
	Roles   []string `json:"roles"`
	AgentID string   `json:"agent_id,omitempty"`
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
}

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

func newAuthenticator(ctx context.Context, cfg AuthConfig) (*authenticator, error) {
	opts := []jwt.ParserOption{jwt.WithExpirationRequired(), jwt.WithLeeway(5 * time.Second)}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	a := &authenticator{operatorOrgs: cfg.OperatorOrgs}
	switch {
	case len(cfg.Secret) > 0 && cfg.JWKSURL != "":
		return nil, errors.New("auth: set either REVEILLE_JWT_SECRET or REVEILLE_JWKS_URL, not both")
	case len(cfg.Secret) > 0:
		if len(cfg.Secret) < 32 {
			return nil, errors.New("auth: REVEILLE_JWT_SECRET must be at least 32 bytes")
		}
		secret := cfg.Secret
		opts = append(opts, jwt.WithValidMethods([]string{"HS256"}))
		a.keyfunc = func(*jwt.Token) (any, error) { return secret, nil }
	case cfg.JWKSURL != "":
		noErr := true
		kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{NoErrorReturnFirstHTTPReq: &noErr})
		if err != nil {
			return nil, fmt.Errorf("auth: JWKS %s: %w", cfg.JWKSURL, err)
		}
		opts = append(opts, jwt.WithValidMethods([]string{"RS256", "ES256", "EdDSA"}))
		a.keyfunc = kf.Keyfunc
	default:
		return nil, errors.New("auth: no token verification configured: set REVEILLE_JWT_SECRET (HS256, ≥32 bytes) or REVEILLE_JWKS_URL")
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// verify parses and checks a token and returns its principal.
func (a *authenticator) verify(raw string) (Principal, error) {
	var claims Claims
	if _, err := a.parser.ParseWithClaims(raw, &claims, a.keyfunc); err != nil {
		return Principal{}, err
	}
	if claims.OrgID == "" {
		return Principal{}, errors.New("token has no org_id claim")
	}
	roles := make([]string, 0, len(claims.Roles))
	for _, r := range claims.Roles {
		if !slices.Contains(AllRoles, r) || slices.Contains(roles, r) {
			continue // unknown roles grant nothing
		}
		if r == RoleOperator && !slices.Contains(a.operatorOrgs, claims.OrgID) {
			continue
		}
		roles = append(roles, r)
	}
	return Principal{OrgID: claims.OrgID, Sub: claims.Subject, Roles: roles, AgentID: claims.AgentID}, nil
}

// middleware rejects requests without a valid bearer token (401) and stores
// the principal.
func (a *authenticator) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		header := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, raw, ok := strings.Cut(header, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(raw) == "" {
			return unauthorized("missing bearer token: send Authorization: Bearer <JWT>")
		}
		p, err := a.verify(strings.TrimSpace(raw))
		if err != nil {
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
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token has expired"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token has no exp claim"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token is not valid yet (nbf)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "signature is invalid"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "wrong audience"
	case errors.Is(err, jwt.ErrTokenUnverifiable), errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "token cannot be verified (algorithm not allowed or unknown key)"
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
			return NewProblem(http.StatusForbidden, "forbidden", "this route needs the role "+strings.Join(roles, " or "))
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

// TokenSpec describes a token for SignToken.
type TokenSpec struct {
	OrgID, Sub, AgentID string
	Roles               []string
	TTL                 time.Duration
	Issuer, Audience    string // set when the server checks them
}

// SignToken makes an HS256 token (the `engine token` command and tests use it).
func SignToken(secret []byte, spec TokenSpec) (string, error) {
	now := time.Now()
	claims := Claims{OrgID: spec.OrgID, Roles: spec.Roles, AgentID: spec.AgentID, RegisteredClaims: jwt.RegisteredClaims{
		Subject: spec.Sub, Issuer: spec.Issuer, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(spec.TTL)),
	}}
	if spec.Audience != "" {
		claims.Audience = jwt.ClaimStrings{spec.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}
