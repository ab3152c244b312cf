package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"time"
)

// MandatesService calls the mandate routes (/v1/mandates): spending
// authority and its ledger.
type MandatesService struct{ c *Client }

// Mandate is an agent's budget for a scope.
type Mandate struct {
	ID      string `json:"id"`
	AgentID string `json:"agent_id"`
	Scope   string `json:"scope"`
	Budget  int64  `json:"budget"`
	// Spent is the sum of the ledger; it may exceed Budget after an
	// approved overrun.
	Spent int64 `json:"spent"`
	// Remaining is max(Budget − Spent, 0).
	Remaining int64 `json:"remaining"`
	// Status is active or revoked.
	Status     string     `json:"status"`
	ValidUntil *time.Time `json:"valid_until"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// MandateCreate is the body of POST /v1/mandates.
type MandateCreate struct {
	AgentID    string     `json:"agent_id"`
	Scope      string     `json:"scope"`
	Budget     int64      `json:"budget"`
	ValidUntil *time.Time `json:"valid_until,omitempty"`
}

// MandateUpdate is the body of PATCH /v1/mandates/{id}: absent fields are
// kept; ValidUntil: Null clears it.
type MandateUpdate struct {
	Budget *int64 `json:"budget,omitempty"`
	// Status is active or revoked.
	Status     string              `json:"status,omitempty"`
	ValidUntil Nullable[time.Time] `json:"valid_until,omitzero"`
}

// MandateListParams filter GET /v1/mandates.
type MandateListParams struct {
	AgentID string
	Scope   string
	PageParams
}

// SpendRequest is the body of POST /v1/mandates/spend.
type SpendRequest struct {
	AgentID string `json:"agent_id"`
	Scope   string `json:"scope"`
	Cost    int64  `json:"cost"`
	Reason  string `json:"reason,omitempty"`
}

// SpendResult is an allowed spend.
type SpendResult struct {
	OK        bool  `json:"ok"`
	Remaining int64 `json:"remaining"`
}

// LedgerEntry is one row of a mandate's ledger.
type LedgerEntry struct {
	ID string `json:"id"`
	// Kind is debit, refund or approved_overrun.
	Kind string `json:"kind"`
	// Amount is signed: refunds are negative.
	Amount         int64   `json:"amount"`
	Reason         string  `json:"reason"`
	IdempotencyKey *string `json:"idempotency_key"`
	// ApprovalID is the approval request an approved_overrun charges.
	ApprovalID string    `json:"approval_id,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// Create creates a mandate.
func (s *MandatesService) Create(ctx context.Context, req MandateCreate, opts ...CallOption) (Mandate, error) {
	return doJSON[Mandate](ctx, s.c, endpoint{method: http.MethodPost, path: "/v1/mandates", safety: keyed}, req, opts)
}

// List iterates over the mandates in creation order.
func (s *MandatesService) List(ctx context.Context, p MandateListParams, opts ...CallOption) iter.Seq2[Mandate, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[Mandate], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.ListPage(ctx, p, opts...)
	})
}

// ListPage returns one page of the mandates.
func (s *MandatesService) ListPage(ctx context.Context, p MandateListParams, opts ...CallOption) (Page[Mandate], error) {
	q := url.Values{}
	setIf(q, "agent_id", p.AgentID)
	setIf(q, "scope", p.Scope)
	return doJSON[Page[Mandate]](ctx, s.c, endpoint{method: http.MethodGet, path: "/v1/mandates", query: p.addTo(q)}, nil, opts)
}

// Spend debits a mandate. A refusal is an *Error with status 402 whose
// ApprovalID names the approval request created (IsSpendRefused). The
// call carries an Idempotency-Key, so its retries never debit twice.
func (s *MandatesService) Spend(ctx context.Context, req SpendRequest, opts ...CallOption) (SpendResult, error) {
	return doJSON[SpendResult](ctx, s.c, endpoint{method: http.MethodPost, path: "/v1/mandates/spend", safety: keyed}, req, opts)
}

// Get returns a mandate.
func (s *MandatesService) Get(ctx context.Context, id string, opts ...CallOption) (Mandate, error) {
	return doJSON[Mandate](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "mandates", id), argErr: needArgs("Mandates.Get", "id", id)}, nil, opts)
}

// Update changes a mandate's budget, status or valid_until.
func (s *MandatesService) Update(ctx context.Context, id string, req MandateUpdate, opts ...CallOption) (Mandate, error) {
	return doJSON[Mandate](ctx, s.c, endpoint{method: http.MethodPatch, path: pathOf("v1", "mandates", id), argErr: needArgs("Mandates.Update", "id", id)}, req, opts)
}

// Ledger iterates over a mandate's ledger, oldest first.
func (s *MandatesService) Ledger(ctx context.Context, id string, p PageParams, opts ...CallOption) iter.Seq2[LedgerEntry, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[LedgerEntry], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.LedgerPage(ctx, id, p, opts...)
	})
}

// LedgerPage returns one page of a mandate's ledger.
func (s *MandatesService) LedgerPage(ctx context.Context, id string, p PageParams, opts ...CallOption) (Page[LedgerEntry], error) {
	ep := endpoint{method: http.MethodGet, path: pathOf("v1", "mandates", id, "ledger"), query: p.addTo(nil), argErr: needArgs("Mandates.LedgerPage", "id", id)}
	return doJSON[Page[LedgerEntry]](ctx, s.c, ep, nil, opts)
}

// MandateApprovalsService calls the overrun approval routes
// (/v1/mandate-approvals).
type MandateApprovalsService struct{ c *Client }

// MandateApproval is a request to approve a refused spend.
type MandateApproval struct {
	ID      string `json:"id"`
	AgentID string `json:"agent_id"`
	Scope   string `json:"scope"`
	Cost    int64  `json:"cost"`
	// Budget and Spent are the mandate's when the spend was refused (nil:
	// there was no mandate).
	Budget *int64 `json:"budget"`
	Spent  *int64 `json:"spent"`
	// RequestedBy is the sub of the token that made the refused spend.
	RequestedBy string `json:"requested_by"`
	Reason      string `json:"reason"`
	// Refusal is why the spend was refused: no_mandate, revoked, expired
	// or insufficient.
	Refusal string `json:"refusal,omitempty"`
	// State is pending, approved, denied, expired or canceled.
	State      string     `json:"state"`
	ExpiresAt  time.Time  `json:"expires_at"`
	CreatedAt  time.Time  `json:"created_at"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	// ResolvedBy is the sub of the resolving token.
	ResolvedBy string `json:"resolved_by,omitempty"`
	Note       string `json:"note,omitempty"`
}

// MandateApprovalListParams filter GET /v1/mandate-approvals.
type MandateApprovalListParams struct {
	// Status is pending, approved, denied, expired or canceled.
	Status  string
	AgentID string
	// Order is "oldest" (the server's default: creation order) or "newest".
	Order string
	PageParams
}

// Resolution is the body of an approve or deny.
type Resolution struct {
	Note string `json:"note,omitempty"`
}

// List iterates over the approval requests in creation order, or newest
// first with Order "newest".
func (s *MandateApprovalsService) List(ctx context.Context, p MandateApprovalListParams, opts ...CallOption) iter.Seq2[MandateApproval, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[MandateApproval], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.ListPage(ctx, p, opts...)
	})
}

// ListPage returns one page of the approval requests.
func (s *MandateApprovalsService) ListPage(ctx context.Context, p MandateApprovalListParams, opts ...CallOption) (Page[MandateApproval], error) {
	q := url.Values{}
	setIf(q, "status", p.Status)
	setIf(q, "agent_id", p.AgentID)
	setIf(q, "order", p.Order)
	ep := endpoint{method: http.MethodGet, path: "/v1/mandate-approvals", query: p.addTo(q)}
	return doJSON[Page[MandateApproval]](ctx, s.c, ep, nil, opts)
}

// Get returns an approval request.
func (s *MandateApprovalsService) Get(ctx context.Context, id string, opts ...CallOption) (MandateApproval, error) {
	return doJSON[MandateApproval](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "mandate-approvals", id), argErr: needArgs("MandateApprovals.Get", "id", id)}, nil, opts)
}

// Approve charges the overrun and informs the requester.
func (s *MandateApprovalsService) Approve(ctx context.Context, id string, r Resolution, opts ...CallOption) (MandateApproval, error) {
	ep := endpoint{method: http.MethodPost, path: pathOf("v1", "mandate-approvals", id, "approve"), safety: keyed, argErr: needArgs("MandateApprovals.Approve", "id", id)}
	return doJSON[MandateApproval](ctx, s.c, ep, r, opts)
}

// Deny refuses the overrun.
func (s *MandateApprovalsService) Deny(ctx context.Context, id string, r Resolution, opts ...CallOption) (MandateApproval, error) {
	ep := endpoint{method: http.MethodPost, path: pathOf("v1", "mandate-approvals", id, "deny"), safety: keyed, argErr: needArgs("MandateApprovals.Deny", "id", id)}
	return doJSON[MandateApproval](ctx, s.c, ep, r, opts)
}
