package approvals

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/workflows/signals"
)

// checkText rejects empty required fields, text over max bytes, NUL bytes
// and invalid UTF-8 (which Postgres text cannot hold).
func checkText(inv *apperr.InvalidError, field, v string, max int, required bool) {
	switch {
	case v == "" && required:
		inv.Add(field, "must not be empty")
	case len(v) > max:
		inv.Add(field, fmt.Sprintf("must be at most %d bytes", max))
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		inv.Add(field, "must be valid UTF-8 without NUL characters")
	}
}

// checkSegment is checkText of a required value that is a path segment of
// the API's routes (a session id, an agent id, a tool name): it must not
// be "." or "..", which URL clients — browsers, fetch, URL libraries,
// curl — remove from a path even percent-encoded, so that nothing could
// reach or answer what it names (a tool call in session ".." could never
// be answered from the inbox page).
func checkSegment(inv *apperr.InvalidError, field, v string, max int) {
	n := len(inv.Fields)
	checkText(inv, field, v, max, true)
	if len(inv.Fields) == n && (v == "." || v == "..") {
		inv.Add(field, dotSegmentDetail)
	}
}

// dotSegmentDetail is the problem of a "." or ".." id.
const dotSegmentDetail = `must not be "." or ".." (URL clients remove them as path segments)`

// checkToolName also rejects control characters: a tool name is a path
// segment of the policy routes and a label people read.
func checkToolName(inv *apperr.InvalidError, field, v string) {
	n := len(inv.Fields)
	checkSegment(inv, field, v, MaxToolName)
	if len(inv.Fields) == n && strings.IndexFunc(v, unicode.IsControl) >= 0 {
		inv.Add(field, "must not hold control characters")
	}
}

// checkPolicy accepts always, once and never (and "" when optional).
func checkPolicy(inv *apperr.InvalidError, field, v string, required bool) {
	switch v {
	case PolicyAlways, PolicyOnce, PolicyNever:
	case "":
		if required {
			inv.Add(field, "is required: always, once or never")
		}
	default:
		inv.Add(field, "must be always, once or never")
	}
}

// checkWorkflow checks a request's Temporal target: the workflow id must be
// the org's ("<org_id>/…", read by the workflow side as signals.OrgOf), and
// run_id and signal need a workflow id.
func checkWorkflow(inv *apperr.InvalidError, orgID, workflowID, runID, signal string) {
	checkText(inv, "workflow_id", workflowID, MaxText, false)
	checkText(inv, "run_id", runID, MaxText, false)
	checkText(inv, "signal", signal, MaxText, false)
	if workflowID == "" {
		if runID != "" {
			inv.Add("run_id", "needs workflow_id")
		}
		if signal != "" {
			inv.Add("signal", "needs workflow_id")
		}
		return
	}
	switch {
	case signals.OwnsNone(orgID):
		inv.Add("workflow_id", fmt.Sprintf("cannot name a workflow of org %q: %s", orgID, signals.OwnsNoneRule))
	case workflowID == orgID+"/":
		inv.Add("workflow_id", fmt.Sprintf("needs a workflow name after %q", orgID+"/"))
	case !signals.Owns(orgID, workflowID):
		inv.Add("workflow_id", fmt.Sprintf("must start with %q: a tool call may only signal its own org's workflows", orgID+"/"))
	}
}

// unstorable says what jsonb refuses of valid JSON (internal/jsonb).
const unstorable = "must be JSON Postgres can store: UTF-8 text, no \\u0000, no unpaired surrogate escape, no number beyond numeric's range"

// normalizeInput returns the input to store: nil for none (absent or
// null), else the JSON as given, bounded by MaxInput.
func normalizeInput(inv *apperr.InvalidError, input json.RawMessage) json.RawMessage {
	trimmed := bytes.TrimSpace(input)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return nil
	}
	if len(trimmed) > MaxInput {
		inv.Add("input", fmt.Sprintf("must be at most %d bytes of JSON", MaxInput))
		return nil
	}
	if !json.Valid(trimmed) {
		inv.Add("input", "must be JSON")
		return nil
	}
	if jsonb.Nesting(trimmed) > MaxInputNesting {
		// (the lists show it inside their items: nested deeper, they
		// would be JSON no decoder with Go's limit, 10,000, could read)
		inv.Add("input", fmt.Sprintf("must not nest arrays and objects more than %d deep", MaxInputNesting))
		return nil
	}
	if !jsonb.Storable(trimmed) {
		inv.Add("input", unstorable)
		return nil
	}
	if jsonb.TextLen(trimmed) > MaxInput {
		inv.Add("input", printedTooLong(MaxInput))
		return nil
	}
	return trimmed
}

// normalizeMatch returns a policy's match: nil for none, else a non-empty
// JSON object — for a match to be stored (put), bounded by MaxMatch as
// sent and as given back, and by MaxMatchArrayElements: a match that names
// a policy to delete may be one stored before those bounds, and spelled as
// the list gives it back.
func normalizeMatch(inv *apperr.InvalidError, match json.RawMessage, put bool) json.RawMessage {
	trimmed := bytes.TrimSpace(match)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return nil
	}
	// (a match that names a policy to delete is only compared, and is
	// spelled as the list gave it: numbers in plain notation, &, < and >
	// escaped, longer than the match was put)
	if put && len(trimmed) > MaxMatch {
		inv.Add("match", fmt.Sprintf("must be at most %d bytes of JSON", MaxMatch))
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil || obj == nil {
		inv.Add("match", "must be a JSON object (the keys and values the call's input must contain)")
		return nil
	}
	if len(obj) == 0 {
		inv.Add("match", "must name at least one key (omit match for the unconditional policy)")
		return nil
	}
	if put {
		if n := arrayElements(trimmed); n > MaxMatchArrayElements {
			inv.Add("match", fmt.Sprintf("must hold at most %d array elements in all (it holds %d): each is compared with each element of a call's input array", MaxMatchArrayElements, n))
			return nil
		}
	}
	if !jsonb.Storable(trimmed) {
		inv.Add("match", unstorable)
		return nil
	}
	if put && jsonb.TextLen(trimmed) > MaxMatch {
		inv.Add("match", printedTooLong(MaxMatch))
		return nil
	}
	return trimmed
}

// printedTooLong is the detail of JSON longer than limit as Postgres gives
// it back (jsonb.TextLen).
func printedTooLong(limit int) string {
	return fmt.Sprintf("must be at most %d bytes of JSON as Postgres gives it back (numbers in plain notation — 1e5000 is 5001 digits — and a space after each \",\" and \":\")", limit)
}

// arrayElements counts the elements of every array in doc, nested ones
// too (doc is valid JSON).
func arrayElements(doc []byte) int {
	var v any
	if json.Unmarshal(doc, &v) != nil {
		return 0
	}
	var count func(any) int
	count = func(v any) int {
		n := 0
		switch v := v.(type) {
		case []any:
			n += len(v)
			for _, e := range v {
				n += count(e)
			}
		case map[string]any:
			for _, e := range v {
				n += count(e)
			}
		}
		return n
	}
	return count(v)
}
