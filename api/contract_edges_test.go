package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// An operation that takes no body ignores whatever body was sent
// (limitBody), so a body sent with Content-Encoding cannot make it answer a
// 415 its document does not declare.
func TestABodylessOperationIgnoresTheContentEncodingOfTheBodyItIgnores(t *testing.T) {
	s := newTestServer(t, withWorkpool(t), func(c *Config, _ *Services) { c.Auth.OperatorOrgs = []string{"org-a"} })
	tok := token(t, "org-a", AllRoles...)
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/pause", tok, "{}", "Content-Encoding", "gzip")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, "{}", "Content-Encoding", "gzip")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
}

// A Prometheus server that asks for the protobuf exposition format gets it:
// the document must declare that media type (the contract check fails on
// an undeclared one).
func TestMetricsInTheProtobufFormatAreDeclared(t *testing.T) {
	s := newTestServer(t)
	r := do(t, s.Handler(), http.MethodGet, "/metrics", "", nil,
		"Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	require.Equal(t, http.StatusOK, r.Status)
}

// A JSON body is taken under any +json media type (components/responses/
// UnsupportedMediaType), a stream append's included.
func TestAStreamAppendTakesJSONUnderAPlusJSONMediaType(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	r := do(t, s.Handler(), http.MethodPost, streamBase+"out/chunks", tok, `{"chunks":[{"data_base64":"aGk="}]}`,
		"Content-Type", "application/vnd.reveille+json")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
}

// api/redocly.yaml demotes nullable-type-sibling to a warning for one
// reason only: "any JSON value, null included" has no typed form in
// OpenAPI 3.0. Any other schema that is nullable without a type (nullable
// beside allOf/oneOf/anyOf or $ref) is one OpenAPI 3.0.3 tooling reads as
// not nullable — null fails the non-nullable subschema — and the warning
// hides it.
func TestOnlyAnyJSONValueSchemasAreNullableWithoutAType(t *testing.T) {
	doc, err := mergedOpenAPI()
	require.NoError(t, err)
	walkOpenAPI(doc, "#", func(node map[string]any, at string) {
		if nullable, _ := node["nullable"].(bool); !nullable {
			return
		}
		if _, typed := node["type"]; typed {
			return
		}
		for _, k := range []string{"allOf", "oneOf", "anyOf", "$ref", "properties", "items", "enum"} {
			assert.NotContains(t, node, k, "%s: nullable without a type beside %s: null is refused by tooling that reads OpenAPI 3.0.3", at, k)
		}
	})
}

// A replayed answer carries Idempotent-Replayed: true (the document names
// the header in one description, "as on every route"); a client generated
// from the document should find it declared on the answers that carry it.
func TestTheReplayHeaderIsDeclared(t *testing.T) {
	s := newTestServer(t, withMandates(t))
	tok := token(t, "org-a", RoleAdmin)
	body := `{"agent_id":"a1","scope":"s","budget":5}`
	first := do(t, s.Handler(), http.MethodPost, "/v1/mandates", tok, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	again := do(t, s.Handler(), http.MethodPost, "/v1/mandates", tok, body, "Idempotency-Key", "k1")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))

	doc, err := contractDocument()
	require.NoError(t, err)
	res := doc.Paths.Value("/v1/mandates").Post.Responses.Status(http.StatusCreated).Value
	var names []string
	for name := range res.Headers {
		names = append(names, strings.ToLower(name))
	}
	require.Contains(t, names, "idempotent-replayed", "createMandate's 201 declares the header it is replayed with")
}

// The server takes a JSON body without a Content-Type, or under a +json
// type (as components/responses/UnsupportedMediaType says); the request
// bodies list application/json alone, so the contract check (an accepted
// request the document calls invalid) fails.
func TestJSONBodiesTheServerTakesAreOnesTheDocumentTakes(t *testing.T) {
	s := newTestServer(t, withMandates(t))
	tok := token(t, "org-a", RoleAdmin)
	for i, ct := range []string{"application/vnd.reveille+json", ""} {
		r := do(t, s.Handler(), http.MethodPost, "/v1/mandates", tok, `{"agent_id":"a`+string(rune('0'+i))+`","scope":"s","budget":5}`, "Content-Type", ct)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
}
