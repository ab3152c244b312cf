// Package web holds the engine's browser pages, embedded in the binary:
// plain HTML, CSS and JavaScript with no build step and nothing fetched
// from elsewhere. It is presentation only: a page talks to the API with
// the user's token like any other client, so it imports no domain package
// and the api package serves it.
package web

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed inbox
var inboxFiles embed.FS

// InboxCSP is the inbox's Content-Security-Policy: only its own files run
// or load, nothing inline, and it talks only to its own origin, so data an
// agent put into a tool call cannot run even if it reached the DOM as HTML.
const InboxCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// contentTypes are the types of the files a page may hold; a fixed table,
// not the mime package's, which reads the machine's mime.types.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Inbox serves the approvals inbox: the page at "" (index.html) and its
// assets by file name. Lookups of names it does not hold return ok false.
type Inbox struct {
	assets map[string]asset
}

// NewInbox loads the embedded inbox files.
func NewInbox() (*Inbox, error) {
	in := &Inbox{assets: map[string]asset{}}
	err := fs.WalkDir(inboxFiles, "inbox", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := inboxFiles.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("web: no content type for %s", p)
		}
		sum := sha256.Sum256(body)
		in.assets[strings.TrimPrefix(p, "inbox/")] = asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return in, err
}

// SetHeaders sets the headers every inbox response carries, errors
// included.
func SetHeaders(h http.Header) {
	h.Set("Content-Security-Policy", InboxCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	// The token arrives in the fragment, which browsers never send, but no
	// page URL needs to be told to anyone either.
	h.Set("Referrer-Policy", "no-referrer")
}

// Serve writes the named asset ("" or "index.html" for the page) and
// reports whether it exists. The files change only with the binary, and
// their names carry no version, so a browser revalidates each load
// (no-cache) and gets a 304 from the ETag while it is current.
func (in *Inbox) Serve(w http.ResponseWriter, r *http.Request, name string) bool {
	if name == "" {
		name = "index.html"
	}
	a, ok := in.assets[name]
	if !ok {
		return false
	}
	h := w.Header()
	SetHeaders(h)
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	if match := r.Header.Get("If-None-Match"); match != "" && etagMatches(match, a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return true
	}
	h.Set("Content-Type", a.contentType)
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(a.body)
	}
	return true
}

// etagMatches reports whether an If-None-Match list names etag.
func etagMatches(list, etag string) bool {
	for _, m := range strings.Split(list, ",") {
		m = strings.TrimPrefix(strings.TrimSpace(m), "W/")
		if m == etag || m == "*" {
			return true
		}
	}
	return false
}
