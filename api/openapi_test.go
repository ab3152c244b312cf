package api

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

const (
	testWait  = 10 * time.Second
	pollEvery = 5 * time.Millisecond
)

var echoParam = regexp.MustCompile(`:([a-z_]+)`)

// Every registered route is documented and every documented route exists.
func TestOpenAPIDocumentMatchesTheRoutes(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{}), withMandates(t), withWakeups(t), withWorkpool(t), withApprovals(t))
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
	for _, rt := range s.Echo().Routes() {
		registered = append(registered, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
	}
	sort.Strings(documented)
	sort.Strings(registered)
	require.Equal(t, documented, registered)
}
