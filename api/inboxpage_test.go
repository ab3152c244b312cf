package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/web"
)

// The inbox page is served without a token, with its security headers on
// every answer, a missing file's 404 included.
func TestInboxPageIsServedWithoutATokenUnderItsStrictHeaders(t *testing.T) {
	h := newTestServer(t).Handler()
	for _, tc := range []struct {
		path, contentType string
		status            int
	}{
		{"/inbox", "text/html; charset=utf-8", http.StatusOK},
		{"/inbox/", "text/html; charset=utf-8", http.StatusOK},
		{"/inbox/inbox.js", "text/javascript; charset=utf-8", http.StatusOK},
		{"/inbox/inbox.css", "text/css; charset=utf-8", http.StatusOK},
		{"/inbox/missing.js", "application/problem+json", http.StatusNotFound},
	} {
		t.Run(tc.path, func(t *testing.T) {
			r := do(t, h, http.MethodGet, tc.path, "", nil)
			require.Equal(t, tc.status, r.Status, string(r.Body))
			require.Equal(t, tc.contentType, r.Header.Get("Content-Type"))
			require.Equal(t, web.InboxCSP, r.Header.Get("Content-Security-Policy"))
			require.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"))
			require.Equal(t, "no-referrer", r.Header.Get("Referrer-Policy"))
		})
	}
}

// Probes and browsers send HEAD to what they GET: the headers, no body,
// not a 405.
func TestUnauthenticatedGetRoutesAnswerHead(t *testing.T) {
	s := newTestServer(t)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json", "/inbox", "/inbox/inbox.js"} {
		t.Run(path, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodHead, srv.URL+path, nil)
			require.NoError(t, err)
			res, err := srv.Client().Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(res.Body)
			require.NoError(t, err)
			require.NoError(t, res.Body.Close())
			require.Equal(t, http.StatusOK, res.StatusCode)
			require.NotEmpty(t, res.Header.Get("Content-Type"))
			require.Empty(t, body)
		})
	}
}
