package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/workflows/signals"
)

// RequestParams ask to call a tool.
type RequestParams struct {
	OrgID     string
	SessionID string // bound to AgentID on first use
	AgentID   string
	ToolName  string
	Input     json.RawMessage // optional; what conditional policies match
	// WorkflowID (optional, "<org_id>/…") is signalled with the decision of
	// a request that waits for a human: under Signal (default "approval"),
	// at RunID when given.
	WorkflowID string
	RunID      string
	Signal     string
	// ExpiresIn bounds the wait for a human (MinExpiresIn … MaxExpiresIn;
	// nil: the configured TTL).
	ExpiresIn *time.Duration
	// IdempotencyKey makes Request act at most once per (org, agent, key):
	// a repeat returns the same approval; another agent's key is no key.
	IdempotencyKey string
	// RequestedBy is the caller's token sub (it may not answer its own call).
	RequestedBy string
}

// RequestResult is the answer to a request: Decision approved or denied
// with Source policy (and the deciding Policy), or pending. A replayed
// idempotency key answers with the approval's state now.
type RequestResult struct {
	Decision string
	Source   string
	Policy   *Policy
	Approval ToolApproval
}

// Request records a tool call in its session and decides it by policy, or
// leaves it pending for a human; the session's events say which. Errors:
// *apperr.InvalidError, ErrSessionAgent, ErrIdempotencyKeyReused.
func (s *Service) Request(ctx context.Context, p RequestParams) (RequestResult, error) {
	input, err := s.validateRequest(&p)
	if err != nil {
		return RequestResult{}, err
	}
	ttl := s.cfg.TTL
	if p.ExpiresIn != nil {
		ttl = *p.ExpiresIn
	}
	var id uuid.UUID
	var pol *Policy
	var replay bool
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var bound string
		if err := tx.QueryRow(ctx, qBindSession, p.OrgID, p.SessionID, p.AgentID).Scan(&bound); err != nil {
			return fmt.Errorf("binding session: %w", err)
		}
		if bound != p.AgentID {
			return ErrSessionAgent
		}
		if pol, err = decidingPolicy(ctx, tx, p.OrgID, p.AgentID, p.ToolName, input); err != nil {
			return err
		}
		status, source, policyID := StatusPending, (*string)(nil), (*uuid.UUID)(nil)
		if pol != nil && pol.Approval != PolicyOnce {
			status, source, policyID = StatusApproved, ptr(SourcePolicy), &pol.ID
			if pol.Approval == PolicyNever {
				status = StatusDenied
			}
		}
		id = newID()
		// A concurrent first use of the key waits here for the first to
		// commit, and then inserts nothing.
		tag, err := tx.Exec(ctx, qInsertApproval, id, p.OrgID, p.SessionID, p.AgentID, p.ToolName, input, status, source, policyID,
			p.RequestedBy, nullIfEmpty(p.WorkflowID), nullIfEmpty(p.RunID), nullIfEmpty(p.Signal), nullIfEmpty(p.IdempotencyKey), ttl.Microseconds())
		if err != nil {
			return fmt.Errorf("recording tool call: %w", err)
		}
		if tag.RowsAffected() == 0 {
			replay = true
			err := tx.QueryRow(ctx, qApprovalByKey, p.OrgID, p.AgentID, p.IdempotencyKey).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				return errKeyPurged
			}
			if err != nil {
				return fmt.Errorf("reading the key's first tool call: %w", err)
			}
			return errReplay // a replay writes nothing, not even a new session
		}
		if status != StatusPending {
			return appendEvents(ctx, tx, p.OrgID, p.SessionID,
				newEvent{EventResolved, map[string]any{"approval_id": id, "tool_name": p.ToolName, "decision": status, "source": SourcePolicy}})
		}
		err = appendEvents(ctx, tx, p.OrgID, p.SessionID,
			newEvent{EventRequested, map[string]any{"approval_id": id, "tool_name": p.ToolName, "input": rawOrNull(input)}})
		if err != nil {
			return err
		}
		return s.appendInbox(ctx, tx, inbox.TypeRequested, p.OrgID, id)
	})
	if errors.Is(err, errKeyPurged) {
		return s.Request(ctx, p) // its call was purged past its retention: decided afresh
	}
	if err != nil && !errors.Is(err, errReplay) {
		return RequestResult{}, err
	}
	a, err := s.Get(ctx, p.OrgID, id, "")
	if replay && errors.Is(err, ErrNotFound) {
		return s.Request(ctx, p) // (purged since the key was read)
	}
	if err != nil {
		return RequestResult{}, err
	}
	if replay {
		return s.replay(ctx, p, input, a)
	}
	if a.Source == SourcePolicy {
		s.metrics.decided(SourcePolicy, a.Status)
		return RequestResult{Decision: a.Decision(), Source: SourcePolicy, Policy: pol, Approval: a}, nil
	}
	s.metrics.requested()
	return RequestResult{Decision: DecisionPending, Approval: a}, nil
}

// errKeyPurged rolls back a request whose key's call was purged
// (internal/retention) between the insert that found it and its read.
var errKeyPurged = errors.New("approvals: the key's call was purged")

// errReplay rolls back the transaction of a request whose key was used.
var errReplay = errors.New("approvals: idempotency key replay")

// replay answers a repeated idempotency key with the first request's
// approval, as it stands now.
func (s *Service) replay(ctx context.Context, p RequestParams, input json.RawMessage, a ToolApproval) (RequestResult, error) {
	if a.SessionID != p.SessionID || a.AgentID != p.AgentID || a.ToolName != p.ToolName || a.WorkflowID != p.WorkflowID ||
		a.RunID != p.RunID || a.Signal != p.Signal || !jsonb.Equal(a.Input, input) ||
		// (a retry without expires_in_s asks for no particular wait: the
		// configured TTL may have changed since the first call)
		(p.ExpiresIn != nil && a.ExpiresAt.Sub(a.CreatedAt) != *p.ExpiresIn) {
		return RequestResult{}, ErrIdempotencyKeyReused
	}
	res := RequestResult{Decision: a.Decision(), Source: a.Source, Approval: a}
	if a.PolicyID != nil {
		pol, err := scanPolicy(s.db.QueryRow(ctx, qGetPolicy, p.OrgID, *a.PolicyID))
		switch {
		case err == nil:
			// (a policy whose approval was replaced since no longer gives
			// this decision: not shown, as a deleted one is not)
			if decidedBy[pol.Approval] == a.Status {
				res.Policy = &pol
			}
		case !errors.Is(err, pgx.ErrNoRows): // a deleted policy is simply not shown
			return RequestResult{}, fmt.Errorf("reading tool policy: %w", err)
		}
	}
	return res, nil
}

// validateRequest checks a request before anything is written, fills in
// the default signal and returns the input to store.
func (s *Service) validateRequest(p *RequestParams) (json.RawMessage, error) {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "session_id", p.SessionID, MaxID)
	checkSegment(inv, "agent_id", p.AgentID, MaxText)
	checkToolName(inv, "tool_name", p.ToolName)
	input := normalizeInput(inv, p.Input)
	checkWorkflow(inv, p.OrgID, p.WorkflowID, p.RunID, p.Signal)
	if p.ExpiresIn != nil && (*p.ExpiresIn < MinExpiresIn || *p.ExpiresIn > MaxExpiresIn) {
		inv.Add("expires_in_s", fmt.Sprintf("must be from %d to %d seconds", int(MinExpiresIn.Seconds()), int(MaxExpiresIn.Seconds())))
	}
	if p.WorkflowID != "" && p.Signal == "" {
		p.Signal = signals.ApprovalSignal
	}
	return input, inv.OrNil()
}

func ptr[T any](v T) *T { return &v }

func rawOrNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// decidedBy is the status a policy's approval gives a call it decides
// (once decides none: the call waits for a human).
var decidedBy = map[string]string{PolicyAlways: StatusApproved, PolicyNever: StatusDenied}
