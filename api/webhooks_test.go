package api

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/webhooks"
	"github.com/reveille/reveille/workpool/httpwork"
)

// withWebhooks serves the approval webhooks, their URLs checked against an
// allow-list of 127.0.0.1 (deliveries are the webhooks package's tests).
func withWebhooks(t *testing.T) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		rules, err := httpwork.NewURLRules(httpwork.Config{AllowedHosts: []string{"127.0.0.1:*"}})
		require.NoError(t, err)
		sv.Webhooks = webhooks.New(sv.DB, sv.Workpool, webhooks.Config{CheckURL: rules.CheckURL})
	}
}

const hooksPath = "/v1/approvals/webhooks"

func TestAnAdminCreatesReadsReplacesAndDeletesAnApprovalWebhook(t *testing.T) {
	s := newTestServer(t, withWebhooks(t))
	h, admin := s.Handler(), subToken(t, "org-a", "root", "", RoleAdmin)

	created := do(t, h, "PUT", hooksPath+"/ops", admin, map[string]any{"url": "http://127.0.0.1:9/hook", "format": "json"})
	require.Equal(t, http.StatusCreated, created.Status, "body: %s", created.Body)
	body := created.JSON(t)
	secret, _ := body["secret"].(string)
	require.NotEmpty(t, secret, "the secret is shown at creation")
	require.Equal(t, "ops", body["name"])
	require.Equal(t, "json", body["format"])

	got := do(t, h, "GET", hooksPath+"/ops", admin, nil)
	require.Equal(t, http.StatusOK, got.Status)
	require.NotContains(t, string(got.Body), secret, "and never again")
	require.Equal(t, "http://127.0.0.1:9/hook", got.JSON(t)["url"])
	for _, field := range []string{"last_delivery", "last_failure"} {
		require.Contains(t, got.JSON(t), field, "always sent")
		require.Nil(t, got.JSON(t)[field], "null until a delivery finished")
	}

	replaced := do(t, h, "PUT", hooksPath+"/ops", admin, map[string]any{"url": "http://127.0.0.1:9/v2", "format": "slack"})
	require.Equal(t, http.StatusOK, replaced.Status, "body: %s", replaced.Body)
	require.NotContains(t, replaced.JSON(t), "secret")
	require.Equal(t, "slack", replaced.JSON(t)["format"])

	list := do(t, h, "GET", hooksPath, admin, nil)
	require.Equal(t, http.StatusOK, list.Status)
	items := list.JSON(t)["items"].([]any)
	require.Len(t, items, 1)
	require.Contains(t, list.JSON(t), "next_cursor", "a list's shape: {items, next_cursor}")
	require.Nil(t, list.JSON(t)["next_cursor"])
	require.Equal(t, "http://127.0.0.1:9/v2", items[0].(map[string]any)["url"])
	require.NotContains(t, string(list.Body), secret)

	require.Equal(t, http.StatusNoContent, do(t, h, "DELETE", hooksPath+"/ops", admin, nil).Status)
	do(t, h, "GET", hooksPath+"/ops", admin, nil).requireProblem(t, http.StatusNotFound)
	do(t, h, "DELETE", hooksPath+"/ops", admin, nil).requireProblem(t, http.StatusNotFound)
	require.Empty(t, do(t, h, "GET", hooksPath, admin, nil).JSON(t)["items"])
}

// A create retried under its Idempotency-Key gets the first answer, secret
// included, rather than a secretless replace.
func TestARetriedCreateGetsItsSecretAgain(t *testing.T) {
	s := newTestServer(t, withWebhooks(t))
	h, admin := s.Handler(), subToken(t, "org-a", "root", "", RoleAdmin)
	body := map[string]any{"url": "http://127.0.0.1:9/hook", "format": "json"}
	first := do(t, h, "PUT", hooksPath+"/ops", admin, body, "Idempotency-Key", "k1")
	again := do(t, h, "PUT", hooksPath+"/ops", admin, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, first.JSON(t)["secret"], again.JSON(t)["secret"])
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
}

func TestBadWebhookInputIsA400NamingTheField(t *testing.T) {
	s := newTestServer(t, withWebhooks(t))
	h, admin := s.Handler(), subToken(t, "org-a", "root", "", RoleAdmin)
	good := "http://127.0.0.1:9/hook"
	cases := []struct {
		name, hook string
		body       any
		field      string
	}{
		{"an upper-case name", "Ops", map[string]any{"url": good, "format": "json"}, "name"},
		{"a name of 65 characters", strings.Repeat("a", 65), map[string]any{"url": good, "format": "json"}, "name"},
		{"no url", "ops", map[string]any{"format": "json"}, "url"},
		{"a url that is not http", "ops", map[string]any{"url": "file:///etc/passwd", "format": "json"}, "url"},
		{"a private address outside the allow-list", "ops", map[string]any{"url": "http://10.0.0.5/hook", "format": "json"}, "url"},
		{"the cloud metadata endpoint", "ops", map[string]any{"url": "http://169.254.169.254/", "format": "slack"}, "url"},
		{"a url that is not a string", "ops", map[string]any{"url": 5, "format": "json"}, "url"},
		{"an unknown format", "ops", map[string]any{"url": good, "format": "xml"}, "format"},
		{"no format", "ops", map[string]any{"url": good}, "format"},
		{"an unknown field", "ops", map[string]any{"url": good, "format": "json", "secret": "mine"}, "secret"},
		{"no body", "ops", nil, "url"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			do(t, h, "PUT", hooksPath+"/"+tc.hook, admin, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
		})
	}
	require.Empty(t, do(t, h, "GET", hooksPath, admin, nil).JSON(t)["items"], "nothing was stored")
}

func TestApprovalWebhooksAreTheOrgAdminsAlone(t *testing.T) {
	s := newTestServer(t, withWebhooks(t))
	h := s.Handler()
	adminA, adminB := subToken(t, "org-a", "root", "", RoleAdmin), subToken(t, "org-b", "root-b", "", RoleAdmin)
	body := map[string]any{"url": "http://127.0.0.1:9/org-a", "format": "json"}
	require.Equal(t, http.StatusCreated, do(t, h, "PUT", hooksPath+"/ops", adminA, body).Status)

	cases := []struct {
		name, method, path, tok string
		status                  int
	}{
		{"another org's GET", "GET", hooksPath + "/ops", adminB, http.StatusNotFound},
		{"another org's DELETE", "DELETE", hooksPath + "/ops", adminB, http.StatusNotFound},
		{"an approver", "GET", hooksPath, subToken(t, "org-a", "alice", "", RoleApprover, RoleAgent, RoleOperator), http.StatusForbidden},
		{"an admin token bound to an agent", "GET", hooksPath + "/ops", subToken(t, "org-a", "a1", "agent-1", RoleAdmin), http.StatusForbidden},
		{"an admin token bound to an agent, deleting", "DELETE", hooksPath + "/ops", subToken(t, "org-a", "a1", "agent-1", RoleAdmin), http.StatusForbidden},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, h, tc.method, tc.path, tc.tok, nil)
			r.requireProblem(t, tc.status)
			require.NotContains(t, string(r.Body), "org-a")
		})
	}
	list := do(t, h, "GET", hooksPath, adminB, nil)
	require.Equal(t, http.StatusOK, list.Status)
	require.Empty(t, list.JSON(t)["items"], "another org lists none of them")
	require.Equal(t, http.StatusOK, do(t, h, "GET", hooksPath+"/ops", adminA, nil).Status, "org A's webhook is still there")
}

func TestTheWebhookListPagesByNameAndRefusesABadLimitOrCursor(t *testing.T) {
	s := newTestServer(t, withWebhooks(t))
	h, admin := s.Handler(), subToken(t, "org-a", "root", "", RoleAdmin)
	names := []string{"a", "a-b", "b", "c_d", "z9"}
	for _, n := range slices.Backward(names) {
		r := do(t, h, "PUT", hooksPath+"/"+url.PathEscape(n), admin, map[string]any{"url": "http://127.0.0.1:9/hook", "format": "json"})
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	var got []string
	path := hooksPath + "?limit=2"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3, "5 webhooks in pages of 2")
		body := do(t, h, "GET", path, admin, nil).JSON(t)
		for _, it := range body["items"].([]any) {
			got = append(got, it.(map[string]any)["name"].(string))
		}
		next, _ := body["next_cursor"].(string)
		if next == "" {
			break
		}
		path = hooksPath + "?limit=2&cursor=" + url.QueryEscape(next)
	}
	require.Equal(t, names, got, "each once, in name order")
	require.Len(t, do(t, h, "GET", hooksPath, admin, nil).JSON(t)["items"], 5, "the default limit holds every webhook an org may have")

	for _, q := range []string{"limit=0", "limit=501", "limit=abc"} {
		do(t, h, "GET", hooksPath+"?"+q, admin, nil).requireProblem(t, http.StatusBadRequest, "limit")
	}
	// (not base64url; and base64url of "\x00" and of "\xff", which no name
	// holds: read as cursors, they paged from wherever the bytes fell)
	for _, q := range []string{"cursor=%25%25", "cursor=a+b", "cursor=AA", "cursor=_w"} {
		do(t, h, "GET", hooksPath+"?"+q, admin, nil).requireProblem(t, http.StatusBadRequest, "cursor")
	}
}
