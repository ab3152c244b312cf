package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/workpool"
)

// ProblemTypeBase prefixes every problem type URI.
const ProblemTypeBase = "https://reveille.dev/problems/"

// Problem is an RFC 9457 problem detail. It is also an error, so handlers
// return it directly.
type Problem struct {
	Type       string              `json:"type"`
	Title      string              `json:"title"`
	Status     int                 `json:"status"`
	Detail     string              `json:"detail,omitempty"`
	Instance   string              `json:"instance,omitempty"`
	Errors     []apperr.FieldError `json:"errors,omitempty"`
	Extensions map[string]any      `json:"-"`
	// retryAfter, when set, is sent as the Retry-After header (seconds).
	retryAfter int
}

func (p *Problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail) }

// MarshalJSON flattens the extensions (approval_id, wakeup_id, …) into the
// top-level object, as RFC 9457 asks.
func (p *Problem) MarshalJSON() ([]byte, error) {
	type plain Problem
	base, err := json.Marshal((*plain)(p))
	if err != nil || len(p.Extensions) == 0 {
		return base, err
	}
	ext, err := json.Marshal(p.Extensions)
	if err != nil {
		return nil, err
	}
	return append(append(base[:len(base)-1], ','), ext[1:]...), nil
}

// NewProblem builds a problem of the given status; kind is the last segment
// of its type URI.
func NewProblem(status int, kind, detail string) *Problem {
	return &Problem{Type: ProblemTypeBase + kind, Title: http.StatusText(status), Status: status, Detail: detail}
}

// With adds an extension member.
func (p *Problem) With(key string, value any) *Problem {
	if p.Extensions == nil {
		p.Extensions = map[string]any{}
	}
	p.Extensions[key] = value
	return p
}

// Invalid is a 400 naming one field.
func Invalid(field, detail string) *Problem {
	return invalidFields([]apperr.FieldError{{Field: field, Detail: detail}})
}

// invalidFields is a 400 naming every field with its own detail (the
// detail text too: one message for several fields would claim the first
// field's reason for all of them).
func invalidFields(fields []apperr.FieldError) *Problem {
	// (at most maxEchoedFields of them: an args object of 10,000 unknown
	// keys, 100 KB, was answered 4.6 MB)
	more := 0
	if len(fields) > maxEchoedFields {
		fields, more = fields[:maxEchoedFields], len(fields)-maxEchoedFields
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		// (a path or detail echoing a key of the request is bounded: an
		// unknown key of 70,000 characters came back twice, in a problem
		// past what a client keeps of an error answer, which then lost its
		// type and every field)
		f.Field, f.Detail = boundEcho(f.Field, maxEchoedField), boundEcho(f.Detail, maxEchoedDetail)
		fields[i] = f
		parts[i] = f.Field + ": " + f.Detail
	}
	detail := "invalid " + strings.Join(parts, "; ")
	if more > 0 {
		detail += fmt.Sprintf("; and %d more", more)
	}
	p := NewProblem(http.StatusBadRequest, "invalid-request", detail)
	p.Errors = fields
	return p
}

// The most of a field's path, and of its detail, a problem echoes; what
// is longer ends in "…".
const (
	maxEchoedField  = 256
	maxEchoedDetail = 1024
)

// maxEchoedFields is the most fields one problem names; a detail says how
// many more there were.
const maxEchoedFields = 100

// boundEcho is s cut to at most limit bytes (on a rune boundary, "…"
// marking the cut).
func boundEcho(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return prefixOf(s, limit-len("…")) + "…"
}

// unsupportedMediaType is a 415 naming the Content-Type header, as a 400
// names its field: the body was sent as a media type the operation does
// not take.
func unsupportedMediaType(detail string) *Problem {
	p := NewProblem(http.StatusUnsupportedMediaType, "unsupported-media-type", detail)
	p.Errors = []apperr.FieldError{{Field: echo.HeaderContentType, Detail: detail}}
	return p
}

// pendingRetryAfterSeconds is the Retry-After of a refusal for too much
// pending work: room comes back only as the org's work in the pool
// finishes, and the pool counts a refused org again at most once a second,
// so an earlier retry would mostly be refused again; a few seconds is still
// short next to how long a queue that deep takes to drain.
const pendingRetryAfterSeconds = 5

// unavailableRetryAfterSeconds is the Retry-After of a 503 for a
// database out of reach: a restart or a failover takes seconds.
const unavailableRetryAfterSeconds = 5

// stoppingRetryAfterSeconds is the Retry-After of a 503 for a live stream
// asked of a replica that is starting or stopping: another replica, or
// this one a moment later, serves it.
const stoppingRetryAfterSeconds = 1

// stoppingProblem is the 503 of a live stream (what) asked while the
// server starts or stops.
func stoppingProblem(what string) *Problem {
	p := NewProblem(http.StatusServiceUnavailable, "unavailable", what+" unavailable while the server starts or stops; retry")
	p.retryAfter = stoppingRetryAfterSeconds
	return p
}

// databaseUnavailable reports whether err is Postgres out of reach rather
// than a statement that failed: no connection could be made (or one
// broke), or the server is shutting down or starting (SQLSTATE classes
// 08 and 57P). A client should retry those — with its Idempotency-Key, as
// a request cut off mid-commit may have taken effect — where a 500 reads
// as a bug.
func databaseUnavailable(err error) bool {
	var connect *pgconn.ConnectError
	var netErr *net.OpError
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &connect), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, pgconn.ErrConnClosed):
		// a pooled connection the server (or the network) closed: what the
		// first requests after a restart or a failover meet
		return true
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return false
}

// problemFor maps any error a handler returns to a problem.
func problemFor(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	var invalid *apperr.InvalidError
	if errors.As(err, &invalid) && len(invalid.Fields) > 0 {
		return invalidFields(invalid.Fields)
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return echoProblem(he)
	}
	switch {
	case databaseUnavailable(err):
		p := NewProblem(http.StatusServiceUnavailable, "unavailable",
			"the database cannot be reached; nothing was done that did not commit: retry shortly")
		p.retryAfter = unavailableRetryAfterSeconds
		return p
	case errors.Is(err, workpool.ErrTooManyPending):
		p := NewProblem(http.StatusTooManyRequests, "too-many-pending", err.Error())
		p.retryAfter = pendingRetryAfterSeconds
		return p
	case errors.Is(err, apperr.ErrNotFound):
		return NewProblem(http.StatusNotFound, "not-found", err.Error())
	case errors.Is(err, apperr.ErrConflict):
		return NewProblem(http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, apperr.ErrForbidden):
		return NewProblem(http.StatusForbidden, "forbidden", err.Error())
	}
	return NewProblem(http.StatusInternalServerError, "internal", "internal error; the request id in the X-Request-Id header identifies it in the logs")
}

func echoProblem(he *echo.HTTPError) *Problem {
	detail := http.StatusText(he.Code)
	if msg, ok := he.Message.(string); ok && msg != "" {
		detail = msg
	}
	switch he.Code {
	case http.StatusNotFound:
		return NewProblem(he.Code, "not-found", "no such route")
	case http.StatusMethodNotAllowed:
		return NewProblem(he.Code, "method-not-allowed", "method not allowed on this route")
	case http.StatusRequestEntityTooLarge:
		return tooLargeProblem("body-too-large", "body", "request body exceeds the limit")
	case http.StatusUnsupportedMediaType:
		return unsupportedMediaType(detail)
	}
	return NewProblem(he.Code, strings.ReplaceAll(strings.ToLower(http.StatusText(he.Code)), " ", "-"), detail)
}

// statusClientClosedRequest is nginx's 499, "client closed request": what
// the access log and reveille_http_requests_total record for a request
// whose client went away before it was answered. No client sees it, so
// the OpenAPI document declares it nowhere.
const statusClientClosedRequest = 499

// clientClosed reports whether err is the request's own cancellation: the
// client hung up (net/http cancels the request's context then), and what
// failed was only waiting for it. A context.Canceled while the request's
// context is live is some other context's, a genuine failure.
func clientClosed(c echo.Context, err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(c.Request().Context().Err(), context.Canceled)
}

// errorHandler writes every error as application/problem+json, and logs
// server errors with the request id. A client that went away gets no
// problem body, only the status 499 (a client that still reads — one that
// closed only its sending side — sees that rather than an empty 200), and
// its error is logged at debug: nothing failed on the server's side.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if clientClosed(c, err) {
		s.logger.DebugContext(c.Request().Context(), "client closed the request", "error", err.Error(),
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "path", c.Request().URL.Path)
		c.Response().WriteHeader(statusClientClosedRequest)
		return
	}
	p := problemFor(err)
	if p.Status == http.StatusServiceUnavailable {
		// (an outage is the operator's already, from /readyz: one line
		// per refused request at WARN, not a page of ERRORs)
		msg := "request refused: the database cannot be reached"
		if !databaseUnavailable(err) {
			msg = "request refused: " + p.Detail
		}
		s.logger.WarnContext(c.Request().Context(), msg, "error", err.Error(),
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "path", c.Request().URL.Path)
	} else if p.Status >= 500 {
		s.logger.ErrorContext(c.Request().Context(), "request failed", "error", err.Error(),
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "path", c.Request().URL.Path)
	}
	writeProblem(c, p)
}

func writeProblem(c echo.Context, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		body = []byte(`{"type":"` + ProblemTypeBase + `internal","title":"Internal Server Error","status":500}`)
	}
	if p.retryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(p.Status)
		return
	}
	_ = c.Blob(p.Status, "application/problem+json", body)
}
