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
	"strings"

	"github.com/labstack/echo/v4"
)

// bind decodes a JSON request body into dst strictly: unknown fields, wrong
// types, trailing data and malformed JSON are 400 problems naming the field.
// An empty body decodes as {} so that all-optional bodies may be omitted.
func bind(c echo.Context, dst any) error {
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != echo.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
			return NewProblem(http.StatusUnsupportedMediaType, "unsupported-media-type", "the body must be application/json")
		}
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return readError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	return decodeJSON(body, dst)
}

// decodeJSON is bind without the request: strict decoding of body into dst.
func decodeJSON(body []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonProblem(err)
	}
	if dec.More() {
		return NewProblem(http.StatusBadRequest, "invalid-json", "the body holds more than one JSON value")
	}
	return nil
}

func readError(err error) error {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return NewProblem(http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("request body exceeds %d bytes", maxErr.Limit))
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
		return NewProblem(http.StatusBadRequest, "invalid-json", fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return NewProblem(http.StatusBadRequest, "invalid-json", "malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return Invalid(name, "unknown field")
	}
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return readError(err)
	}
	return NewProblem(http.StatusBadRequest, "invalid-json", "malformed JSON: "+err.Error())
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
