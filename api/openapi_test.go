package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

const (
	testWait  = 10 * time.Second
	pollEvery = 5 * time.Millisecond
)

var echoParam = regexp.MustCompile(`:([a-z_]+)`)

// Every registered route is documented and every documented route exists.
func TestOpenAPIDocumentMatchesTheRoutes(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t), withInbox(t, 0), withWebhooks(t))
	r := do(t, s.Handler(), http.MethodGet, "/openapi.json", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."))

	var documented, registered []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	gets := map[string]bool{}
	for _, rt := range s.Echo().Routes() {
		if rt.Method == http.MethodGet {
			gets[rt.Path] = true
		}
	}
	for _, rt := range s.Echo().Routes() {
		if rt.Method == http.MethodHead {
			// (a HEAD is its GET's headers, documented by the GET)
			require.True(t, gets[rt.Path], "HEAD %s without a GET", rt.Path)
			continue
		}
		registered = append(registered, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
	}
	sort.Strings(documented)
	sort.Strings(registered)
	require.Equal(t, documented, registered)
}

// Every /v1 operation refuses a request without a token (401), a token
// without its role (403; /v1/whoami needs none), a query parameter that is
// not text (400) and an org over its request rate (429). Through
// newTestServer's contract check, an operation whose document does not
// declare one of these fails here, routes added later included.
func TestEveryV1OperationDeclaresItsRefusals(t *testing.T) {
	var orgs []string // one per request that counts against an org's rate
	for i := range 200 {
		orgs = append(orgs, fmt.Sprintf("org-%d", i))
	}
	s := newTestServer(t, withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t), withWebhooks(t),
		func(c *Config, _ *Services) {
			c.OrgRate, c.OrgBurst = 0.001, 1 // one request per org, then 429
			c.Auth.OperatorOrgs = orgs       // so the operator role counts and the 400 is reached
		})
	h := s.Handler()
	var routes []*echo.Route
	for _, rt := range s.Echo().Routes() {
		if strings.HasPrefix(rt.Path, "/v1/") {
			routes = append(routes, rt)
		}
	}
	require.NotEmpty(t, routes)
	require.LessOrEqual(t, 2*len(routes), len(orgs))
	for i, rt := range routes {
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			path := echoParam.ReplaceAllString(rt.Path, "x")
			do(t, h, rt.Method, path, "", nil).requireProblem(t, http.StatusUnauthorized)

			noRole := do(t, h, rt.Method, path, token(t, orgs[2*i]), nil)
			if rt.Path == "/v1/whoami" {
				require.Equal(t, http.StatusOK, noRole.Status)
			} else {
				noRole.requireProblem(t, http.StatusForbidden)
			}

			every := token(t, orgs[2*i+1], AllRoles...)
			do(t, h, rt.Method, path+"?q=%00", every, nil).requireProblem(t, http.StatusBadRequest, "q")
			do(t, h, rt.Method, path, every, nil).requireProblem(t, http.StatusTooManyRequests)
		})
	}
}

// operationIDPattern is camelCase: generated clients name their methods
// after it.
var operationIDPattern = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// Every operation has an operationId, camelCase and unique, and each is the
// one api/testdata/operation-ids.txt pins: clients are generated with
// methods of these names, so one that changes breaks them.
func TestEveryOperationHasAStableOperationID(t *testing.T) {
	doc, err := mergedOpenAPI()
	require.NoError(t, err)
	var got []string
	seen := map[string]string{}
	for o := range operations(doc) {
		where := strings.ToUpper(o.method) + " " + o.path
		id, _ := o.op["operationId"].(string)
		if !assert.Regexp(t, operationIDPattern, id, "%s: operationId must be camelCase", where) {
			continue
		}
		if other, dup := seen[id]; dup {
			t.Errorf("operationId %s names both %s and %s", id, other, where)
		}
		seen[id] = where
		got = append(got, id+" "+where)
	}
	require.NotEmpty(t, got)
	raw, err := os.ReadFile("testdata/operation-ids.txt")
	require.NoError(t, err)
	var pinned []string
	for line := range strings.Lines(string(raw)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			pinned = append(pinned, line)
		}
	}
	sort.Strings(got)
	sort.Strings(pinned)
	require.Equal(t, pinned, got, "testdata/operation-ids.txt pins every operation's id: add a new operation's line there; never change one")
}

// The document's parts hold no mistake a YAML parser accepts silently but a
// client feels: a key with a space in it (an unquoted description with
// ", " in a flow mapping is cut short there and adds a stray key), an enum
// of a nullable schema that does not list null (null is refused by it), a
// default in a request body's schema (generators then make the field
// required: the default is said in its description instead).
func TestOpenAPIDocumentHasNoSilentYAMLMistakes(t *testing.T) {
	doc, err := mergedOpenAPI()
	require.NoError(t, err)
	walkOpenAPI(doc, "#", func(node map[string]any, at string) {
		for k := range node {
			assert.NotContains(t, k, " ", "%s: the key %q is a description cut short at a comma; quote the description", at, k)
		}
		if nullable, _ := node["nullable"].(bool); nullable {
			if enum, ok := node["enum"].([]any); ok {
				assert.Contains(t, enum, nil, "%s: a nullable enum must list null", at)
			}
		}
	})
	schemas, _ := doc["components"].(map[string]any)["schemas"].(map[string]any)
	for o := range operations(doc) {
		body, _ := o.op["requestBody"].(map[string]any)
		content, _ := body["content"].(map[string]any)
		for mediaType, mt := range content {
			schema, _ := mt.(map[string]any)["schema"].(map[string]any)
			at := strings.ToUpper(o.method) + " " + o.path + " " + mediaType
			walkSchema(schema, schemas, at, map[string]bool{}, func(node map[string]any, at string) {
				assert.NotContains(t, node, "default", "%s: a request body's default goes in the description (generators make a field with a default required)", at)
			})
		}
	}
}

// walkOpenAPI calls visit on every mapping of the document.
func walkOpenAPI(node any, at string, visit func(map[string]any, string)) {
	switch n := node.(type) {
	case map[string]any:
		visit(n, at)
		for k, v := range n {
			walkOpenAPI(v, at+"/"+k, visit)
		}
	case []any:
		for i, v := range n {
			walkOpenAPI(v, fmt.Sprintf("%s/%d", at, i), visit)
		}
	}
}

// walkSchema calls visit on every schema within schema, following
// references to components/schemas (each once).
func walkSchema(schema, components map[string]any, at string, seen map[string]bool, visit func(map[string]any, string)) {
	if schema == nil {
		return
	}
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		if seen[name] {
			return
		}
		seen[name] = true
		target, _ := components[name].(map[string]any)
		walkSchema(target, components, at+" → "+name, seen, visit)
		return
	}
	visit(schema, at)
	props, _ := schema["properties"].(map[string]any)
	for name, p := range props {
		sub, _ := p.(map[string]any)
		walkSchema(sub, components, at+"."+name, seen, visit)
	}
	for _, key := range []string{"items", "additionalProperties", "not"} {
		if sub, ok := schema[key].(map[string]any); ok {
			walkSchema(sub, components, at+"/"+key, seen, visit)
		}
	}
	for _, key := range []string{"allOf", "anyOf", "oneOf"} {
		subs, _ := schema[key].([]any)
		for i, s := range subs {
			sub, _ := s.(map[string]any)
			walkSchema(sub, components, fmt.Sprintf("%s/%s/%d", at, key, i), seen, visit)
		}
	}
}

// While the database cannot be reached, every operation that reads it
// answers 503 `unavailable` with Retry-After, and those marked
// `x-reveille-database: false` answer as ever; through newTestServer's
// contract check, an operation whose document does not declare the 503
// (or whatever else it answers) fails here, routes added later included.
// Each route is called once, bodiless, with every role: the reads reach
// the database; the writes are refused before it (400) or reach it too.
func TestEveryOperationDeclaresTheDatabasesOutage(t *testing.T) {
	db, cut := testkit.NewCuttablePool(t)
	s := newTestServer(t, func(c *Config, sv *Services) { sv.DB = db; c.Auth.OperatorOrgs = []string{"org-a"} },
		withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t), withInbox(t, 0), withWebhooks(t))
	cut()
	h := s.Handler()
	doc, err := mergedOpenAPI()
	require.NoError(t, err)
	paths, _ := doc["paths"].(map[string]any)
	every := token(t, "org-a", AllRoles...)
	unavailable := 0
	for _, rt := range s.Echo().Routes() {
		if rt.Method == http.MethodHead {
			continue
		}
		item, _ := paths[echoParam.ReplaceAllString(rt.Path, "{$1}")].(map[string]any)
		op, _ := item[strings.ToLower(rt.Method)].(map[string]any)
		require.NotNil(t, op, "%s %s is documented", rt.Method, rt.Path)
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			// a UUID for an id (anything else names nothing: 404 before any read)
			path := strings.ReplaceAll(rt.Path, ":id", "0190a5c4-0000-7000-8000-000000000000")
			r := do(t, h, rt.Method, echoParam.ReplaceAllString(path, "x"), every, nil)
			if op["x-reveille-database"] == false {
				require.NotEqual(t, http.StatusServiceUnavailable, r.Status, "body: %s", r.Body)
				return
			}
			if rt.Method == http.MethodGet {
				r.requireProblem(t, http.StatusServiceUnavailable)
			}
			if r.Status == http.StatusServiceUnavailable && strings.Contains(string(r.Body), "/problems/unavailable") {
				unavailable++
				require.Equal(t, "5", r.Header.Get("Retry-After"))
			}
		})
	}
	require.Greater(t, unavailable, 15, "most operations reached the database")
}
