package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
)

// bind decodes a JSON request body into dst strictly: unknown fields, wrong
// types, trailing data and malformed JSON are 400 problems naming the field.
// An empty body decodes as {} so that all-optional bodies may be omitted.
func bind(c echo.Context, dst any) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	return decodeJSON(body, dst)
}

// bindBody reads a JSON request body and hands it to decode, which decodes
// and validates it without the request: the fuzz targets call the same
// decoders.
func bindBody[T any](c echo.Context, decode func(body []byte) (T, error)) (T, error) {
	body, err := readJSONBody(c)
	if err != nil {
		var zero T
		return zero, err
	}
	return decode(body)
}

// readJSONBody checks the media type and reads the body ("{}" when empty).
func readJSONBody(c echo.Context) ([]byte, error) {
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != echo.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
			return nil, NewProblem(http.StatusUnsupportedMediaType, "unsupported-media-type", "the body must be application/json")
		}
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return nil, readError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	return body, nil
}

// decodeJSON is bind without the request: strict decoding of body into dst.
// The body must be UTF-8 (RFC 8259) and hold nothing Postgres cannot store
// (unstorableJSON): a field kept as raw JSON (args) would otherwise reach
// the database unchecked.
func decodeJSON(body []byte, dst any) error {
	if !utf8.Valid(body) {
		return invalidJSON(fmt.Sprintf("the body is not UTF-8 (byte %d)", invalidUTF8At(body)))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonProblem(err)
	}
	if dec.More() {
		return invalidJSON("the body holds more than one JSON value")
	}
	if field, detail, found := unstorableJSON(body); found {
		return Invalid(field, detail)
	}
	return nil
}

// invalidJSON is a 400 for a body that is not the JSON asked for as a
// whole: the field it names is "body".
func invalidJSON(detail string) *Problem {
	p := NewProblem(http.StatusBadRequest, "invalid-json", detail)
	p.Errors = []apperr.FieldError{{Field: "body", Detail: detail}}
	return p
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}

func readError(err error) error {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return tooLargeProblem("body-too-large", "body", fmt.Sprintf("request body exceeds %d bytes", maxErr.Limit))
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return he
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return NewProblem(http.StatusRequestTimeout, "request-timeout", "the request body was not sent within the server's read timeout")
	}
	return NewProblem(http.StatusBadRequest, "unreadable-body", "could not read the request body")
}

func jsonProblem(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return Invalid("body", "must be a JSON object")
		}
		return Invalid(field, fmt.Sprintf("must be %s, not %s", jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value))
	case errors.As(err, &syntaxErr):
		return invalidJSON(fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidJSON("malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		quoted := strings.TrimPrefix(err.Error(), "json: unknown field ")
		name, uerr := strconv.Unquote(quoted)
		if uerr != nil || name == "" {
			return Invalid("body", "has an unknown field "+quoted)
		}
		return Invalid(name, "unknown field")
	}
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return readError(err)
	}
	return invalidJSON("malformed JSON: " + err.Error())
}

func jsonTypeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer in range"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return "a valid value"
}
