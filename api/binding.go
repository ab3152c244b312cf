package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/workpool"
)

// A token with an agent_id claim is that agent's identity, whatever roles it
// carries (SPEC §2, docs/security.md): it reads and acts on that agent's
// objects only. By id, another agent's object is absent (the domain lookups
// take the agent in their WHERE clause, so it is the very answer an absent
// id gets); a list is narrowed to the agent, and a filter naming another
// agent is 403; objects that belong to no agent (pools, plain work) and the
// resolution of approvals (approvers are people) are 403.

// agentFilter returns the agent a list is narrowed to: param's value for a
// token bound to no agent, the bound agent otherwise (also when param is
// absent); a bound token naming another agent is refused.
func agentFilter(c echo.Context, param string) (string, error) {
	requested, bound := c.QueryParam(param), PrincipalFrom(c).AgentID
	switch {
	case bound == "":
		return requested, nil
	case requested == "" || requested == bound:
		return bound, nil
	}
	return "", NewProblem(http.StatusForbidden, "forbidden",
		fmt.Sprintf("the token is bound to agent %q and may list only its objects, not agent %q's (%s)", bound, requested, param))
}

// refuseBoundTokens refuses every token bound to an agent (403); why says
// what the route does that an agent may not.
func refuseBoundTokens(why string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if agent := PrincipalFrom(c).AgentID; agent != "" {
				return NewProblem(http.StatusForbidden, "forbidden", fmt.Sprintf("the token is bound to agent %q: %s", agent, why))
			}
			return next(c)
		}
	}
}

// requireSub refuses a token without a sub claim (403): what needs names the
// act that needs an identity.
func requireSub(what string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if PrincipalFrom(c).Sub == "" {
				return NewProblem(http.StatusForbidden, "forbidden", "a token without a sub claim cannot "+what+
					": sub identifies who asked, so that they cannot approve their own request")
			}
			return next(c)
		}
	}
}

// workStatus is the status of work as p may see it: work has an agent only
// through the wake-up that enqueued it, so a bound token sees its agent's
// wake-up work and nothing else (plain work included) — as absent.
func (s *Server) workStatus(ctx context.Context, p Principal, id uuid.UUID) (workpool.Status, error) {
	if p.AgentID == "" {
		return s.svc.Workpool.Status(ctx, p.OrgID, id)
	}
	if s.svc.Wakeups == nil {
		return workpool.Status{}, workpool.ErrNotFound // no wake-ups, so no agent's work
	}
	return s.svc.Wakeups.WorkStatus(ctx, p.OrgID, p.AgentID, id)
}
