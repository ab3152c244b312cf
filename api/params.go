package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/page"
)

// checkParams refuses a request whose path parameters, query parameter
// names or values, or Idempotency-Key are not UTF-8 text without NUL: a
// 400 naming the parameter. Postgres text can hold neither, so such a value used to reach
// a query and fail it (500); and no object can be named by one.
func checkParams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := pathParamsProblem(c); err != nil {
			return err
		}
		if err := queryParamsProblem(c.Request().URL.RawQuery); err != nil {
			return err
		}
		// The one header stored as text (net/http refuses NUL in headers,
		// not bytes that are not UTF-8).
		if !isText(IdempotencyKey(c)) {
			return paramProblem("header", "Idempotency-Key", "must be UTF-8 text without NUL characters")
		}
		// (the first of two would be the key, and a proxy may keep the other)
		if len(c.Request().Header.Values("Idempotency-Key")) > 1 {
			return paramProblem("header", "Idempotency-Key", "must be given once")
		}
		if err := contentEncodingProblem(c.Request()); err != nil {
			return err
		}
		return next(c)
	}
}

// pathParamsProblem checks the route's parameters. Echo routes on the
// escaped path when the URL has one, and its parameters are then escaped.
func pathParamsProblem(c echo.Context) error {
	escaped := c.Request().URL.RawPath != ""
	for i, name := range c.ParamNames() {
		v := c.ParamValues()[i]
		if escaped {
			var err error
			if v, err = url.PathUnescape(v); err != nil {
				return paramProblem("path", name, "is not a valid escaped path segment")
			}
		}
		if !isText(v) {
			return paramProblem("path", name, "must be UTF-8 text without NUL characters")
		}
		if isDotSegment(v) {
			return paramProblem("path", name, dotSegmentDetail)
		}
	}
	return nil
}

// isDotSegment reports whether v is "." or "..": URL clients (browsers,
// fetch, URL libraries, curl) remove such a segment, percent-encoded or
// not, so that no route taking it as an id (a session, an agent, a tool, a
// run, a stream) could be reached by the URL that names it — a session
// ".." took tool calls the inbox page could never answer.
func isDotSegment(v string) bool { return v == "." || v == ".." }

// dotSegmentDetail is the problem of a "." or ".." id.
const dotSegmentDetail = `must not be "." or ".." (URL clients remove them as path segments)`

// queryParamsProblem checks every name=value pair of the raw query, the
// ones url.ParseQuery would drop (bad escapes) included. A parameter given
// twice is refused: every one takes a single value, and the first was read
// while the client may have meant either (or both: ?status=a&status=b).
func queryParamsProblem(rawQuery string) error {
	var seen map[string]bool
	for pair := range strings.SplitSeq(rawQuery, "&") {
		if pair == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return paramProblem("query", rawName, "has a malformed %-escape in its name")
		}
		if !isText(name) {
			return paramProblem("query", name, "must have a UTF-8 name without NUL characters")
		}
		// (url.ParseQuery, and so c.QueryParam, drops a pair holding a raw
		// ";": the filter or limit it sets would be silently ignored)
		if strings.Contains(pair, ";") {
			return paramProblem("query", name, `holds a raw ";", which is not a separator: escape it as %3B`)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return paramProblem("query", name, "has a malformed %-escape")
		}
		if !isText(value) {
			return paramProblem("query", name, "must be UTF-8 text without NUL characters")
		}
		if value == "" && notEmptyQueryParams[name] {
			return paramProblem("query", name, "must not be empty: leave the parameter out for its default")
		}
		if seen[name] {
			return paramProblem("query", name, "is given more than once: it takes one value")
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[name] = true
	}
	return nil
}

// notEmptyQueryParams are the query parameters the document types as an
// integer or an enum, of which "" is no value (?limit=, ?status=): a 400,
// rather than read as absent — a filter a client meant to set and sent
// empty would list everything. (TestEmptyQueryValuesAreRefusedWhereTheDocumentTypesThem
// keeps this set equal to the document's.) The string parameters (cursor,
// agent_id, …) take "" as absent, as the document allows.
var notEmptyQueryParams = map[string]bool{"after": true, "delivery": true, "limit": true, "order": true, "start_index": true, "status": true}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// paramProblem is a 400 naming a path or query parameter.
func paramProblem(in, name, detail string) *Problem {
	name = boundEcho(strings.ToValidUTF8(name, "\uFFFD"), maxEchoedField)
	p := NewProblem(http.StatusBadRequest, "invalid-request", fmt.Sprintf("invalid %s parameter %q: %s", in, name, boundEcho(detail, maxEchoedDetail)))
	p.Errors = []apperr.FieldError{{Field: name, Detail: boundEcho(in+" parameter "+detail, maxEchoedDetail)}}
	return p
}

// pathParam returns a path parameter unescaped (echo routes on the escaped
// path when the URL has one, and its parameters are then still escaped).
func pathParam(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if c.Request().URL.RawPath != "" {
		var err error
		if v, err = url.PathUnescape(v); err != nil {
			return "", Invalid(name, "is not a valid escaped path segment")
		}
	}
	return v, nil
}

// parseUUID reads an id as the API writes it: 36 characters, hex digits
// in 8-4-4-4-12 groups (either case). uuid.Parse also takes braces,
// "urn:uuid:" and the hex alone, which made one object answer to several
// paths (and an Idempotency-Key record, kept per path, be kept for each).
func parseUUID(s string) (uuid.UUID, error) {
	if len(s) != 36 {
		return uuid.Nil, fmt.Errorf("%q is not a UUID in its 36-character form", s)
	}
	return uuid.Parse(s)
}

// contentEncodingProblem refuses a body sent compressed (RFC 9110 §8.4:
// 415): no route decodes one, and a gzipped JSON body read as sent was
// "not UTF-8", a gzipped stream chunk stored compressed.
func contentEncodingProblem(r *http.Request) error {
	enc := strings.TrimSpace(r.Header.Get("Content-Encoding"))
	// (an operation that takes no body was given none by limitBody, whatever
	// was sent: there is nothing to decode, so nothing to refuse)
	if enc == "" || strings.EqualFold(enc, "identity") || r.ContentLength == 0 || r.Body == http.NoBody {
		return nil
	}
	p := NewProblem(http.StatusUnsupportedMediaType, "unsupported-media-type",
		fmt.Sprintf("request bodies are not decoded: send it uncompressed, without Content-Encoding (got %q)", enc))
	p.Errors = []apperr.FieldError{{Field: "Content-Encoding", Detail: "must be absent or identity"}}
	return p
}

// listLimit parses ?limit= as every list does (default
// page.DefaultLimit, 1 to page.MaxLimit).
func listLimit(c echo.Context) (int, error) {
	raw := c.QueryParam("limit")
	if raw == "" {
		return page.DefaultLimit, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > page.MaxLimit {
		return 0, Invalid("limit", fmt.Sprintf("must be an integer from 1 to %d", page.MaxLimit))
	}
	return n, nil
}

// namePage is one page of a list the API holds whole (pools, an org's
// webhooks), in name order: ?limit= as every list, ?cursor= the
// next_cursor of the page before — the last name it held, base64url, so
// that any name makes a cursor safe in a query.
func namePage[T any](c echo.Context, items []T, name func(T) string) (pageItems []T, next *string, err error) {
	limit, err := listLimit(c)
	if err != nil {
		return nil, nil, err
	}
	items = slices.SortedFunc(slices.Values(items), func(a, b T) int { return strings.Compare(name(a), name(b)) })
	if raw := c.QueryParam("cursor"); raw != "" {
		// (no name holds bytes that are not UTF-8 or a control character:
		// such a cursor was not returned by the list)
		after, err := base64.RawURLEncoding.DecodeString(raw)
		if err != nil || len(after) == 0 || !utf8.Valid(after) || strings.ContainsFunc(string(after), unicode.IsControl) {
			return nil, nil, Invalid("cursor", "is not a cursor this list returned")
		}
		// (names are unique: the page starts after the one named, or where it would be)
		i, found := slices.BinarySearchFunc(items, string(after), func(it T, n string) int { return strings.Compare(name(it), n) })
		if found {
			i++
		}
		items = items[i:]
	}
	if len(items) > limit {
		cursor := base64.RawURLEncoding.EncodeToString([]byte(name(items[limit-1])))
		return items[:limit], &cursor, nil
	}
	return items, nil, nil
}
