package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// The isolation matrix (issue 10): one row per route of the OpenAPI
// document (a route without a row fails the test). With real objects of org
// A — agent-a1's where an object has an agent — in a real database, each row
// asserts that
//   - org B's token on org A's object answers exactly as on an absent one
//     (status, content type and body, request-specific fields aside), or, for
//     lists and creates, exactly as an empty org's token; never A's data;
//   - a token lacking the route's roles is 403;
//   - a token bound to agent-a2 of org A answers on agent-a1's object exactly
//     as on an absent one (404), is 403 where it may not act at all (org-wide
//     objects, approvals, tool policies, acting as agent-a1) or lists with a
//     filter (or a path) naming agent-a1, and lists none of agent-a1's
//     objects unfiltered;
// and that none of that changed org A's objects. Then each row's owner
// call shows that the object was there to be reached.

// isoMarker is in every object of org A (scope, reason, args, chunk), so its
// absence from an answer shows that none of A's data leaked.
const isoMarker = "org-a-marker"

// Agents of org A.
const (
	isoAgent1 = "agent-a1" // owns org A's objects
	isoAgent2 = "agent-a2" // owns nothing
)

// crossOrgCheck is how org B's token is checked on a route.
type crossOrgCheck int

const (
	// crossOrgNone: the route reaches no org's objects (why says why).
	crossOrgNone crossOrgCheck = iota
	// crossOrgAsAbsent: B on A's object answers as B on an absent id.
	crossOrgAsAbsent
	// crossOrgAsEmptyOrg: B answers as the token of an org with nothing
	// that made the same calls (lists, creates, the shared pools).
	crossOrgAsEmptyOrg
)

// boundCheck is how a token bound to agent-a2 is checked on a route.
type boundCheck int

const (
	// boundAsAbsent: on agent-a1's object it answers as on an absent id (404).
	boundAsAbsent boundCheck = iota + 1
	// boundForbidden: 403 whatever the object.
	boundForbidden
	// boundList: unfiltered it lists none of agent-a1's objects; a filter
	// naming agent-a1 is 403.
	boundList
	// boundAsOwner: the objects have no agent (streams, the principal): it
	// answers as agent-a1's token does.
	boundAsOwner
	// boundAgentInPath: the path's {agent_id} chooses whose objects are
	// listed: naming agent-a1 is 403, naming its own agent is 200.
	boundAgentInPath
)

type isoRow struct {
	route  string   // "METHOD /path" as in the OpenAPI document
	public bool     // no token needed
	roles  []string // any of them may call it; nil with !public: any token
	idOf   string   // the object {id} names: mandate, approval, approval2, wakeup, work, toolApproval
	query  string
	body   func(org string) any
	sse    bool   // a live tail: read for a moment, then hang up
	stream string // the stream name when not the fixture's

	crossOrg   crossOrgCheck
	why        string   // for crossOrgNone
	volatile   []string // response fields that differ from call to call
	bound      boundCheck
	listFilter string // the list's agent filter parameter
	boundToken string // the bound token when not agent-a2 of org A

	owner       string // the token of the control call
	ownerStatus int
	ownerSees   string // an object id the owner's answer holds
}

// isoVolatile are fields of every answer that name the object just made or
// when it was made, so differ between two equivalent calls.
var isoVolatile = []string{"id", "created_at", "updated_at", "expires_at", "run_at", "approval_id", "wakeup_id"}

// The org A tool (approvals) objects: agent-a1's session and its policies
// are for this tool; the marker is in the call's input and a policy's match.
const (
	isoSession = "session-a1"
	isoTool    = "shell"
)

func isoRows() []isoRow {
	admin, agent, approver, operator := []string{RoleAdmin}, []string{RoleAgent}, []string{RoleApprover}, []string{RoleOperator}
	streamReaders := []string{RoleAgent, RoleApprover}
	spend := func(string) any {
		return map[string]any{"agent_id": isoAgent1, "scope": "row-scope", "cost": 1, "reason": "row"}
	}
	chunk := func(string) any {
		return map[string]any{"chunks": []any{map[string]any{"data_base64": base64.StdEncoding.EncodeToString([]byte("row"))}}}
	}
	none := func(string) any { return map[string]any{} }
	answer := func(string) any { return map[string]any{"tool_name": isoTool, "decision": "approved"} }
	// In another org the call names an agent of its own: were the session
	// looked up across orgs, org A's session bound to agent-a1 would make
	// it a 409 where an empty org gets a pending call.
	toolCall := func(org string) any {
		agentID := isoAgent1
		if org != "org-a" {
			agentID = "agent-other"
		}
		return map[string]any{"agent_id": agentID, "tool_name": isoTool}
	}
	return []isoRow{
		{route: "GET /healthz", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /readyz", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /metrics", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /openapi.json", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /inbox", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /inbox/{asset}", public: true, owner: "none", ownerStatus: 200},
		{route: "GET /v1/whoami", crossOrg: crossOrgNone, why: "the principal is the caller's own", bound: boundAsOwner, owner: "a1", ownerStatus: 200},

		// Pools are shared; each org sees its own counts in them.
		{route: "GET /v1/pools", roles: admin, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "adminA", ownerStatus: 200},
		{route: "GET /v1/pools/{pool}", roles: admin, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "adminA", ownerStatus: 200},
		{route: "PATCH /v1/pools/{pool}", roles: operator, body: func(string) any { return map[string]any{"max_parallelism": 25} },
			crossOrg: crossOrgNone, why: "operator settings span orgs by design (SPEC §2)", bound: boundForbidden, boundToken: "opsBound",
			owner: "operator", ownerStatus: 200},
		{route: "POST /v1/pools/{pool}/work", roles: admin,
			body:     func(string) any { return map[string]any{"handler": "echo", "run_at": "2099-01-01T00:00:00Z"} },
			crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden, owner: "adminA", ownerStatus: 201},
		{route: "GET /v1/work/{id}", roles: []string{RoleAdmin, RoleAgent}, idOf: "work", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200},

		{route: "POST /v1/mandates", roles: admin,
			body:     func(string) any { return map[string]any{"agent_id": isoAgent1, "scope": "row-create", "budget": 1} },
			crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden, owner: "a1", ownerStatus: 201},
		{route: "GET /v1/mandates", roles: admin, crossOrg: crossOrgAsEmptyOrg, bound: boundList, listFilter: "agent_id",
			owner: "a1", ownerStatus: 200, ownerSees: "mandate"},
		{route: "POST /v1/mandates/spend", roles: agent, body: spend, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "a1", ownerStatus: 200},
		{route: "GET /v1/mandates/{id}", roles: admin, idOf: "mandate", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200, ownerSees: "mandate"},
		{route: "GET /v1/mandates/{id}/ledger", roles: admin, idOf: "mandate", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200},
		{route: "GET /v1/mandate-approvals", roles: approver, crossOrg: crossOrgAsEmptyOrg, volatile: []string{"requested_by"}, bound: boundList, listFilter: "agent_id",
			owner: "a1", ownerStatus: 200, ownerSees: "approval"},
		{route: "GET /v1/mandate-approvals/{id}", roles: approver, idOf: "approval", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200, ownerSees: "approval"},

		{route: "GET /v1/runs/{run_id}/streams", roles: streamReaders, crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 200},
		{route: "GET /v1/runs/{run_id}/streams/{name}", roles: streamReaders, crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 200},
		{route: "GET /v1/runs/{run_id}/streams/{name}/chunks", roles: streamReaders, crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 200},
		{route: "GET /v1/runs/{run_id}/streams/{name}/sse", roles: streamReaders, sse: true, crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 200},
		{route: "POST /v1/runs/{run_id}/streams/{name}/chunks", roles: agent, body: chunk, crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 201},

		{route: "POST /v1/wakeups", roles: agent, body: func(org string) any {
			return map[string]any{"agent_id": isoAgent1, "workflow_id": org + "/wf", "signal": "wake", "scope": "row-scope", "cost": 1,
				"work": map[string]any{"handler": "echo"}}
		}, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden, owner: "a1", ownerStatus: 201},
		{route: "GET /v1/wakeups", roles: []string{RoleAgent, RoleAdmin}, crossOrg: crossOrgAsEmptyOrg, volatile: []string{"workflow_id"},
			bound: boundList, listFilter: "agent_id", owner: "a1", ownerStatus: 200, ownerSees: "wakeup"},
		{route: "GET /v1/wakeups/{id}", roles: []string{RoleAgent, RoleAdmin}, idOf: "wakeup", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200, ownerSees: "wakeup"},

		{route: "GET /v1/sessions/{session_id}/events", roles: []string{RoleAgent, RoleApprover}, crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200, ownerSees: "toolApproval"},
		{route: "GET /v1/tool-approvals", roles: approver, crossOrg: crossOrgAsEmptyOrg, bound: boundList, listFilter: "agent_id",
			owner: "a1", ownerStatus: 200, ownerSees: "toolApproval"},
		{route: "GET /v1/tool-approvals/{id}", roles: []string{RoleAgent, RoleApprover}, idOf: "toolApproval", crossOrg: crossOrgAsAbsent,
			bound: boundAsAbsent, owner: "a1", ownerStatus: 200, ownerSees: "toolApproval"},
		// From the current end: B's own events (of the rows' calls) carry
		// ids and times that differ from an empty org's; that B never sees
		// A's events on a replay is TestAnotherOrgsApprovalEventsNeverAppear….
		{route: "GET /v1/approvals/events", roles: approver, sse: true, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "approverA", ownerStatus: 200},
		{route: "GET /v1/agents/{agent_id}/tool-policies", roles: []string{RoleAdmin, RoleApprover}, crossOrg: crossOrgAsEmptyOrg,
			bound: boundAgentInPath, owner: "adminA", ownerStatus: 200},
		// Approval webhooks are the org's: {name} is the fixture's stream
		// name, which org A's webhook has too; its URL holds the marker.
		{route: "GET /v1/approvals/webhooks", roles: admin, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "adminA", ownerStatus: 200},
		{route: "GET /v1/approvals/webhooks/{name}", roles: admin, crossOrg: crossOrgAsAbsent, bound: boundForbidden,
			owner: "adminA", ownerStatus: 200},

		// Writes last: their owner calls change the objects.
		{route: "PATCH /v1/mandates/{id}", roles: admin, idOf: "mandate", body: func(string) any { return map[string]any{"budget": 11} },
			crossOrg: crossOrgAsAbsent, bound: boundAsAbsent, owner: "a1", ownerStatus: 200},
		{route: "POST /v1/mandate-approvals/{id}/approve", roles: approver, idOf: "approval", body: none,
			crossOrg: crossOrgAsAbsent, bound: boundForbidden, owner: "approverA", ownerStatus: 200},
		{route: "POST /v1/mandate-approvals/{id}/deny", roles: approver, idOf: "approval2", body: none,
			crossOrg: crossOrgAsAbsent, bound: boundForbidden, owner: "approverA", ownerStatus: 200},
		{route: "POST /v1/wakeups/{id}/redeliver", roles: admin, idOf: "wakeup", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: http.StatusConflict}, // found, but its signal is not undeliverable
		{route: "POST /v1/tool-approvals/{id}/redeliver", roles: admin, idOf: "toolApproval", crossOrg: crossOrgAsAbsent,
			bound: boundAsAbsent, owner: "a1", ownerStatus: http.StatusConflict}, // found, but its signal is not undeliverable
		{route: "POST /v1/work/{id}/cancel", roles: admin, idOf: "work", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200},
		{route: "POST /v1/wakeups/{id}/cancel", roles: agent, idOf: "wakeup", crossOrg: crossOrgAsAbsent, bound: boundAsAbsent,
			owner: "a1", ownerStatus: 200},
		// Another name: closing the fixture's stream would refuse the appends.
		{route: "POST /v1/runs/{run_id}/streams/{name}/close", roles: agent, stream: "closed", crossOrg: crossOrgAsAbsent, bound: boundAsOwner,
			owner: "a1", ownerStatus: 204},
		// An agent never answers tool calls nor sets policies, its own
		// agent's included (docs/approvals.md).
		{route: "POST /v1/sessions/{session_id}/tool-approvals", roles: approver, body: answer, crossOrg: crossOrgAsAbsent, bound: boundForbidden,
			owner: "approverA", ownerStatus: 200},
		// Before the PUT: org B's PUT makes a policy of that name in org B.
		{route: "DELETE /v1/agents/{agent_id}/tool-policies/{tool_name}", roles: admin, crossOrg: crossOrgAsAbsent, bound: boundForbidden,
			owner: "adminA", ownerStatus: 204},
		{route: "PUT /v1/agents/{agent_id}/tool-policies/{tool_name}", roles: admin, body: func(string) any { return map[string]any{"approval": "always"} },
			crossOrg: crossOrgAsEmptyOrg, volatile: []string{"updated_by"}, bound: boundForbidden, owner: "adminA", ownerStatus: 200},
		// Before the PUT: org B's PUT makes a webhook of that name in org B.
		{route: "DELETE /v1/approvals/webhooks/{name}", roles: admin, crossOrg: crossOrgAsAbsent, bound: boundForbidden,
			owner: "adminA", ownerStatus: 204},
		{route: "PUT /v1/approvals/webhooks/{name}", roles: admin,
			body:     func(string) any { return map[string]any{"url": "http://127.0.0.1:9/row", "format": "json"} },
			crossOrg: crossOrgAsEmptyOrg, volatile: []string{"secret"}, bound: boundForbidden, owner: "adminA", ownerStatus: 201},
		// Last: org B's call makes a session of that name in org B, which the
		// rows above look for in org B as absent.
		{route: "POST /v1/sessions/{session_id}/tool-calls", roles: agent, body: toolCall, crossOrg: crossOrgAsEmptyOrg, bound: boundForbidden,
			owner: "a1", ownerStatus: 200},
		// After every other owner call (a paused pool starts nothing), and
		// the resume after the pause.
		{route: "POST /v1/pools/{pool}/pause", roles: operator, crossOrg: crossOrgNone, why: "operator settings span orgs by design (SPEC §2)",
			bound: boundForbidden, boundToken: "opsBound", owner: "operator", ownerStatus: 200},
		{route: "POST /v1/pools/{pool}/resume", roles: operator, crossOrg: crossOrgNone, why: "operator settings span orgs by design (SPEC §2)",
			bound: boundForbidden, boundToken: "opsBound", owner: "operator", ownerStatus: 200},
	}
}

// isoTarget names the objects a request is about.
type isoTarget struct {
	ids                  map[string]string // by isoRow.idOf
	pool, run            string
	stream               string
	agent, session, tool string
}

type isoFixture struct {
	s      *Server
	tokens map[string]string
	a      isoTarget // org A's objects
	absent isoTarget // ids nothing has
}

func newIsoFixture(t *testing.T) *isoFixture {
	t.Helper()
	s := newTestServer(t, func(c *Config, sv *Services) {
		pool, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t), Cooldown: 50 * time.Millisecond,
			LeaderRetry: 50 * time.Millisecond, StopGrace: time.Second})
		require.NoError(t, err)
		pool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		pool.Register("block", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		require.NoError(t, pool.Start(context.Background()))
		t.Cleanup(func() { _ = pool.Stop(context.Background()) })
		st, err := streams.New(sv.DB, streams.Config{Logger: testkit.Logger(t)})
		require.NoError(t, err)
		require.NoError(t, st.Start(context.Background()))
		t.Cleanup(func() { _ = st.Stop(context.Background()) })
		sv.Workpool, sv.Streams = pool, st
		sv.Inbox = inbox.New(sv.DB, inbox.Config{Logger: testkit.Logger(t)})
		require.NoError(t, sv.Inbox.Start(context.Background()))
		t.Cleanup(func() { _ = sv.Inbox.Stop(context.Background()) })
		sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t), Registry: c.Registry, Inbox: sv.Inbox})
		sv.Wakeups = wakeup.New(sv.DB, pool, sv.Mandates, wakeup.Config{Logger: testkit.Logger(t)})
		sv.Approvals = approvals.New(sv.DB, approvals.Config{Logger: testkit.Logger(t), Registry: c.Registry, Inbox: sv.Inbox})
		withWebhooks(t)(c, sv)
	})
	all := []string{RoleAdmin, RoleAgent, RoleApprover}
	f := &isoFixture{s: s, tokens: map[string]string{
		"adminA":    subToken(t, "org-a", "admin-a", "", RoleAdmin),
		"allA":      subToken(t, "org-a", "all-a", "", all...),
		"approverA": subToken(t, "org-a", "approver-a", "", RoleApprover),
		"a1":        subToken(t, "org-a", "a1-runtime", isoAgent1, all...),
		"a2":        subToken(t, "org-a", "a2-runtime", isoAgent2, all...),
		"orgB":      subToken(t, "org-b", "user-b", "", all...),
		"orgC":      subToken(t, "org-c", "user-c", "", all...),
		"operator":  subToken(t, "ops-org", "ops", "", RoleOperator),
		"opsBound":  subToken(t, "ops-org", "ops-a2", isoAgent2, append(all, RoleOperator)...),
		"none":      "",
	}}
	h, a1, adminA := s.Handler(), f.tokens["a1"], f.tokens["adminA"]
	created := func(r response, status int) map[string]any {
		t.Helper()
		require.Equal(t, status, r.Status, "fixture: %s", r.Body)
		return r.JSON(t)
	}
	f.a = isoTarget{ids: map[string]string{}, pool: "default", run: "run-" + isoMarker, stream: "out",
		agent: isoAgent1, session: isoSession, tool: isoTool}
	f.a.ids["mandate"] = created(do(t, h, "POST", "/v1/mandates", adminA,
		map[string]any{"agent_id": isoAgent1, "scope": isoMarker, "budget": 10}), 201)["id"].(string)
	created(do(t, h, "POST", "/v1/mandates", adminA, map[string]any{"agent_id": isoAgent1, "scope": "row-scope", "budget": 100}), 201)
	overrun := map[string]any{"agent_id": isoAgent1, "scope": isoMarker, "cost": 100, "reason": isoMarker}
	f.a.ids["approval"] = created(do(t, h, "POST", "/v1/mandates/spend", a1, overrun), 402)["approval_id"].(string)
	f.a.ids["approval2"] = created(do(t, h, "POST", "/v1/mandates/spend", a1, overrun), 402)["approval_id"].(string)
	f.a.ids["wakeup"] = created(do(t, h, "POST", "/v1/wakeups", a1, map[string]any{
		"agent_id": isoAgent1, "workflow_id": "org-a/wf-" + isoMarker, "signal": "wake", "scope": isoMarker, "cost": 1,
		"reason": isoMarker, "work": map[string]any{"handler": "block", "args": map[string]any{"m": isoMarker}},
	}), 201)["id"].(string)
	f.a.ids["work"] = created(do(t, h, "GET", "/v1/wakeups/"+f.a.ids["wakeup"], a1, nil), 200)["work_id"].(string)
	require.Eventually(t, func() bool { // it blocks until canceled: a steady state
		return created(do(t, h, "GET", "/v1/work/"+f.a.ids["work"], a1, nil), 200)["state"] == "running"
	}, testWait, pollEvery)
	f.a.ids["plainWork"] = created(do(t, h, "POST", "/v1/pools/default/work", adminA,
		map[string]any{"handler": "echo", "run_at": "2099-01-01T00:00:00Z", "args": map[string]any{"m": isoMarker}}), 201)["id"].(string)
	created(do(t, h, "POST", "/v1/runs/"+f.a.run+"/streams/out/chunks", a1, map[string]any{"chunks": []any{
		map[string]any{"data_base64": base64.StdEncoding.EncodeToString([]byte(isoMarker))}}}), 201)
	// A pending call first (a policy would decide it), then an
	// unconditional and a conditional policy.
	f.a.ids["toolApproval"] = created(do(t, h, "POST", "/v1/sessions/"+isoSession+"/tool-calls", a1, map[string]any{
		"agent_id": isoAgent1, "tool_name": isoTool, "input": map[string]any{"m": isoMarker}}), 200)["approval_id"].(string)
	policies := "/v1/agents/" + isoAgent1 + "/tool-policies/" + isoTool
	created(do(t, h, "PUT", policies, adminA, map[string]any{"approval": "once"}), 200)
	created(do(t, h, "PUT", policies, adminA, map[string]any{"approval": "never", "match": map[string]any{"m": isoMarker}}), 200)
	created(do(t, h, "PUT", "/v1/approvals/webhooks/"+f.a.stream, adminA,
		map[string]any{"url": "http://127.0.0.1:9/" + isoMarker, "format": "json"}), 201)

	f.absent = isoTarget{ids: map[string]string{}, pool: "default", run: "run-absent", stream: "out",
		agent: "agent-absent", session: "session-absent", tool: isoTool}
	for kind := range f.a.ids {
		f.absent.ids[kind] = uuid.Must(uuid.NewV7()).String()
	}
	return f
}

// markers are what no answer to another org or agent may hold.
func (f *isoFixture) markers() []string {
	m := []string{isoMarker, base64.StdEncoding.EncodeToString([]byte(isoMarker))}
	for _, id := range f.a.ids {
		m = append(m, id)
	}
	return m
}

func (f *isoFixture) call(t *testing.T, row isoRow, tok string, tgt isoTarget, org, query string) response {
	t.Helper()
	method, path, _ := strings.Cut(row.route, " ")
	if row.stream != "" {
		tgt.stream = row.stream
	}
	path = strings.NewReplacer("{id}", tgt.ids[row.idOf], "{pool}", tgt.pool, "{run_id}", tgt.run, "{name}", tgt.stream,
		"{agent_id}", tgt.agent, "{session_id}", tgt.session, "{tool_name}", tgt.tool,
		"{asset}", "inbox.js").Replace(path) // the inbox page's files are the same for everyone
	if q := strings.Join(slices.DeleteFunc([]string{row.query, query}, func(s string) bool { return s == "" }), "&"); q != "" {
		path += "?" + q
	}
	if !row.sse {
		var body any
		if row.body != nil {
			body = row.body(org)
		}
		return do(t, f.s.Handler(), method, path, tok, body)
	}
	// A live tail of an open stream never ends: hang up after a moment and
	// compare what was sent until then.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, method, path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

// comparable is an answer with its request-specific parts left out: the
// X-Request-Id header, and the volatile fields of a JSON body.
func comparable(t *testing.T, r response, volatile []string) any {
	t.Helper()
	ct := r.Header.Get("Content-Type")
	if !strings.Contains(ct, "json") {
		return []any{r.Status, ct, string(r.Body)}
	}
	var v any
	require.NoError(t, json.Unmarshal(r.Body, &v), "body: %s", r.Body)
	return []any{r.Status, ct, dropFields(v, append(slices.Clone(isoVolatile), volatile...))}
}

func dropFields(v any, names []string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if !slices.Contains(names, k) {
				out[k] = dropFields(e, names)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropFields(e, names)
		}
		return out
	}
	return v
}

func (f *isoFixture) requireNoneOfAsData(t *testing.T, r response) {
	t.Helper()
	for _, m := range f.markers() {
		require.NotContains(t, string(r.Body), m, "the answer holds org A's (agent-a1's) data")
	}
}

// snapshot is org A's objects as an unbound token of A sees them. Streams are left
// out: they have no agent, so the bound-token checks write them as their
// owner may (docs/security.md).
func (f *isoFixture) snapshot(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, path := range []string{
		"/v1/mandates/" + f.a.ids["mandate"], "/v1/mandates/" + f.a.ids["mandate"] + "/ledger",
		"/v1/mandate-approvals/" + f.a.ids["approval"], "/v1/mandate-approvals/" + f.a.ids["approval2"],
		"/v1/wakeups/" + f.a.ids["wakeup"], "/v1/work/" + f.a.ids["work"], "/v1/work/" + f.a.ids["plainWork"],
		"/v1/pools/default", "/v1/pools/wakeup",
		"/v1/tool-approvals/" + f.a.ids["toolApproval"], "/v1/sessions/" + isoSession + "/events",
		"/v1/agents/" + isoAgent1 + "/tool-policies", "/v1/approvals/webhooks",
	} {
		r := do(t, f.s.Handler(), "GET", path, f.tokens["allA"], nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		out[path] = string(mustJSON(t, dropFields(r.JSON(t), []string{"run_status", "oldest_pending_age_s"})))
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// documentedRoutes lists "METHOD /path" for every operation of the OpenAPI
// document.
func documentedRoutes(t *testing.T) []string {
	t.Helper()
	raw, err := OpenAPIDocument()
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	var routes []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				routes = append(routes, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(routes)
	return routes
}

func TestEveryRouteKeepsOrgsRolesAndAgentsApart(t *testing.T) {
	f := newIsoFixture(t)
	rows := isoRows()
	var covered []string
	for _, row := range rows {
		covered = append(covered, row.route)
	}
	sort.Strings(covered)
	require.Equal(t, documentedRoutes(t), covered, "every documented route has exactly one row")
	for _, row := range rows {
		if !row.public && row.crossOrg == crossOrgNone {
			require.NotEmpty(t, row.why, "%s reaches no org's objects: its row says why", row.route)
		}
	}

	// Public routes take no token, so only their owner call below applies;
	// a check that cannot apply to a row (no org's objects, any role) is
	// not run rather than run and skipped.
	before := f.snapshot(t)
	for _, row := range rows {
		if row.public {
			continue
		}
		t.Run(row.route, func(t *testing.T) {
			if row.crossOrg != crossOrgNone {
				t.Run("another org's object behaves as absent", func(t *testing.T) { f.checkCrossOrg(t, row) })
			}
			if row.roles != nil {
				t.Run("a token without the route's role is refused", func(t *testing.T) { f.checkRoles(t, row) })
			}
			t.Run("a token bound to another agent gets nothing of its objects", func(t *testing.T) { f.checkBound(t, row) })
		})
	}
	require.Equal(t, before, f.snapshot(t), "no call of another org, role or agent changed org A's objects")

	for _, row := range rows {
		t.Run(row.route+"/its owner reaches it", func(t *testing.T) {
			r := f.call(t, row, f.tokens[row.owner], f.a, "org-a", "")
			require.Equal(t, row.ownerStatus, r.Status, "body: %s", r.Body)
			if row.ownerSees != "" {
				require.Contains(t, string(r.Body), f.a.ids[row.ownerSees])
			}
		})
	}
}

func (f *isoFixture) checkCrossOrg(t *testing.T, row isoRow) {
	orgB := f.tokens["orgB"]
	switch row.crossOrg {
	case crossOrgAsAbsent:
		onA := f.call(t, row, orgB, f.a, "org-b", "")
		onAbsent := f.call(t, row, orgB, f.absent, "org-b", "")
		require.Equal(t, comparable(t, onAbsent, row.volatile), comparable(t, onA, row.volatile),
			"on A's object: %s\non an absent one: %s", onA.Body, onAbsent.Body)
		f.requireNoneOfAsData(t, onA)
	case crossOrgAsEmptyOrg:
		b := f.call(t, row, orgB, f.a, "org-b", "")
		empty := f.call(t, row, f.tokens["orgC"], f.a, "org-c", "")
		require.Equal(t, comparable(t, empty, row.volatile), comparable(t, b, row.volatile),
			"org B: %s\nan empty org: %s", b.Body, empty.Body)
		f.requireNoneOfAsData(t, b)
	default:
		t.Fatalf("%s: no cross-org check of kind %d", row.route, row.crossOrg)
	}
}

func (f *isoFixture) checkRoles(t *testing.T, row isoRow) {
	org := "org-a"
	if slices.Contains(row.roles, RoleOperator) {
		org = "ops-org" // where the operator role would count
	}
	lacking := slices.DeleteFunc(slices.Clone(AllRoles), func(r string) bool { return slices.Contains(row.roles, r) })
	for _, roles := range [][]string{lacking, nil} {
		r := f.call(t, row, subToken(t, org, "lacking", "", roles...), f.a, org, "")
		r.requireProblem(t, http.StatusForbidden)
		f.requireNoneOfAsData(t, r)
	}
}

func (f *isoFixture) checkBound(t *testing.T, row isoRow) {
	tok := f.tokens["a2"]
	if row.boundToken != "" {
		tok = f.tokens[row.boundToken]
	}
	switch row.bound {
	case boundAsAbsent:
		onA1 := f.call(t, row, tok, f.a, "org-a", "")
		onAbsent := f.call(t, row, tok, f.absent, "org-a", "")
		onA1.requireProblem(t, http.StatusNotFound)
		require.Equal(t, comparable(t, onAbsent, row.volatile), comparable(t, onA1, row.volatile),
			"on agent-a1's object: %s\non an absent one: %s", onA1.Body, onAbsent.Body)
		f.requireNoneOfAsData(t, onA1)
	case boundForbidden:
		r := f.call(t, row, tok, f.a, "org-a", "")
		r.requireProblem(t, http.StatusForbidden)
		f.requireNoneOfAsData(t, r)
		if strings.Contains(row.route, "{agent_id}") {
			// Whatever the object: its own agent's too (tool policies).
			own := f.a
			own.agent = isoAgent2
			f.call(t, row, tok, own, "org-a", "").requireProblem(t, http.StatusForbidden)
		}
	case boundList:
		r := f.call(t, row, tok, f.a, "org-a", "")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		f.requireNoneOfAsData(t, r)
		r = f.call(t, row, tok, f.a, "org-a", row.listFilter+"="+isoAgent1)
		r.requireProblem(t, http.StatusForbidden)
		f.requireNoneOfAsData(t, r)
		r = f.call(t, row, tok, f.a, "org-a", row.listFilter+"="+isoAgent2)
		require.Equal(t, http.StatusOK, r.Status, "a filter naming its own agent: %s", r.Body)
	case boundAgentInPath:
		r := f.call(t, row, tok, f.a, "org-a", "")
		r.requireProblem(t, http.StatusForbidden)
		f.requireNoneOfAsData(t, r)
		own := f.a
		own.agent = isoAgent2
		r = f.call(t, row, tok, own, "org-a", "")
		require.Equal(t, http.StatusOK, r.Status, "its own agent in the path: %s", r.Body)
		f.requireNoneOfAsData(t, r)
	case boundAsOwner:
		mine := f.call(t, row, f.tokens["a1"], f.a, "org-a", "")
		theirs := f.call(t, row, tok, f.a, "org-a", "")
		require.Equal(t, mine.Status, theirs.Status, "agent-a1: %s\nagent-a2: %s", mine.Body, theirs.Body)
	default:
		t.Fatal("the row says nothing about agent-bound tokens")
	}
}

// A token bound to an agent lists only its agent's approval requests
// (docs/security.md § Agent binding): what other agents of its org do must
// not show in its answer. Each row's list is read by agent-a2, which owns
// nothing, before and after agent-a1 makes more requests; its answer must
// be the same both times, as it would be were agent-a1 in another org.
func TestABoundTokensApprovalListsDoNotCountOtherAgentsRequests(t *testing.T) {
	f := newIsoFixture(t)
	h, a1, a2 := f.s.Handler(), f.tokens["a1"], f.tokens["a2"]
	lists := []string{"/v1/mandate-approvals", "/v1/mandate-approvals?order=newest", "/v1/tool-approvals",
		"/v1/mandate-approvals?agent_id=" + isoAgent2, "/v1/tool-approvals?agent_id=" + isoAgent2}
	before := map[string]string{}
	for _, path := range lists {
		r := do(t, h, "GET", path, a2, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		before[path] = string(r.Body)
	}
	// agent-a1 (not agent-a2) is refused a spend and asks to call a tool.
	r := do(t, h, "POST", "/v1/mandates/spend", a1, map[string]any{"agent_id": isoAgent1, "scope": isoMarker, "cost": 100, "reason": "more"})
	require.Equal(t, http.StatusPaymentRequired, r.Status, "body: %s", r.Body)
	r = do(t, h, "POST", "/v1/sessions/"+isoSession+"/tool-calls", a1, map[string]any{"agent_id": isoAgent1, "tool_name": "other-tool"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	for _, path := range lists {
		t.Run(path, func(t *testing.T) {
			r := do(t, h, "GET", path, a2, nil)
			require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
			require.JSONEq(t, before[path], string(r.Body), "agent-a2's list changed with agent-a1's requests alone")
		})
	}
}
