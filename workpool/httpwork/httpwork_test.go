package httpwork

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func run(t *testing.T, h workpool.Handler, ctx context.Context, args any) (Result, error) {
	t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(t, err)
	out, err := h(ctx, workpool.Job{Args: raw, Attempt: 1})
	var res Result
	if err == nil {
		require.NoError(t, json.Unmarshal(out, &res))
	}
	return res, err
}

func TestHTTPHandler(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Method", r.Method)
		w.Write([]byte(`{"ok":true}`))
	})
	mux.HandleFunc("/text", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("plain words")) })
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Content-Type", r.Header.Get("Content-Type"))
		w.Write(body)
	})
	mux.HandleFunc("/status/", func(w http.ResponseWriter, r *http.Request) {
		code := map[string]int{"404": 404, "500": 500, "429": 429, "408": 408, "400": 400}[strings.TrimPrefix(r.URL.Path, "/status/")]
		w.WriteHeader(code)
		w.Write([]byte("nope"))
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	mux.HandleFunc("/huge", func(w http.ResponseWriter, _ *http.Request) { w.Write(make([]byte, MaxResponseBytes+10)) })
	// A body within MaxResponseBytes whose result, as JSON, is not: the
	// quotes and headers around a 1 MiB string, or a JSON body whose <
	// the result escapes as \u003c (six bytes for one).
	mux.HandleFunc("/full", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(strings.Repeat("a", MaxResponseBytes)))
	})
	mux.HandleFunc("/escaped", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`"` + strings.Repeat("<", MaxResponseBytes/5) + `"`))
	})
	mux.HandleFunc("/huge-headers", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("h", MaxResponseHeaderBytes))
		w.Write([]byte(`{}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	// A second name for the same server that is not allow-listed.
	elsewhere := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	mux.HandleFunc("/redirect-away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere+"/json", http.StatusFound)
	})
	mux.HandleFunc("/redirect-home", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, srv.URL+"/json", http.StatusFound)
	})

	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("2xx JSON body is returned as JSON", func(t *testing.T) {
		res, err := run(t, h, ctx, Args{URL: srv.URL + "/json", Method: "post"})
		require.NoError(t, err)
		require.Equal(t, 200, res.Status)
		require.JSONEq(t, `{"ok":true}`, string(res.Body))
		require.Equal(t, "POST", res.Headers["X-Seen-Method"])
	})
	t.Run("non-JSON body is returned as a string", func(t *testing.T) {
		res, err := run(t, h, ctx, Args{URL: srv.URL + "/text"})
		require.NoError(t, err)
		require.Equal(t, `"plain words"`, string(res.Body))
	})
	t.Run("an object body is sent as JSON, a string body as is", func(t *testing.T) {
		res, err := run(t, h, ctx, Args{URL: srv.URL + "/echo", Method: "POST", Body: json.RawMessage(`{"a":1}`)})
		require.NoError(t, err)
		require.JSONEq(t, `{"a":1}`, string(res.Body))
		require.Equal(t, "application/json", res.Headers["X-Content-Type"])
		res, err = run(t, h, ctx, Args{URL: srv.URL + "/echo", Method: "POST", Body: json.RawMessage(`"raw text"`),
			Headers: map[string]string{"Content-Type": "text/plain"}})
		require.NoError(t, err)
		require.Equal(t, `"raw text"`, string(res.Body))
		require.Equal(t, "text/plain", res.Headers["X-Content-Type"])
	})
	t.Run("redirect within allowed hosts is followed", func(t *testing.T) {
		res, err := run(t, h, ctx, Args{URL: srv.URL + "/redirect-home"})
		require.NoError(t, err)
		require.Equal(t, 200, res.Status)
	})

	failures := []struct {
		name      string
		args      Args
		ctx       func() (context.Context, context.CancelFunc)
		retryable bool
		contains  string
	}{
		{"disallowed host", Args{URL: elsewhere + "/json"}, nil, false, "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"redirect to a disallowed host", Args{URL: srv.URL + "/redirect-away"}, nil, false, "redirect"},
		{"404 is final", Args{URL: srv.URL + "/status/404"}, nil, false, "HTTP 404"},
		{"400 is final", Args{URL: srv.URL + "/status/400"}, nil, false, "HTTP 400"},
		{"500 is retried", Args{URL: srv.URL + "/status/500"}, nil, true, "HTTP 500"},
		{"429 is retried", Args{URL: srv.URL + "/status/429"}, nil, true, "HTTP 429"},
		{"408 is retried", Args{URL: srv.URL + "/status/408"}, nil, true, "HTTP 408"},
		{"timeout is retried", Args{URL: srv.URL + "/slow"}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 100*time.Millisecond)
		}, true, "deadline"},
		{"network error is retried", Args{URL: "http://127.0.0.1:1/x"}, nil, true, "refused"},
		{"oversized response is final", Args{URL: srv.URL + "/huge"}, nil, false, "exceeds"},
		{"a body within the cap whose result is over the pool's limit is final", Args{URL: srv.URL + "/full"}, nil, false,
			"the response (status, headers and a body of 1048576 bytes, as JSON: "},
		{"a body the result escapes past the pool's limit is final", Args{URL: srv.URL + "/escaped"}, nil, false,
			"exceeds the 1048576-byte (1 MiB) result limit; ask the target for less"},
		{"oversized headers are refused", Args{URL: srv.URL + "/huge-headers"}, nil, true, "headers exceeded"},
		{"bad url is final", Args{URL: "ftp://127.0.0.1/x"}, nil, false, "http(s)"},
		{"a bad header name is final", Args{URL: srv.URL + "/json", Headers: map[string]string{"X Trace": "1"}}, nil, false, "header name"},
	}
	for _, tc := range failures {
		t.Run(tc.name, func(t *testing.T) {
			c, cancel := context.WithCancel(ctx)
			if tc.ctx != nil {
				c, cancel = tc.ctx()
			}
			defer cancel()
			_, err := run(t, h, c, tc.args)
			require.Error(t, err)
			require.Equal(t, !tc.retryable, workpool.IsNonRetryable(err), "retryable? %v", err)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	t.Run("no allowed hosts allows nothing", func(t *testing.T) {
		none, err := New(Config{})
		require.NoError(t, err)
		_, err = run(t, none, ctx, Args{URL: srv.URL + "/json"})
		require.True(t, workpool.IsNonRetryable(err))
	})
}

// Through the pool: a 500 is retried per the work's policy and the 200
// that follows succeeds.
func TestServerErrorThenSuccessIsRetriedInThePool(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Write([]byte(`{"fine":true}`))
	}))
	defer srv.Close()

	st := runInPool(t, srv.URL, &workpool.RetryPolicy{MaxAttempts: 3, InitialBackoffMS: 10, Base: 2})
	require.Equal(t, workpool.OutcomeSucceeded, st.Outcome)
	require.EqualValues(t, 2, calls.Load())
	require.Equal(t, 2, st.Attempts)
	var res Result
	require.NoError(t, json.Unmarshal(st.Result, &res))
	require.JSONEq(t, `{"fine":true}`, string(res.Body))
}

// A 2xx body is the work's result, kept in Postgres jsonb: a body jsonb
// cannot hold as JSON (\u0000, an unpaired surrogate escape, a huge
// number) or as a string (NUL bytes), or whose numbers jsonb gives back
// far longer (plain notation), is kept as a string it can hold, so the
// request succeeds instead of failing as an unstorable result.
func TestHTTPHandlerKeepsAnyBodyAsJSONPostgresCanStore(t *testing.T) {
	db := testkit.NewPool(t)
	for _, tc := range []struct{ name, body, want string }{
		{"JSON with \\u0000", `{"a":"\u0000"}`, `"{\"a\":\"\\u0000\"}"`},
		{"JSON with an unpaired surrogate", `["\ud800"]`, `"[\"\\ud800\"]"`},
		{"JSON with a number out of range", `1e999999999`, `"1e999999999"`},
		{"binary with NUL bytes", "a\x00b\xffc", `"a\ufffdb\ufffdc"`},
		{"storable JSON stays JSON", `{"a":"\u00e9"}`, `{"a":"\u00e9"}`},
		// (given back in plain notation, 1e131071 is 131,072 digits, at
		// every read of the result)
		{"JSON whose numbers print far longer", `[1e131071]`, `"[1e131071]"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(tc.body)) }))
			defer srv.Close()
			h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
			require.NoError(t, err)
			res, err := run(t, h, context.Background(), Args{URL: srv.URL})
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(res.Body))
			full, err := json.Marshal(res)
			require.NoError(t, err)
			_, err = db.Exec(context.Background(), `SELECT $1::text::jsonb`, string(full))
			require.NoError(t, err, "Postgres stores the result")
		})
	}
}

// A request runs as long as its work's timeout allows: the handler sets no
// shorter bound of its own (it had one, 30 s, which failed slow requests
// that the work's timeout_ms, 10 minutes by default, allowed).
func TestARequestRunsAsLongAsItsWorksTimeoutAllows(t *testing.T) {
	t.Parallel() // (waits 31 s for a slow answer)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(31 * time.Second):
			w.Write([]byte(`{"late":true}`))
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the work's timeout_ms
	defer cancel()
	res, err := run(t, h, ctx, Args{URL: srv.URL})
	require.NoError(t, err)
	require.JSONEq(t, `{"late":true}`, string(res.Body))
}

func TestANegativeTimeoutIsRefused(t *testing.T) {
	_, err := New(Config{Timeout: -time.Second})
	require.ErrorContains(t, err, "negative")
}

// Work the handler would refuse for good whatever happened later is refused
// at enqueue, every problem named inside args, and nothing is written.
// Work the allow-list refuses at enqueue counts in
// reveille_http_work_refused_total as work it refuses when it runs does.
func TestWorkRefusedAtEnqueueCountsAsRefusedByTheNetworkRules(t *testing.T) {
	db := testkit.NewPool(t)
	m, err := workpool.New(db, workpool.Config{Pools: map[string]int{"default": 2}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, Register(m, Config{AllowedHosts: []string{"api.example.com"}, Registry: reg}))
	ctx := context.Background()
	for _, url := range []string{"https://elsewhere.example.com/x", "https://api.example.com:8443/x", "https://elsewhere.example.com/y"} {
		_, err := m.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name, Args: json.RawMessage(`{"url": "` + url + `"}`)})
		require.Error(t, err)
	}
	_, err = m.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name, Args: json.RawMessage(`{"url": "ftp://x/"}`)})
	require.Error(t, err, "not the network rules: not counted")
	require.Equal(t, 2.0, counterValue(t, reg, "reveille_http_work_refused_total", "host"))
	require.Equal(t, 1.0, counterValue(t, reg, "reveille_http_work_refused_total", "port"))
}

func TestWorkThatCouldNeverRunIsRefusedAtEnqueue(t *testing.T) {
	db := testkit.NewPool(t)
	m, err := workpool.New(db, workpool.Config{Pools: map[string]int{"default": 2}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, Register(m, Config{AllowedHosts: []string{"api.example.com", "127.0.0.1:*"}}))
	ctx := context.Background()
	for _, tc := range []struct {
		name, args, field, detail string
	}{
		{"no arguments", ``, "args", "must be an object"},
		{"a string", `"https://api.example.com/x"`, "args", "must be an object"},
		{"headers that are not strings", `{"url": "https://api.example.com/x", "headers": {"a": 1}}`, "args", "must be an object"},
		{"no url", `{}`, "args.url", "absolute http(s) URL"},
		{"a relative url", `{"url": "/x"}`, "args.url", "absolute http(s) URL"},
		{"an ftp url", `{"url": "ftp://api.example.com/x"}`, "args.url", "absolute http(s) URL"},
		{"a bad method", `{"url": "https://api.example.com/x", "method": "GE T"}`, "args.method", "must be one of GET, HEAD, POST"},
		{"a method no API call needs", `{"url": "https://api.example.com/x", "method": "CONNECT"}`, "args.method", "must be one of GET, HEAD, POST"},
		{"an extension method", `{"url": "https://api.example.com/x", "method": "FETCH"}`, "args.method", "must be one of GET, HEAD, POST"},
		{"a misspelt key", `{"url": "https://api.example.com/x", "methd": "POST"}`, "args.methd", "unknown field"},
		{"a key spelt in another case", `{"URL": "https://api.example.com/x"}`, "args.URL", "unknown field"},
		{"a host outside the allow-list", `{"url": "https://elsewhere.example.com/x"}`, "args.url", "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"a port outside the allow-list", `{"url": "https://api.example.com:8443/x"}`, "args.url", "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"a header name with a space", `{"url": "https://api.example.com/x", "headers": {"X Trace": "1"}}`, "args.headers.X Trace", `"X Trace" is not a valid header name`},
		{"an empty header name", `{"url": "https://api.example.com/x", "headers": {"": "1"}}`, "args.headers", `"" is not a valid header name`},
		{"a header value with a line break", `{"url": "https://api.example.com/x", "headers": {"X-A": "1\r\nX-B: 2"}}`, "args.headers.X-A", `value of "X-A"`},
		// (http work is one request and its response)
		{"an Upgrade header", `{"url": "https://api.example.com/x", "headers": {"Upgrade": "websocket"}}`, "args.headers.Upgrade", "does not switch protocols"},
		{"an Upgrade header on an http URL", `{"url": "http://127.0.0.1:9/x", "headers": {"upgrade": "h2c"}}`, "args.headers.upgrade", "does not switch protocols"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name, Args: json.RawMessage(tc.args)})
			var inv *apperr.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Len(t, inv.Fields, 1, "%v", inv.Fields)
			require.Equal(t, tc.field, inv.Fields[0].Field)
			require.Contains(t, inv.Fields[0].Detail, tc.detail)
		})
	}
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work`).Scan(&n))
	require.Zero(t, n, "nothing written")
	for _, args := range []string{`{"url": "https://api.example.com/x"}`, `{"url": "http://127.0.0.1:9/x", "method": "post"}`,
		`{"url": "https://api.example.com/x", "method": "DELETE", "body": null}`,
		`{"url": "https://api.example.com/x", "headers": {"X-Trace_Id.v2": "a b\tc", "Accept": ""}}`} {
		_, err := m.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name, Args: json.RawMessage(args)})
		require.NoError(t, err, args)
	}
}

func TestAFailedRequestsErrorMasksTheQuerysValuesAndThePassword(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close()) // (nothing listens there now: the connect fails)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.example.com/x?token=REDIRSECRET", http.StatusFound)
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for _, tc := range []struct{ name, url, want string }{
		{"a connect that fails", "http://user:PASSWORD@" + closed + "/x?api_key=URLSECRET&page=2&flag", "api_key=xxxxx&page=xxxxx&flag"},
		{"a redirect refused", srv.URL + "/go?api_key=URLSECRET", "token=xxxxx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, h, context.Background(), Args{URL: tc.url})
			require.Error(t, err)
			require.NotContains(t, err.Error(), "SECRET")
			require.NotContains(t, err.Error(), "PASSWORD")
			require.Contains(t, err.Error(), tc.want, "the names stay, to say which parameter")
		})
	}
}

// A URL whose path is its credential (a Slack webhook's) is named by its
// scheme and host only in the errors of work that says so (secret_path):
// they are the work's error, a webhook's last failure and the log's line.
func TestAFailedRequestsErrorLeavesOutASecretPath(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close()) // (nothing listens there now: the connect fails)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.example.com/services/REDIRSECRET", http.StatusFound)
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for _, tc := range []struct{ name, url, want string }{
		{"a connect that fails", "http://" + closed + "/services/T000/B000/PATHSECRET", "http://" + closed + "/…"},
		{"a redirect refused", srv.URL + "/services/T000/B000/PATHSECRET", "http://elsewhere.example.com/…"},
		{"a URL that is not absolute", "/services/T000/B000/PATHSECRET", "url: want an absolute http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, h, context.Background(), Args{URL: tc.url, SecretPath: true})
			require.Error(t, err)
			require.NotContains(t, err.Error(), "SECRET")
			require.NotContains(t, err.Error(), "/services", "nothing of the path")
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// A redirect that keeps the method and body (307, 308) is followed; one
// that would send the request again as a GET without its body (301, 302,
// 303 after a POST) fails for good: followed, the work was reported
// answered by a target that never got what it was sent. A GET follows any.
func TestARedirectIsFollowedOnlyWhereItKeepsTheRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/moved/")); err == nil {
			http.Redirect(w, r, "/here", code)
			return
		}
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "%s %s", r.Method, b)
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for _, tc := range []struct {
		method string
		code   int
		want   string // the body answered; "" for a refusal
	}{
		{http.MethodPost, http.StatusTemporaryRedirect, `"POST event"`},
		{http.MethodPost, http.StatusPermanentRedirect, `"POST event"`},
		{http.MethodPost, http.StatusMovedPermanently, ""},
		{http.MethodPost, http.StatusFound, ""},
		{http.MethodPut, http.StatusSeeOther, ""},
		{http.MethodGet, http.StatusFound, ""}, // (a GET with a body loses it too)
	} {
		t.Run(fmt.Sprintf("%s %d", tc.method, tc.code), func(t *testing.T) {
			res, err := run(t, h, context.Background(), Args{URL: srv.URL + "/moved/" + strconv.Itoa(tc.code), Method: tc.method, Body: json.RawMessage(`"event"`)})
			if tc.want != "" {
				require.NoError(t, err)
				require.JSONEq(t, tc.want, string(res.Body))
				return
			}
			require.Error(t, err)
			require.True(t, workpool.IsNonRetryable(err), "a redirect refused does not retry: %v", err)
			require.Contains(t, err.Error(), "redirect to "+srv.URL+"/here refused: it would send the "+tc.method+" again as a GET without its body")
		})
	}
}

// The allow-list's own refusals (a scheme or port no request may use) name
// a secret path's URL by scheme and host only too — for a redirect's URL
// and for the work's own; they quoted it whole.
func TestARefusalByTheAllowListLeavesOutASecretPath(t *testing.T) {
	for _, loc := range []string{
		"ftp://elsewhere.example.com/services/REDIRSECRET",
		"http://127.0.0.1:0/services/REDIRSECRET",
	} {
		t.Run("a redirect to "+loc, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", loc)
				w.WriteHeader(http.StatusTemporaryRedirect)
			}))
			defer srv.Close()
			h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
			require.NoError(t, err)
			_, err = run(t, h, context.Background(), Args{URL: srv.URL + "/services/T000/B000/PATHSECRET", SecretPath: true, Method: "POST"})
			require.Error(t, err)
			require.NotContains(t, err.Error(), "SECRET")
		})
	}
	t.Run("the work's own URL", func(t *testing.T) {
		h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
		require.NoError(t, err)
		_, err = run(t, h, context.Background(), Args{URL: "http://127.0.0.1:0/services/T000/B000/PATHSECRET", SecretPath: true})
		require.Error(t, err)
		require.NotContains(t, err.Error(), "SECRET")
		require.Contains(t, err.Error(), "http://127.0.0.1:0/…")
	})
}

// A 2xx body nested as deep as Go's JSON decoder allows (10,000) is valid
// JSON, and the request succeeds: kept in the result one level deeper
// ({status, headers, body}), it must still be a result the pool takes —
// not "handler returned invalid JSON", a final failure of a request that
// succeeded.
func TestA2xxBodyNestedToTheDecodersDepthLimitSucceeds(t *testing.T) {
	const depth = 10000
	body := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	require.True(t, json.Valid([]byte(body)), "the body is valid JSON")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(body)) }))
	defer srv.Close()

	st := runInPool(t, srv.URL, nil)
	require.Equal(t, workpool.OutcomeSucceeded, st.Outcome, "error: %s", st.Error)
}

// runInPool runs one request to url as work of a started pool (with
// retry, when set) and returns the work's status once it finished.
func runInPool(t *testing.T, url string, retry *workpool.RetryPolicy) workpool.Status {
	t.Helper()
	db := testkit.NewPool(t)
	m, err := workpool.New(db, workpool.Config{Pools: map[string]int{"default": 2}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, Register(m, Config{AllowedHosts: []string{"127.0.0.1:*"}}))
	ctx := context.Background()
	require.NoError(t, m.Start(ctx))
	defer m.Stop(ctx)

	args, _ := json.Marshal(Args{URL: url})
	id, err := m.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name, Args: args, Retry: retry})
	require.NoError(t, err)
	var st workpool.Status
	require.Eventually(t, func() bool {
		st, err = m.Status(ctx, "o", id)
		return err == nil && st.State == workpool.StateFinished
	}, 20*time.Second, 10*time.Millisecond)
	return st
}
