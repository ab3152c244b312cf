package approvals

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

// An input or a put match is bounded as it is stored and given back, not
// only as sent: jsonb prints a number in plain notation, so 1e131071 (8
// bytes) comes back as 131,072 digits. A 907-byte input of such numbers
// was accepted and read back as 13 MB — in the call's GET, every inbox
// list page, the session's events and the inbox event — and a 64 KiB one
// as about a gigabyte: an agent token could make the approvers' inbox
// unreadable. A 79-byte match came back as 1 MB in every call it decided.
func TestAnInputOrMatchIsBoundedAsItIsGivenBack(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	in := `{"x":[` + strings.Repeat("1e131071,", 99) + `1e131071]}`
	_, err := s.Request(ctx, RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(in), RequestedBy: "agent-runtime"})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "input", inv.Fields[0].Field)
	require.Zero(t, count(t, db, `SELECT count(*) FROM tool_approvals`))

	_, err = s.PutPolicy(ctx, org, PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways,
		Match: json.RawMessage(`{"n":[` + strings.Repeat("1e131071,", 7) + `1e131071]}`), UpdatedBy: "root"})
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "match", inv.Fields[0].Field)
	require.Zero(t, count(t, db, `SELECT count(*) FROM tool_policies`))

	// (floats as clients write them pass)
	_, err = s.Request(ctx, RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(`{"ratio": 6.02e23, "tiny": 5e-324, "big": 1e308}`), RequestedBy: "agent-runtime"})
	require.NoError(t, err)
}

// An input is at most 64 KiB as jsonb gives it back, the space it writes
// after every ',' and ':' included: 32,766 zeros, 65,533 bytes as sent,
// came back from Postgres as 98,301 bytes.
func TestAnInputIsBoundedAsJSONBPrintsIt(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	in := "[" + strings.Repeat("0,", MaxInput/2-2) + "0]"
	require.LessOrEqual(t, len(in), MaxInput)
	_, err := s.Request(ctx, RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(in), RequestedBy: "agent-runtime"})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "input", inv.Fields[0].Field)
	require.Zero(t, count(t, db, `SELECT count(*) FROM tool_approvals`))

	// what prints within the bound is taken, and prints so
	in = "[" + strings.Repeat("0,", MaxInput/3-2) + "0]"
	_, err = s.Request(ctx, RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(in), RequestedBy: "agent-runtime"})
	require.NoError(t, err)
	var printed int
	require.NoError(t, db.QueryRow(ctx, `SELECT length(input::text) FROM tool_approvals`).Scan(&printed))
	require.LessOrEqual(t, printed, MaxInput)
}
