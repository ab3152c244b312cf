package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// Every /v1 route, with each of its path parameters and with a query
// parameter (value or name) that is not UTF-8 text without NUL, is a 400
// naming the parameter. Postgres rejects such text, which made some of
// these 500s.
func TestNULOrInvalidUTF8InAnyParameterIs400NamingIt(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t), withInbox(t, 0), withWebhooks(t))
	tok := token(t, "ops-org", AllRoles...)
	bad := []struct {
		name, escaped, decoded string // decoded: as the problem names it
	}{
		{"NUL", "a%00b", "a\x00b"},
		{"invalid UTF-8, escaped as the server would not", "a%ffb", "a\uFFFDb"},
		{"invalid UTF-8, escaped as the server would", "a%FFb", "a\uFFFDb"},
		{"overlong UTF-8", "%C0%AF", "\uFFFD"},
	}
	// get bounds each request, so that without the check the SSE route fails
	// instead of streaming forever.
	get := func(t *testing.T, method, path string) response {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, method, path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	}
	var routes []string
	for _, rt := range s.Echo().Routes() {
		if !strings.HasPrefix(rt.Path, "/v1/") {
			continue
		}
		routes = append(routes, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
		params := echoParam.FindAllStringSubmatch(rt.Path, -1)
		// path fills every parameter with a valid value but the one named.
		path := func(param, value string) string {
			return echoParam.ReplaceAllStringFunc(rt.Path, func(m string) string {
				if m[1:] == param {
					return value
				}
				return "x"
			})
		}
		for _, b := range bad {
			for _, p := range params {
				t.Run(rt.Method+" "+rt.Path+" "+p[1]+" "+b.name, func(t *testing.T) {
					get(t, rt.Method, path(p[1], b.escaped)).requireProblem(t, http.StatusBadRequest, p[1])
				})
			}
			t.Run(rt.Method+" "+rt.Path+" query "+b.name, func(t *testing.T) {
				get(t, rt.Method, path("", "")+"?limit=5&after="+b.escaped).requireProblem(t, http.StatusBadRequest, "after")
				get(t, rt.Method, path("", "")+"?"+b.escaped+"=1").requireProblem(t, http.StatusBadRequest, b.decoded)
			})
		}
		t.Run(rt.Method+" "+rt.Path+" malformed query escape", func(t *testing.T) {
			get(t, rt.Method, path("", "")+"?after=%zz").requireProblem(t, http.StatusBadRequest, "after")
		})
	}
	documented := slices.DeleteFunc(documentedRoutes(t), func(r string) bool { return !strings.Contains(r, " /v1/") })
	sort.Strings(routes)
	require.Equal(t, documented, routes, "every documented route is registered, so checked")
}

// Every /v1 route with a path parameter of "." or "..", as written or
// percent-encoded, is a 400 naming the parameter: URL clients remove such
// segments, so that nothing named so could be reached by its URL (a tool
// call in session ".." could not be answered from the inbox page).
func TestADotSegmentInAnyPathParameterIs400NamingIt(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t), withInbox(t, 0), withWebhooks(t))
	tok := token(t, "ops-org", AllRoles...)
	checked := 0
	for _, rt := range s.Echo().Routes() {
		if !strings.HasPrefix(rt.Path, "/v1/") {
			continue
		}
		for _, p := range echoParam.FindAllStringSubmatch(rt.Path, -1) {
			for _, dots := range []string{".", "..", "%2E", "%2e%2E"} {
				path := echoParam.ReplaceAllStringFunc(rt.Path, func(m string) string {
					if m[1:] == p[1] {
						return dots
					}
					return "x"
				})
				t.Run(rt.Method+" "+rt.Path+" "+p[1]+" "+dots, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), testWait)
					defer cancel()
					req := httptest.NewRequestWithContext(ctx, rt.Method, "/", nil)
					decoded, err := url.PathUnescape(path)
					require.NoError(t, err)
					req.URL.Path = decoded
					if decoded != path {
						req.URL.RawPath = path // (as a client sends %2E: echo routes on it)
					}
					req.Header.Set("Authorization", "Bearer "+tok)
					rec := httptest.NewRecorder()
					s.Handler().ServeHTTP(rec, req)
					p := response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}.requireProblem(t, http.StatusBadRequest, p[1])
					require.Contains(t, p["detail"], `must not be "." or ".."`)
				})
				checked++
			}
		}
	}
	require.Greater(t, checked, 40)
}

func TestTwoIdempotencyKeysAre400NamingTheHeader(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	req := httptest.NewRequest(http.MethodPost, "/v1/pools/default/work", strings.NewReader(`{"handler": "echo"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token(t, "org-a", RoleAdmin))
	req.Header.Add("Idempotency-Key", "k1")
	req.Header.Add("Idempotency-Key", "k2")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}.requireProblem(t, http.StatusBadRequest, "Idempotency-Key")
	require.Zero(t, workCount(t, s))
}

func TestAnIdempotencyKeyThatIsNotUTF8Is400NamingIt(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-a", RoleAdmin), `{"handler": "echo"}`,
		"Idempotency-Key", "key-\xff")
	r.requireProblem(t, http.StatusBadRequest, "Idempotency-Key")
	require.Zero(t, workCount(t, s))
}

// A query parameter given twice is a 400 naming it: the first value was
// read while the client may have meant the other (or both, as a filter).
func TestAQueryParameterGivenTwiceIs400NamingIt(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	tok := subToken(t, "org-a", "root", "", RoleAdmin, RoleAgent)
	for _, q := range []string{"status=pending&status=delivered", "limit=1&limit=2", "agent_id=a&agent_id=a", "cursor=&cursor="} {
		t.Run(q, func(t *testing.T) {
			name, _, _ := strings.Cut(q, "=")
			do(t, s.Handler(), http.MethodGet, "/v1/wakeups?"+q, tok, nil).requireProblem(t, http.StatusBadRequest, name)
		})
	}
	r := do(t, s.Handler(), http.MethodGet, "/v1/wakeups?status=pending&limit=1", tok, nil)
	require.Equal(t, http.StatusOK, r.Status, "distinct parameters: %s", r.Body)
}

// A raw ";" in a query pair is a 400 naming the parameter: url.ParseQuery
// (and so every handler's QueryParam) drops such a pair whole, so a filter
// or limit the client set was silently ignored (every agent's mandates for
// ?agent_id=a1;, a default page for ?limit=1;).
func TestARawSemicolonInAQueryPairIs400NamingIt(t *testing.T) {
	s := newTestServer(t, withMandates(t))
	h, admin := s.Handler(), token(t, "org-a", RoleAdmin)
	for _, agent := range []string{"a1", "a2"} {
		r := do(t, h, http.MethodPost, "/v1/mandates", admin, map[string]any{"agent_id": agent, "scope": "llm", "budget": 1})
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	for _, tc := range []struct{ query, param string }{
		{"agent_id=a1;", "agent_id"},
		{"limit=1;", "limit"},
		{"agent_id=a1;limit=1", "agent_id"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			do(t, h, http.MethodGet, "/v1/mandates?"+tc.query, admin, nil).requireProblem(t, http.StatusBadRequest, tc.param)
		})
	}
	r := do(t, h, http.MethodGet, "/v1/mandates?agent_id=a1%3B", admin, nil)
	require.Equal(t, http.StatusOK, r.Status, "an escaped semicolon is part of the value: %s", r.Body)
	require.Empty(t, r.JSON(t)["items"])
}

// A query parameter the document types as an integer or an enum takes no
// empty value (?status=, ?limit=): a 400 naming it, where it used to read
// as absent — a filter sent empty listed everything. The set the check
// refuses is the document's (string parameters take "" as absent).
func TestEmptyQueryValuesAreRefusedWhereTheDocumentTypesThem(t *testing.T) {
	doc, err := contractDocument()
	require.NoError(t, err)
	typed := map[string]bool{}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, ref := range append(slices.Clone(item.Parameters), op.Parameters...) {
				p := ref.Value
				if p.In != "query" || p.Schema == nil || p.Schema.Value == nil {
					continue
				}
				s := p.Schema.Value
				if s.Type.Is("integer") || len(s.Enum) > 0 {
					typed[p.Name] = true
				}
			}
		}
	}
	require.Equal(t, typed, notEmptyQueryParams)

	for name := range notEmptyQueryParams {
		err := queryParamsProblem(name + "=&x=1")
		var p *Problem
		require.ErrorAs(t, err, &p, name)
		require.Equal(t, name, p.Errors[0].Field)
		require.Contains(t, p.Errors[0].Detail, "must not be empty")
	}
	require.NoError(t, queryParamsProblem("cursor=&agent_id=&limit=5"), "string parameters take an empty value as absent")

	s := newTestServer(t, withWakeups(t))
	tok := subToken(t, "org-a", "root", "", RoleAdmin, RoleAgent)
	do(t, s.Handler(), http.MethodGet, "/v1/wakeups?status=", tok, nil).requireProblem(t, http.StatusBadRequest, "status")
}
