package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
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
	}
	return nil
}

// queryParamsProblem checks every name=value pair of the raw query, the
// ones url.ParseQuery would drop (bad escapes) included.
func queryParamsProblem(rawQuery string) error {
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
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return paramProblem("query", name, "has a malformed %-escape")
		}
		if !isText(value) {
			return paramProblem("query", name, "must be UTF-8 text without NUL characters")
		}
	}
	return nil
}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// paramProblem is a 400 naming a path or query parameter.
func paramProblem(in, name, detail string) *Problem {
	name = strings.ToValidUTF8(name, "\uFFFD")
	p := NewProblem(http.StatusBadRequest, "invalid-request", fmt.Sprintf("invalid %s parameter %q: %s", in, name, detail))
	p.Errors = []apperr.FieldError{{Field: name, Detail: in + " parameter " + detail}}
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
