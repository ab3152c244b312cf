package api

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

// withMandates adds the mandates service to a test server.
func withMandates(t *testing.T) func(*Config, *Services) {
	return func(c *Config, sv *Services) {
		sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t), Registry: c.Registry})
	}
}

// newMandateServer is a test server with the mandates service.
func newMandateServer(t *testing.T) (*Server, *mandates.Service) {
	t.Helper()
	s := newTestServer(t, withMandates(t))
	return s, s.svc.Mandates
}

// subToken is a token with a chosen sub and optional agent binding.
func subToken(t *testing.T, org, sub, agentID string, roles ...string) string {
	t.Helper()
	tok, err := SignToken(testSecret, TokenSpec{OrgID: org, Sub: sub, AgentID: agentID, Roles: roles, TTL: time.Hour})
	require.NoError(t, err)
	return tok
}

func createMandate(t *testing.T, h http.Handler, tok, agent, scope string, budget int64) map[string]any {
	t.Helper()
	r := do(t, h, http.MethodPost, "/v1/mandates", tok, map[string]any{"agent_id": agent, "scope": scope, "budget": budget})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	return r.JSON(t)
}

func TestMandateRoutesMatchTheirOpenAPIPart(t *testing.T) {
	s, _ := newMandateServer(t)
	raw, err := fs.ReadFile(openapiParts, "openapi/30-mandates.yaml")
	require.NoError(t, err)
	var part struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &part))
	var documented, registered []string
	for path, ops := range part.Paths {
		for method := range ops {
			if method != "parameters" {
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	for _, rt := range s.Echo().Routes() {
		if strings.HasPrefix(rt.Path, "/v1/mandate") {
			registered = append(registered, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
		}
	}
	sort.Strings(documented)
	sort.Strings(registered)
	require.Equal(t, documented, registered)

	// The part merges with the base without redefining anything.
	base, err := fs.ReadFile(openapiParts, "openapi/00-base.yaml")
	require.NoError(t, err)
	var doc, mine map[string]any
	require.NoError(t, yaml.Unmarshal(base, &doc))
	require.NoError(t, yaml.Unmarshal(raw, &mine))
	require.NoError(t, mergeInto(doc, mine, "30-mandates.yaml"))
}

func TestMandateRoutesAreLeftOutWithoutTheService(t *testing.T) {
	s := newTestServer(t)
	r := do(t, s.Handler(), http.MethodGet, "/v1/mandates", token(t, "org-a", "admin"), nil)
	r.requireProblem(t, http.StatusNotFound)
}

func TestMandatesCanBeCreatedReadChangedAndListedByAnAdmin(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin := s.Handler(), token(t, "org-a", "admin")

	r := do(t, h, http.MethodPost, "/v1/mandates", admin, `{"agent_id":"agent-1","scope":"llm","budget":10,"valid_until":"2099-01-02T03:04:05Z"}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	m := r.JSON(t)
	id := m["id"].(string)
	for _, k := range []string{"id", "agent_id", "scope", "budget", "spent", "remaining", "status", "valid_until", "created_at", "updated_at"} {
		require.Contains(t, m, k)
	}
	require.Len(t, m, 10)
	require.Equal(t, "agent-1", m["agent_id"])
	require.EqualValues(t, 10, m["budget"])
	require.EqualValues(t, 0, m["spent"])
	require.EqualValues(t, 10, m["remaining"])
	require.Equal(t, "active", m["status"])
	require.Equal(t, "2099-01-02T03:04:05Z", m["valid_until"])
	_, err := time.Parse(time.RFC3339, m["created_at"].(string))
	require.NoError(t, err)

	t.Run("an existing one is a conflict", func(t *testing.T) {
		do(t, h, http.MethodPost, "/v1/mandates", admin, `{"agent_id":"agent-1","scope":"llm","budget":1}`).requireProblem(t, http.StatusConflict)
	})
	t.Run("get", func(t *testing.T) {
		r := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, m, r.JSON(t))
	})
	t.Run("patch changes only what it names; null clears valid_until", func(t *testing.T) {
		r := do(t, h, http.MethodPatch, "/v1/mandates/"+id, admin, `{"budget":3,"status":"revoked","valid_until":null}`)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		p := r.JSON(t)
		require.EqualValues(t, 3, p["budget"])
		require.Equal(t, "revoked", p["status"])
		require.Nil(t, p["valid_until"])
		r = do(t, h, http.MethodPatch, "/v1/mandates/"+id, admin, `{"status":"active","valid_until":"2098-01-01T00:00:00Z"}`)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		p = r.JSON(t)
		require.EqualValues(t, 3, p["budget"])
		require.Equal(t, "2098-01-01T00:00:00Z", p["valid_until"])
	})
	t.Run("list filters and pages", func(t *testing.T) {
		createMandate(t, h, admin, "agent-1", "tools", 1)
		createMandate(t, h, admin, "agent-2", "llm", 1)
		r := do(t, h, http.MethodGet, "/v1/mandates?agent_id=agent-1&limit=1", admin, nil)
		require.Equal(t, http.StatusOK, r.Status)
		page := r.JSON(t)
		require.Len(t, page["items"], 1)
		require.Equal(t, id, page["items"].([]any)[0].(map[string]any)["id"])
		next := page["next_cursor"].(string)
		r = do(t, h, http.MethodGet, "/v1/mandates?agent_id=agent-1&limit=1&cursor="+next, admin, nil)
		page = r.JSON(t)
		require.Len(t, page["items"], 1)
		require.Equal(t, "tools", page["items"].([]any)[0].(map[string]any)["scope"])
		require.Nil(t, page["next_cursor"])
		require.Contains(t, page, "next_cursor")

		r = do(t, h, http.MethodGet, "/v1/mandates?scope=llm", admin, nil)
		require.Len(t, r.JSON(t)["items"], 2)
		r = do(t, h, http.MethodGet, "/v1/mandates", token(t, "org-b", "admin"), nil)
		require.Equal(t, map[string]any{"items": []any{}, "next_cursor": nil}, r.JSON(t))
	})
}

func TestBadMandateInputIsA400NamingTheField(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin, agent, approver := s.Handler(), token(t, "org-a", "admin"), token(t, "org-a", "agent"), token(t, "org-a", "approver")
	id := createMandate(t, h, admin, "agent-1", "llm", 10)["id"].(string)
	long := strings.Repeat("é", 501) // 1,002 bytes
	cases := []struct {
		method, path, tok string
		body              any
		field             string
	}{
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":-1}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":9007199254740992}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":1e30}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a\u0000","scope":"s","budget":1}`, "agent_id"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":1.5}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":"10"}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s"}`, "budget"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"","budget":1}`, "scope"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"","scope":"s","budget":1}`, "agent_id"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":1,"owner":"x"}`, "owner"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"a","scope":"s","budget":1,"valid_until":"tomorrow"}`, "valid_until"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"budget":-1}`, "budget"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"budget":2.5}`, "budget"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"status":"paused"}`, "status"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"valid_until":5}`, "valid_until"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"valid_until":"soon"}`, "valid_until"},
		{"PATCH", "/v1/mandates/" + id, admin, `{"spent":0}`, "spent"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":-1}`, "cost"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":0.5}`, "cost"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":"1"}`, "cost"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":1,"reason":"x\u0000"}`, "reason"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s"}`, "cost"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"","cost":1}`, "scope"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"","scope":"s","cost":1}`, "agent_id"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":1,"budget":9}`, "budget"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"s","cost":1,"reason":"` + long + `"}`, "reason"},
		{"POST", "/v1/mandates/spend", agent, `{"agent_id":"a","scope":"` + long + `","cost":1}`, "scope"},
		{"POST", "/v1/mandates", admin, `{"agent_id":"` + long + `","scope":"s","budget":1}`, "agent_id"},
		{"GET", "/v1/mandates?limit=0", admin, nil, "limit"},
		{"GET", "/v1/mandates?limit=501", admin, nil, "limit"},
		{"GET", "/v1/mandates?limit=ten", admin, nil, "limit"},
		{"GET", "/v1/mandates?cursor=nope", admin, nil, "cursor"},
		{"GET", "/v1/mandates/" + id + "/ledger?limit=-1", admin, nil, "limit"},
		{"GET", "/v1/mandate-approvals?status=bogus", approver, nil, "status"},
		{"GET", "/v1/mandate-approvals?order=desc", approver, nil, "order"},
		{"POST", "/v1/mandate-approvals/" + id + "/approve", approver, `{"note":1}`, "note"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s %s %v", tc.method, tc.path, tc.body), func(t *testing.T) {
			do(t, h, tc.method, tc.path, tc.tok, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
		})
	}
	r := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil)
	require.EqualValues(t, 10, r.JSON(t)["budget"], "nothing changed")
	require.Empty(t, do(t, h, http.MethodGet, "/v1/mandate-approvals", approver, nil).JSON(t)["items"], "no spend was attempted")
}

func TestMandateRoutesNeedTheirRoles(t *testing.T) {
	s, _ := newMandateServer(t)
	h := s.Handler()
	id := createMandate(t, h, token(t, "org-a", "admin"), "agent-1", "llm", 10)["id"].(string)
	agent, admin, approver := token(t, "org-a", "agent"), token(t, "org-a", "admin"), token(t, "org-a", "approver")
	spend := `{"agent_id":"agent-1","scope":"llm","cost":1}`
	for _, tc := range []struct {
		method, path, tok string
		body              any
	}{
		{"POST", "/v1/mandates", agent, `{"agent_id":"agent-1","scope":"x","budget":1}`},
		{"POST", "/v1/mandates", approver, `{"agent_id":"agent-1","scope":"x","budget":1}`},
		{"GET", "/v1/mandates", agent, nil},
		{"GET", "/v1/mandates/" + id, agent, nil},
		{"PATCH", "/v1/mandates/" + id, agent, `{"budget":100}`},
		{"GET", "/v1/mandates/" + id + "/ledger", approver, nil},
		{"POST", "/v1/mandates/spend", admin, spend},
		{"POST", "/v1/mandates/spend", approver, spend},
		{"GET", "/v1/mandate-approvals", admin, nil},
		{"GET", "/v1/mandate-approvals", agent, nil},
		{"POST", "/v1/mandate-approvals/" + id + "/approve", admin, `{}`},
		{"POST", "/v1/mandate-approvals/" + id + "/deny", agent, `{}`},
	} {
		do(t, h, tc.method, tc.path, tc.tok, tc.body).requireProblem(t, http.StatusForbidden)
	}
	do(t, h, http.MethodPost, "/v1/mandates/spend", "", spend).requireProblem(t, http.StatusUnauthorized)

	t.Run("a token bound to an agent spends only as that agent", func(t *testing.T) {
		bound := subToken(t, "org-a", "wf", "agent-2", RoleAgent)
		do(t, h, http.MethodPost, "/v1/mandates/spend", bound, spend).requireProblem(t, http.StatusForbidden)
		r := do(t, h, http.MethodPost, "/v1/mandates/spend", subToken(t, "org-a", "wf", "agent-1", RoleAgent), spend)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	})
	r := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil)
	require.EqualValues(t, 10, r.JSON(t)["budget"])
	require.EqualValues(t, 1, r.JSON(t)["spent"], "only the bound agent's own spend went through")
}

func TestSpendAnswers200WhileCoveredAnd402WithACommittedApprovalRequest(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin, agent, approver := s.Handler(), token(t, "org-a", "admin"), token(t, "org-a", "agent"), token(t, "org-a", "approver")
	id := createMandate(t, h, admin, "agent-1", "llm", 5)["id"].(string)

	r := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"llm","cost":3,"reason":"summarise"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"ok": true, "remaining": float64(2)}, r.JSON(t))

	r = do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"llm","cost":3,"reason":"again"}`)
	p := r.requireProblem(t, http.StatusPaymentRequired)
	approvalID, _ := p["approval_id"].(string)
	require.NotEmpty(t, approvalID)
	require.Equal(t, "insufficient", p["refusal"])

	r = do(t, h, http.MethodGet, "/v1/mandate-approvals/"+approvalID, approver, nil)
	require.Equal(t, http.StatusOK, r.Status)
	a := r.JSON(t)
	require.Equal(t, "pending", a["state"])
	require.Equal(t, "agent-1", a["agent_id"])
	require.Equal(t, "llm", a["scope"])
	require.EqualValues(t, 3, a["cost"])
	require.Equal(t, "again", a["reason"])
	require.Equal(t, "insufficient", a["refusal"])
	require.Contains(t, a, "expires_at")
	require.NotContains(t, a, "resolved_at")

	r = do(t, h, http.MethodGet, "/v1/mandates/"+id+"/ledger", admin, nil)
	require.Equal(t, http.StatusOK, r.Status)
	items := r.JSON(t)["items"].([]any)
	require.Len(t, items, 1)
	e := items[0].(map[string]any)
	require.Equal(t, "debit", e["kind"])
	require.EqualValues(t, 3, e["amount"])
	require.Equal(t, "summarise", e["reason"])
	require.Nil(t, e["idempotency_key"])

	t.Run("no mandate at all is refused the same way", func(t *testing.T) {
		p := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"none","cost":0}`).requireProblem(t, http.StatusPaymentRequired)
		require.Equal(t, "no_mandate", p["refusal"])
	})
}

func TestMandateApprovalsListNewestFirstWithOrderNewest(t *testing.T) {
	s, _ := newMandateServer(t)
	h, agent, approver := s.Handler(), token(t, "org-a", "agent"), token(t, "org-a", "approver")
	var ids []string
	for range 3 {
		p := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"none","cost":1}`).requireProblem(t, http.StatusPaymentRequired)
		ids = append(ids, p["approval_id"].(string))
	}
	listed := func(query string) ([]string, any) {
		page := do(t, h, http.MethodGet, "/v1/mandate-approvals?"+query, approver, nil).JSON(t)
		var got []string
		for _, it := range page["items"].([]any) {
			got = append(got, it.(map[string]any)["id"].(string))
		}
		return got, page["next_cursor"]
	}
	first, next := listed("order=newest&limit=2")
	require.Equal(t, []string{ids[2], ids[1]}, first)
	rest, end := listed("order=newest&limit=2&cursor=" + next.(string))
	require.Equal(t, []string{ids[0]}, rest)
	require.Nil(t, end)
	oldest, _ := listed("order=oldest")
	require.Equal(t, ids, oldest)
}

// Many clients against a small budget: never overspent, and every refusal's
// approval id is in the approver's pending list.
func TestConcurrentSpendClientsNeverOverspendAndEveryRefusalIsListed(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin, agent, approver := s.Handler(), token(t, "org-a", "admin"), token(t, "org-a", "agent"), token(t, "org-a", "approver")
	id := createMandate(t, h, admin, "agent-1", "llm", 7)["id"].(string)
	const n = 40
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"llm","cost":1}`)
		})
	}
	wg.Wait()
	ok := 0
	refusals := map[string]bool{}
	for _, r := range results {
		switch r.Status {
		case http.StatusOK:
			ok++
		case http.StatusPaymentRequired:
			refusals[r.JSON(t)["approval_id"].(string)] = true
		default:
			t.Fatalf("unexpected %d: %s", r.Status, r.Body)
		}
	}
	require.Equal(t, 7, ok)
	require.Len(t, refusals, n-7)
	listed := map[string]bool{}
	for _, it := range do(t, h, http.MethodGet, "/v1/mandate-approvals?status=pending&limit=500", approver, nil).JSON(t)["items"].([]any) {
		listed[it.(map[string]any)["id"].(string)] = true
	}
	require.Equal(t, refusals, listed)
	m := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil).JSON(t)
	require.EqualValues(t, 7, m["spent"])
	var sum float64
	for _, it := range do(t, h, http.MethodGet, "/v1/mandates/"+id+"/ledger?limit=500", admin, nil).JSON(t)["items"].([]any) {
		sum += it.(map[string]any)["amount"].(float64)
	}
	require.EqualValues(t, 7, sum)
}

func TestSpendRetriesWithAnIdempotencyKeyDebitOnce(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin, agent := s.Handler(), token(t, "org-a", "admin"), token(t, "org-a", "agent")
	id := createMandate(t, h, admin, "agent-1", "llm", 100)["id"].(string)
	body := `{"agent_id":"agent-1","scope":"llm","cost":10}`
	first := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusOK, first.Status)
	again := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusOK, again.Status)
	require.JSONEq(t, string(first.Body), string(again.Body))

	const n = 8
	var wg sync.WaitGroup
	concurrent := make([]response, n)
	for i := range n {
		wg.Go(func() {
			concurrent[i] = do(t, h, http.MethodPost, "/v1/mandates/spend", agent, body, "Idempotency-Key", "k2")
		})
	}
	wg.Wait()
	for _, r := range concurrent {
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.JSONEq(t, string(concurrent[0].Body), string(r.Body))
	}
	m := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil).JSON(t)
	require.EqualValues(t, 20, m["spent"], "two keys, two debits")
	items := do(t, h, http.MethodGet, "/v1/mandates/"+id+"/ledger", admin, nil).JSON(t)["items"].([]any)
	require.Len(t, items, 2)
	require.Equal(t, "k1", items[0].(map[string]any)["idempotency_key"])

	t.Run("the key with another body is 422", func(t *testing.T) {
		do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"agent-1","scope":"llm","cost":11}`, "Idempotency-Key", "k1").
			requireProblem(t, http.StatusUnprocessableEntity)
	})
	t.Run("a refusal is replayed with the same approval id", func(t *testing.T) {
		big := `{"agent_id":"agent-1","scope":"llm","cost":1000}`
		p1 := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, big, "Idempotency-Key", "k3").requireProblem(t, http.StatusPaymentRequired)
		p2 := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, big, "Idempotency-Key", "k3").requireProblem(t, http.StatusPaymentRequired)
		require.Equal(t, p1["approval_id"], p2["approval_id"])
	})
}

func TestApproversResolveOverrunsButNotTheirOwn(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin := s.Handler(), token(t, "org-a", "admin")
	id := createMandate(t, h, admin, "agent-1", "llm", 0)["id"].(string)
	// One principal that is both agent and approver.
	both := subToken(t, "org-a", "alice", "", RoleAgent, RoleApprover)
	bob := subToken(t, "org-a", "bob", "", RoleApprover)
	refused := func() string {
		p := do(t, h, http.MethodPost, "/v1/mandates/spend", both, `{"agent_id":"agent-1","scope":"llm","cost":4}`).requireProblem(t, http.StatusPaymentRequired)
		return p["approval_id"].(string)
	}

	a1 := refused()
	do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a1+"/approve", both, `{}`).requireProblem(t, http.StatusForbidden)
	do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a1+"/deny", both, nil).requireProblem(t, http.StatusForbidden)
	r := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a1+"/approve", bob, `{"note":"ok this once"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	a := r.JSON(t)
	require.Equal(t, "approved", a["state"])
	require.Equal(t, "bob", a["resolved_by"])
	require.Equal(t, "ok this once", a["note"])
	require.Contains(t, a, "resolved_at")
	// A second answer's 409 says what became of it, for a UI to show.
	for _, verb := range []string{"approve", "deny"} {
		p := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a1+"/"+verb, bob, `{}`).requireProblem(t, http.StatusConflict)
		require.Equal(t, a1, p["approval_id"])
		require.Equal(t, "approved", p["state"])
		require.Equal(t, "bob", p["resolved_by"])
		require.Equal(t, a["resolved_at"], p["resolved_at"])
	}

	m := do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil).JSON(t)
	require.EqualValues(t, 4, m["spent"], "the overrun is charged, visibly past the budget")
	require.EqualValues(t, 0, m["budget"])
	items := do(t, h, http.MethodGet, "/v1/mandates/"+id+"/ledger", admin, nil).JSON(t)["items"].([]any)
	require.Equal(t, "approved_overrun", items[0].(map[string]any)["kind"])
	require.Equal(t, a1, items[0].(map[string]any)["approval_id"])

	a2 := refused()
	r = do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a2+"/deny", bob, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, "denied", r.JSON(t)["state"])

	for status, want := range map[string]string{"approved": a1, "denied": a2} {
		items := do(t, h, http.MethodGet, "/v1/mandate-approvals?status="+status, bob, nil).JSON(t)["items"].([]any)
		require.Len(t, items, 1, status)
		require.Equal(t, want, items[0].(map[string]any)["id"])
	}
	require.Empty(t, do(t, h, http.MethodGet, "/v1/mandate-approvals?status=pending", bob, nil).JSON(t)["items"])

	// An expired request's 409 names no one, and no time of an answer.
	a3 := refused()
	_, err := s.svc.DB.Exec(context.Background(), `UPDATE mandate_approvals SET expires_at = now() - interval '1 minute' WHERE id = $1`, a3)
	require.NoError(t, err)
	p := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+a3+"/approve", bob, `{}`).requireProblem(t, http.StatusConflict)
	require.Equal(t, "expired", p["state"])
	require.NotContains(t, p, "resolved_by")
	require.NotContains(t, p, "resolved_at", "absent for an expiry")
}

// The tester's repro: overruns of 2^53−1 approved one after another. The
// second would take spent past 2^53−1: a 409 saying so, and the request
// stays pending and can be denied; no number the API returns passes 2^53−1.
func TestApprovingAnOverrunPastTwoToTheFiftyThreeIsA409AndTheRequestCanStillBeDenied(t *testing.T) {
	s, _ := newMandateServer(t)
	h, admin := s.Handler(), token(t, "org-a", "admin")
	agent := subToken(t, "org-a", "alice", "", RoleAgent)
	bob := subToken(t, "org-a", "bob", "", RoleApprover)
	refused := func() string {
		p := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"huge","scope":"s","cost":9007199254740991}`).requireProblem(t, http.StatusPaymentRequired)
		return p["approval_id"].(string)
	}
	first, second := refused(), refused()
	r := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+first+"/approve", bob, `{}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	p := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+second+"/approve", bob, `{}`).requireProblem(t, http.StatusConflict)
	require.Contains(t, p["detail"], "past 2^53−1")
	require.Equal(t, "pending", do(t, h, http.MethodGet, "/v1/mandate-approvals/"+second, bob, nil).JSON(t)["state"])
	items := do(t, h, http.MethodGet, "/v1/mandates?agent_id=huge", admin, nil).JSON(t)["items"].([]any)
	require.Len(t, items, 1)
	require.EqualValues(t, int64(mandates.MaxAmount), items[0].(map[string]any)["spent"])

	r = do(t, h, http.MethodPost, "/v1/mandate-approvals/"+second+"/deny", bob, `{}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, "denied", r.JSON(t)["state"])
}

func TestATokenWithoutSubCannotResolveRequests(t *testing.T) {
	s, svc := newMandateServer(t)
	h, admin := s.Handler(), token(t, "org-a", "admin")
	createMandate(t, h, admin, "agent-1", "llm", 0)
	anonymous := subToken(t, "org-a", "", "", RoleAgent, RoleApprover)
	// A request with no requester (asked in-process, not over HTTP).
	res, err := svc.Spend(context.Background(), mandates.SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 4})
	require.NoError(t, err)
	id := res.ApprovalID.String()

	for _, action := range []string{"approve", "deny"} {
		do(t, h, http.MethodPost, "/v1/mandate-approvals/"+id+"/"+action, anonymous, `{}`).requireProblem(t, http.StatusForbidden)
	}
	bob := subToken(t, "org-a", "bob", "", RoleApprover)
	a := do(t, h, http.MethodGet, "/v1/mandate-approvals/"+id, bob, nil).JSON(t)
	require.Equal(t, "pending", a["state"], "nothing resolved")
	r := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+id+"/approve", bob, `{}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
}

// sub is required to ask for money: without it nobody could tell the
// requester from an approver.
func TestATokenWithoutSubCannotSpendOrAskForAWakeup(t *testing.T) {
	s := newTestServer(t, withMandates(t), withWakeups(t))
	h := s.Handler()
	createMandate(t, h, token(t, "org-a", "admin"), "agent-1", "llm", 100)
	for _, tok := range []string{subToken(t, "org-a", "", "", RoleAgent), subToken(t, "org-a", "", "agent-1", RoleAgent)} {
		p := do(t, h, http.MethodPost, "/v1/mandates/spend", tok, `{"agent_id":"agent-1","scope":"llm","cost":4}`,
			"Idempotency-Key", "k").requireProblem(t, http.StatusForbidden)
		require.Contains(t, p["detail"], "without a sub claim")
		p = do(t, h, http.MethodPost, "/v1/wakeups", tok, map[string]any{
			"agent_id": "agent-1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "cost": 4, "work": map[string]any{"handler": "echo"},
		}).requireProblem(t, http.StatusForbidden)
		require.Contains(t, p["detail"], "without a sub claim")
	}
	var spent, wakeups int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT (SELECT spent FROM mandates), (SELECT count(*) FROM wakeups)`).Scan(&spent, &wakeups))
	require.Zero(t, spent, "nothing spent")
	require.Zero(t, wakeups, "no wake-up recorded")

	r := do(t, h, http.MethodPost, "/v1/mandates/spend", subToken(t, "org-a", "wf", "", RoleAgent), `{"agent_id":"agent-1","scope":"llm","cost":4}`)
	require.Equal(t, http.StatusOK, r.Status, "with a sub the same spend goes through: %s", r.Body)
}

func TestAnotherOrgsMandateAndRequestAreNotFound(t *testing.T) {
	s, svc := newMandateServer(t)
	h := s.Handler()
	id := createMandate(t, h, token(t, "org-a", "admin"), "agent-1", "llm", 0)["id"].(string)
	res, err := svc.Spend(context.Background(), mandates.SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	approval := res.ApprovalID.String()
	admin, approver := token(t, "org-b", "admin"), token(t, "org-b", "approver")
	for _, tc := range []struct {
		method, path, tok string
		body              any
	}{
		{"GET", "/v1/mandates/" + id, admin, nil},
		{"PATCH", "/v1/mandates/" + id, admin, `{"budget":100}`},
		{"GET", "/v1/mandates/" + id + "/ledger", admin, nil},
		{"GET", "/v1/mandates/not-a-uuid", admin, nil},
		{"GET", "/v1/mandate-approvals/" + approval, approver, nil},
		{"POST", "/v1/mandate-approvals/" + approval + "/approve", approver, `{}`},
		{"POST", "/v1/mandate-approvals/" + approval + "/deny", approver, `{}`},
		{"GET", "/v1/mandate-approvals/not-a-uuid", approver, nil},
	} {
		do(t, h, tc.method, tc.path, tc.tok, tc.body).requireProblem(t, http.StatusNotFound)
	}
	require.Empty(t, do(t, h, http.MethodGet, "/v1/mandate-approvals", approver, nil).JSON(t)["items"])
	a, err := svc.GetApproval(context.Background(), "org-a", mandates.AnyAgent, res.ApprovalID)
	require.NoError(t, err)
	require.Equal(t, mandates.StatePending, a.State)
	m := do(t, h, http.MethodGet, "/v1/mandates/"+id, token(t, "org-a", "admin"), nil).JSON(t)
	require.EqualValues(t, 0, m["budget"])
}
