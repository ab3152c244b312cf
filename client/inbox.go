package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"strconv"
	"time"
)

// ApprovalsService follows the approvals inbox: both kinds of approvals
// (tool calls and mandate overruns) of the token's org.
type ApprovalsService struct{ c *Client }

// Approval event types; ApprovalReset is the client's name for the server's
// `reset` event.
const (
	ApprovalRequested = "requested"
	ApprovalResolved  = "resolved"
	ApprovalReset     = "reset"
)

// ApprovalEvent is one event of GET /v1/approvals/events. A Type of
// ApprovalReset says the resume point was older than what the server
// keeps, or past the end of its log (a seq from a restored database or
// another deployment), or, mid-stream, that retention purged events not
// yet sent: reload the lists; the events after Seq follow (a reconnect
// resumes after Seq).
type ApprovalEvent struct {
	Seq        int64  `json:"seq"`
	Type       string `json:"type"`
	Kind       string `json:"kind"` // tool_call | mandate_overrun
	ApprovalID string `json:"approval_id"`
	// Approval is the ToolApproval or MandateApproval (by Kind) as of the
	// event.
	Approval json.RawMessage `json:"approval"`
	At       time.Time       `json:"at"`
}

// ApprovalEventsParams say where the stream starts.
type ApprovalEventsParams struct {
	// After is the seq to resume after (a list's EventsSeq, or the last
	// event's Seq); nil starts at the current end as the first connection
	// finds it (only new events; the server says which seq that is, and a
	// reconnect resumes after it).
	After *int64
	// IdleTimeout is how long the connection may stay silent, keep-alives
	// included — the wait for its answer's headers too — before the client
	// reconnects (default DefaultSSEIdleTimeout).
	IdleTimeout time.Duration
}

// Events follows the org's approval requests and answers live (GET
// /v1/approvals/events) until ctx ends or the consumer stops. A cut
// connection is resumed with Last-Event-ID from the last event yielded —
// before the first, from where the stream started (each connection's
// first line says so: an id alone, or a reset's): none is yielded twice
// or skipped. Connections are opened again by the client's
// ReconnectPolicy, whatever its RetryPolicy: an outage is ridden out until
// ctx ends (or the policy's MaxOutage), and an answer retrying cannot
// change (a 403 …) is the iteration's error at once.
func (s *ApprovalsService) Events(ctx context.Context, p ApprovalEventsParams, opts ...CallOption) iter.Seq2[ApprovalEvent, error] {
	ep := endpoint{method: http.MethodGet, path: "/v1/approvals/events", accept: "text/event-stream"}
	lastID := ""
	if p.After != nil {
		lastID = strconv.FormatInt(*p.After, 10)
	}
	idle := p.IdleTimeout
	if idle <= 0 {
		idle = DefaultSSEIdleTimeout
	}
	return func(yield func(ApprovalEvent, error) bool) {
		for ev, err := range s.c.events(ctx, ep, lastID, idle, opts) {
			if err != nil {
				yield(ApprovalEvent{}, err)
				return
			}
			var out ApprovalEvent
			switch ev.Type {
			case ApprovalRequested, ApprovalResolved, ApprovalReset:
			default:
				continue // an event type of a later API
			}
			if err := json.Unmarshal([]byte(ev.Data), &out); err != nil {
				yield(ApprovalEvent{}, fmt.Errorf("client: a malformed %s event %q: %w", ev.Type, ev.Data, err))
				return
			}
			if ev.Type == ApprovalReset {
				out.Type = ApprovalReset
			}
			if !yield(out, nil) {
				return
			}
		}
	}
}
