package webhooks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// approvalFields are the fields of both approval kinds' JSON that a Slack
// line names (tool call: GET /v1/tool-approvals/{id}; mandate overrun:
// GET /v1/mandate-approvals/{id}).
type approvalFields struct {
	AgentID     string `json:"agent_id"`
	RequestedBy string `json:"requested_by"`
	ResolvedBy  string `json:"resolved_by"`
	Note        string `json:"note"`
	// A tool call's.
	SessionID string `json:"session_id"`
	ToolName  string `json:"tool_name"`
	Status    string `json:"status"`
	Source    string `json:"source"`
	// A mandate overrun's; money may be a number or a decimal string.
	Scope   string          `json:"scope"`
	Reason  string          `json:"reason"`
	State   string          `json:"state"`
	Refusal string          `json:"refusal"`
	Cost    json.RawMessage `json:"cost"`
	Budget  json.RawMessage `json:"budget"`
	Spent   json.RawMessage `json:"spent"`
}

// slackText is a Slack line for ev: who asks for what, or who answered
// what, then a link to the inbox when the engine's public URL is known.
// Everything that comes from the approval is agents' text and may be
// hostile: it is shown as code, escaped (slackCode), so it can neither
// mention a channel nor make a link.
func slackText(ev Event, publicURL string) string {
	var a approvalFields
	_ = json.Unmarshal(ev.Approval, &a) // a field that does not decode is shown as absent
	var line string
	if ev.Kind == KindMandateOverrun {
		line = overrunText(ev.Type, a)
	} else {
		line = toolCallText(ev.Type, a)
	}
	if ev.Type == TypeRequested && publicURL != "" {
		line += " Approve or deny: <" + publicURL + "/inbox|the approvals inbox>"
	}
	return line
}

func toolCallText(typ string, a approvalFields) string {
	if typ == TypeRequested {
		return fmt.Sprintf("Agent %s asks to call %s in session %s (requested by %s).",
			slackCode(a.AgentID), slackCode(a.ToolName), slackCode(a.SessionID), slackCode(a.RequestedBy))
	}
	return fmt.Sprintf("The call of %s by agent %s in session %s was %s.",
		slackCode(a.ToolName), slackCode(a.AgentID), slackCode(a.SessionID), resolution(a.Status, a.Source, a.ResolvedBy, a.Note))
}

func overrunText(typ string, a approvalFields) string {
	if typ == TypeRequested {
		what := fmt.Sprintf("Agent %s asks to spend %s on %s", slackCode(a.AgentID), money(a.Cost), slackCode(a.Scope))
		switch {
		case a.Refusal == "no_mandate":
			what += " without a mandate"
		case a.Refusal == "revoked" || a.Refusal == "expired":
			what += " under a mandate that is " + a.Refusal
		case len(a.Budget) > 0 && string(a.Budget) != "null":
			what += fmt.Sprintf(" past its mandate (budget %s, spent %s)", money(a.Budget), money(a.Spent))
		}
		if a.Reason != "" {
			what += ", for " + slackCode(a.Reason)
		}
		return what + fmt.Sprintf(" (requested by %s).", slackCode(a.RequestedBy))
	}
	return fmt.Sprintf("The spend of %s on %s by agent %s was %s.",
		money(a.Cost), slackCode(a.Scope), slackCode(a.AgentID), resolution(a.State, "", a.ResolvedBy, a.Note))
}

// resolution says how an approval ended: "approved by `alice` (note: …)",
// "denied by policy", "expired unanswered".
func resolution(status, source, by, note string) string {
	if status == "expired" || source == "expired" {
		return "not answered in time (expired)"
	}
	s := slackEscape(status)
	switch {
	case source == "policy":
		s += " by a standing policy"
	case by != "":
		s += " by " + slackCode(by)
	}
	if note != "" {
		s += " (note: " + slackCode(note) + ")"
	}
	return s
}

// money shows an amount given as a JSON number or decimal string.
func money(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return slackCode(s)
	}
	if t := bytes.TrimSpace(raw); len(t) > 0 && string(t) != "null" {
		return slackCode(string(t))
	}
	return "?"
}

// maxShown bounds each value in a line, in characters.
const maxShown = 120

// slackCode shows s as inline code: escaped, on one line, without
// backticks (one would end the code span), at most maxShown characters.
func slackCode(s string) string {
	if s == "" {
		return "(none)"
	}
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '`':
			return '\''
		case r < ' ' || r == 0x7f || r == '\u2028' || r == '\u2029':
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > maxShown {
		s = string([]rune(s)[:maxShown]) + "…"
	}
	return "`" + slackEscape(s) + "`"
}

// slackEscape escapes what Slack's message format gives meaning to: &, <
// and > (links, mentions).
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
