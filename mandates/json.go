package mandates

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// approvalJSON is an overrun approval request as GET
// /v1/mandate-approvals/{id} shows it. It lives here, not in the HTTP
// layer, because the approvals inbox's events carry the same object and
// are written in this package's transactions: one shape, one place.
type approvalJSON struct {
	ID          uuid.UUID  `json:"id"`
	AgentID     string     `json:"agent_id"`
	Scope       string     `json:"scope"`
	Cost        int64      `json:"cost"`
	Budget      *int64     `json:"budget"`
	Spent       *int64     `json:"spent"`
	Reason      string     `json:"reason"`
	Refusal     string     `json:"refusal,omitempty"`
	State       string     `json:"state"`
	RequestedBy string     `json:"requested_by"`
	ExpiresAt   time.Time  `json:"expires_at"`
	CreatedAt   time.Time  `json:"created_at"`
	ResolvedAt  *time.Time `json:"resolved_at,omitempty"`
	ResolvedBy  string     `json:"resolved_by,omitempty"`
	Note        string     `json:"note,omitempty"`
}

// MarshalJSON is the request as its GET route shows it.
func (a Approval) MarshalJSON() ([]byte, error) {
	out := approvalJSON{ID: a.ID, AgentID: a.AgentID, Scope: a.Scope, Cost: a.Cost, Budget: a.Budget, Spent: a.Spent,
		Reason: a.Reason, Refusal: a.Refusal, State: a.State, RequestedBy: a.RequestedBy,
		ExpiresAt: a.ExpiresAt.UTC(), CreatedAt: a.CreatedAt.UTC(), ResolvedBy: a.ResolvedBy, Note: a.Note}
	if a.ResolvedAt != nil {
		t := a.ResolvedAt.UTC()
		out.ResolvedAt = &t
	}
	return json.Marshal(out)
}
