package approvals

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// toolApprovalJSON is a tool approval as GET /v1/tool-approvals/{id} shows
// it. It lives here, not in the HTTP layer, because the approvals inbox's
// events carry the same object and are written in this package's
// transactions: one shape, one place.
type toolApprovalJSON struct {
	ID          uuid.UUID       `json:"id"`
	SessionID   string          `json:"session_id"`
	AgentID     string          `json:"agent_id"`
	ToolName    string          `json:"tool_name"`
	Input       json.RawMessage `json:"input"`
	Status      string          `json:"status"`
	Source      *string         `json:"source"`
	RequestedBy string          `json:"requested_by"`
	ResolvedBy  *string         `json:"resolved_by"`
	Note        *string         `json:"note"`
	WorkflowID  *string         `json:"workflow_id"`
	RunID       *string         `json:"run_id"`
	Signal      *string         `json:"signal"`
	Delivery    *deliveryJSON   `json:"delivery"`
	CreatedAt   time.Time       `json:"created_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	ResolvedAt  *time.Time      `json:"resolved_at"`
}

type deliveryJSON struct {
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// MarshalJSON is the tool approval as its GET route shows it.
func (a ToolApproval) MarshalJSON() ([]byte, error) {
	out := toolApprovalJSON{ID: a.ID, SessionID: a.SessionID, AgentID: a.AgentID, ToolName: a.ToolName, Input: rawOrNull(a.Input),
		Status: a.Status, Source: nullIfEmpty(a.Source), RequestedBy: a.RequestedBy, ResolvedBy: nullIfEmpty(a.ResolvedBy),
		Note: nullIfEmpty(a.Note), WorkflowID: nullIfEmpty(a.WorkflowID), RunID: nullIfEmpty(a.RunID), Signal: nullIfEmpty(a.Signal),
		CreatedAt: a.CreatedAt.UTC(), ExpiresAt: a.ExpiresAt.UTC(), ResolvedAt: utcPtr(a.ResolvedAt)}
	if a.Delivery != nil {
		out.Delivery = &deliveryJSON{State: a.Delivery.State, Attempts: a.Delivery.Attempts, LastError: a.Delivery.LastError}
	}
	return json.Marshal(out)
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
