package api

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// The JSON request bodies' decoders. Each decodes and validates what it can
// without the request or the database (the caller's agent binding and the
// domain's rules come after), so that the handlers and the fuzz targets
// (FuzzDecodeBodies) run the same code. Every error is a 4xx problem
// naming the field.

type mandateCreateIn struct {
	AgentID    string  `json:"agent_id" required:"true"`
	Scope      string  `json:"scope" required:"true"`
	Budget     *int64  `json:"budget" required:"true"`
	ValidUntil *string `json:"valid_until" nullable:"true"`
}

// decodeMandateCreate decodes POST /v1/mandates.
func decodeMandateCreate(body []byte) (mandates.CreateParams, error) {
	var in mandateCreateIn
	if err := decodeJSON(body, &in); err != nil {
		return mandates.CreateParams{}, err
	}
	if in.Budget == nil {
		return mandates.CreateParams{}, missingWith("budget", in.AgentID, in.Scope)
	}
	p := mandates.CreateParams{AgentID: in.AgentID, Scope: in.Scope, Budget: *in.Budget}
	if in.ValidUntil != nil {
		t, err := parseValidUntil(*in.ValidUntil)
		if err != nil {
			return mandates.CreateParams{}, err
		}
		p.ValidUntil = t
	}
	return p, nil
}

type mandatePatchIn struct {
	Budget     *int64          `json:"budget"`
	Status     *string         `json:"status"`
	ValidUntil json.RawMessage `json:"valid_until"` // absent: keep; null: clear
}

// decodeMandatePatch decodes PATCH /v1/mandates/{id}.
func decodeMandatePatch(body []byte) (mandates.PatchParams, error) {
	var in mandatePatchIn
	if err := decodeJSON(body, &in); err != nil {
		return mandates.PatchParams{}, err
	}
	p := mandates.PatchParams{Budget: in.Budget, Status: in.Status}
	if in.ValidUntil != nil {
		p.SetValidUntil = true
		if string(in.ValidUntil) != "null" {
			var raw string
			if err := json.Unmarshal(in.ValidUntil, &raw); err != nil {
				return mandates.PatchParams{}, Invalid("valid_until", "must be an RFC 3339 timestamp or null")
			}
			var err error
			if p.ValidUntil, err = parseValidUntil(raw); err != nil {
				return mandates.PatchParams{}, err
			}
		}
	}
	return p, nil
}

// spendIn is a POST /v1/mandates/spend body; Cost is never nil once decoded.
type spendIn struct {
	AgentID string `json:"agent_id" required:"true"`
	Scope   string `json:"scope" required:"true"`
	Cost    *int64 `json:"cost" required:"true"`
	Reason  string `json:"reason"`
}

// decodeSpend decodes POST /v1/mandates/spend.
func decodeSpend(body []byte) (spendIn, error) {
	var in spendIn
	if err := decodeJSON(body, &in); err != nil {
		return spendIn{}, err
	}
	if in.Cost == nil {
		return spendIn{}, missingWith("cost", in.AgentID, in.Scope)
	}
	return in, nil
}

// missingWith is the 400 of a missing amount (budget, cost), naming too the
// agent_id and scope the body lacks, in the service's words: every problem
// in one answer, as decodeWakeup gives it.
func missingWith(amount, agentID, scope string) error {
	inv := &apperr.InvalidError{}
	inv.Add(amount, "is required (an integer ≥ 0)")
	if agentID == "" {
		inv.Add("agent_id", "must not be empty")
	}
	if scope == "" {
		inv.Add("scope", "must not be empty")
	}
	return invalidFields(inv.Fields)
}

type approvalResolveIn struct {
	Note string `json:"note"`
}

// decodeApprovalResolve decodes POST /v1/mandate-approvals/{id}/approve
// and /deny (an empty body is no note).
func decodeApprovalResolve(body []byte) (approvalResolveIn, error) {
	var in approvalResolveIn
	err := decodeJSON(body, &in)
	return in, err
}

// decodeWakeup decodes POST /v1/wakeups; Cost and Work are never nil once
// decoded.
func decodeWakeup(body []byte) (wakeupRequest, error) {
	var in wakeupRequest
	if err := decodeJSON(body, &in); err != nil {
		return wakeupRequest{}, err
	}
	inv := &apperr.InvalidError{}
	if in.Cost == nil {
		inv.Add("cost", "is required (an integer ≥ 0)")
	}
	switch {
	case in.Work == nil:
		inv.Add("work", "is required: {handler, args, retry?, timeout_ms?, concurrency_key?, key_limit?}")
	default:
		in.Work.Retry.checkBase(inv, "work.retry.base")
		if in.Work.KeyLimit != nil {
			checkKeyLimit(inv, "work.key_limit", *in.Work.KeyLimit)
		}
	}
	if len(inv.Fields) > 0 {
		// Every problem in one answer: the required fields the service
		// would name too, in the service's words.
		for _, f := range []struct{ name, v string }{
			{"agent_id", in.AgentID}, {"workflow_id", in.WorkflowID}, {"signal", in.Signal}, {"scope", in.Scope},
		} {
			if f.v == "" {
				inv.Add(f.name, "must not be empty")
			}
		}
		if in.Work != nil && in.Work.Handler == "" {
			inv.Add("work.handler", "must not be empty")
		}
		return wakeupRequest{}, invalidFields(inv.Fields)
	}
	return in, nil
}

// decodeWorkEnqueue decodes POST /v1/pools/{pool}/work into the params the
// body sets (not OrgID, Pool).
func decodeWorkEnqueue(body []byte) (workpool.EnqueueParams, error) {
	var in workIn
	if err := decodeJSON(body, &in); err != nil {
		return workpool.EnqueueParams{}, err
	}
	p := workpool.EnqueueParams{Handler: in.Handler, Args: in.Args, Retry: in.Retry.policy(), ConcurrencyKey: in.ConcurrencyKey}
	inv := &apperr.InvalidError{}
	in.Retry.checkBase(inv, "retry.base")
	if in.KeyLimit != nil {
		checkKeyLimit(inv, "key_limit", *in.KeyLimit)
		p.KeyLimit = *in.KeyLimit
	}
	if in.RunAt != nil {
		if at, err := parseTimestamp(*in.RunAt); err != nil {
			inv.Add("run_at", err.Error())
		} else {
			p.RunAt, p.RunAtSet = at, true
		}
	}
	if in.TimeoutMS != nil {
		if *in.TimeoutMS < 1 || *in.TimeoutMS > workpool.MaxTimeoutMS {
			inv.Add("timeout_ms",
				fmt.Sprintf("must be from 1 to %d milliseconds (omit it for the default, %d)", workpool.MaxTimeoutMS, workpool.DefaultTimeoutMS))
		}
		p.TimeoutMS = *in.TimeoutMS
	}
	if len(inv.Fields) > 0 {
		// Every problem of these fields in one answer, and the required
		// field the service would name too, in its words. (The rest — an
		// unknown handler, args, retry, the key's length — the service
		// names once these are right.)
		if in.Handler == "" {
			inv.Add("handler", "must not be empty")
		}
		return workpool.EnqueueParams{}, invalidFields(inv.Fields)
	}
	return p, nil
}

// retryIn is a request's retry policy: base is kept as given, so that an
// explicit 0 (which the Go API reads as "the default") is refused.
type retryIn struct {
	MaxAttempts      int      `json:"max_attempts" required:"true"`
	InitialBackoffMS int      `json:"initial_backoff_ms"`
	Base             *float64 `json:"base"`
}

func (r *retryIn) policy() *workpool.RetryPolicy {
	if r == nil {
		return nil
	}
	return &workpool.RetryPolicy{MaxAttempts: r.MaxAttempts, InitialBackoffMS: r.InitialBackoffMS, Base: deref(r.Base)}
}

// checkBase refuses a base the domain would read as its default (0, or a
// number so small it decodes to 0); other out-of-range bases are the
// domain's to name.
func (r *retryIn) checkBase(inv *apperr.InvalidError, field string) {
	if r != nil && r.Base != nil && *r.Base == 0 {
		inv.Add(field, "must be between 1 and 100 (omit it for the default, 2)")
	}
}

// checkKeyLimit refuses a key_limit below 1: the Go API reads 0 as "the
// default", which a client that sends 0 did not mean. (The domain checks
// the upper bound.)
func checkKeyLimit(inv *apperr.InvalidError, field string, n int) {
	if n < 1 {
		inv.Add(field, "must be between 1 and 10000")
	}
}

// decodePoolPatch decodes PATCH /v1/pools/{pool}; at least one field must
// be set. Value ranges are the domain's (workpool.UpdatePool).
func decodePoolPatch(body []byte) (workpool.PoolUpdate, error) {
	var in poolPatch
	if err := decodeJSON(body, &in); err != nil {
		return workpool.PoolUpdate{}, err
	}
	// A pool always has a limit: a null max_parallelism is refused, not
	// read as absent (the document declares an integer).
	var present map[string]json.RawMessage
	if json.Unmarshal(body, &present) == nil && string(present["max_parallelism"]) == "null" {
		return workpool.PoolUpdate{}, Invalid("max_parallelism",
			fmt.Sprintf("must be between 1 and %d (a pool's limit cannot be removed)", workpool.MaxParallelismLimit))
	}
	if in.MaxParallelism == nil && in.MaxParallelismPerOrg == nil && in.OrgWeights == nil {
		return workpool.PoolUpdate{}, Invalid("max_parallelism", "is required unless max_parallelism_per_org or org_weights is given")
	}
	u := workpool.PoolUpdate{MaxParallelism: in.MaxParallelism, SetMaxParallelismPerOrg: in.MaxParallelismPerOrg != nil}
	if u.SetMaxParallelismPerOrg && string(in.MaxParallelismPerOrg) != "null" {
		var n int
		if err := json.Unmarshal(in.MaxParallelismPerOrg, &n); err != nil {
			return workpool.PoolUpdate{}, Invalid("max_parallelism_per_org", "must be an integer or null")
		}
		u.MaxParallelismPerOrg = &n
	}
	if in.OrgWeights == nil {
		return u, nil
	}
	if string(in.OrgWeights) == "null" {
		u.ClearOrgWeights = true
		return u, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(in.OrgWeights, &raw); err != nil {
		return workpool.PoolUpdate{}, Invalid("org_weights", "must be an object of org ids to weights, or null")
	}
	u.OrgWeights = make(map[string]*int, len(raw))
	for _, org := range slices.Sorted(maps.Keys(raw)) { // the first bad entry is named, always the same
		if string(raw[org]) == "null" {
			u.OrgWeights[org] = nil
			continue
		}
		var n int
		if err := json.Unmarshal(raw[org], &n); err != nil {
			return workpool.PoolUpdate{}, Invalid("org_weights."+org, "must be an integer between 1 and 100, or null")
		}
		u.OrgWeights[org] = &n
	}
	return u, nil
}

type toolCallIn struct {
	AgentID    string          `json:"agent_id" required:"true"`
	ToolName   string          `json:"tool_name" required:"true"`
	Input      json.RawMessage `json:"input"`
	WorkflowID string          `json:"workflow_id"`
	RunID      string          `json:"run_id"`
	Signal     string          `json:"signal"`
	ExpiresInS *int64          `json:"expires_in_s"`
}

// decodeToolCall decodes POST /v1/sessions/{session_id}/tool-calls into the
// params the body sets (not OrgID, SessionID, IdempotencyKey, RequestedBy).
func decodeToolCall(body []byte) (approvals.RequestParams, error) {
	var in toolCallIn
	if err := decodeJSON(body, &in); err != nil {
		return approvals.RequestParams{}, err
	}
	p := approvals.RequestParams{AgentID: in.AgentID, ToolName: in.ToolName, Input: in.Input,
		WorkflowID: in.WorkflowID, RunID: in.RunID, Signal: in.Signal}
	if in.ExpiresInS != nil {
		// Clamped to just outside the range, so that seconds never overflow a
		// Duration and the domain's range check names the field.
		secs := min(max(*in.ExpiresInS, -1), int64(approvals.MaxExpiresIn/time.Second)+1)
		d := time.Duration(secs) * time.Second
		p.ExpiresIn = &d
	}
	return p, nil
}

type toolAnswerIn struct {
	ToolName     string `json:"tool_name"`
	ApprovalID   string `json:"approval_id"`
	Decision     string `json:"decision" required:"true"`
	UpdatePolicy string `json:"update_policy"`
	Note         string `json:"note"`
}

// decodeToolAnswer decodes POST /v1/sessions/{session_id}/tool-approvals
// into the params the body sets (not OrgID, SessionID, ResolvedBy).
func decodeToolAnswer(body []byte) (approvals.RespondParams, error) {
	var in toolAnswerIn
	if err := decodeJSON(body, &in); err != nil {
		return approvals.RespondParams{}, err
	}
	p := approvals.RespondParams{ToolName: in.ToolName, Decision: in.Decision, UpdatePolicy: in.UpdatePolicy, Note: in.Note}
	if in.ApprovalID != "" {
		id, err := parseUUID(in.ApprovalID)
		if err != nil {
			return approvals.RespondParams{}, Invalid("approval_id", "must be a tool approval's id (a UUID)")
		}
		if id == uuid.Nil {
			// (read as "absent", the nil UUID beside tool_name turned an
			// answer naming one call into an answer to every call of the tool)
			return approvals.RespondParams{}, Invalid("approval_id", "must be a tool approval's id (the nil UUID names none)")
		}
		p.ApprovalID = id
	}
	return p, nil
}

type toolPolicyIn struct {
	Approval string          `json:"approval" required:"true"`
	Match    json.RawMessage `json:"match"`
}

// decodeToolPolicy decodes PUT /v1/agents/{agent_id}/tool-policies/{tool_name}
// into the params the body sets (not AgentID, ToolName, UpdatedBy).
func decodeToolPolicy(body []byte) (approvals.PolicyParams, error) {
	var in toolPolicyIn
	if err := decodeJSON(body, &in); err != nil {
		return approvals.PolicyParams{}, err
	}
	return approvals.PolicyParams{Approval: in.Approval, Match: in.Match}, nil
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
