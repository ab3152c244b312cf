package approvals

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	org   = "org-a"
	agent = "agent-1"
	sess  = "session-1"
)

// newTestService returns a service on a fresh database.
func newTestService(t *testing.T, cfg ...Config) (*Service, *pgxpool.Pool) {
	t.Helper()
	db := testkit.NewPool(t)
	c := Config{}
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.Logger = testkit.Logger(t)
	return New(db, c), db
}

// request asks for tool in the test session as the test agent.
func request(t *testing.T, s *Service, tool string, input string, mutate ...func(*RequestParams)) RequestResult {
	t.Helper()
	p := RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: tool, RequestedBy: "agent-runtime"}
	if input != "" {
		p.Input = json.RawMessage(input)
	}
	for _, m := range mutate {
		m(&p)
	}
	res, err := s.Request(context.Background(), p)
	require.NoError(t, err)
	return res
}

func setPolicy(t *testing.T, s *Service, tool, approval, match string) Policy {
	t.Helper()
	p := PolicyParams{AgentID: agent, ToolName: tool, Approval: approval, UpdatedBy: "admin"}
	if match != "" {
		p.Match = json.RawMessage(match)
	}
	pol, err := s.PutPolicy(context.Background(), org, p)
	require.NoError(t, err)
	return pol
}

func respond(s *Service, p RespondParams) (RespondResult, error) {
	if p.OrgID == "" {
		p.OrgID = org
	}
	if p.SessionID == "" {
		p.SessionID = sess
	}
	if p.ResolvedBy == "" {
		p.ResolvedBy = "alice"
	}
	return s.Respond(context.Background(), p)
}

// eventsOf returns a session's events as (name, payload) pairs with seq
// checked to run 1…N.
func eventsOf(t *testing.T, s *Service, session string) []namedEvent {
	t.Helper()
	evs, next, err := s.Events(context.Background(), org, session, "", 0, MaxLimit)
	require.NoError(t, err)
	require.Nil(t, next)
	out := make([]namedEvent, len(evs))
	for i, e := range evs {
		require.EqualValues(t, i+1, e.Seq, "seq runs 1…N")
		var p map[string]any
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		out[i] = namedEvent{e.Name, p}
	}
	return out
}

type namedEvent struct {
	Name    string
	Payload map[string]any
}

func names(evs []namedEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Name
	}
	return out
}

func count(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func idStr(id uuid.UUID) string { return id.String() }
