package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var testSecret = []byte("test-secret-test-secret-test-secret-0123")

// newTestServer builds a server on a fresh database with HS256 auth. Every
// request and response through it is checked against the OpenAPI document
// (checkContract).
func newTestServer(t testing.TB, mutate ...func(*Config, *Services)) *Server {
	t.Helper()
	cfg := Config{Auth: AuthConfig{Secrets: [][]byte{testSecret}, OperatorOrgs: []string{"ops-org"}}, Registry: prometheus.NewRegistry(),
		Logger: testkit.Logger(t)}
	svc := Services{DB: testkit.NewPool(t)}
	for _, m := range mutate {
		m(&cfg, &svc)
	}
	s, err := New(context.Background(), cfg, svc)
	require.NoError(t, err)
	if _, bench := t.(*testing.B); !bench { // benchmarks measure the server alone
		checkContract(t, s)
	}
	return s
}

func token(t *testing.T, org string, roles ...string) string {
	t.Helper()
	tok, err := SignToken(testSecret, TokenSpec{OrgID: org, Sub: "user-" + org, Roles: roles, TTL: time.Hour})
	require.NoError(t, err)
	return tok
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) JSON(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &m), "body: %s", r.Body)
	return m
}

// requireProblem asserts an RFC 9457 response with status and, when given,
// the named field in errors[].
func (r response) requireProblem(t *testing.T, status int, field ...string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.Status, "body: %s", r.Body)
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	p := r.JSON(t)
	require.EqualValues(t, status, p["status"])
	require.NotEmpty(t, p["type"])
	require.NotEmpty(t, p["title"])
	for _, f := range field {
		errs, _ := p["errors"].([]any)
		var names []string
		for _, e := range errs {
			names = append(names, e.(map[string]any)["field"].(string))
		}
		require.Contains(t, names, f, "problem names the field: %s", r.Body)
	}
	return p
}

func do(t *testing.T, h http.Handler, method, path, tok string, body any, headers ...string) response {
	t.Helper()
	var rdr io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rdr = strings.NewReader(b)
	case []byte:
		rdr = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		rdr = bytes.NewReader(raw)
	}
	req := httptest.NewRequest(method, path, rdr)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}
