package client

import (
	"context"
	"encoding/json"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ToolApprovalsService calls the tool approval routes: an agent asks to
// call a tool in a session, an approver answers, both read the session's
// events.
type ToolApprovalsService struct{ c *Client }

// ToolCallRequest is the body of POST /v1/sessions/{session_id}/tool-calls.
type ToolCallRequest struct {
	AgentID  string `json:"agent_id"`
	ToolName string `json:"tool_name"`
	// Input is the call's input (any JSON value, at most 64 KiB): what
	// conditional policies match.
	Input any `json:"input,omitempty"`
	// WorkflowID, when set, is signalled with the decision; it must start
	// with "<org_id>/".
	WorkflowID string `json:"workflow_id,omitempty"`
	RunID      string `json:"run_id,omitempty"`
	// Signal is the signal's name (default "approval").
	Signal string `json:"signal,omitempty"`
	// ExpiresInS is how long the call waits for a human (10 s–7 days;
	// default the server's REVEILLE_TOOL_APPROVAL_TTL).
	ExpiresInS *int64 `json:"expires_in_s,omitempty"`
}

// ToolCallAnswer is the decision on a tool call, or pending.
type ToolCallAnswer struct {
	// Decision is approved, denied or pending.
	Decision   string `json:"decision"`
	ApprovalID string `json:"approval_id"`
	// Source is who decided: policy, human or expired (absent while
	// pending).
	Source string `json:"source,omitempty"`
	// Policy is the policy that decided (Source policy).
	Policy *ToolPolicy `json:"policy,omitempty"`
	// ExpiresAt is when a pending call expires.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// ToolCallResponse is the body of POST
// /v1/sessions/{session_id}/tool-approvals: exactly one of ToolName and
// ApprovalID.
type ToolCallResponse struct {
	ToolName   string `json:"tool_name,omitempty"`
	ApprovalID string `json:"approval_id,omitempty"`
	// Decision is approved or denied.
	Decision string `json:"decision"`
	// UpdatePolicy sets the agent's unconditional policy for the tool:
	// always, once or never.
	UpdatePolicy string `json:"update_policy,omitempty"`
	Note         string `json:"note,omitempty"`
}

// ToolCallResolution is the calls an answer resolved and the agent's
// unconditional policy for the tool after it.
type ToolCallResolution struct {
	Resolved []string `json:"resolved"`
	Policy   *string  `json:"policy"`
}

// ToolApproval is a recorded tool call.
type ToolApproval struct {
	ID        string          `json:"id"`
	SessionID string          `json:"session_id"`
	AgentID   string          `json:"agent_id"`
	ToolName  string          `json:"tool_name"`
	Input     json.RawMessage `json:"input"`
	// Status is pending, approved, denied or expired.
	Status string `json:"status"`
	// Source is human, policy or expired once decided.
	Source      *string   `json:"source"`
	RequestedBy string    `json:"requested_by"`
	ResolvedBy  *string   `json:"resolved_by"`
	Note        *string   `json:"note"`
	WorkflowID  *string   `json:"workflow_id"`
	RunID       *string   `json:"run_id"`
	Signal      *string   `json:"signal"`
	Delivery    *Delivery `json:"delivery"`

	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	ResolvedAt *time.Time `json:"resolved_at"`
}

// ToolApprovalListParams filter GET /v1/tool-approvals.
type ToolApprovalListParams struct {
	// Status is pending, resolved, approved, denied or expired.
	Status    string
	AgentID   string
	SessionID string
	// Delivery is the decision signal's state: waiting, queued, sent or
	// undeliverable (the decisions an admin may Redeliver; the list itself
	// is an approver's).
	Delivery string
	PageParams
}

// SessionEvent is one event of a session: seq 1, 2, 3 … without gaps.
type SessionEvent struct {
	Seq int64 `json:"seq"`
	// Name is tool.approval.requested, tool.approval.resolved or
	// turn.tool_call.denied.
	Name      string          `json:"name"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// SessionEventParams page a session's events.
type SessionEventParams struct {
	// After is the seq to read after (default 0: from the start).
	After int64
	// Limit is the page size (1–500; 0: 50).
	Limit int
}

// Request asks to call a tool: a standing policy decides at once, else the
// call waits for a human (Decision pending).
func (s *ToolApprovalsService) Request(ctx context.Context, sessionID string, req ToolCallRequest, opts ...CallOption) (ToolCallAnswer, error) {
	ep := endpoint{method: http.MethodPost, path: pathOf("v1", "sessions", sessionID, "tool-calls"), safety: keyed, argErr: needArgs("ToolApprovals.Request", "sessionID", sessionID)}
	return doJSON[ToolCallAnswer](ctx, s.c, ep, req, opts)
}

// Respond answers a session's pending calls and/or sets the standing
// policy.
func (s *ToolApprovalsService) Respond(ctx context.Context, sessionID string, req ToolCallResponse, opts ...CallOption) (ToolCallResolution, error) {
	ep := endpoint{method: http.MethodPost, path: pathOf("v1", "sessions", sessionID, "tool-approvals"), safety: keyed, argErr: needArgs("ToolApprovals.Respond", "sessionID", sessionID)}
	return doJSON[ToolCallResolution](ctx, s.c, ep, req, opts)
}

// Events iterates over a session's events stored now, in seq order.
func (s *ToolApprovalsService) Events(ctx context.Context, sessionID string, p SessionEventParams, opts ...CallOption) iter.Seq2[SessionEvent, error] {
	return all(ctx, strconv.FormatInt(p.After, 10), func(ctx context.Context, cursor string) (Page[SessionEvent], error) {
		after, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil {
			return Page[SessionEvent]{}, err
		}
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.After = after
		return s.EventsPage(ctx, sessionID, p, opts...)
	})
}

// EventsPage returns one page of a session's events; its NextCursor is the
// seq to pass as After next.
func (s *ToolApprovalsService) EventsPage(ctx context.Context, sessionID string, p SessionEventParams, opts ...CallOption) (Page[SessionEvent], error) {
	q := url.Values{}
	if p.After != 0 { // (a negative one too: the server's 400 names it)
		q.Set("after", strconv.FormatInt(p.After, 10))
	}
	if p.Limit != 0 { // (a negative one too: the server's 400 names it)
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	ep := endpoint{method: http.MethodGet, path: pathOf("v1", "sessions", sessionID, "events"), query: q, argErr: needArgs("ToolApprovals.EventsPage", "sessionID", sessionID)}
	return doJSON[Page[SessionEvent]](ctx, s.c, ep, nil, opts)
}

// List iterates over the inbox of tool calls, newest first.
func (s *ToolApprovalsService) List(ctx context.Context, p ToolApprovalListParams, opts ...CallOption) iter.Seq2[ToolApproval, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[ToolApproval], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.ListPage(ctx, p, opts...)
	})
}

// ListPage returns one page of the inbox.
func (s *ToolApprovalsService) ListPage(ctx context.Context, p ToolApprovalListParams, opts ...CallOption) (Page[ToolApproval], error) {
	q := url.Values{}
	setIf(q, "status", p.Status)
	setIf(q, "agent_id", p.AgentID)
	setIf(q, "session_id", p.SessionID)
	setIf(q, "delivery", p.Delivery)
	ep := endpoint{method: http.MethodGet, path: "/v1/tool-approvals", query: p.addTo(q)}
	return doJSON[Page[ToolApproval]](ctx, s.c, ep, nil, opts)
}

// Get returns one tool approval (an agent without a workflow polls its
// answer here).
func (s *ToolApprovalsService) Get(ctx context.Context, id string, opts ...CallOption) (ToolApproval, error) {
	return doJSON[ToolApproval](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "tool-approvals", id), argErr: needArgs("ToolApprovals.Get", "id", id)}, nil, opts)
}

// Redeliver queues again the decision signal of a tool approval given up
// on (delivery undeliverable; 409 when it is not) [admin].
func (s *ToolApprovalsService) Redeliver(ctx context.Context, id string, opts ...CallOption) (ToolApproval, error) {
	return doJSON[ToolApproval](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "tool-approvals", id, "redeliver"), safety: unsafe, argErr: needArgs("ToolApprovals.Redeliver", "id", id)}, nil, opts)
}

// ToolPoliciesService calls the standing tool policy routes
// (/v1/agents/{agent_id}/tool-policies).
type ToolPoliciesService struct{ c *Client }

// ToolPolicy is a standing decision for an agent's calls of a tool.
type ToolPolicy struct {
	// ID is the policy's; a put that replaces its approval keeps it.
	ID       string `json:"id"`
	ToolName string `json:"tool_name"`
	// Approval is always, once or never.
	Approval string `json:"approval"`
	// Match is null for the unconditional policy; else the JSON object a
	// call's input must contain.
	Match     json.RawMessage `json:"match"`
	UpdatedAt time.Time       `json:"updated_at"`
	// UpdatedBy is the sub of the token that set it.
	UpdatedBy string `json:"updated_by"`
}

// ToolPolicyRequest is the body of PUT
// /v1/agents/{agent_id}/tool-policies/{tool_name}.
type ToolPolicyRequest struct {
	// Approval is always, once or never.
	Approval string `json:"approval"`
	// Match, when set, makes the policy conditional: a JSON object (at most
	// 4 KiB) a call's input must contain.
	Match any `json:"match,omitempty"`
}

// List iterates over an agent's standing policies in creation order.
func (s *ToolPoliciesService) List(ctx context.Context, agentID string, p PageParams, opts ...CallOption) iter.Seq2[ToolPolicy, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[ToolPolicy], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.ListPage(ctx, agentID, p, opts...)
	})
}

// ListPage returns one page of an agent's standing policies.
func (s *ToolPoliciesService) ListPage(ctx context.Context, agentID string, p PageParams, opts ...CallOption) (Page[ToolPolicy], error) {
	ep := endpoint{method: http.MethodGet, path: pathOf("v1", "agents", agentID, "tool-policies"), query: p.addTo(nil), argErr: needArgs("ToolPolicies.ListPage", "agentID", agentID)}
	return doJSON[Page[ToolPolicy]](ctx, s.c, ep, nil, opts)
}

// Put sets a standing policy: one per (agent, tool, match).
func (s *ToolPoliciesService) Put(ctx context.Context, agentID, toolName string, req ToolPolicyRequest, opts ...CallOption) (ToolPolicy, error) {
	ep := endpoint{method: http.MethodPut, path: pathOf("v1", "agents", agentID, "tool-policies", toolName),
		argErr: needArgs("ToolPolicies.Put", "agentID", agentID, "toolName", toolName)}
	return doJSON[ToolPolicy](ctx, s.c, ep, req, opts)
}

// Delete removes a standing policy: the conditional one of match, or the
// unconditional one when match is nil. A 404 is an error (IsNotFound) —
// but not to a retry after an attempt that got no answer at all (or a
// success cut short): that attempt deleted the policy, and Delete returns nil. (After a 5xx, or an
// error answer cut inside its body, the 404 stays an error, a
// *MaybeAppliedError: the status line may come from a proxy that
// forwarded nothing.)
func (s *ToolPoliciesService) Delete(ctx context.Context, agentID, toolName string, match any, opts ...CallOption) error {
	q := url.Values{}
	if match != nil {
		raw, err := json.Marshal(match)
		if err != nil {
			return err
		}
		q.Set("match", string(raw))
	}
	ep := endpoint{method: http.MethodDelete, path: pathOf("v1", "agents", agentID, "tool-policies", toolName), query: q,
		argErr: needArgs("ToolPolicies.Delete", "agentID", agentID, "toolName", toolName), goneIsDone: true}
	return doNoContent(ctx, s.c, ep, nil, opts)
}
