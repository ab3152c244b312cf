package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"
)

// The contract check: every request and response that passes through a test
// server (newTestServer) is checked against the OpenAPI document, so the
// document cannot drift from what the server does without a test failing.
//
//   - A response whose status the operation does not declare fails, as does
//     a body the declared response does not describe: a JSON body that does
//     not match its schema, a body of an undeclared media type, or any body
//     where the response declares none.
//   - A response may carry no field the document does not declare: it is
//     checked against the document with every object that lists its
//     properties, and says nothing of others, closed to others
//     (contractResponseDocument). A client generated from the document
//     would not see such a field.
//   - Only JSON bodies are checked against a schema. Others (the SSE stream,
//     text/event-stream; /metrics) are checked for their status and media
//     type only.
//   - A request is checked only when the server accepted it (2xx): tests send
//     bad requests on purpose, and a 4xx says the server refused them. An
//     accepted request the document calls invalid means the document is
//     stricter than the server, and fails.
//   - Routes the document does not have (the tests' own /v1/test/… routes,
//     404s, 405s) are not checked here; TestOpenAPIDocumentMatchesTheRoutes
//     keeps the document's routes equal to the server's.
//   - A 499 is not checked: it is the status recorded for a request whose
//     client went away before its answer (errorHandler), which no client
//     sees, so the document rightly declares it nowhere.

// contractDocument loads the merged document once per test process.
var contractDocument = sync.OnceValues(func() (*openapi3.T, error) {
	raw, err := OpenAPIDocument()
	if err != nil {
		return nil, err
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("load the OpenAPI document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the OpenAPI document is invalid: %w", err)
	}
	return doc, nil
})

// contractResponseDocument is the document that responses are held to:
// the document as written, with every object schema that lists its
// properties and says nothing of other properties (additionalProperties
// absent) closed to them, so that a field the server sends but the
// document does not declare fails the check. (Requests are held to the
// document as written: where it leaves an object open, the server may
// ignore what it does not know.)
var contractResponseDocument = sync.OnceValues(func() (*openapi3.T, error) {
	raw, err := OpenAPIDocument()
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("load the OpenAPI document: %w", err)
	}
	// Each part of an allOf of several is checked alone, so each stays
	// open: closed, every part would refuse the others' properties (a
	// Problem's extension members, say).
	parts := map[*openapi3.Schema]bool{}
	eachSchema(doc, func(s *openapi3.Schema) {
		if len(s.AllOf) > 1 {
			for _, r := range s.AllOf {
				parts[r.Value] = true
			}
		}
	})
	eachSchema(doc, func(s *openapi3.Schema) {
		if !parts[s] && len(s.Properties) > 0 && s.AdditionalProperties.Has == nil && s.AdditionalProperties.Schema == nil {
			s.AdditionalProperties.Has = openapi3.Ptr(false)
		}
	})
	return doc, nil
})

// eachSchema calls visit once for every schema of doc's components and of
// its operations' responses, and every schema inside them.
func eachSchema(doc *openapi3.T, visit func(*openapi3.Schema)) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(ref *openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		visit(s)
		for _, p := range s.Properties {
			walk(p)
		}
		for _, refs := range []openapi3.SchemaRefs{s.AllOf, s.OneOf, s.AnyOf} {
			for _, r := range refs {
				walk(r)
			}
		}
		walk(s.Items)
		walk(s.AdditionalProperties.Schema)
	}
	for _, ref := range doc.Components.Schemas {
		walk(ref)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, res := range op.Responses.Map() {
				if res.Value != nil {
					for _, media := range res.Value.Content {
						walk(media.Schema)
					}
				}
			}
		}
	}
}

// contractChecker checks exchanges against doc (responses against
// closed, doc's contractResponseDocument) and tells report what does not
// match.
type contractChecker struct {
	doc, closed *openapi3.T
	report      func(format string, args ...any)
}

// newContractChecker is a checker of the real document.
func newContractChecker(report func(format string, args ...any)) (*contractChecker, error) {
	doc, err := contractDocument()
	if err != nil {
		return nil, err
	}
	closed, err := contractResponseDocument()
	if err != nil {
		return nil, err
	}
	return &contractChecker{doc: doc, closed: closed, report: report}, nil
}

// checkContract puts the contract check in front of every route of s for
// the duration of t: a mismatch fails t.
func checkContract(t testing.TB, s *Server) {
	t.Helper()
	// A request still running once the test has finished (an SSE reader the
	// cleanup cuts) must not report: t.Errorf then panics.
	var mu sync.Mutex
	finished := false
	t.Cleanup(func() { mu.Lock(); finished = true; mu.Unlock() })
	checker, err := newContractChecker(func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			t.Errorf(format, args...)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Echo().Use(checker.middleware)
}

// middleware runs innermost of the server's global middleware: it sees the
// route (c.Path()), and every response the route writes or returns.
func (cc *contractChecker) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if req.Method == http.MethodHead {
			return next(c)
		}
		route := cc.route(c)
		if route == nil {
			return next(c)
		}
		// The handler reads the body as it pleases; a copy is kept of what it
		// reads, and of the rest once it is done.
		var reqBody bytes.Buffer
		var body io.ReadCloser
		if req.Body != nil && req.Body != http.NoBody {
			body = req.Body
			req.Body = readCloser{io.TeeReader(body, &reqBody), body}
		}
		rec := &contractRecorder{ResponseWriter: c.Response().Writer}
		c.Response().Writer = rec
		if err := next(c); err != nil {
			c.Error(err) // write the problem now, so that it is checked
		}
		if body != nil {
			_, _ = io.Copy(&reqBody, body)
		}
		cc.check(c, route, reqBody.Bytes(), rec)
		return nil
	}
}

// route finds the documented operation the request was routed to.
func (cc *contractChecker) route(c echo.Context) *routers.Route {
	if c.Path() == "" {
		return nil
	}
	path := echoParam.ReplaceAllString(c.Path(), "{$1}")
	item := cc.doc.Paths.Value(path)
	if item == nil {
		return nil
	}
	op := item.GetOperation(c.Request().Method)
	if op == nil {
		return nil
	}
	return &routers.Route{Spec: cc.doc, Path: path, PathItem: item, Method: c.Request().Method, Operation: op}
}

func (cc *contractChecker) check(c echo.Context, route *routers.Route, reqBody []byte, rec *contractRecorder) {
	req := c.Request()
	res := c.Response()
	if res.Status == statusClientClosedRequest || rec.cut {
		// No client was there to read it (or it stopped reading, and the
		// write timeout cut it off): nothing to hold to the document.
		return
	}
	where := fmt.Sprintf("contract: %s %s → %d", req.Method, req.URL.RequestURI(), res.Status)
	params := map[string]string{}
	for i, name := range c.ParamNames() {
		params[name] = c.ParamValues()[i]
	}
	reqInput := &openapi3filter.RequestValidationInput{
		Request: req.Clone(context.Background()), PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, SkipSettingDefaults: true},
	}
	reqInput.Request.Body = io.NopCloser(bytes.NewReader(reqBody))
	// A JSON body is taken under any +json type or without a Content-Type
	// (components/responses/UnsupportedMediaType), which OpenAPI 3.0 cannot
	// list: such a body is held to the operation's application/json schema.
	if rb := route.Operation.RequestBody; rb != nil && rb.Value != nil && rb.Value.Content.Get(echo.MIMEApplicationJSON) != nil {
		mt, _, _ := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
		if strings.HasSuffix(mt, "+json") || mt == "" && len(reqBody) > 0 {
			reqInput.Request.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
		}
	}
	if res.Status >= 200 && res.Status < 300 {
		if err := openapi3filter.ValidateRequest(context.Background(), reqInput); err != nil {
			cc.report("%s: the server accepted a request the document calls invalid (body %s): %v", where, clip(reqBody), err)
		}
	}

	mediaType := ""
	if ct := res.Header().Get(echo.HeaderContentType); ct != "" {
		mediaType, _, _ = mime.ParseMediaType(ct)
	}
	isJSON := mediaType == echo.MIMEApplicationJSON || strings.HasSuffix(mediaType, "+json")
	declared := route.Operation.Responses.Status(res.Status)
	if declared == nil || declared.Value == nil {
		cc.report("%s: the document declares no %d for this operation (body %s)", where, res.Status, clip(rec.body.Bytes()))
		return
	}
	if len(declared.Value.Content) == 0 {
		if rec.written > 0 {
			cc.report("%s: the document declares no body for this response, the server sent %s: %s", where, mediaType, clip(rec.body.Bytes()))
		}
		return
	}
	if rec.written == 0 && res.Status == http.StatusNoContent {
		return
	}
	if declared.Value.Content.Get(mediaType) == nil {
		cc.report("%s: the document declares no %q body for this response (it declares %v)", where, mediaType, mediaTypes(declared.Value.Content))
		return
	}
	if !isJSON {
		return // the stream and other non-JSON bodies: status and media type only
	}
	closedInput := *reqInput
	closedInput.Route = cc.closedRoute(route)
	resInput := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &closedInput, Status: res.Status, Header: res.Header(),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	resInput.SetBodyBytes(rec.body.Bytes())
	if err := openapi3filter.ValidateResponse(context.Background(), resInput); err != nil {
		cc.report("%s: the response does not match the document (body %s): %v", where, clip(rec.body.Bytes()), err)
	}
}

// closedRoute is route in the closed document.
func (cc *contractChecker) closedRoute(route *routers.Route) *routers.Route {
	item := cc.closed.Paths.Value(route.Path)
	return &routers.Route{Spec: cc.closed, Path: route.Path, PathItem: item, Method: route.Method, Operation: item.GetOperation(route.Method)}
}

func mediaTypes(content openapi3.Content) []string {
	var out []string
	for mt := range content {
		out = append(out, mt)
	}
	return out
}

func clip(b []byte) string {
	const most = 2000
	if len(b) > most {
		return string(b[:most]) + "…"
	}
	return string(b)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// contractRecorder keeps a copy of a JSON response body (an SSE stream is
// only counted: it may be long and is not checked against a schema).
type contractRecorder struct {
	http.ResponseWriter
	body    bytes.Buffer
	written int
	cut     bool // a write failed: the client left or stopped reading
}

func (r *contractRecorder) Write(b []byte) (int, error) {
	r.written += len(b)
	if mt, _, _ := mime.ParseMediaType(r.Header().Get(echo.HeaderContentType)); mt == echo.MIMEApplicationJSON || strings.HasSuffix(mt, "+json") {
		r.body.Write(b)
	}
	n, err := r.ResponseWriter.Write(b)
	r.cut = r.cut || err != nil && !errors.Is(err, http.ErrBodyNotAllowed)
	return n, err
}

func (r *contractRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *contractRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// The check fails a test for each way a server can break the document, and
// for none of the ways it keeps it. The handlers stand in for a server that
// drifted; the document is the real one.
func TestContractCheckFailsOnWhatTheDocumentDoesNotDeclare(t *testing.T) {
	problem := func(status int) echo.HandlerFunc {
		return func(echo.Context) error { return NewProblem(status, "test", "test") }
	}
	sendJSON := func(status int, body string) echo.HandlerFunc {
		return func(c echo.Context) error { return c.JSONBlob(status, []byte(body)) }
	}
	const whoami = `{"org_id":"o","sub":"s","roles":["admin"]}`
	const mandate = `{"id":"01a232ee-050a-7608-9b8b-8772cce274e5","agent_id":"a","scope":"s","budget":1,"spent":0,"remaining":1,` +
		`"status":"active","valid_until":null,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}`
	const wakeup = `{"id":"01a232ee-050a-7608-9b8b-8772cce274e5","agent_id":"a","workflow_id":"o/wf","run_id":null,"signal":"wake",` +
		`"scope":"s","cost":1,"pool":"wakeup","status":"pending","outcome":null,"approval":null,` +
		`"delivery":{"state":"waiting","attempts":0},"work_id":null,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}`
	cases := []struct {
		name    string
		method  string
		route   string // as echo registers it
		path    string
		body    string
		handler echo.HandlerFunc
		fails   string // a phrase of the report; "" for none
	}{
		{name: "a declared status with a matching body passes", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: sendJSON(200, whoami)},
		{name: "a declared problem passes", method: "GET", route: "/v1/whoami", path: "/v1/whoami", handler: problem(401)},
		{name: "an undeclared status fails", method: "GET", route: "/v1/whoami", path: "/v1/whoami", handler: problem(418),
			fails: "declares no 418"},
		{name: "a field of the wrong type fails", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: sendJSON(200, `{"org_id":1,"sub":"s","roles":[]}`), fails: "does not match"},
		{name: "a missing required field fails", method: "GET", route: "/v1/wakeups/:id", path: "/v1/wakeups/01a232ee-050a-7608-9b8b-8772cce274e5",
			handler: sendJSON(200, strings.Replace(wakeup, `"outcome":null,`, "", 1)), fails: "does not match"},
		{name: "a null outcome passes", method: "GET", route: "/v1/wakeups/:id", path: "/v1/wakeups/01a232ee-050a-7608-9b8b-8772cce274e5",
			handler: sendJSON(200, wakeup)},
		{name: "an outcome outside the enum fails", method: "GET", route: "/v1/wakeups/:id", path: "/v1/wakeups/01a232ee-050a-7608-9b8b-8772cce274e5",
			handler: sendJSON(200, strings.Replace(wakeup, `"outcome":null`, `"outcome":"exploded"`, 1)), fails: "does not match"},
		{name: "a 402 without wakeup_id fails", method: "POST", route: "/v1/wakeups", path: "/v1/wakeups",
			handler: func(echo.Context) error {
				return NewProblem(402, "spend-refused", "refused").With("approval_id", "01a232ee-050a-7608-9b8b-8772cce274e5").With("refusal", "insufficient")
			}, fails: "does not match"},
		{name: "a field the document does not declare fails", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: sendJSON(200, strings.Replace(whoami, `{`, `{"secret":"s",`, 1)), fails: "does not match"},
		{name: "an undeclared field in a nested object fails", method: "GET", route: "/v1/wakeups/:id", path: "/v1/wakeups/01a232ee-050a-7608-9b8b-8772cce274e5",
			handler: sendJSON(200, strings.Replace(wakeup, `"attempts":0`, `"attempts":0,"secret":"s"`, 1)), fails: "does not match"},
		{name: "a problem's extension members pass", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: func(echo.Context) error { return NewProblem(401, "test", "test").With("hint", "renew the token") }},
		{name: "a 402 with its members passes", method: "POST", route: "/v1/wakeups", path: "/v1/wakeups",
			handler: func(echo.Context) error {
				return NewProblem(402, "spend-refused", "refused").With("approval_id", "01a232ee-050a-7608-9b8b-8772cce274e5").
					With("wakeup_id", "01a232ee-050a-7608-9b8b-8772cce274e5").With("refusal", "insufficient")
			}},
		{name: "an undeclared media type fails", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: func(c echo.Context) error { return c.String(200, "hello") }, fails: `no "text/plain" body`},
		{name: "a body where none is declared fails", method: "POST", route: "/v1/runs/:run_id/streams/:name/close", path: "/v1/runs/r/streams/n/close",
			handler: sendJSON(204, `{}`), fails: "declares no body"},
		{name: "an event stream is checked for its status and media type only", method: "GET", route: "/v1/runs/:run_id/streams/:name/sse",
			path: "/v1/runs/r/streams/n/sse", handler: func(c echo.Context) error {
				c.Response().Header().Set(echo.HeaderContentType, "text/event-stream")
				return c.String(200, "id: 0\ndata: aGk=\n\n")
			}},
		{name: "an accepted request the document refuses fails", method: "POST", route: "/v1/mandates", path: "/v1/mandates",
			body: `{"agent_id":"a","budget":"lots"}`, handler: sendJSON(201, mandate), fails: "accepted a request"},
		{name: "a refused invalid request passes", method: "POST", route: "/v1/mandates", path: "/v1/mandates",
			body: `{"agent_id":"a","budget":"lots"}`, handler: problem(400)},
		{name: "a route the document does not have is not checked", method: "GET", route: "/v1/test/undocumented", path: "/v1/test/undocumented",
			handler: problem(418)},
		{name: "a client that left (499) is not checked", method: "GET", route: "/v1/whoami", path: "/v1/whoami",
			handler: func(c echo.Context) error { c.Response().WriteHeader(statusClientClosedRequest); return nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var reports []string
			checker, err := newContractChecker(func(format string, args ...any) { reports = append(reports, fmt.Sprintf(format, args...)) })
			require.NoError(t, err)
			e := echo.New()
			e.HTTPErrorHandler = func(err error, c echo.Context) { writeProblem(c, problemFor(err)) }
			e.Use(checker.middleware)
			e.Add(tc.method, tc.route, tc.handler)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req := httptest.NewRequest(tc.method, tc.path, body)
			if tc.body != "" {
				req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
			}
			e.ServeHTTP(httptest.NewRecorder(), req)
			if tc.fails == "" {
				require.Empty(t, reports)
				return
			}
			require.Len(t, reports, 1)
			require.Contains(t, reports[0], tc.fails)
		})
	}
}
