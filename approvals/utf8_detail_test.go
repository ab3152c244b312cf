package approvals

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

// An in-process caller's input or match holding bytes that are not UTF-8
// (json.Valid takes them; the reference workflow's activity passes input
// straight through) is refused since jsonb.Storable refuses them — but
// the detail lists only \u0000, surrogates and numbers: nothing the
// caller sent. It must say what is wrong.
func TestAnInputOrMatchThatIsNotUTF8IsRefusedSayingSo(t *testing.T) {
	s, _ := newTestService(t)
	_, err := s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage("{\"q\":\"caf\xe9\"}")})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Len(t, inv.Fields, 1)
	require.Equal(t, "input", inv.Fields[0].Field)
	require.Contains(t, inv.Fields[0].Detail, "UTF-8", "the input's detail")

	_, err = s.PutPolicy(context.Background(), org, PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways,
		Match: json.RawMessage("{\"q\":\"caf\xe9\"}")})
	require.ErrorAs(t, err, &inv)
	require.Len(t, inv.Fields, 1)
	require.Equal(t, "match", inv.Fields[0].Field)
	require.Contains(t, inv.Fields[0].Detail, "UTF-8", "the match's detail")
}
