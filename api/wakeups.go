package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/wakeup"
)

func (s *Server) wakeupRoutes() {
	if s.svc.Wakeups == nil {
		return
	}
	s.route(http.MethodPost, "/v1/wakeups", s.createWakeup, []string{RoleAgent}, requireSub("ask for a wake-up (it spends)"), s.idempotent())
	s.route(http.MethodGet, "/v1/wakeups", s.listWakeups, []string{RoleAgent, RoleAdmin})
	s.route(http.MethodGet, "/v1/wakeups/:id", s.getWakeup, []string{RoleAgent, RoleAdmin})
	s.route(http.MethodPost, "/v1/wakeups/:id/cancel", s.cancelWakeup, []string{RoleAgent})
	s.route(http.MethodPost, "/v1/wakeups/:id/redeliver", s.redeliverWakeup, []string{RoleAdmin})
}

type wakeupJSON struct {
	ID         string           `json:"id"`
	AgentID    string           `json:"agent_id"`
	WorkflowID string           `json:"workflow_id"`
	RunID      *string          `json:"run_id"`
	Signal     string           `json:"signal"`
	Scope      string           `json:"scope"`
	Cost       int64            `json:"cost"`
	Pool       string           `json:"pool"`
	Status     string           `json:"status"`
	Outcome    *string          `json:"outcome"`
	Result     any              `json:"result,omitempty"`
	Error      string           `json:"error,omitempty"`
	Approval   *wakeup.Approval `json:"approval"`
	Delivery   wakeup.Delivery  `json:"delivery"`
	WorkID     *uuid.UUID       `json:"work_id"`
	CreatedAt  time.Time        `json:"created_at"`
	UpdatedAt  time.Time        `json:"updated_at"`
}

func wakeupOut(w wakeup.Wakeup) wakeupJSON {
	out := wakeupJSON{
		ID: w.ID.String(), AgentID: w.AgentID, WorkflowID: w.WorkflowID, Signal: w.Signal, Scope: w.Scope, Cost: w.Cost,
		Pool: w.Pool, Status: w.Status, Error: w.Error, Approval: w.Approval, Delivery: w.Delivery, WorkID: w.WorkID,
		CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC(),
	}
	if w.RunID != "" {
		out.RunID = &w.RunID
	}
	if w.Outcome != "" {
		out.Outcome = &w.Outcome
	}
	if len(w.Result) > 0 {
		out.Result = rawJSON(w.Result)
	}
	return out
}

// rawJSON embeds stored JSON as is.
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }

type wakeupRequest struct {
	AgentID    string `json:"agent_id" required:"true"`
	WorkflowID string `json:"workflow_id" required:"true"`
	RunID      string `json:"run_id"`
	Signal     string `json:"signal" required:"true"`
	Scope      string `json:"scope" required:"true"`
	Reason     string `json:"reason"`
	Cost       *int64 `json:"cost" required:"true"`
	Pool       string `json:"pool"`
	Work       *struct {
		Handler        string   `json:"handler" required:"true"`
		Args           rawArgs  `json:"args"`
		Retry          *retryIn `json:"retry"`
		TimeoutMS      int      `json:"timeout_ms"`
		ConcurrencyKey string   `json:"concurrency_key" nullable:"true"`
		KeyLimit       *int     `json:"key_limit" nullable:"true"`
	} `json:"work" required:"true"`
}

// rawArgs keeps a JSON value as its bytes.
type rawArgs []byte

func (r *rawArgs) UnmarshalJSON(b []byte) error { *r = append((*r)[:0], b...); return nil }

func (s *Server) createWakeup(c echo.Context) error {
	in, err := bindBody(c, decodeWakeup)
	if err != nil {
		return err
	}
	if err := checkBodyAgent(c, in.AgentID); err != nil {
		return err
	}
	p := PrincipalFrom(c)
	w, err := s.svc.Wakeups.Create(c.Request().Context(), wakeup.CreateParams{
		OrgID: p.OrgID, AgentID: in.AgentID, WorkflowID: in.WorkflowID, RunID: in.RunID, Signal: in.Signal,
		Scope: in.Scope, Reason: in.Reason, Cost: *in.Cost, Pool: in.Pool,
		Work: wakeup.Work{Handler: in.Work.Handler, Args: []byte(in.Work.Args), Retry: in.Work.Retry.policy(), TimeoutMS: in.Work.TimeoutMS,
			ConcurrencyKey: in.Work.ConcurrencyKey, KeyLimit: deref(in.Work.KeyLimit)},
		IdempotencyKey: IdempotencyKey(c), RequestedBy: p.Sub,
	})
	var refused *wakeup.RefusedError
	switch {
	case errors.As(err, &refused):
		detail := "the agent's mandate does not cover this wake-up; an approval request was created and the workflow will be woken once it is resolved"
		if refused.Settled() {
			detail = "the agent's mandate did not cover this wake-up and its approval request was " +
				refused.Wakeup.Approval.State + ": the wake-up resolved as " + refused.Wakeup.Outcome +
				" and its workflow was woken"
		}
		return NewProblem(http.StatusPaymentRequired, "spend-refused", detail).
			With("approval_id", refused.ApprovalID).With("wakeup_id", refused.Wakeup.ID).With("refusal", refused.Refusal)
	case errors.Is(err, wakeup.ErrIdempotencyKeyReused):
		return NewProblem(http.StatusUnprocessableEntity, "idempotency-key-reused", err.Error())
	case err != nil && w.ID != uuid.Nil:
		// Funded, but the enqueue did not happen here: the reconciler will
		// enqueue it. For the caller the wake-up exists and is pending.
		s.logger.Warn("wake-up funded; enqueue left to the reconciler", "wakeup_id", w.ID, "error", err.Error())
	case err != nil:
		return err
	}
	// (a funded request's answer, first or retried: as SPEC §5 has it)
	return c.JSON(http.StatusCreated, map[string]any{"id": w.ID.String(), "status": wakeup.StatusPending, "outcome": nil})
}

// getWakeup answers with the :id wake-up; to a token bound to an agent,
// another agent's is absent.
func (s *Server) getWakeup(c echo.Context) error {
	id, err := pathID(c, wakeup.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	w, err := s.svc.Wakeups.Get(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wakeupOut(w))
}

func (s *Server) listWakeups(c echo.Context) error {
	cursor, limit, err := listPage(c)
	if err != nil {
		return err
	}
	agent, err := agentFilter(c, "agent_id")
	if err != nil {
		return err
	}
	items, next, err := s.svc.Wakeups.List(c.Request().Context(), PrincipalFrom(c).OrgID,
		wakeup.ListFilter{WorkflowID: c.QueryParam("workflow_id"), Status: c.QueryParam("status"), AgentID: agent,
			Delivery: c.QueryParam("delivery")}, cursor, limit)
	if err != nil {
		return err
	}
	out := struct {
		Items      []wakeupJSON `json:"items"`
		NextCursor *string      `json:"next_cursor"`
	}{Items: make([]wakeupJSON, 0, len(items))}
	for _, w := range items {
		out.Items = append(out.Items, wakeupOut(w))
	}
	if next != nil {
		n := next.String()
		out.NextCursor = &n
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) cancelWakeup(c echo.Context) error {
	id, err := pathID(c, wakeup.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	w, err := s.svc.Wakeups.Cancel(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wakeupOut(w))
}

func (s *Server) redeliverWakeup(c echo.Context) error {
	id, err := pathID(c, wakeup.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	w, err := s.svc.Wakeups.Redeliver(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wakeupOut(w))
}

// listPage reads ?cursor=&limit= for lists keyed by UUIDv7 ids (limit
// 1–500, default 50).
func listPage(c echo.Context) (*uuid.UUID, int, error) {
	limit, err := listLimit(c)
	if err != nil {
		return nil, 0, err
	}
	if raw := c.QueryParam("cursor"); raw != "" {
		id, err := parseUUID(raw)
		if err != nil {
			return nil, 0, Invalid("cursor", "is not a cursor this list returned")
		}
		return &id, limit, nil
	}
	return nil, limit, nil
}
