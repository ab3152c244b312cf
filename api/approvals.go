package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/approvals"
)

// approvalRoutes serves tool approvals (SPEC §7): sessions and their
// events, tool-call requests (agent), answers and the inbox (approver),
// standing policies (admin; approvers read them).
func (s *Server) approvalRoutes() {
	if s.svc.Approvals == nil {
		return
	}
	agent, approver, admin := []string{RoleAgent}, []string{RoleApprover}, []string{RoleAdmin}
	// An agent never approves its own (or another agent's) tool calls, now
	// or in advance through a standing policy.
	notAnAgent := refuseBoundTokens("an agent cannot approve, deny or set standing approvals for tool calls")
	s.route(http.MethodPost, "/v1/sessions/:session_id/tool-calls", s.requestToolCall, agent, s.idempotent())
	s.route(http.MethodPost, "/v1/sessions/:session_id/tool-approvals", s.respondToolCalls, approver,
		notAnAgent, requireSub("approve or deny tool calls"), s.idempotent())
	s.route(http.MethodGet, "/v1/sessions/:session_id/events", s.sessionEvents, []string{RoleAgent, RoleApprover})
	s.route(http.MethodGet, "/v1/tool-approvals", s.listToolApprovals, approver)
	s.route(http.MethodGet, "/v1/tool-approvals/:id", s.getToolApproval, []string{RoleAgent, RoleApprover})
	s.route(http.MethodPost, "/v1/tool-approvals/:id/redeliver", s.redeliverToolApproval, admin)
	s.route(http.MethodGet, "/v1/agents/:agent_id/tool-policies", s.listToolPolicies, []string{RoleAdmin, RoleApprover})
	s.route(http.MethodPut, "/v1/agents/:agent_id/tool-policies/:tool_name", s.putToolPolicy, admin, notAnAgent,
		requireSub("set standing approvals for tool calls"))
	s.route(http.MethodDelete, "/v1/agents/:agent_id/tool-policies/:tool_name", s.deleteToolPolicy, admin, notAnAgent,
		requireSub("delete standing approvals for tool calls"))
}

type toolPolicyJSON struct {
	// ID is the policy's, kept when a put replaces its approval (SPEC §2:
	// resources carry id; the list's cursor is one).
	ID        uuid.UUID `json:"id"`
	ToolName  string    `json:"tool_name"`
	Approval  string    `json:"approval"`
	Match     rawJSON   `json:"match"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

func toolPolicyOut(p approvals.Policy) toolPolicyJSON {
	out := toolPolicyJSON{ID: p.ID, ToolName: p.ToolName, Approval: p.Approval, Match: rawJSON("null"), UpdatedAt: p.UpdatedAt.UTC(), UpdatedBy: p.UpdatedBy}
	if len(p.Match) > 0 {
		out.Match = rawJSON(p.Match)
	}
	return out
}

// toolApprovalOut is the tool approval as its routes show it: its JSON is
// the domain type's (approvals.ToolApproval.MarshalJSON), which the
// approvals inbox's events carry too.
func toolApprovalOut(a approvals.ToolApproval) approvals.ToolApproval { return a }

type sessionEventJSON struct {
	Seq       int64     `json:"seq"`
	Name      string    `json:"name"`
	Payload   rawJSON   `json:"payload"`
	CreatedAt time.Time `json:"created_at"`
}

func (s *Server) requestToolCall(c echo.Context) error {
	sessionID, err := pathParam(c, "session_id")
	if err != nil {
		return err
	}
	params, err := bindBody(c, decodeToolCall)
	if err != nil {
		return err
	}
	if err := checkBodyAgent(c, params.AgentID); err != nil {
		return err
	}
	p := PrincipalFrom(c)
	params.OrgID, params.SessionID, params.IdempotencyKey, params.RequestedBy = p.OrgID, sessionID, IdempotencyKey(c), p.Sub
	res, err := s.svc.Approvals.Request(c.Request().Context(), params)
	if err != nil {
		return idempotencyKeyReused(err, approvals.ErrIdempotencyKeyReused)
	}
	out := map[string]any{"decision": res.Decision, "approval_id": res.Approval.ID}
	if res.Decision == approvals.DecisionPending {
		out["expires_at"] = res.Approval.ExpiresAt.UTC()
		return c.JSON(http.StatusOK, out)
	}
	out["source"] = res.Source
	if res.Policy != nil { // (absent when a human or the expiry decided)
		out["policy"] = toolPolicyOut(*res.Policy)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) respondToolCalls(c echo.Context) error {
	sessionID, err := pathParam(c, "session_id")
	if err != nil {
		return err
	}
	params, err := bindBody(c, decodeToolAnswer)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	params.OrgID, params.SessionID, params.ResolvedBy = p.OrgID, sessionID, p.Sub
	res, err := s.svc.Approvals.Respond(c.Request().Context(), params)
	if errors.Is(err, approvals.ErrAlreadyResolved) && params.ApprovalID != uuid.Nil {
		if now, getErr := s.svc.Approvals.Get(c.Request().Context(), p.OrgID, params.ApprovalID, ""); getErr == nil {
			state := now.Status
			if state == approvals.DecisionPending && !now.ExpiresAt.After(time.Now()) {
				state = "expired" // (past its expiry; the sweeper has yet to mark it)
			}
			return alreadyResolved(err, params.ApprovalID, state, now.ResolvedBy, now.ResolvedAt)
		}
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"resolved": res.Resolved, "policy": res.Policy})
}

func (s *Server) sessionEvents(c echo.Context) error {
	sessionID, err := pathParam(c, "session_id")
	if err != nil {
		return err
	}
	after, limit, err := eventsPage(c)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	events, next, err := s.svc.Approvals.Events(c.Request().Context(), p.OrgID, sessionID, p.AgentID, after, limit)
	if err != nil {
		return err
	}
	out := struct {
		Items      []sessionEventJSON `json:"items"`
		NextCursor *string            `json:"next_cursor"`
	}{Items: make([]sessionEventJSON, 0, len(events))}
	for _, e := range events {
		out.Items = append(out.Items, sessionEventJSON{Seq: e.Seq, Name: e.Name, Payload: rawJSON(e.Payload), CreatedAt: e.CreatedAt.UTC()})
	}
	if next != nil {
		n := strconv.FormatInt(*next, 10)
		out.NextCursor = &n
	}
	return c.JSON(http.StatusOK, out)
}

// eventsPage reads ?after=&limit= (after exclusive; cursor, the list
// convention's name, is accepted for after).
func eventsPage(c echo.Context) (int64, int, error) {
	limit, err := listLimit(c)
	if err != nil {
		return 0, 0, err
	}
	field, raw := "after", c.QueryParam("after")
	if raw == "" {
		field, raw = "cursor", c.QueryParam("cursor")
	}
	var after int64
	if raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, Invalid(field, "must be a seq (an integer ≥ 0)")
		}
		after = n
	}
	return after, limit, nil
}

func (s *Server) listToolApprovals(c echo.Context) error {
	page, err := mandatePage(c)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	agentID, err := agentFilter(c, "agent_id")
	if err != nil {
		return err
	}
	f := approvals.ListFilter{Status: c.QueryParam("status"), AgentID: agentID, SessionID: c.QueryParam("session_id"),
		Delivery: c.QueryParam("delivery")}
	seq, err := s.eventsSeq(c)
	if err != nil {
		return err
	}
	items, next, err := s.svc.Approvals.List(c.Request().Context(), p.OrgID, f, page)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, approvalList[approvals.ToolApproval]{newMandateList(items, next, toolApprovalOut), seq})
}

func (s *Server) getToolApproval(c echo.Context) error {
	id, err := pathID(c, approvals.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	a, err := s.svc.Approvals.Get(c.Request().Context(), p.OrgID, id, p.AgentID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toolApprovalOut(a))
}

func (s *Server) redeliverToolApproval(c echo.Context) error {
	id, err := pathID(c, approvals.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	a, err := s.svc.Approvals.Redeliver(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toolApprovalOut(a))
}

// policyAgent reads the :agent_id of the policy routes; a bound token
// names only its own agent.
func policyAgent(c echo.Context) (string, error) {
	agentID, err := pathParam(c, "agent_id")
	if err != nil {
		return "", err
	}
	return agentID, checkAgent(c, "agent_id", agentID)
}

func (s *Server) listToolPolicies(c echo.Context) error {
	agentID, err := policyAgent(c)
	if err != nil {
		return err
	}
	page, err := mandatePage(c)
	if err != nil {
		return err
	}
	items, next, err := s.svc.Approvals.ListPolicies(c.Request().Context(), PrincipalFrom(c).OrgID, agentID, page)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newMandateList(items, next, toolPolicyOut))
}

func (s *Server) putToolPolicy(c echo.Context) error {
	agentID, err := policyAgent(c)
	if err != nil {
		return err
	}
	tool, err := pathParam(c, "tool_name")
	if err != nil {
		return err
	}
	params, err := bindBody(c, decodeToolPolicy)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	params.AgentID, params.ToolName, params.UpdatedBy = agentID, tool, p.Sub
	pol, err := s.svc.Approvals.PutPolicy(c.Request().Context(), p.OrgID, params)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toolPolicyOut(pol))
}

func (s *Server) deleteToolPolicy(c echo.Context) error {
	agentID, err := policyAgent(c)
	if err != nil {
		return err
	}
	tool, err := pathParam(c, "tool_name")
	if err != nil {
		return err
	}
	var match json.RawMessage
	if raw := c.QueryParam("match"); raw != "" {
		if !json.Valid([]byte(raw)) {
			return Invalid("match", "must be URL-encoded JSON: the match object of the policy to delete")
		}
		match = json.RawMessage(raw) // the domain checks it as it checks a PUT's
	}
	if err := s.svc.Approvals.DeletePolicy(c.Request().Context(), PrincipalFrom(c).OrgID, agentID, tool, match); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// idempotencyKeyReused maps a domain's key-reuse error to 422, as the
// idempotency layer answers a reused key.
func idempotencyKeyReused(err, reused error) error {
	if errors.Is(err, reused) {
		return NewProblem(http.StatusUnprocessableEntity, "idempotency-key-reused", err.Error())
	}
	return err
}
