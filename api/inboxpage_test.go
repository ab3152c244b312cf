package api

import (
	"net/http"
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
