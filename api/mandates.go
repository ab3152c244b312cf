package api

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/mandates"
)

// mandateRoutes serves mandates (admin), spend (agent) and overrun approval
// requests (approver), SPEC §6.
func (s *Server) mandateRoutes() {
	if s.svc.Mandates == nil {
		return
	}
	admin, agent, approver := []string{RoleAdmin}, []string{RoleAgent}, []string{RoleApprover}
	notAnAgent := refuseBoundTokens("approvers are people, not agents; an agent never resolves an approval request")
	s.route(http.MethodPost, "/v1/mandates", s.createMandate, admin, s.idempotent())
	s.route(http.MethodGet, "/v1/mandates", s.listMandates, admin)
	s.route(http.MethodPost, "/v1/mandates/spend", s.spendMandate, agent, requireSub("spend"), s.idempotent())
	s.route(http.MethodGet, "/v1/mandates/:id", s.getMandate, admin)
	s.route(http.MethodPatch, "/v1/mandates/:id", s.patchMandate, admin)
	s.route(http.MethodGet, "/v1/mandates/:id/ledger", s.mandateLedger, admin)
	s.route(http.MethodGet, "/v1/mandate-approvals", s.listMandateApprovals, approver)
	s.route(http.MethodGet, "/v1/mandate-approvals/:id", s.getMandateApproval, approver)
	s.route(http.MethodPost, "/v1/mandate-approvals/:id/approve", s.resolveMandateApproval(s.svc.Mandates.Approve), approver, notAnAgent, s.idempotent())
	s.route(http.MethodPost, "/v1/mandate-approvals/:id/deny", s.resolveMandateApproval(s.svc.Mandates.Deny), approver, notAnAgent, s.idempotent())
}

type mandateJSON struct {
	ID         uuid.UUID  `json:"id"`
	AgentID    string     `json:"agent_id"`
	Scope      string     `json:"scope"`
	Budget     int64      `json:"budget"`
	Spent      int64      `json:"spent"`
	Remaining  int64      `json:"remaining"`
	Status     string     `json:"status"`
	ValidUntil *time.Time `json:"valid_until"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

func mandateOut(m mandates.Mandate) mandateJSON {
	return mandateJSON{ID: m.ID, AgentID: m.AgentID, Scope: m.Scope, Budget: m.Budget, Spent: m.Spent,
		Remaining: m.Remaining(), Status: m.Status, ValidUntil: utcPtr(m.ValidUntil),
		CreatedAt: m.CreatedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC()}
}

type ledgerEntryJSON struct {
	ID             uuid.UUID  `json:"id"`
	Kind           string     `json:"kind"`
	Amount         int64      `json:"amount"`
	Reason         string     `json:"reason"`
	IdempotencyKey *string    `json:"idempotency_key"`
	ApprovalID     *uuid.UUID `json:"approval_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
}

func ledgerEntryOut(e mandates.LedgerEntry) ledgerEntryJSON {
	out := ledgerEntryJSON{ID: e.ID, Kind: e.Kind, Amount: e.Amount, Reason: e.Reason, ApprovalID: e.ApprovalID, CreatedAt: e.CreatedAt.UTC()}
	if e.IdempotencyKey != "" {
		out.IdempotencyKey = &e.IdempotencyKey
	}
	return out
}

// mandateApprovalOut is the request as its routes show it: its JSON is the
// domain type's (mandates.Approval.MarshalJSON), which the approvals
// inbox's events carry too.
func mandateApprovalOut(a mandates.Approval) mandates.Approval { return a }

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// mandateList is a page of a list: {items, next_cursor}.
type mandateList[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

func newMandateList[S, T any](items []S, next *uuid.UUID, out func(S) T) mandateList[T] {
	l := mandateList[T]{Items: make([]T, 0, len(items))}
	for _, it := range items {
		l.Items = append(l.Items, out(it))
	}
	if next != nil {
		cur := next.String()
		l.NextCursor = &cur
	}
	return l
}

// approvalList is a page of an approvals list with the approvals event seq
// it reflects (events_seq): a client subscribes to GET /v1/approvals/events
// from there and misses nothing.
type approvalList[T any] struct {
	mandateList[T]
	EventsSeq int64 `json:"events_seq"`
}

// mandatePage reads ?cursor=&limit= (limit 1–500, default 50).
func mandatePage(c echo.Context) (mandates.Page, error) {
	var p mandates.Page
	var err error
	if p.Limit, err = listLimit(c); err != nil {
		return p, err
	}
	if raw := c.QueryParam("cursor"); raw != "" {
		id, err := parseUUID(raw)
		if err != nil {
			return p, Invalid("cursor", "is not a cursor this list returned")
		}
		p.Cursor = id
	}
	return p, nil
}

// pathID reads the :id path parameter; an id that is not a UUID names
// nothing, so it is reported as absent.
func pathID(c echo.Context, notFound error) (uuid.UUID, error) {
	id, err := parseUUID(c.Param("id"))
	if err != nil {
		return uuid.Nil, notFound
	}
	return id, nil
}

// parseValidUntil reads an RFC 3339 timestamp for valid_until.
func parseValidUntil(raw string) (*time.Time, error) {
	t, err := parseTimestamp(raw)
	if err != nil {
		return nil, Invalid("valid_until", err.Error())
	}
	return &t, nil
}

// rfc3339 is RFC 3339's date-time (the document's format), which
// time.Parse is laxer than: it also takes a comma before the fraction and
// offsets of 24 hours or 60 minutes (read as another instant than the
// client wrote: +05:60 as +06:00).
var rfc3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// parseTimestamp reads a client's RFC 3339 timestamp; its UTC instant must
// fall within the years 0000–9999, which the answers (RFC 3339, in UTC)
// can spell: one beyond was stored and then failed every response that
// showed it (a 500, for good).
func parseTimestamp(raw string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil || !rfc3339.MatchString(raw) {
		return time.Time{}, errors.New("must be an RFC 3339 timestamp")
	}
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return time.Time{}, errors.New("must be an RFC 3339 timestamp within the years 0000–9999 in UTC")
	}
	return t, nil
}

func (s *Server) createMandate(c echo.Context) error {
	p, err := bindBody(c, decodeMandateCreate)
	if err != nil {
		return err
	}
	if err := checkBodyAgent(c, p.AgentID); err != nil {
		return err
	}
	m, err := s.svc.Mandates.Create(c.Request().Context(), PrincipalFrom(c).OrgID, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, mandateOut(m))
}

func (s *Server) listMandates(c echo.Context) error {
	page, err := mandatePage(c)
	if err != nil {
		return err
	}
	agent, err := agentFilter(c, "agent_id")
	if err != nil {
		return err
	}
	f := mandates.MandateFilter{AgentID: agent, Scope: c.QueryParam("scope")}
	items, next, err := s.svc.Mandates.List(c.Request().Context(), PrincipalFrom(c).OrgID, f, page)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newMandateList(items, next, mandateOut))
}

func (s *Server) getMandate(c echo.Context) error {
	id, err := pathID(c, mandates.ErrNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	m, err := s.svc.Mandates.Get(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, mandateOut(m))
}

func (s *Server) patchMandate(c echo.Context) error {
	id, err := pathID(c, mandates.ErrNotFound)
	if err != nil {
		return err
	}
	p, err := bindBody(c, decodeMandatePatch)
	if err != nil {
		return err
	}
	who := PrincipalFrom(c)
	m, err := s.svc.Mandates.Patch(c.Request().Context(), who.OrgID, who.AgentID, id, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, mandateOut(m))
}

func (s *Server) mandateLedger(c echo.Context) error {
	id, err := pathID(c, mandates.ErrNotFound)
	if err != nil {
		return err
	}
	page, err := mandatePage(c)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	items, next, err := s.svc.Mandates.Ledger(c.Request().Context(), p.OrgID, p.AgentID, id, page)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newMandateList(items, next, ledgerEntryOut))
}

func (s *Server) spendMandate(c echo.Context) error {
	in, err := bindBody(c, decodeSpend)
	if err != nil {
		return err
	}
	if err := checkBodyAgent(c, in.AgentID); err != nil {
		return err
	}
	p := PrincipalFrom(c)
	res, err := s.svc.Mandates.Spend(c.Request().Context(), mandates.SpendParams{
		OrgID: p.OrgID, AgentID: in.AgentID, Scope: in.Scope, Cost: *in.Cost, Reason: in.Reason,
		IdempotencyKey: IdempotencyKey(c), RequestedBy: p.Sub,
	})
	if errors.Is(err, mandates.ErrIdempotencyKeyReused) {
		return NewProblem(http.StatusUnprocessableEntity, "idempotency-key-reused", err.Error())
	}
	if err != nil {
		return err
	}
	if !res.OK {
		return NewProblem(http.StatusPaymentRequired, "spend-refused",
			"the mandate does not cover this spend ("+res.Refusal+"); an approval request was created").
			With("approval_id", res.ApprovalID).With("refusal", res.Refusal)
	}
	return c.JSON(http.StatusOK, map[string]any{"ok": true, "remaining": res.Remaining})
}

func (s *Server) listMandateApprovals(c echo.Context) error {
	page, err := mandatePage(c)
	if err != nil {
		return err
	}
	agent, err := agentFilter(c, "agent_id")
	if err != nil {
		return err
	}
	f := mandates.ApprovalFilter{State: c.QueryParam("status"), AgentID: agent}
	switch c.QueryParam("order") {
	case "", "oldest":
	case "newest":
		f.NewestFirst = true
	default:
		return Invalid("order", "must be oldest or newest")
	}
	seq, err := s.eventsSeq(c)
	if err != nil {
		return err
	}
	items, next, err := s.svc.Mandates.ListApprovals(c.Request().Context(), PrincipalFrom(c).OrgID, f, page)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, approvalList[mandates.Approval]{newMandateList(items, next, mandateApprovalOut), seq})
}

func (s *Server) getMandateApproval(c echo.Context) error {
	id, err := pathID(c, mandates.ErrApprovalNotFound)
	if err != nil {
		return err
	}
	p := PrincipalFrom(c)
	a, err := s.svc.Mandates.GetApproval(c.Request().Context(), p.OrgID, p.AgentID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, mandateApprovalOut(a))
}

// resolveMandateApproval approves or denies; the resolver is the token's
// sub, which may not be the sub that created the request.
func (s *Server) resolveMandateApproval(resolve func(ctx context.Context, orgID string, id uuid.UUID, resolverSub, note string) (mandates.Approval, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		id, err := pathID(c, mandates.ErrApprovalNotFound)
		if err != nil {
			return err
		}
		in, err := bindBody(c, decodeApprovalResolve)
		if err != nil {
			return err
		}
		p := PrincipalFrom(c)
		if p.Sub == "" {
			// Without an identity the rule that a requester may not resolve
			// its own request cannot be kept.
			return NewProblem(http.StatusForbidden, "forbidden", "a token without a sub claim cannot approve or deny requests")
		}
		a, err := resolve(c.Request().Context(), p.OrgID, id, p.Sub, in.Note)
		if errors.Is(err, mandates.ErrAlreadyResolved) {
			if now, getErr := s.svc.Mandates.GetApproval(c.Request().Context(), p.OrgID, "", id); getErr == nil {
				state := now.State
				if state == "pending" && !now.ExpiresAt.After(time.Now()) {
					state = "expired" // (past its expiry; the sweeper has yet to mark it)
				}
				return alreadyResolved(err, id, state, now.ResolvedBy, now.ResolvedAt)
			}
		}
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, mandateApprovalOut(a))
	}
}

// alreadyResolved is the 409 for answering a request (a mandate approval,
// or a tool call by its approval_id) that is no longer pending, with what
// a UI needs to show what became of it instead of the answer: approval_id,
// its current state, and resolved_by and resolved_at when a person
// resolved it (as the document says: not for an expiry, a withdrawal or a
// policy's decision, which have a resolved_at but no one behind it).
func alreadyResolved(err error, id uuid.UUID, state, resolvedBy string, resolvedAt *time.Time) *Problem {
	p := NewProblem(http.StatusConflict, "conflict", err.Error()).With("approval_id", id.String()).With("state", state)
	if resolvedBy != "" {
		p.With("resolved_by", resolvedBy)
		if resolvedAt != nil {
			p.With("resolved_at", resolvedAt.UTC())
		}
	}
	return p
}
