package httpwork

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
)

// A 2xx body that is valid JSON but holds bytes that are not UTF-8 inside
// a string must be kept as something Postgres can store.
func TestA2xxJSONBodyWithInvalidUTF8IsStorable(t *testing.T) {
	db := testkit.NewPool(t)
	body := "{\"name\":\"caf\xe9\"}" // Latin-1 é: valid JSON to Go, not UTF-8
	require.True(t, json.Valid([]byte(body)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(body)) }))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	raw, _ := json.Marshal(Args{URL: srv.URL})
	out, err := h(context.Background(), workpool.Job{Args: raw, Attempt: 1})
	require.NoError(t, err)
	_, err = db.Exec(context.Background(), `SELECT $1::text::jsonb`, string(out))
	require.NoError(t, err, "Postgres stores the result")
}

func TestA2xxJSONBodyWithInvalidUTF8InThePool(t *testing.T) {
	body := "{\"name\":\"caf\xe9\"}"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(body)) }))
	defer srv.Close()
	st := runInPool(t, srv.URL, nil)
	require.Equal(t, workpool.OutcomeSucceeded, st.Outcome, "error: %s", st.Error)
}

// The spec: 408/429/5xx are retryable. A 503 whose error page is over the
// body cap (which only a 2xx's result needs) must still be retried.
func TestA5xxWithABodyOverTheCapIsRetried(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			w.Write(make([]byte, MaxResponseBytes+10))
		}))
		h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
		require.NoError(t, err)
		_, err = run(t, h, context.Background(), Args{URL: srv.URL})
		srv.Close()
		require.Error(t, err)
		require.False(t, workpool.IsNonRetryable(err), "HTTP %d must be retried: %v", code, err)
	}
}

// With discard_body a 2xx succeeds whatever its body's length, and keeps
// no body; without it, a body over the cap fails the work for good.
func TestA2xxWithDiscardBodySucceedsWhateverItsLength(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.Write(make([]byte, 2*MaxResponseBytes))
	}))
	t.Cleanup(srv.Close)
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	res, err := run(t, h, context.Background(), Args{URL: srv.URL, DiscardBody: true})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.Status)
	require.JSONEq(t, `null`, string(res.Body))
	_, err = run(t, h, context.Background(), Args{URL: srv.URL})
	require.ErrorContains(t, err, "response body exceeds")
	require.True(t, workpool.IsNonRetryable(err))
}

// A redirect that would send the request again without its body is
// refused (a target that never got the body was reported as answered):
// a GET that carries a body is such a request too.
func TestARedirectThatDropsAGETsBodyIsRefused(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "/here", http.StatusFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+string(b))
		w.Write([]byte(`{"hits":{"total":0}}`))
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	_, err = run(t, h, context.Background(), Args{URL: srv.URL + "/moved", Method: "GET", Body: json.RawMessage(`{"query":{"match":{"user":"kim"}}}`)})
	require.Error(t, err, "the target answered a request without the body it was sent: %q", seen)
}

// A redirect to another host is sent the first URL as Referer: its path
// (secret_path) and its query's keys.
func TestARedirectDoesNotSendTheSecretURLAsReferer(t *testing.T) {
	var referer string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		referer = r.Header.Get("Referer")
		w.Write([]byte(`{}`))
	}))
	defer other.Close()
	elsewhere := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere+"/x", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*", "localhost:*"}})
	require.NoError(t, err)
	_, err = run(t, h, context.Background(), Args{URL: srv.URL + "/services/T000/B000/PATHSECRET?api_key=KEYSECRET", Method: "POST", Body: json.RawMessage(`"e"`), SecretPath: true})
	require.NoError(t, err)
	require.NotContains(t, referer, "SECRET")
}

// "2xx succeeds, 408, 429, 5xx and network errors are retried per the
// work's policy, any other status fails for good": a redirect whose
// Location does not parse, which net/http gives as an error rather than a
// response, is the target's answer all the same (every attempt gets it),
// and so is a status past 599, which net/http takes. Both were retried —
// the first as a network error, the second as a 5xx. Found by review.
func TestAnAnswerOfNoRetryableStatusFailsForGood(t *testing.T) {
	badLocation := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Location"] = []string{"http://[::1"}
		w.WriteHeader(http.StatusFound)
	}))
	defer badLocation.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = c.Write([]byte("HTTP/1.1 600 Unknown\r\nContent-Length: 4\r\n\r\nnope"))
				}
			}()
		}
	}()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for name, url := range map[string]string{"a Location that does not parse": badLocation.URL, "a status of 600": "http://" + ln.Addr().String() + "/"} {
		_, err := run(t, h, context.Background(), Args{URL: url})
		require.Error(t, err, name)
		require.True(t, workpool.IsNonRetryable(err), "%s: retried: %v", name, err)
	}
}

// "Redirects are checked the same way …, up to 10" (docs/security.md): a
// chain of ten is followed, an eleventh redirect is refused for good. The
// tenth was refused, its error saying ten had been followed. Found by
// review.
func TestTenRedirectsAreFollowedAndAnEleventhIsRefused(t *testing.T) {
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if n > 0 {
			http.Redirect(w, r, fmt.Sprintf("%s/?n=%d", srv.URL, n-1), http.StatusFound)
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	_, err = run(t, h, context.Background(), Args{URL: srv.URL + "/?n=10"})
	require.NoError(t, err, "10 redirects")
	_, err = run(t, h, context.Background(), Args{URL: srv.URL + "/?n=11"})
	require.ErrorContains(t, err, "stopped after 10 redirects")
	require.True(t, workpool.IsNonRetryable(err))
}
