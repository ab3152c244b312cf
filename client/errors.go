package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProblemTypeBase prefixes the type URI of every problem the API returns.
const ProblemTypeBase = "https://reveille.dev/problems/"

// Error is a non-2xx answer: the API's RFC 9457 problem (or, from
// something in front of the API, whatever came back). Get it with
// errors.As:
//
//	var apiErr *client.Error
//	if errors.As(err, &apiErr) && apiErr.Status == http.StatusPaymentRequired {
//		log.Printf("refused; approval %s", apiErr.ApprovalID)
//	}
type Error struct {
	// Status is the HTTP status.
	Status int `json:"status"`
	// Type is the problem's type URI; Kind is its last segment
	// ("spend-refused", "not-found", "invalid-request", …).
	Type  string `json:"type"`
	Title string `json:"title"`
	// Detail says what went wrong in words.
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors names the offending fields of a 400 or 413, and the
	// Content-Type header of a 415.
	Errors []FieldError `json:"errors,omitempty"`

	// The extension members the API sets: ApprovalID and Refusal on a
	// refused spend or wake-up (402; a retried wake-up's Refusal may say
	// how its approval request was settled: "approval denied", "approval
	// expired", "approval canceled"), WakeupID on a refused wake-up, WorkID
	// on a 409 for purged work.
	ApprovalID string `json:"approval_id,omitempty"`
	WakeupID   string `json:"wakeup_id,omitempty"`
	Refusal    string `json:"refusal,omitempty"`
	WorkID     string `json:"work_id,omitempty"`
	// Extensions holds every member beyond type, title, status, detail,
	// instance and errors (the ones above included), undecoded.
	Extensions map[string]json.RawMessage `json:"-"`

	// RetryAfter is the answer's Retry-After (429, 503), 0 when absent.
	RetryAfter time.Duration `json:"-"`
	// RequestID is the X-Request-Id header, which names the request in
	// the server's logs.
	RequestID string `json:"-"`
	// Body is the raw answer (at most 1 MiB of it); an answer cut before
	// its end is never an *Error, but a lost answer (see MaybeAppliedError).
	Body []byte `json:"-"`
}

// FieldError names one offending field: a dotted JSON path
// ("work.handler", "chunks[2].data_base64") or a parameter name.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reveille: %d %s", e.Status, cmpOr(e.Title, http.StatusText(e.Status)))
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if e.RequestID != "" {
		b.WriteString(" (request " + e.RequestID + ")")
	}
	return b.String()
}

// Kind is the last segment of the problem's type URI, e.g. "spend-refused".
func (e *Error) Kind() string {
	if i := strings.LastIndexByte(e.Type, '/'); i >= 0 {
		return e.Type[i+1:]
	}
	return e.Type
}

// Field returns the detail for the named field, and whether the error
// names it.
func (e *Error) Field(name string) (string, bool) {
	for _, f := range e.Errors {
		if f.Field == name {
			return f.Detail, true
		}
	}
	return "", false
}

// retryable reports whether the answer says a later attempt may succeed:
// 408, 429, a 5xx, or a 409 for a duplicate still in flight under the same
// Idempotency-Key.
func (e *Error) retryable() bool {
	switch {
	case e.Status == http.StatusRequestTimeout, e.Status == http.StatusTooManyRequests:
		return true
	case e.Status == http.StatusConflict:
		return e.Kind() == "idempotency-key-in-flight"
	case e.Status == http.StatusNotImplemented, e.Status == http.StatusHTTPVersionNotSupported:
		return false
	}
	return e.Status >= 500
}

// answeredForKey reports whether a keyed attempt's error answer is the
// server's answer for its Idempotency-Key — the one it replays to every
// retry under the key, which settles whether an earlier attempt whose
// answer was lost acted: a replay (Idempotent-Replayed), or a status the
// API keeps under the key. Not the statuses it never keeps, answered
// before the key is looked at or refusing a malformed request (401 and 403
// from the token's check — a retry's token may have expired or rotated
// since the attempt that acted —, 429, 400, 413, 415), nor a retryable
// answer or any 5xx: after those an earlier attempt may still have acted.
// After a success answered for the key (succeeded: one cut inside its
// body), only its replay is: the key's kept answer is that success.
func answeredForKey(res *http.Response, e *Error, succeeded bool) bool {
	if res.Header.Get("Idempotent-Replayed") == "true" {
		return true
	}
	if succeeded {
		return false
	}
	switch e.Status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusTooManyRequests:
		return false
	}
	return !e.retryable() && e.Status < 500
}

// maxErrorBody bounds what is kept of an error answer's body: room for
// any problem Reveille answers (one cut short loses its type and fields).
const maxErrorBody = 1 << 20

// errorFrom reads a non-2xx response into an *Error, and closes its body.
// It fails when the body could not be read whole (the connection was cut
// inside it): the answer was lost — its approval_id or wakeup_id with it —
// and must not pass for the server's answer.
func errorFrom(res *http.Response) (*Error, error) {
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	if err == nil {
		// (the rest, if any, is not kept; reading it lets the connection be
		// reused, and shows a cut there too)
		_, err = io.Copy(io.Discard, io.LimitReader(res.Body, maxErrorBody))
	}
	if err != nil {
		return nil, err
	}
	return errorOf(res, raw), nil
}

// errorOf is the *Error of a non-2xx response whose body is raw.
func errorOf(res *http.Response, raw []byte) *Error {
	e := &Error{Status: res.StatusCode, Body: raw, RequestID: res.Header.Get("X-Request-Id"),
		RetryAfter: parseRetryAfter(res.Header.Get("Retry-After"))}
	if isMediaType(res, "application/problem+json") || isMediaType(res, "application/json") {
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) == nil {
			_ = json.Unmarshal(raw, e)
			e.Status = res.StatusCode // the status line is the truth
			for _, std := range []string{"type", "title", "status", "detail", "instance", "errors"} {
				delete(members, std)
			}
			if len(members) > 0 {
				e.Extensions = members
			}
		}
	}
	if e.Title == "" {
		e.Title = http.StatusText(res.StatusCode)
	}
	if e.Type == "" && e.Detail == "" && len(raw) > 0 {
		e.Detail = strings.TrimSpace(string(raw[:min(len(raw), 512)]))
	}
	return e
}

// parseRetryAfter reads delay-seconds or an HTTP date.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// StatusOf is the HTTP status of an *Error in err's chain, 0 when there is
// none (a transport error, a canceled context).
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports a 404: the object is absent, or another org's (or,
// to a token bound to an agent, another agent's).
func IsNotFound(err error) bool { return StatusOf(err) == http.StatusNotFound }

// IsInvalid reports a 400: bad input, with the fields named in Errors.
func IsInvalid(err error) bool { return StatusOf(err) == http.StatusBadRequest }

// IsUnauthorized reports a 401: no token, or a bad or expired one.
func IsUnauthorized(err error) bool { return StatusOf(err) == http.StatusUnauthorized }

// IsForbidden reports a 403: the token lacks the role, or acts for another
// agent.
func IsForbidden(err error) bool { return StatusOf(err) == http.StatusForbidden }

// IsConflict reports a 409: the object's state does not allow the call.
func IsConflict(err error) bool { return StatusOf(err) == http.StatusConflict }

// IsSpendRefused reports a 402: the mandate does not cover the spend or
// wake-up; the *Error's ApprovalID names the approval request created.
func IsSpendRefused(err error) bool { return StatusOf(err) == http.StatusPaymentRequired }

// IsRateLimited reports a 429 (the org's request rate, or its cap of
// unfinished work in a pool); the *Error's RetryAfter says when to retry.
func IsRateLimited(err error) bool { return StatusOf(err) == http.StatusTooManyRequests }

// MaybeAppliedError is a call that failed after one of its attempts reached
// the server and lost its answer, or was answered a 5xx (but 501 and 505):
// the server may have acted on it (a
// wake-up created and spent, a chunk appended), whatever the last
// attempt's error (Err: a refused connection, a 503, a canceled context, a
// 401 or 403 to a retry whose token expired meanwhile, a 429) says; only
// the server's answer for the call's Idempotency-Key (a replay, or a
// status the API keeps under the key, such as a 402 or 409 — after a
// success cut short, a replay only: the key's answer is that success)
// settles it. Retry with the same IdempotencyKey (WithIdempotencyKey) and the
// server acts at most once, answering as it first did. A call safe to
// repeat by nature (Repeatable: a PATCH, a DELETE, a cancel, a stream's
// close) may simply be sent again, key or no key — not a webhook's PUT,
// whose first answer alone carries the secret: retry it under its key. Another call sent
// without a key (IdempotencyKey "", Repeatable false) cannot be retried
// safely — look the object up. errors.As sees through it to Err (an
// *Error, a *net.OpError …).
type MaybeAppliedError struct {
	Method, Path   string
	IdempotencyKey string
	// Repeatable says the call has the same effect however many times it
	// is applied.
	Repeatable bool
	Err        error
}

func (e *MaybeAppliedError) Error() string {
	if e.IdempotencyKey == "" && e.Repeatable {
		return fmt.Sprintf("client: %s %s may have been applied (an answer was lost or was a 5xx); it is safe to repeat: %v",
			e.Method, e.Path, e.Err)
	}
	if e.IdempotencyKey == "" {
		return fmt.Sprintf("client: %s %s may have been applied (an answer was lost or was a 5xx; no Idempotency-Key, so do not repeat it blindly): %v",
			e.Method, e.Path, e.Err)
	}
	return fmt.Sprintf("client: %s %s may have been applied (an answer was lost or was a 5xx); retry with Idempotency-Key %s to apply it at most once: %v",
		e.Method, e.Path, e.IdempotencyKey, e.Err)
}

func (e *MaybeAppliedError) Unwrap() error { return e.Err }
