// Package httpwork is the workpool's built-in "http" handler: work that is
// one HTTP request to an allow-listed host and port. Its result is the
// response ({status, headers, body}); 2xx succeeds, 408, 429, 5xx and network
// errors are retried per the work's policy, any other status fails for good.
//
// Requests are a tenant's way into the service's network, so two checks
// stand between a URL and a connection: the allow-list (host and port of the
// URL and of every redirect) and the dial check (the address actually
// connected to, after DNS, must not be loopback, private, link-local, ...
// unless REVEILLE_HTTP_ALLOWED_NETS or an address entry admits it). A
// refusal fails the work for good (*RefusedError).
package httpwork

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"

	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/workpool"
)

// Name is the handler's registered name.
const Name = "http"

// MaxResponseBytes caps the response body a handler reads. The result
// that keeps the body — {status, headers, body} as JSON — must also fit in
// the pool's workpool.MaxResultBytes (1 MiB as well): headers, quotes and
// escapes (a string body's quotes, backslashes and control characters; <, >
// and & anywhere as \u003c…) make it longer than the body, so a body near
// this cap may not fit (ResultTooLargeError).
const MaxResponseBytes = 1 << 20

// MaxResponseHeaderBytes caps a response's headers, which the result keeps
// too: Go's default of 10 MB would let a target write that much into every
// result row.
const MaxResponseHeaderBytes = 64 << 10

// Config configures the handler.
type Config struct {
	// AllowedHosts are the hosts requests and redirects may go to
	// (REVEILLE_HTTP_ALLOWED_HOSTS): `host` (ports 80 and 443), `host:port`
	// or `host:*`; IPv6 in brackets. Empty allows none.
	AllowedHosts []string
	// AllowedNets are CIDRs (REVEILLE_HTTP_ALLOWED_NETS) whose loopback,
	// private, link-local, CGNAT, unspecified, multicast or reserved
	// addresses requests may connect to. Empty: only the addresses listed
	// in AllowedHosts.
	AllowedNets []string
	// Timeout, when set, bounds one request below the work's timeout_ms.
	// Unset (0), a request runs as long as its attempt may: the work's
	// timeout_ms applies through the handler's context.
	Timeout time.Duration
	// Lookup resolves host names (default: the system resolver). Tests
	// replace it to make a name resolve to a chosen address.
	Lookup LookupFunc
	// Registry receives the refusal counter (default: none registered).
	Registry prometheus.Registerer
}

// Args are the work's arguments.
type Args struct {
	URL     string            `json:"url"`
	Method  string            `json:"method,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// Body is sent as is when it is a JSON string, else JSON-encoded.
	Body json.RawMessage `json:"body,omitempty"`
	// SecretPath says the URL's path is a secret (a Slack or Discord
	// webhook's URL is its credential): errors — the work's, the log's —
	// name the URL's scheme and host only.
	SecretPath bool `json:"secret_path,omitempty"`
	// DiscardBody keeps no response body: a 2xx succeeds whatever its
	// body's length, its result's body null (an approval webhook's
	// delivery needs only the status: a receiver's large 200 page
	// failed it).
	DiscardBody bool `json:"discard_body,omitempty"`
}

// Result is the handler's result.
type Result struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	// Body is the response body as JSON when it parses, else as a string.
	Body json.RawMessage `json:"body"`
}

// ResultTooLargeError is a 2xx response whose result — {status, headers,
// body} as JSON — is longer than the pool keeps (workpool.MaxResultBytes),
// though its body is within MaxResponseBytes: it fails the work for good.
type ResultTooLargeError struct {
	BodyBytes, ResultBytes int
}

func (e *ResultTooLargeError) Error() string {
	return fmt.Sprintf("the response (status, headers and a body of %d bytes, as JSON: %d bytes) exceeds the %d-byte (1 MiB) result limit; "+
		"ask the target for less (a smaller page or range)", e.BodyBytes, e.ResultBytes, workpool.MaxResultBytes)
}

// StatusError is a response outside 2xx; its Result is kept in the error
// text so the final failure says what the server answered.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body)
}

// Register registers the handler on m, and the check of its arguments at
// enqueue (CheckArgs).
func Register(m *workpool.Manager, cfg Config) error {
	h, list, refusals, err := newHandler(cfg)
	if err != nil {
		return err
	}
	m.Register(Name, h)
	// (work refused at enqueue counts as refused by the network rules too:
	// a tenant aiming at hosts not allowed shows in the metric either way)
	m.RegisterArgsCheck(Name, checkArgs(list, func(reason string) { refusals.WithLabelValues(reason).Inc() }))
	return nil
}

// CheckArgs is the check at enqueue of what the handler would refuse for
// good whatever happens later: arguments that are not {url, method?,
// headers?, body?, secret_path?, discard_body?} (an unknown key included),
// a header no request of the work may carry, a URL that is not absolute
// http(s), a method other than GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS,
// a host or port outside the allow-list. (Addresses are checked when a
// request connects: DNS may answer differently by then.)
func CheckArgs(list *AllowList) workpool.ArgsCheck { return checkArgs(list, func(string) {}) }

// argKeys are the keys Args has, as the check at enqueue accepts them
// (spelt exactly so: JSON decoding alone would take "URL" for url).
var argKeys = []string{"url", "method", "headers", "body", "secret_path", "discard_body"}

const argsShape = `must be an object {"url", "method"?, "headers"?, "body"?, "secret_path"?, "discard_body"?} (url a string, headers an object of strings, secret_path and discard_body booleans)`

// methods are the methods a request may use (any case). CONNECT and TRACE,
// and extension methods, are refused: no API call needs them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// checkArgs is CheckArgs, calling refused with the reason of each refusal
// by the allow-list.
func checkArgs(list *AllowList, refused func(reason string)) workpool.ArgsCheck {
	return func(raw json.RawMessage, report func(field, detail string)) {
		var a Args
		var keys map[string]json.RawMessage
		if len(raw) == 0 || json.Unmarshal(raw, &a) != nil || json.Unmarshal(raw, &keys) != nil {
			report("", argsShape)
			return
		}
		// (a misspelt key would otherwise be dropped: "methd": "POST" would
		// send a GET, after the spend of a wake-up)
		unknown := false
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			if !slices.Contains(argKeys, k) {
				report(k, "unknown field: "+argsShape)
				unknown = true
			}
		}
		if unknown {
			return
		}
		// (the request the handler would build, so that the two agree)
		req, err := buildRequest(context.Background(), a)
		if err != nil {
			var bad *badArgError
			if errors.As(err, &bad) {
				report(bad.field, bad.detail)
			} else {
				report("", err.Error())
			}
			return
		}
		if r := list.check(req.URL); r != nil {
			refused(r.Reason)
			report("url", strings.TrimPrefix(r.Error(), "http: "))
		}
	}
}

// New returns the handler, or an error naming every invalid entry of the
// allow-list and the allowed nets.
func New(cfg Config) (workpool.Handler, error) {
	h, _, _, err := newHandler(cfg)
	return h, err
}

// newHandler is New, with the allow-list it parsed and its refusals
// counter.
func newHandler(cfg Config) (workpool.Handler, *AllowList, *prometheus.CounterVec, error) {
	if cfg.Timeout < 0 {
		return nil, nil, nil, fmt.Errorf("httpwork: timeout %s is negative", cfg.Timeout)
	}
	if cfg.Lookup == nil {
		cfg.Lookup = systemLookup
	}
	list, listErr := ParseAllowList(cfg.AllowedHosts)
	nets, netsErr := ParseNets(cfg.AllowedNets)
	if err := errors.Join(listErr, netsErr); err != nil {
		return nil, nil, nil, err
	}
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reveille_http_work_refused_total",
		Help: "http work refused by the network rules, at enqueue or when it runs, by reason (host, port, url or the address class)."},
		[]string{"reason"})
	// (every reason at 0 from the start: an alert on its rate sees a
	// series before the first refusal)
	for _, reason := range refusalReasons() {
		refusals.WithLabelValues(reason)
	}
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(refusals); err != nil {
			return nil, nil, nil, fmt.Errorf("httpwork metrics: %w", err)
		}
	}
	rules := &netRules{nets: nets, list: list}
	dialer := &guardedDialer{rules: rules, lookup: cfg.Lookup,
		dialer: &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: rules.control}}
	client := &http.Client{
		Timeout: cfg.Timeout,
		Transport: newConnHeaderRouter(&http.Transport{
			// No proxy: a proxy would connect on the request's behalf,
			// past the dial check.
			Proxy:                  nil,
			DialContext:            dialer.DialContext,
			ForceAttemptHTTP2:      true,
			MaxIdleConns:           100,
			IdleConnTimeout:        90 * time.Second,
			TLSHandshakeTimeout:    10 * time.Second,
			ExpectContinueTimeout:  time.Second,
			MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		}),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if r := list.checkShown(req.URL, shown(req.Context(), req.URL)); r != nil {
				return refused(r.Reason, "redirect to %s refused: %s", shown(req.Context(), req.URL), strings.TrimPrefix(r.Error(), "http: "))
			}
			// (a 301, 302 or 303 turns a POST into a GET without its body:
			// following it would report a request that never reached the
			// target as answered — a webhook's event lost as "succeeded")
			// (and after a GET that carries a body, one keeps the method
			// but drops the body all the same)
			if req.Method != via[0].Method || via[0].ContentLength != 0 && req.GetBody == nil {
				return workpool.NonRetryable(fmt.Errorf("redirect to %s refused: it would send the %s again as a %s without its body; use the final URL",
					shown(req.Context(), req.URL), via[0].Method, req.Method))
			}
			// (net/http sends the previous URL as Referer: a secret path
			// and a query's keys, to whatever host the redirect names)
			if via[0].Header.Get("Referer") == "" {
				req.Header.Del("Referer")
			}
			// (via holds the first request too: at >= 10 the 10th redirect
			// was refused, and the error said 10 were followed)
			if len(via) > maxRedirects {
				return workpool.NonRetryable(fmt.Errorf("stopped after %d redirects", maxRedirects))
			}
			return nil
		},
	}
	return func(ctx context.Context, job workpool.Job) (json.RawMessage, error) {
		var a Args
		if err := json.Unmarshal(job.Args, &a); err != nil {
			return nil, workpool.NonRetryable(fmt.Errorf("http work args: %w", err))
		}
		if a.SecretPath {
			ctx = context.WithValue(ctx, secretPathKey{}, true)
		}
		req, err := buildRequest(ctx, a)
		if err != nil {
			return nil, workpool.NonRetryable(err)
		}
		if r := list.checkShown(req.URL, shown(ctx, req.URL)); r != nil {
			err = r
		} else {
			var out json.RawMessage
			if out, err = do(client, req, a.DiscardBody); err == nil {
				return out, nil
			}
		}
		var r *RefusedError
		if errors.As(err, &r) {
			refusals.WithLabelValues(r.Reason).Inc()
			return nil, workpool.NonRetryable(r)
		}
		return nil, err
	}, list, refusals, nil
}

// badArgError is an argument no request can be built from: field names it
// inside the arguments, detail says why (for the check at enqueue).
type badArgError struct {
	field, detail string
	err           error
}

func (e *badArgError) Error() string { return e.err.Error() }

func buildRequest(ctx context.Context, a Args) (*http.Request, error) {
	u, err := url.Parse(a.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if a.SecretPath {
			return nil, &badArgError{"url", "must be an absolute http(s) URL", errors.New("url: want an absolute http(s) URL")}
		}
		return nil, &badArgError{"url", "must be an absolute http(s) URL", fmt.Errorf("url %q: want an absolute http(s) URL", redactedString(a.URL))}
	}
	method := strings.ToUpper(cmpOr(a.Method, http.MethodGet))
	if !slices.Contains(methods, method) {
		return nil, &badArgError{"method", "must be one of " + strings.Join(methods, ", "), fmt.Errorf("method %q: want one of %s", a.Method, strings.Join(methods, ", "))}
	}
	var body io.Reader
	contentType := ""
	if len(a.Body) > 0 && string(a.Body) != "null" {
		var s string
		if json.Unmarshal(a.Body, &s) == nil {
			body = strings.NewReader(s)
		} else {
			body, contentType = bytes.NewReader(a.Body), "application/json"
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil { // (the URL parsed above: the method is at fault)
		return nil, &badArgError{"method", "must be an HTTP method (GET, POST, …)", fmt.Errorf("request: %w", err)}
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	// (in name order, so that the first bad one named is always the same)
	for _, k := range slices.Sorted(maps.Keys(a.Headers)) {
		v := a.Headers[k]
		field := "headers" // (the header's own path: headers.X-Trace)
		if k != "" {
			field += "." + k
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, &badArgError{field, fmt.Sprintf("%q is not a valid header name", k), fmt.Errorf("header name %q is invalid", k)}
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			return nil, &badArgError{field, fmt.Sprintf("the value of %q is not a valid header value (control characters)", k), fmt.Errorf("header %q: invalid value", k)}
		}
		// (net/http sends the URL's host, never Header["Host"]: taken, it
		// was silently dropped; honoured, it would reach any virtual host
		// behind an allowed name's address)
		if strings.EqualFold(k, "Host") {
			return nil, &badArgError{field, fmt.Sprintf("%q: the request's Host is its URL's host", k), fmt.Errorf("header %q: the Host is the URL's", k)}
		}
		if strings.EqualFold(k, "Upgrade") && v != "" {
			return nil, &badArgError{field, fmt.Sprintf("%q: http work is one request and its response; it does not switch protocols", k), fmt.Errorf("header %q: an upgrade", k)}
		}
		req.Header.Set(k, v)
	}
	return req, nil
}

// connectionHeader reports whether the header k: v is one net/http's
// HTTP/2 transport refuses to send (every attempt failed the same way, as a
// network error): an Upgrade, a Transfer-Encoding other than chunked, a
// Connection other than close or keep-alive. A request carrying one goes
// over HTTP/1.1 (connHeaderRouter).
func connectionHeader(k, v string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Upgrade":
		return v != ""
	case "Transfer-Encoding":
		return v != "" && v != "chunked"
	case "Connection":
		return v != "" && !strings.EqualFold(v, "close") && !strings.EqualFold(v, "keep-alive")
	case "Te":
		// (RFC 9113 §8.2.2: in HTTP/2, TE may only be "trailers")
		return v != "" && v != "trailers"
	}
	return false
}

func do(client *http.Client, req *http.Request, discardBody bool) (json.RawMessage, error) {
	res, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			if workpool.IsNonRetryable(ue.Err) {
				return nil, ue.Err
			}
			ue.URL = shownString(req.Context(), ue.URL) // (it quotes the URL whole)
			// A redirect whose Location does not parse is the target's
			// answer, the same at every attempt, not a network error:
			// net/http gives it as an error of its own (this text), without
			// the response.
			if strings.HasPrefix(ue.Err.Error(), "failed to parse Location header") {
				return nil, workpool.NonRetryable(fmt.Errorf("%s %s: the target's redirect has a Location that does not parse: %w",
					req.Method, shown(req.Context(), req.URL), ue.Err))
			}
		}
		return nil, fmt.Errorf("%s %s: %w", req.Method, shown(req.Context(), req.URL), err) // network: retryable
	}
	defer res.Body.Close()
	// (a 101's body is the switched connection itself, which no context or
	// timeout ends: reading it held the attempt, and its goroutine, for as
	// long as the target kept the connection open)
	if res.StatusCode == http.StatusSwitchingProtocols {
		return nil, workpool.NonRetryable(&StatusError{Status: res.StatusCode, Body: "the target switched protocols: http work is one request and its response"})
	}
	switch s := res.StatusCode; {
	case s < 200 || s >= 300:
		// (only a snippet is kept, and the status decides: a body that
		// ended early or dripped past the timeout made a 4xx a network
		// error, retried)
		raw, _ := io.ReadAll(io.LimitReader(res.Body, snippetBytes+1))
		if s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500 && s < 600 {
			return nil, &StatusError{Status: s, Body: snippet(raw)}
		}
		return nil, workpool.NonRetryable(&StatusError{Status: s, Body: snippet(raw)})
	case discardBody:
		// (a body the work discards is not read: its 2xx is the answer, and
		// a body that ended early or dripped past the timeout failed it, the
		// target that had answered 2xx sent the request again)
		return json.Marshal(Result{Status: s, Headers: flatten(res.Header), Body: json.RawMessage("null")})
	}
	raw, err := io.ReadAll(io.LimitReader(res.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	if len(raw) > MaxResponseBytes {
		return nil, workpool.NonRetryable(fmt.Errorf("response body exceeds %d bytes", MaxResponseBytes))
	}
	out, err := json.Marshal(Result{Status: res.StatusCode, Headers: flatten(res.Header), Body: bodyJSON(raw)})
	if err == nil && len(out) > workpool.MaxResultBytes {
		return nil, workpool.NonRetryable(&ResultTooLargeError{BodyBytes: len(raw), ResultBytes: len(out)})
	}
	return out, err
}

// bodyJSON is the response body as the result keeps it: as JSON when it
// is JSON Postgres jsonb can store, whose numbers jsonb does not give back
// much longer than written (jsonb.MaxNumberGrowth: 1e5000 is 5001 digits),
// else as a string jsonb can store (NUL and bytes that are not UTF-8
// become U+FFFD).
func bodyJSON(raw []byte) json.RawMessage {
	if len(bytes.TrimSpace(raw)) > 0 && json.Valid(raw) && utf8.Valid(raw) && jsonb.Storable(raw) && jsonb.Nesting(raw) <= maxBodyNesting &&
		jsonb.NumberGrowth(raw) <= jsonb.MaxNumberGrowth {
		return raw
	}
	b, _ := json.Marshal(jsonb.Text(string(raw)))
	return b
}

// maxBodyNesting bounds how deep a body kept as JSON may nest: the result
// wraps it ({status, headers, body}), a wake-up's signal wraps the result
// ({result}), and Go's JSON decoder (the pool's check of a result, the
// workflow's of its signal) refuses anything nested past 10,000. A deeper
// body is kept as a string.
const maxBodyNesting = 10000 - 8

func flatten(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = strings.Join(v, ", ")
	}
	return out
}

// snippetBytes is how much of a body outside 2xx an error keeps.
const snippetBytes = 512

// maxRedirects is the most redirects one request follows.
const maxRedirects = 10

func snippet(raw []byte) string {
	if len(raw) > snippetBytes {
		return string(raw[:snippetBytes]) + "…"
	}
	return string(raw)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redacted is u as errors show it — and so the work item, and the log
// line of work that fails: its password masked (url.Redacted) and the
// values of its query, where many APIs take their keys
// (?api_key=xxxxx), the names kept.
func redacted(u *url.URL) string {
	if u.RawQuery == "" {
		return u.Redacted()
	}
	c := *u
	parts := strings.Split(c.RawQuery, "&")
	for i, part := range parts {
		if name, _, found := strings.Cut(part, "="); found {
			parts[i] = name + "=xxxxx"
		}
	}
	c.RawQuery = strings.Join(parts, "&")
	return c.Redacted()
}

// secretPathKey marks a request's context when its work's URL path is a
// secret (Args.SecretPath).
type secretPathKey struct{}

// shown is u as the errors of ctx's request show it: redacted, or only its
// scheme and host when its path is a secret.
func shown(ctx context.Context, u *url.URL) string {
	if secret, _ := ctx.Value(secretPathKey{}).(bool); secret {
		return u.Scheme + "://" + u.Host + "/…"
	}
	return redacted(u)
}

// shownString is shown for a URL as text.
func shownString(ctx context.Context, raw string) string {
	if secret, _ := ctx.Value(secretPathKey{}).(bool); secret {
		if u, err := url.Parse(raw); err == nil {
			return shown(ctx, u)
		}
		return "(a URL whose path is secret)"
	}
	return redactedString(raw)
}

// redactedString is redacted for a URL as text; one that does not parse
// loses everything from its "?" and "@" on.
func redactedString(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return redacted(u)
	}
	raw, _, _ = strings.Cut(raw, "?")
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		raw = "xxxxx" + raw[at:]
	}
	return raw
}

// connHeaderRouter sends a request carrying a connection header (one the
// HTTP/2 transport refuses) over HTTP/1.1 only, whatever its URL or the
// redirect it follows (which keeps the original request's headers); the
// others as the transport chooses. Whether a target speaks HTTP/2 is the
// TLS handshake's to say, so refusing such headers on https URLs refused
// work an HTTP/1.1 target would have taken.
type connHeaderRouter struct{ any, h1 *http.Transport }

func newConnHeaderRouter(t *http.Transport) connHeaderRouter {
	h1 := t.Clone()
	h1.ForceAttemptHTTP2 = false
	h1.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	// (Clone set up HTTP/2 on t first, and copied its ALPN offer of h2: a
	// target that speaks it would pick it for a transport that does not)
	if h1.TLSClientConfig == nil {
		h1.TLSClientConfig = &tls.Config{}
	}
	h1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	return connHeaderRouter{any: t, h1: h1}
}

func (r connHeaderRouter) RoundTrip(req *http.Request) (*http.Response, error) {
	for k, vv := range req.Header {
		if len(vv) > 0 && connectionHeader(k, vv[0]) {
			return r.h1.RoundTrip(req)
		}
	}
	return r.any.RoundTrip(req)
}

// CloseIdleConnections closes both transports' idle connections (the
// client's CloseIdleConnections reaches them through it).
func (r connHeaderRouter) CloseIdleConnections() {
	r.any.CloseIdleConnections()
	r.h1.CloseIdleConnections()
}
