package web

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func serve(t *testing.T, in *Inbox, name string, headers ...string) (*httptest.ResponseRecorder, bool) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/inbox/"+name, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	ok := in.Serve(rec, req, name)
	return rec, ok
}

func TestInboxServesEachFileWithItsTypeAndTheStrictHeaders(t *testing.T) {
	in, err := NewInbox()
	require.NoError(t, err)
	for _, tc := range []struct{ name, contentType, contains string }{
		{"", "text/html; charset=utf-8", "<title>Approvals inbox"},
		{"index.html", "text/html; charset=utf-8", `<script src="/inbox/inbox.js" defer></script>`},
		{"inbox.js", "text/javascript; charset=utf-8", "'use strict'"},
		{"inbox.css", "text/css; charset=utf-8", "prefers-color-scheme: dark"},
		{"icon.svg", "image/svg+xml", "<svg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, ok := serve(t, in, tc.name)
			require.True(t, ok)
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, tc.contentType, rec.Header().Get("Content-Type"))
			require.Equal(t, InboxCSP, rec.Header().Get("Content-Security-Policy"))
			require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
			require.Equal(t, "no-referrer", rec.Header().Get("Referrer-Policy"))
			require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"))
			require.NotEmpty(t, rec.Header().Get("ETag"))
			require.Contains(t, rec.Body.String(), tc.contains)
		})
	}
}

func TestInboxAnswersNotModifiedWhileTheBrowsersCopyIsCurrent(t *testing.T) {
	in, err := NewInbox()
	require.NoError(t, err)
	first, _ := serve(t, in, "inbox.js")
	etag := first.Header().Get("ETag")
	for _, tc := range []struct {
		ifNoneMatch string
		want        int
	}{
		{etag, http.StatusNotModified},
		{`"stale", ` + etag, http.StatusNotModified},
		{"W/" + etag, http.StatusNotModified},
		{`"stale"`, http.StatusOK},
	} {
		rec, ok := serve(t, in, "inbox.js", "If-None-Match", tc.ifNoneMatch)
		require.True(t, ok)
		require.Equal(t, tc.want, rec.Code, "If-None-Match %s", tc.ifNoneMatch)
		require.Equal(t, InboxCSP, rec.Header().Get("Content-Security-Policy"))
		if tc.want == http.StatusNotModified {
			require.Empty(t, rec.Body.Bytes())
		}
	}
}

func TestInboxDoesNotServeFilesItDoesNotHold(t *testing.T) {
	in, err := NewInbox()
	require.NoError(t, err)
	for _, name := range []string{"nope.js", "../web.go", "inbox/index.html", "%2e%2e"} {
		_, ok := serve(t, in, name)
		require.False(t, ok, name)
	}
}

// The CSP forbids inline script and style, so the page must have none;
// and data reaches the DOM as text only, so the script must not use the
// APIs that parse HTML or run strings as code. A cheap guard against a
// later edit; the browser tests (internal/e2e) check the behaviour.
func TestInboxFilesHoldNoInlineCodeAndNoHTMLParsingAPIs(t *testing.T) {
	html, err := fs.ReadFile(inboxFiles, "inbox/index.html")
	require.NoError(t, err)
	for _, tag := range regexp.MustCompile(`(?is)<script\b[^>]*>(.*?)</script>`).FindAllStringSubmatch(string(html), -1) {
		require.Contains(t, tag[0], ` src="/inbox/`, "a script is loaded from the page's own files")
		require.Empty(t, strings.TrimSpace(tag[1]), "no inline script")
	}
	require.NotRegexp(t, `(?i)<style\b|\sstyle=|\son[a-z]+=|javascript:`, string(html))

	js, err := fs.ReadFile(inboxFiles, "inbox/inbox.js")
	require.NoError(t, err)
	code := regexp.MustCompile(`(?m)^\s*//.*$`).ReplaceAllString(string(js), "") // comments may name what code must not use
	forbidden := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|\.href\s*=|localStorage|document\.cookie`)
	require.Empty(t, forbidden.FindAllString(code, -1))
}
