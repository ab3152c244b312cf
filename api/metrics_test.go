package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

// httpSeries counts the series of reveille_http_requests_total and of
// reveille_http_request_duration_seconds, and lists the method labels seen.
func httpSeries(t *testing.T, s *Server) (requests, durations int, methods map[string]bool) {
	t.Helper()
	families, err := s.cfg.Registry.Gather()
	require.NoError(t, err)
	methods = map[string]bool{}
	for _, f := range families {
		switch f.GetName() {
		case "reveille_http_requests_total":
			requests = len(f.GetMetric())
		case "reveille_http_request_duration_seconds":
			durations = len(f.GetMetric())
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" {
					methods[l.GetValue()] = true
				}
			}
		}
	}
	return requests, durations, methods
}

// Requests anyone can send — made-up methods, made-up paths — add no
// series to /metrics however many distinct ones there are: a method
// outside net/http's is labelled "other", a path no route matches
// "unmatched", and a matched one by its route template. (Each made-up one
// was a series of its own: 3,000 took /metrics from 51 KB to 4.5 MB.)
func TestMadeUpMethodsAndPathsAddNoSeries(t *testing.T) {
	cases := []struct {
		name       string
		request    func(i int) (method, path string)
		wantMethod string
		wantRoute  string
		wantStatus string
	}{
		{name: "made-up methods on a route", request: func(i int) (string, string) { return fmt.Sprintf("M%05dXYZ", i), "/healthz" },
			wantMethod: "other", wantRoute: "/healthz", wantStatus: "405"},
		{name: "lower-case methods on a route", request: func(i int) (string, string) { return strings.Repeat("get", i%7+1) + fmt.Sprint(i), "/readyz" },
			wantMethod: "other", wantRoute: "/readyz", wantStatus: "405"},
		{name: "made-up paths", request: func(i int) (string, string) { return http.MethodGet, fmt.Sprintf("/no-such-%d/x", i) },
			wantMethod: http.MethodGet, wantRoute: "unmatched", wantStatus: "404"},
		{name: "made-up methods on made-up paths", request: func(i int) (string, string) { return fmt.Sprintf("X-%d", i), fmt.Sprintf("/p%d", i) },
			wantMethod: "other", wantRoute: "unmatched", wantStatus: "404"},
		{name: "distinct ids under one route template", request: func(i int) (string, string) { return http.MethodGet, fmt.Sprintf(streamBase+"s%d/chunks", i) },
			wantMethod: http.MethodGet, wantRoute: streamChunksPath, wantStatus: "401"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, withStreams(t, streams.Config{}))
			send := func(i int) {
				method, path := tc.request(i)
				rec := httptest.NewRecorder()
				s.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, nil))
				require.Equal(t, tc.wantStatus, fmt.Sprint(rec.Code), "%s %s", method, path)
			}
			send(0)
			requests, durations, _ := httpSeries(t, s)
			for i := 1; i <= 200; i++ {
				send(i)
			}
			after, afterDurations, methods := httpSeries(t, s)
			require.Equal(t, requests, after, "reveille_http_requests_total series")
			require.Equal(t, durations, afterDurations, "reveille_http_request_duration_seconds series")
			require.Equal(t, map[string]bool{tc.wantMethod: true}, methods)
			require.EqualValues(t, 201, requestsTotal(t, s, tc.wantMethod, tc.wantRoute, tc.wantStatus))
		})
	}
}

// The access log cuts a method and a path longer than anyone's at 64 and
// 2048 bytes, saying so, rather than writing a line as long as the request
// line a client chose to send (up to the 1 MiB header limit).
func TestTheAccessLogCutsLongMethodsAndPaths(t *testing.T) {
	cases := []struct {
		name               string
		method, path       string
		wantMethod         string
		wantPathPrefix     string // "": the path is logged as sent
		wantPathCutComment string
	}{
		{name: "an ordinary request is logged as sent", method: http.MethodGet, path: "/healthz", wantMethod: http.MethodGet},
		{name: "a 200 KB method is cut to 64 bytes", method: strings.Repeat("M", 200<<10), path: "/healthz",
			wantMethod: strings.Repeat("M", 64) + "…(cut, 204800 bytes)"},
		{name: "a 100 KB path is cut to 2048 bytes", method: http.MethodGet, path: "/" + strings.Repeat("p", 100<<10),
			wantMethod: http.MethodGet, wantPathPrefix: "/" + strings.Repeat("p", 2047), wantPathCutComment: "…(cut, 102401 bytes)"},
		{name: "a path is cut between characters, not inside one", method: http.MethodGet, path: "/" + strings.Repeat("é", 1500),
			wantMethod: http.MethodGet, wantPathPrefix: "/" + strings.Repeat("é", 1023), wantPathCutComment: "…(cut, 3001 bytes)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs testkit.LogBuffer
			s := newTestServer(t, func(c *Config, _ *Services) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
			s.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(tc.method, tc.path, nil))

			var line struct{ Method, Path string }
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `"msg":"http request"`) {
					require.NoError(t, json.Unmarshal([]byte(l), &line))
				}
			}
			require.Equal(t, tc.wantMethod, line.Method)
			if tc.wantPathPrefix == "" {
				require.Equal(t, tc.path, line.Path)
				return
			}
			require.Equal(t, tc.wantPathPrefix+tc.wantPathCutComment, line.Path)
		})
	}
}

func TestAClientsRequestIDIsKeptOnlyWhenItIsShortVisibleASCII(t *testing.T) {
	s := newTestServer(t)
	for _, tc := range []struct {
		name, id string
		kept     bool
	}{
		{"a trace id", "4bf92f3577b34da6a3ce929d0e0e4736", true},
		{"a long one", strings.Repeat("a", 129), false},
		{"one with a space", "a b", false},
		{"one with a line break", "a\nlevel=ERROR", false},
		{"one not ASCII", "идентификатор", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			req.Header[echo.HeaderXRequestID] = []string{tc.id}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			got := rec.Header().Get(echo.HeaderXRequestID)
			if tc.kept {
				require.Equal(t, tc.id, got)
				return
			}
			require.NotEqual(t, tc.id, got)
			_, err := uuid.Parse(got)
			require.NoError(t, err, "an id of its own: %q", got)
		})
	}
}
