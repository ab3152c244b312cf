package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"
)

// The contract check: every request and response that passes through a test
// server (newTestServer) is checked against the OpenAPI document, so the
// document cannot drift from what the server does without a test failing.
//
//   - A response whose status the operation does not declare fails, as does
//     a body the declared response does not describe: a JSON body that does
//     not match its schema, a body of an undeclared media type, or any body
//     where the response declares none.
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

// contractChecker checks exchanges against doc and tells report what does
// not match.
type contractChecker struct {
	doc    *openapi3.T
	report func(format string, args ...any)
}

// checkContract puts the contract check in front of every route of s for
// the duration of t: a mismatch fails t.
func checkContract(t testing.TB, s *Server) {
	t.Helper()
	doc, err := contractDocument()
	if err != nil {
		t.Fatal(err)
	}
	// A request still running once the test has finished (an SSE reader the
	// cleanup cuts) must not report: t.Errorf then panics.
	var mu sync.Mutex
	finished := false
	t.Cleanup(func() { mu.Lock(); finished = true; mu.Unlock() })
	checker := &contractChecker{doc: doc, report: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			t.Errorf(format, args...)
		}
	}}
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
	resInput := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: reqInput, Status: res.Status, Header: res.Header(),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	resInput.SetBodyBytes(rec.body.Bytes())
	if err := openapi3filter.ValidateResponse(context.Background(), resInput); err != nil {
		cc.report("%s: the response does not match the document (body %s): %v", where, clip(rec.body.Bytes()), err)
	}
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
}

func (r *contractRecorder) Write(b []byte) (int, error) {
	r.written += len(b)
	if mt, _, _ := mime.ParseMediaType(r.Header().Get(echo.HeaderContentType)); mt == echo.MIMEApplicationJSON || strings.HasSuffix(mt, "+json") {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

func (r *contractRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *contractRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
