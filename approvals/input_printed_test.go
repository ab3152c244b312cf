package approvals

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

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
