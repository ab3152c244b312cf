package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// DefaultUserAgent is sent when WithUserAgent is not given.
const DefaultUserAgent = "reveille-go-client/1"

// Client calls a Reveille API. It is safe for concurrent use; make one per
// process (or per token) and share it.
type Client struct {
	base      *url.URL
	http      *http.Client
	token     func(ctx context.Context) (string, error)
	userAgent string
	retry     RetryPolicy
	reconnect ReconnectPolicy

	// The API by resource: one method per route.
	Wakeups          *WakeupsService
	Mandates         *MandatesService
	MandateApprovals *MandateApprovalsService
	Pools            *PoolsService
	Work             *WorkService
	Streams          *StreamsService
	ToolApprovals    *ToolApprovalsService
	Approvals        *ApprovalsService
	ToolPolicies     *ToolPoliciesService
	ApprovalWebhooks *ApprovalWebhooksService
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends a static bearer token on every call.
func WithToken(token string) Option {
	return func(c *Client) {
		c.token = func(context.Context) (string, error) { return token, nil }
	}
}

// WithTokenFunc asks f for the bearer token before every attempt, so that a
// rotating token is picked up by retries too. An error from f fails the call
// (and ends a live reader: Streams.Tail, Approvals.Events).
func WithTokenFunc(f func(ctx context.Context) (string, error)) Option {
	return func(c *Client) { c.token = f }
}

// defaultIdleConnsPerHost is how many idle connections the default
// transport keeps to the API (net/http's default: 2).
const defaultIdleConnsPerHost = 64

// WithHTTPClient sends the requests through hc (default: a client of its
// own with no overall timeout, which SSE needs — bound calls with their
// context — keeping up to 64 idle connections to the API). When hc has no
// CheckRedirect, the client uses a copy of hc that follows no redirect
// (see New). The body of a request that must not act twice unseen (a keyed
// call's — a create, a spend, an append — or a POST's that is not
// idempotent) cannot be rewound (GetBody is nil, an empty body when it has none),
// so that hc never sends it again on its own: a RoundTripper of hc's that
// buffers a body and sets GetBody, or that retries by itself, brings back
// resends the client cannot see.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// errRedirectRefused is what refuseRedirect answers net/http.
var errRedirectRefused = errors.New("the client follows no redirect")

// errRedirectWithBody is why a 307 or 308 to a call that must not act twice
// unseen is not followed, whatever the http.Client's CheckRedirect.
var errRedirectWithBody = errors.New("a call that must not act twice is not sent on to another URL: set the base URL to the API's own")

func refuseRedirect(*http.Request, []*http.Request) error { return errRedirectRefused }

// WithUserAgent sets the User-Agent header (default DefaultUserAgent).
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithRetry sets the calls' retry policy (default DefaultRetryPolicy; a
// RetryPolicy{MaxAttempts: 1} disables retries). Live readers reconnect
// by their own policy (WithReconnect).
func WithRetry(p RetryPolicy) Option { return func(c *Client) { c.retry = p } }

// WithReconnect sets how live readers (Streams.Tail, Approvals.Events)
// connect again after a cut (default DefaultReconnectPolicy: until their
// context ends). WithRetry does not touch it.
func WithReconnect(p ReconnectPolicy) Option { return func(c *Client) { c.reconnect = p } }

// New returns a client of the API at baseURL, e.g. "http://localhost:8080"
// (a path prefix, for an API behind a proxy, is kept). A base URL without
// a host, or with a query or a fragment (the calls' own path and query
// follow it), is refused. Nil options are ignored.
func New(baseURL string, opts ...Option) (*Client, error) {
	base, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	switch {
	case base.Scheme != "http" && base.Scheme != "https":
		return nil, fmt.Errorf("client: base URL %q: the scheme must be http or https", baseURL)
	case base.Host == "":
		return nil, fmt.Errorf("client: base URL %q: it names no host", baseURL)
	case base.RawQuery != "" || base.ForceQuery || strings.ContainsRune(baseURL, '#'):
		return nil, fmt.Errorf("client: base URL %q: it may not have a query or a fragment (the calls add their own path and query)", baseURL)
	}
	base.Path, base.RawPath = strings.TrimRight(base.Path, "/"), strings.TrimRight(base.RawPath, "/")
	c := &Client{base: base, userAgent: DefaultUserAgent, retry: DefaultRetryPolicy, reconnect: DefaultReconnectPolicy}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.http == nil {
		// One client serves a process's calls: keep a connection for each
		// of many concurrent callers, where net/http's default kept two
		// and every call past them dialled a new one (32 goroutines: a
		// new connection for one call in eight).
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = defaultIdleConnsPerHost
		c.http = &http.Client{Transport: t}
	}
	if c.http.CheckRedirect == nil {
		// The API redirects no call, so a redirect comes from something in
		// front of it, and following one is never right: net/http would
		// send the bearer token on to another port of the same host, and
		// turn a POST answered 301, 302 or 303 into a GET whose 200 would
		// pass for the create's answer.
		hc := *c.http
		hc.CheckRedirect = refuseRedirect
		c.http = &hc
	}
	c.retry = c.retry.withDefaults()
	c.reconnect = c.reconnect.withDefaults()
	c.Wakeups = &WakeupsService{c}
	c.Mandates = &MandatesService{c}
	c.MandateApprovals = &MandateApprovalsService{c}
	c.Pools = &PoolsService{c}
	c.Work = &WorkService{c}
	c.Streams = &StreamsService{c}
	c.ToolApprovals = &ToolApprovalsService{c}
	c.Approvals = &ApprovalsService{c}
	c.ToolPolicies = &ToolPoliciesService{c}
	c.ApprovalWebhooks = &ApprovalWebhooksService{c}
	return c, nil
}

// CallOption adjusts one call. Nil call options are ignored.
type CallOption func(*callOptions)

// callOptionsOf applies opts.
func callOptionsOf(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

type callOptions struct {
	idempotencyKey   string
	noIdempotencyKey bool
	header           http.Header
	onResponse       func(*http.Response)
}

// WithIdempotencyKey sends key as the call's Idempotency-Key instead of a
// generated one: use it to make a retry of your own (another process, a
// restart) the same logical call as the first. It counts on the calls that
// carry a key (creates, spends, appends, answers: see the package doc's
// Retries), and is ignored on the others.
func WithIdempotencyKey(key string) CallOption {
	return func(o *callOptions) { o.idempotencyKey = key }
}

// WithoutIdempotencyKey sends no Idempotency-Key on a call that would get
// one (it saves the server's idempotency records); the call is then never
// retried once its request may have reached the server.
func WithoutIdempotencyKey() CallOption {
	return func(o *callOptions) { o.noIdempotencyKey = true }
}

// WithHeader adds a request header to the call. An Idempotency-Key (in
// any case) is not added beside the call's own: it is the call's key, as
// WithIdempotencyKey(value) — the server reads one key, and a second header
// would leave the retries under another than the caller meant.
func WithHeader(name, value string) CallOption {
	if http.CanonicalHeaderKey(name) == "Idempotency-Key" {
		return WithIdempotencyKey(value)
	}
	return func(o *callOptions) {
		if o.header == nil {
			o.header = http.Header{}
		}
		o.header.Add(name, value)
	}
}

// WithResponse hands f the final HTTP response of the call, its body
// already read, for headers such as X-Request-Id or Idempotent-Replayed:
// the answer of the call's last attempt, a success or an error (one
// refused for good, the last of the retries, a 429 whose Retry-After is
// longer than RetryPolicy.MaxRetryAfter or ends past the context's
// deadline, one whose wait for a retry the context ended). f is not called when the last attempt got no whole
// answer: a transport error, an answer cut short, a redirect not followed
// (its body is gone), a context that ended during the attempt, a failed
// token function. On Streams.Tail and Approvals.Events, f is called with
// each connection's answer as it comes (each reconnect's too, an event
// stream or an error), its Body http.NoBody: the events are the
// iteration's.
func WithResponse(f func(*http.Response)) CallOption {
	return func(o *callOptions) { o.onResponse = f }
}

// safety says whether a route's call may be repeated, which decides its
// retries.
type safety int

const (
	// safe calls (GET, PUT, DELETE, and POSTs that are idempotent by
	// nature, such as a cancel) are retried.
	safe safety = iota
	// keyed calls are POSTs the server deduplicates by Idempotency-Key:
	// they get one (generated once per call when the caller gives none)
	// and are retried under it.
	keyed
	// unsafe calls are retried only when their request never left.
	unsafe
)

// endpoint is one call of a route: everything do needs besides the body.
type endpoint struct {
	method string
	path   string // escaped, from pathOf
	query  url.Values
	safety safety
	// contentType of the body (default application/json when there is one).
	contentType string
	// accept is the media type asked for (default application/json).
	accept string
	// argErr refuses the call before anything is sent (see needArgs).
	argErr error
	// goneIsDone marks a delete answered with no content: a 404 to a retry
	// after an attempt that lost its answer is that attempt's effect, and
	// the call succeeds (see do).
	goneIsDone bool
	// repeatable marks a keyed call that is idempotent by nature besides
	// (a cancel, a close): repeated without its key, it has the same
	// effect and answer (MaybeAppliedError.Repeatable).
	repeatable bool
}

// sentOnce says that net/http must not send the call's request again by
// itself (see send): every call but the safe ones, key or no key — not a
// GET (Readyz is unsafe only so that it is not retried). Not a delete
// either: sent again, it does what it did, and net/http's own test of what
// it wrote (a request it wrote nothing of is sent again on a new
// connection) is exact where the client's is not — made sentOnce, a delete
// of what never existed whose write failed as its connection closed was
// read as lost and its 404 as a success. (Over HTTP/2 net/http also sends
// a delete again after the server reset its stream with PROTOCOL_ERROR:
// if the first deleted, the call says not found.)
func (ep endpoint) sentOnce() bool {
	return ep.safety != safe && ep.method != http.MethodGet
}

// ArgumentError is a call refused before anything was sent: an argument
// that names an object in the route's path (an id, a run id, a stream,
// pool, tool or webhook name) is empty. Sent, it would have named another
// route or none, and come back a 404 that says nothing of the caller's
// mistake.
type ArgumentError struct {
	// Method is the client's method ("Wakeups.Get"); Arg its argument
	// ("id").
	Method, Arg string
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("client: %s: the %s argument is empty (nothing was sent)", e.Method, e.Arg)
}

// needArgs is the *ArgumentError of method's first empty path argument,
// given as name, value pairs; nil when none is empty.
func needArgs(method string, namesAndValues ...string) error {
	for i := 0; i+1 < len(namesAndValues); i += 2 {
		if namesAndValues[i+1] == "" {
			return &ArgumentError{Method: method, Arg: namesAndValues[i]}
		}
	}
	return nil
}

// pathOf joins path segments, escaping each: ids chosen by clients (run
// ids, session ids, tool names) may hold any character but "/".
func pathOf(segments ...string) string {
	var b strings.Builder
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// doJSON calls the endpoint with in as its JSON body (nil: none) and
// decodes a 2xx answer into a new Out.
func doJSON[Out any](ctx context.Context, c *Client, ep endpoint, in any, opts []CallOption) (Out, error) {
	var out Out
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return out, fmt.Errorf("client: encoding the %s %s body: %w", ep.method, ep.path, err)
		}
	}
	err := c.do(ctx, ep, body, opts, func(res *http.Response) error { return decodeJSON(res, &out) })
	return out, err
}

// doNoContent calls the endpoint and expects no body back (204).
func doNoContent(ctx context.Context, c *Client, ep endpoint, in any, opts []CallOption) error {
	_, err := doJSON[struct{}](ctx, c, ep, in, opts)
	return err
}

func decodeJSON(res *http.Response, dst any) error {
	_, none := dst.(*struct{})
	if res.StatusCode == http.StatusNoContent && none {
		return nil
	}
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		if none {
			return nil
		}
		// Not the API's answer (each of its 2xx but 204 has a body): a
		// zero value would pass for one.
		return fmt.Errorf("client: the %d answer of %s %s has no body", res.StatusCode, res.Request.Method, res.Request.URL.Path)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("client: decoding the %d answer of %s %s: %w", res.StatusCode, res.Request.Method, res.Request.URL.Path, err)
	}
	return nil
}

// do sends the request, retrying per the policy, and hands a 2xx response
// to read; any other status becomes an *Error. The body is bytes so that
// every attempt sends it again.
func (c *Client) do(ctx context.Context, ep endpoint, body []byte, opts []CallOption, read func(*http.Response) error) error {
	if ep.argErr != nil {
		return ep.argErr
	}
	o := callOptionsOf(opts)
	key := ""
	if ep.safety == keyed && !o.noIdempotencyKey {
		key = o.idempotencyKey
		if key == "" {
			// Once per logical call: every retry below sends the same key,
			// so the server acts once however many attempts reach it.
			key = uuid.Must(uuid.NewV7()).String()
		}
	}
	retryable := ep.safety == safe || key != ""
	// maybeApplied: an attempt's request was written whole and its answer
	// was lost or was a 5xx, so — unless a later attempt got the server's
	// answer for the key — the server may have acted on it, however the
	// call ends. lost: an answer was lost (none came, or a success was cut
	// inside its body), which alone tells a delete's later 404 that the
	// object was there — a 5xx may come from something in front of the API
	// that forwarded nothing, and an error answer cut in its body still
	// said its status.
	// succeeded: an attempt was answered a success cut inside its body —
	// the server acted, and only a replay of that answer settles the call.
	maybeApplied, lost, succeeded := false, false, false
	fail := func(err error) error {
		if maybeApplied && ep.method != http.MethodGet {
			return &MaybeAppliedError{Method: ep.method, Path: ep.path, IdempotencyKey: key, Repeatable: ep.safety == safe || ep.repeatable, Err: err}
		}
		return err
	}
	resends := 0 // of requests that never reached the server (unsent)
	for attempt := 1; ; attempt++ {
		var connected, reused, wroteHeaders, written, wroteFailed atomic.Bool
		trace := &httptrace.ClientTrace{
			GotConn:      func(i httptrace.GotConnInfo) { connected.Store(true); reused.Store(i.Reused) },
			WroteHeaders: func() { wroteHeaders.Store(true) },
			WroteRequest: func(i httptrace.WroteRequestInfo) {
				written.Store(i.Err == nil)
				wroteFailed.Store(i.Err != nil)
			},
		}
		res, err := c.send(ctx, trace, ep, body, key, o.header)
		// headersOut: a request without a body whose write failed after its
		// headers were written — over HTTP/2 they go out alone, and the
		// transport reports the request's write failed only once they did
		// (a failure writing them is reported before) — and whose route may
		// have acted on them (it reads no body). (Over HTTP/1.1 such a
		// request is buffered whole: reported written, then failed — unless
		// its headers pass the connection's 4 KiB buffer, whose write failing
		// among them comes before they are reported written.)
		headersOut := body == nil && wroteHeaders.Load() && wroteFailed.Load()
		notSent := err != nil && res == nil && unsent(err, reused.Load(), headersOut)
		if notSent && ctx.Err() == nil && resends < maxResends {
			// What net/http sends again by itself for a request it may
			// rewind, and not for one whose body it may not (see send):
			// sent again at once — the first time — not counted as an
			// attempt, whatever the call.
			resends++
			if resends > 1 {
				if werr := c.retry.wait(ctx, resends-1, 0); werr != nil {
					return fail(fmt.Errorf("client: %s %s: waiting to send again after %w: %w", ep.method, ep.path, err, werr))
				}
			}
			attempt--
			continue
		}
		var raw []byte
		var apiErr *Error
		var readErr error
		switch {
		case err != nil && res != nil:
			// net/http gave up on a redirect (its CheckRedirect refused it:
			// "stopped after 10 redirects", or the caller's policy), handing
			// back the last answer, its body closed. Every answer of the
			// attempt was a 3xx, and the API answers no call with one — it
			// came from something in front of the API, which did not act
			// (only an earlier attempt may have). Not retried: the next
			// attempt meets the same redirects.
			return fail(notFollowed(ep, res, err))
		case err != nil:
			var tokErr *tokenError
			if errors.As(err, &tokErr) {
				return fail(fmt.Errorf("client: %s %s: %w", ep.method, ep.path, err))
			}
			if !notSent && (written.Load() || headersOut) {
				maybeApplied, lost = true, true
			}
			if ctx.Err() != nil && connected.Load() && ep.sentOnce() {
				// (the attempt ended with its context, perhaps while its
				// request was being written: the transport may report
				// nothing yet of what went out)
				maybeApplied = true
			}
		case (res.StatusCode == http.StatusTemporaryRedirect || res.StatusCode == http.StatusPermanentRedirect) && ep.sentOnce():
			// A 307 or 308 net/http handed back without asking CheckRedirect:
			// it would send the body on, and this call's body it may not send
			// again (see send) — not even where a caller's CheckRedirect
			// would follow. A 3xx as above.
			_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxErrorBody))
			res.Body.Close()
			return fail(notFollowed(ep, res, errRedirectWithBody))
		case res.StatusCode >= 200 && res.StatusCode < 300:
			raw, readErr = io.ReadAll(res.Body)
			res.Body.Close()
		default:
			apiErr, readErr = errorFrom(res)
		}
		if readErr != nil {
			// The whole body first: an answer cut inside it — a 201's or a
			// 402's — is a lost answer (the server may have acted), retried
			// as one; under its key the retry is answered the whole first
			// answer.
			// (a status line that came is the server's word on the
			// object: only a success cut short hides what was done)
			maybeApplied = true
			if res.StatusCode < 300 {
				lost, succeeded = true, true
			}
			err = fmt.Errorf("reading the %d answer: %w", res.StatusCode, readErr)
		}
		if err != nil {
			if ctx.Err() != nil || attempt >= c.retry.MaxAttempts || !(retryable || notSent || neverSent(err)) {
				return fail(fmt.Errorf("client: %s %s: %w", ep.method, ep.path, err))
			}
			if werr := c.retry.wait(ctx, attempt, 0); werr != nil {
				return fail(fmt.Errorf("client: %s %s: waiting to retry after %w: %w", ep.method, ep.path, err, werr))
			}
			continue
		}
		if apiErr == nil {
			res.Body = io.NopCloser(bytes.NewReader(raw))
			err := read(res)
			o.respond(res)
			return err
		}
		if apiErr.Status == http.StatusNotFound && ep.goneIsDone && lost {
			// An earlier attempt's request reached the server whole and its
			// answer was lost: the object it deleted is gone now, which is
			// what the caller asked for. (A 404 to the first attempt, or after
			// attempts the server answered, is an error: there was nothing
			// to delete.)
			o.respond(res)
			return nil
		}
		if written.Load() && apiErr.Status >= 500 && apiErr.retryable() {
			// A 5xx is no answer for the request: a gateway's 502 or 504
			// after it forwarded the request, or the API's 500 or 503 after
			// a commit whose outcome it lost, comes after the server may
			// have acted.
			maybeApplied = true
		}
		if key != "" && answeredForKey(res, apiErr, succeeded) {
			maybeApplied = false // (the server's answer for the key: it stands)
		}
		// (a Retry-After longer than MaxRetryAfter is not worth waiting for
		// within one call, nor one that ends past the context's deadline:
		// the wait would end in a deadline error that hides the answer)
		if attempt >= c.retry.MaxAttempts || !retryable || !apiErr.retryable() || apiErr.RetryAfter > c.retry.MaxRetryAfter ||
			endsPastDeadline(ctx, apiErr.RetryAfter) {
			o.respond(res)
			return fail(apiErr)
		}
		if werr := c.retry.wait(ctx, attempt, apiErr.RetryAfter); werr != nil {
			o.respond(res)
			return fail(fmt.Errorf("client: %s %s: waiting to retry after %w: %w", ep.method, ep.path, apiErr, werr))
		}
	}
}

// maxResends bounds the requests of one call sent again because they never
// reached the server (unsent), as net/http bounds its own (six).
const maxResends = 6

// unsent reports whether a request that failed without an answer never
// reached the server's handler, so that any call may send it again: an
// HTTP/2 server refused the stream (REFUSED_STREAM) or shut the connection
// down gracefully (GOAWAY) before it; an HTTP/1.1 connection the server
// closed while it sat idle, before the request (net/http's "server closed
// idle connection"); or the write of the request failed on a reused
// connection with nothing written (net/http's own test, and its error then
// is the write's, bare). net/http sends those again by itself — but not a
// request whose body it may not rewind (see send), whose error tells which
// it was only by its shape and text. (httptrace's WroteRequest cannot
// tell: it reports the request written once it is in the connection's
// buffer.) Not a failed write when headersOut (a request without a body
// whose headers went out before the write that failed: its route may have
// acted on them — a request with a body acts only once it is read whole).
func unsent(err error, reused, headersOut bool) bool {
	var tokErr *tokenError
	if errors.As(err, &tokErr) {
		return false
	}
	msg := err.Error()
	if strings.Contains(msg, "; REFUSED_STREAM") || strings.Contains(msg, "graceful shutdown GOAWAY") ||
		strings.Contains(msg, "server closed idle connection") {
		return true
	}
	var opErr *net.OpError
	// (a write that put some of the request on the wire is wrapped as the
	// connection "broken")
	return !headersOut && reused && errors.As(err, &opErr) && opErr.Op == "write" && !strings.Contains(msg, "transport connection broken")
}

// notFollowed is the error of an attempt answered a redirect.
func notFollowed(ep endpoint, res *http.Response, err error) error {
	return fmt.Errorf("client: %s %s: answered %d %s redirecting to %q, not followed (the API redirects no call: check the base URL and what is in front of the API): %w",
		ep.method, ep.path, res.StatusCode, http.StatusText(res.StatusCode), res.Header.Get("Location"), err)
}

// respond hands the call's final response to WithResponse's f.
func (o *callOptions) respond(res *http.Response) {
	if o.onResponse != nil {
		o.onResponse(res)
	}
}

// send makes one attempt, traced by trace when it is not nil (the request
// alone: not the token function's calls).
func (c *Client) send(ctx context.Context, trace *httptrace.ClientTrace, ep endpoint, body []byte, key string, extra http.Header) (*http.Response, error) {
	u := *c.base
	u.Path = c.base.Path + unescapedPath(ep.path)
	u.RawPath = c.base.EscapedPath() + ep.path
	u.RawQuery = ep.query.Encode()
	var rdr io.Reader
	if body != nil {
		rdr = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, ep.method, u.String(), rdr)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", cmpOr(ep.contentType, "application/json"))
	}
	req.Header.Set("Accept", cmpOr(ep.accept, "application/json")+", application/problem+json")
	req.Header.Set("User-Agent", c.userAgent)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if ep.sentOnce() {
		// The body of a call that must not act twice unseen cannot be
		// rewound (and one without a body gets an empty one): net/http then
		// never sends it again by itself — over HTTP/1.1 a request with an
		// Idempotency-Key and a rewindable body is "replayable", sent again
		// when its reused connection closes before any answer; over HTTP/2
		// any request whose stream the server reset with PROTOCOL_ERROR is,
		// even after the server read it. The first may have acted: do's
		// loop, which knows what was written, sends it again, and sees the
		// answer lost — or, when the server says it did not process it
		// (unsent), sends it again as net/http would have.
		// (An empty body goes out chunked over HTTP/1.1; the routes without
		// a body read none.)
		if req.Body == nil {
			req.Body = io.NopCloser(bytes.NewReader(nil))
		}
		req.GetBody = nil
	}
	for name, values := range extra {
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	if c.token != nil {
		tok, err := c.token(ctx)
		if err != nil {
			return nil, &tokenError{err}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if trace != nil {
		req = req.WithContext(httptrace.WithClientTrace(ctx, trace))
	}
	return c.http.Do(req)
}

// tokenError is a failure of the token function: nothing was sent, and
// trying again is the token source's business, not the retry loop's.
type tokenError struct{ err error }

func (e *tokenError) Error() string { return "getting the bearer token: " + e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

func unescapedPath(escaped string) string {
	p, err := url.PathUnescape(escaped)
	if err != nil {
		return escaped
	}
	return p
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// isMediaType reports whether the response's Content-Type is mt.
func isMediaType(res *http.Response, mt string) bool {
	got, _, err := mime.ParseMediaType(res.Header.Get("Content-Type"))
	return err == nil && got == mt
}

// endsPastDeadline reports whether a wait of d from now would end at or
// after ctx's deadline.
func endsPastDeadline(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && d > 0 && !time.Now().Add(d).Before(deadline)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
