package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
)

// A create or spend whose answer is lost after the server acted is
// retried by the client under the Idempotency-Key it generated for the
// call: the retry is answered with the first answer, and the server holds
// one object.
func TestAnIdempotentRetryAfterADroppedConnectionProducesOneObject(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	direct, directAgent := newClient(t, e.url, admin, nil), newClient(t, e.url, agent, nil)
	for _, agentID := range []string{"spender", "waker"} {
		_, err := direct.Mandates.Create(ctx, client.MandateCreate{AgentID: agentID, Scope: "wake", Budget: 10})
		require.NoError(t, err)
	}
	proxy := newFaultProxy(t, e.url[len("http://"):])

	cases := []struct {
		name  string
		as    who
		path  string // the route's path as sent
		call  func(c *client.Client, opts ...client.CallOption) error
		count func(t *testing.T) int // the objects the call makes, on the server
	}{
		{
			name: "a mandate", as: admin, path: "/v1/mandates",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "dropped", Scope: "s", Budget: 1}, opts...)
				return err
			},
			count: func(t *testing.T) int {
				return len(collect(t, direct.Mandates.List(ctx, client.MandateListParams{AgentID: "dropped"})))
			},
		},
		{
			name: "a spend", as: agent, path: "/v1/mandates/spend",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "spender", Scope: "wake", Cost: 3}, opts...)
				return err
			},
			count: func(t *testing.T) int {
				m := collect(t, direct.Mandates.List(ctx, client.MandateListParams{AgentID: "spender"}))
				require.Len(t, m, 1)
				return len(collect(t, direct.Mandates.Ledger(ctx, m[0].ID, client.PageParams{})))
			},
		},
		{
			name: "a wake-up", as: agent, path: "/v1/wakeups",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.Wakeups.Create(ctx, wakeupRequest("waker", 1), opts...)
				return err
			},
			count: func(t *testing.T) int {
				return len(collect(t, directAgent.Wakeups.List(ctx, client.WakeupListParams{AgentID: "waker"})))
			},
		},
		{
			name: "plain work", as: admin, path: "/v1/pools/parked/work",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.Pools.Enqueue(ctx, "parked", client.WorkRequest{Handler: "block", Args: map[string]string{"tag": "dropped"}}, opts...)
				return err
			},
			count: func(t *testing.T) int {
				var n int
				require.NoError(t, e.svc.DB().QueryRow(ctx,
					`SELECT count(*) FROM workpool_work WHERE org_id = $1 AND args @> '{"tag": "dropped"}'`, orgA).Scan(&n))
				return n
			},
		},
		{
			name: "a stream chunk", as: agent, path: "/v1/runs/dropped/streams/out/chunks",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.Streams.Append(ctx, "dropped", "out", []byte("once"), opts...)
				return err
			},
			count: func(t *testing.T) int {
				info, err := directAgent.Streams.Info(ctx, "dropped", "out")
				require.NoError(t, err)
				return int(info.TailIndex + 1)
			},
		},
		{
			name: "a tool call", as: agent, path: "/v1/sessions/dropped/tool-calls",
			call: func(c *client.Client, opts ...client.CallOption) error {
				_, err := c.ToolApprovals.Request(ctx, "dropped", client.ToolCallRequest{AgentID: "a", ToolName: "shell"}, opts...)
				return err
			},
			count: func(t *testing.T) int {
				return len(collect(t, newClient(t, e.url, approver, nil).ToolApprovals.List(ctx, client.ToolApprovalListParams{SessionID: "dropped"})))
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			c := newClient(t, proxy.URL(), tc.as, rec)
			proxy.loseNextAnswer()
			var final *http.Response
			require.NoError(t, tc.call(c, client.WithResponse(func(r *http.Response) { final = r })))

			require.Equal(t, 1, tc.count(t), "one object however many attempts reached the server")
			attempts := rec.requests(http.MethodPost, tc.path)
			require.Len(t, attempts, 2, "the first answer was lost, the retry answered")
			require.Zero(t, attempts[0].status, "the first attempt got no answer")
			key := attempts[0].header.Get("Idempotency-Key")
			require.NotEmpty(t, key, "a key is generated when the caller gives none")
			require.Equal(t, key, attempts[1].header.Get("Idempotency-Key"), "the retry is the same call")
			require.Equal(t, "true", final.Header.Get("Idempotent-Replayed"), "the server answered the retry with its first answer")
		})
	}

	t.Run("without retries the lost answer is an error, though the server acted", func(t *testing.T) {
		rec := &recorder{}
		c := newClient(t, proxy.URL(), admin, rec, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		proxy.loseNextAnswer()
		_, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "lost", Scope: "s", Budget: 1})
		require.Error(t, err)
		require.Zero(t, client.StatusOf(err), "a transport error, not an answer")
		list := func() []client.Mandate {
			return collect(t, direct.Mandates.List(ctx, client.MandateListParams{AgentID: "lost"}))
		}
		require.Len(t, list(), 1, "the fault came after the server acted")

		// The caller's own retry under the same key is the same call.
		key := rec.requests(http.MethodPost, "/v1/mandates")[0].header.Get("Idempotency-Key")
		m, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "lost", Scope: "s", Budget: 1}, client.WithIdempotencyKey(key))
		require.NoError(t, err)
		require.Equal(t, list()[0].ID, m.ID)
		require.Len(t, list(), 1)
	})
}

// An answer cut inside its body — the status and headers came, the rest
// did not — is a lost answer too: the server may have acted, so a call it
// acts on once is retried under its key and answered with the first
// answer, and a GET is retried.
func TestAnAnswerCutInItsBodyIsRetriedAndActsOnce(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	direct := newClient(t, e.url, agent, nil)
	proxy := newFaultProxy(t, e.url[len("http://"):])
	rec := &recorder{}
	c := newClient(t, proxy.URL(), agent, rec)
	inBody := cut{pattern: []byte("\r\n\r\n"), offset: 5} // one byte of the body

	proxy.cutAnswers(inBody)
	var final *http.Response
	_, err := c.Streams.Append(ctx, "cut", "out", []byte("once"), client.WithResponse(func(r *http.Response) { final = r }))
	require.NoError(t, err)
	info, err := direct.Streams.Info(ctx, "cut", "out")
	require.NoError(t, err)
	require.EqualValues(t, 0, info.TailIndex, "one chunk appended")
	attempts := rec.requests(http.MethodPost, "/v1/runs/cut/streams/out/chunks")
	require.Len(t, attempts, 2, "the cut answer was retried")
	require.Equal(t, http.StatusCreated, attempts[0].status, "the first answer's status came")
	require.Equal(t, attempts[0].header.Get("Idempotency-Key"), attempts[1].header.Get("Idempotency-Key"))
	require.Equal(t, "true", final.Header.Get("Idempotent-Replayed"), "the retry got the first answer")

	proxy.cutAnswers(inBody)
	again, err := c.Streams.Info(ctx, "cut", "out")
	require.NoError(t, err)
	require.Equal(t, info, again)

	proxy.cutAnswers(inBody)
	once := newClient(t, proxy.URL(), agent, nil, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	_, err = once.Streams.Append(ctx, "cut", "out", []byte("twice"))
	require.ErrorContains(t, err, "POST /v1/runs/cut/streams/out/chunks", "the error names the call")
	require.Zero(t, client.StatusOf(err), "a transport error, not an answer")
}

// An error answer cut inside its body — a refused spend's 402, whose
// approval_id is in the body — is a lost answer too, not a final *Error
// short of its members: the call is retried under its key and answered the
// whole first answer, or, when it may not be retried, is maybe-applied.
func TestAnErrorAnswerCutInItsBodyIsALostAnswer(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	asApprover := newClient(t, e.url, approver, nil)
	rec := &recorder{}
	c := newClient(t, proxy.URL(), agent, rec)
	inBody := cut{pattern: []byte("\r\n\r\n"), offset: 4 + 10} // ten bytes of the body

	proxy.cutAnswers(inBody)
	var final *http.Response
	_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "cut", Scope: "s", Cost: 1}, client.WithResponse(func(r *http.Response) { final = r }))
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	var maybe *client.MaybeAppliedError
	require.False(t, errors.As(err, &maybe), "the retry got the server's answer for the key: %v", err)
	require.Equal(t, http.StatusPaymentRequired, apiErr.Status)
	approvals := collect(t, asApprover.MandateApprovals.List(ctx, client.MandateApprovalListParams{AgentID: "cut"}))
	require.Len(t, approvals, 1, "one refusal, one approval request")
	require.Equal(t, approvals[0].ID, apiErr.ApprovalID, "the whole answer")
	attempts := rec.requests(http.MethodPost, "/v1/mandates/spend")
	require.Len(t, attempts, 2, "the cut answer was retried")
	require.Equal(t, attempts[0].header.Get("Idempotency-Key"), attempts[1].header.Get("Idempotency-Key"))
	require.Equal(t, "true", final.Header.Get("Idempotent-Replayed"))

	proxy.cutAnswers(inBody)
	once := newClient(t, proxy.URL(), agent, nil, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	_, err = once.Mandates.Spend(ctx, client.SpendRequest{AgentID: "cut-once", Scope: "s", Cost: 1})
	require.ErrorAs(t, err, &maybe)
	require.NotEmpty(t, maybe.IdempotencyKey)
	require.Zero(t, client.StatusOf(err), "no answer, not a 402 short of its body: %v", err)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// A call whose attempt reached the server and lost its answer, and whose
// retries then failed otherwise (the server gone: a refused connection),
// says that it may have been applied, with the key to retry it under —
// not just the last attempt's "connection refused", which reads as "never
// sent" and would have the caller repeat it under a new key.
func TestACallWhoseAnswerWasLostSaysItMayHaveBeenApplied(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	direct := newClient(t, e.url, agent, nil)
	for _, tc := range []struct {
		name  string
		opts  []client.CallOption
		keyed bool
	}{
		{"with its Idempotency-Key", nil, true},
		{"without one", []client.CallOption{client.WithoutIdempotencyKey()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := newFaultProxy(t, e.url[len("http://"):])
			rec := &recorder{next: &closeAfterFirst{next: &http.Transport{DisableKeepAlives: true}, after: func() { proxy.ln.Close() }}}
			c := newClient(t, proxy.URL(), agent, nil, client.WithHTTPClient(&http.Client{Transport: rec}))
			run := "lost-" + strings.ReplaceAll(tc.name, " ", "-")
			proxy.loseNextAnswer()

			_, err := c.Streams.Append(ctx, run, "out", []byte("once"), tc.opts...)
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe)
			info, ierr := direct.Streams.Info(ctx, run, "out")
			require.NoError(t, ierr)
			require.EqualValues(t, 0, info.TailIndex, "it was applied, once")
			if !tc.keyed {
				require.Empty(t, maybe.IdempotencyKey)
				require.False(t, maybe.Repeatable)
				require.Contains(t, err.Error(), "do not repeat it blindly")
				require.Len(t, rec.all(), 1, "tried once: it may not be repeated")
				return
			}
			var opErr *net.OpError
			require.ErrorAs(t, err, &opErr, "the last attempt's error is still there: %v", err)
			sent := rec.all()[0].header.Get("Idempotency-Key")
			require.NotEmpty(t, sent)
			require.Equal(t, sent, maybe.IdempotencyKey)
			require.Contains(t, err.Error(), sent)
			var replayed *http.Response
			_, err = direct.Streams.Append(ctx, run, "out", []byte("once"), client.WithIdempotencyKey(maybe.IdempotencyKey),
				client.WithResponse(func(r *http.Response) { replayed = r }))
			require.NoError(t, err)
			require.Equal(t, "true", replayed.Header.Get("Idempotent-Replayed"), "retried under its key, it acts once")
		})
	}
	t.Run("a call safe to repeat says so", func(t *testing.T) {
		m, err := newClient(t, e.url, admin, nil).Mandates.Create(ctx, client.MandateCreate{AgentID: "patched", Scope: "s", Budget: 1})
		require.NoError(t, err)
		proxy := newFaultProxy(t, e.url[len("http://"):])
		proxy.loseNextAnswer()
		budget := int64(5)
		once := newClient(t, proxy.URL(), admin, nil, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		_, err = once.Mandates.Update(ctx, m.ID, client.MandateUpdate{Budget: &budget})
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe)
		require.True(t, maybe.Repeatable)
		require.Empty(t, maybe.IdempotencyKey)
		require.Contains(t, err.Error(), "safe to repeat")
		require.NotContains(t, err.Error(), "do not repeat")
	})
	notApplied := func(t *testing.T, err error, why string) {
		t.Helper()
		require.Error(t, err)
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "%s: %v", why, err)
	}
	t.Run("a request never written is not", func(t *testing.T) {
		_, err := newClient(t, "http://127.0.0.1:1", agent, nil).Streams.Append(ctx, "never", "out", []byte("x"))
		notApplied(t, err, "no connection")
		// (TLS to a plain-HTTP server: the handshake fails before a byte of the request)
		_, err = newClient(t, strings.Replace(e.url, "http://", "https://", 1), agent, nil).Streams.Append(ctx, "never", "out", []byte("x"))
		notApplied(t, err, "no TLS handshake")
	})
	t.Run("a GET is not", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		proxy.loseNextAnswer()
		_, err := newClient(t, proxy.URL(), agent, nil).Readyz(ctx)
		notApplied(t, err, "a probe acts on nothing")
	})
	t.Run("a retry answered for good by the server is not", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		proxy.loseNextAnswer()
		// (no mandate: the spend is refused, and its 402 kept under the key)
		_, err := newClient(t, proxy.URL(), agent, nil).Mandates.Spend(ctx, client.SpendRequest{AgentID: "no-mandate", Scope: "s", Cost: 1})
		notApplied(t, err, "the retry's 402 is the server's answer for the key")
		var apiErr *client.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusPaymentRequired, apiErr.Status)
		require.NotEmpty(t, apiErr.ApprovalID)
	})
	t.Run("a request written whose answer the caller's deadline cut is", func(t *testing.T) {
		// (a server that takes the request and never answers)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(io.Discard, conn) }()
			}
		}()
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err = newClient(t, "http://"+ln.Addr().String(), agent, nil).Streams.Append(short, "deadline", "out", []byte("x"))
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe)
		require.NotEmpty(t, maybe.IdempotencyKey)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// A retry after a lost answer that is refused before the server looks at
// its Idempotency-Key — a token expired or rotated since the attempt that
// acted (401, 403), the org's rate limit (429) — says nothing of that
// attempt: the call may have been applied (here the spend went through),
// so it is a *MaybeAppliedError wrapping the refusal, not a plain *Error.
func TestARefusalBeforeTheKeyAfterALostAnswerIsStillMaybeApplied(t *testing.T) {
	ctx := context.Background()
	// spendThroughProxy spends 3 of agentID's new mandate, the answer of the
	// first attempt lost and the retries sent with the token retryAs.
	spendThroughProxy := func(t *testing.T, e *engine, agentID, retryAs string, opts ...client.Option) (*client.Client, error) {
		t.Helper()
		direct := newClient(t, e.url, admin, nil)
		_, err := direct.Mandates.Create(ctx, client.MandateCreate{AgentID: agentID, Scope: "s", Budget: 10})
		require.NoError(t, err)
		proxy := newFaultProxy(t, e.url[len("http://"):])
		asked := 0
		c := newClient(t, proxy.URL(), agent, nil, append([]client.Option{client.WithTokenFunc(func(context.Context) (string, error) {
			asked++
			if asked == 1 {
				return agent.token(t), nil
			}
			return retryAs, nil
		})}, opts...)...)
		proxy.loseNextAnswer()
		_, err = c.Mandates.Spend(ctx, client.SpendRequest{AgentID: agentID, Scope: "s", Cost: 3})
		return direct, err
	}
	requireMaybeApplied := func(t *testing.T, direct *client.Client, agentID string, err error, status int) {
		t.Helper()
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe)
		require.NotEmpty(t, maybe.IdempotencyKey)
		require.Equal(t, status, client.StatusOf(err), "the last answer is still there: %v", err)
		m := collect(t, direct.Mandates.List(ctx, client.MandateListParams{AgentID: agentID}))
		require.Len(t, m, 1)
		require.EqualValues(t, 3, m[0].Spent, "the first attempt spent")
	}
	e := startEngine(t)
	t.Run("a 401: the retry's token is refused", func(t *testing.T) {
		bad, err := api.SignToken([]byte("another-secret-of-at-least-32-bytes!!"), api.TokenSpec{OrgID: orgA, Sub: "runtime", Roles: agent.roles, TTL: time.Hour})
		require.NoError(t, err)
		direct, err := spendThroughProxy(t, e, "expired", bad)
		requireMaybeApplied(t, direct, "expired", err, http.StatusUnauthorized)
		require.True(t, client.IsUnauthorized(err))
	})
	t.Run("a 403: the retry's token lacks the role", func(t *testing.T) {
		direct, err := spendThroughProxy(t, e, "unroled", approver.token(t))
		requireMaybeApplied(t, direct, "unroled", err, http.StatusForbidden)
	})
	t.Run("a 429 with a Retry-After longer than the policy waits", func(t *testing.T) {
		// (one request every 2 s: the spend takes the one token the org has)
		e := startEngine(t, func(c *service.Config) { c.API.OrgRate, c.API.OrgBurst = 0.5, 2 })
		direct, err := spendThroughProxy(t, e, "limited", agent.token(t), client.WithRetry(client.RetryPolicy{MaxAttempts: 4,
			InitialBackoff: 10 * time.Millisecond, MaxRetryAfter: 100 * time.Millisecond}))
		requireMaybeApplied(t, direct, "limited", err, http.StatusTooManyRequests)
	})
}

// closeAfterFirst runs after once its first round trip is over.
type closeAfterFirst struct {
	next  http.RoundTripper
	after func()
	once  sync.Once
}

func (c *closeAfterFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := c.next.RoundTrip(r)
	c.once.Do(c.after)
	return res, err
}

// Only calls that may be repeated are: a GET, a POST carrying an
// Idempotency-Key. A POST without one, or one whose repeat would meet its
// own effect, is tried once. Attempts are bounded.
func TestRetriesRepeatOnlyCallsThatMayBeRepeated(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	direct := newClient(t, e.url, admin, nil)
	mandates := func(agentID string) int {
		return len(collect(t, direct.Mandates.List(ctx, client.MandateListParams{AgentID: agentID})))
	}
	cases := []struct {
		name         string
		unavailable  int // 503s the proxy answers before the API does
		as           who
		method, path string
		call         func(c *client.Client) error
		attempts     int
		wantStatus   int // 0: success
	}{
		{
			name: "a GET is retried", unavailable: 2, as: agent, method: http.MethodGet, path: "/v1/whoami", attempts: 3,
			call: func(c *client.Client) error { _, err := c.Whoami(ctx); return err },
		},
		{
			name: "a create with a key is retried and makes one object", unavailable: 2, as: admin, method: http.MethodPost, path: "/v1/mandates", attempts: 3,
			call: func(c *client.Client) error {
				_, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "keyed", Scope: "s", Budget: 1})
				if err == nil && mandates("keyed") != 1 {
					t.Errorf("%d mandates, want 1", mandates("keyed"))
				}
				return err
			},
		},
		{
			name: "a create without a key is not retried", unavailable: 1, as: admin, method: http.MethodPost, path: "/v1/mandates", attempts: 1,
			wantStatus: http.StatusServiceUnavailable,
			call: func(c *client.Client) error {
				_, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "unkeyed", Scope: "s", Budget: 1}, client.WithoutIdempotencyKey())
				return err
			},
		},
		{
			name: "a redelivery is not retried", unavailable: 1, as: admin, method: http.MethodPost, path: "/v1/wakeups/0190f0f0-0000-7000-8000-000000000000/redeliver", attempts: 1,
			wantStatus: http.StatusServiceUnavailable,
			call: func(c *client.Client) error {
				_, err := c.Wakeups.Redeliver(ctx, "0190f0f0-0000-7000-8000-000000000000")
				return err
			},
		},
		{
			name: "attempts are bounded", unavailable: 10, as: agent, method: http.MethodGet, path: "/v1/whoami", attempts: 4,
			wantStatus: http.StatusServiceUnavailable,
			call:       func(c *client.Client) error { _, err := c.Whoami(ctx); return err },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			c := newClient(t, proxy.URL(), tc.as, rec)
			proxy.answerUnavailable(tc.unavailable)
			defer proxy.answerUnavailable(0)
			err := tc.call(c)
			require.Equal(t, tc.wantStatus, client.StatusOf(err), "error: %v", err)
			require.Len(t, rec.requests(tc.method, tc.path), tc.attempts)
		})
	}
	require.Zero(t, mandates("unkeyed"), "the refused create never reached the API")
}

// A 429 is retried after its Retry-After; one longer than the policy
// waits for is returned at once, carrying it, and is the call's final
// response WithResponse sees.
func TestA429IsRetriedAfterItsRetryAfter(t *testing.T) {
	// One request every 2 s: the calls below come well within 2 s of the
	// first, however slow the machine.
	e := startEngine(t, func(c *service.Config) { c.API.OrgRate, c.API.OrgBurst = 0.5, 1 })
	ctx := context.Background()
	rec := &recorder{}
	impatient := newClient(t, e.url, agent, rec, client.WithRetry(client.RetryPolicy{MaxRetryAfter: 100 * time.Millisecond}))
	patient := newClient(t, e.url, agent, rec)

	_, err := impatient.Whoami(ctx)
	require.NoError(t, err)
	var final *http.Response
	_, err = impatient.Whoami(ctx, client.WithResponse(func(r *http.Response) { final = r }))
	var limited *client.Error
	require.ErrorAs(t, err, &limited)
	require.True(t, client.IsRateLimited(err))
	require.Contains(t, []time.Duration{time.Second, 2 * time.Second}, limited.RetryAfter, "whole seconds until the next token")
	require.NotNil(t, final, "WithResponse saw the 429")
	require.Equal(t, http.StatusTooManyRequests, final.StatusCode)
	require.Equal(t, limited.RequestID, final.Header.Get("X-Request-Id"))
	require.Len(t, rec.requests(http.MethodGet, "/v1/whoami"), 2, "not retried: the wait is longer than the policy allows")

	_, err = patient.Whoami(ctx)
	require.NoError(t, err)
	statuses := ids(rec.requests(http.MethodGet, "/v1/whoami"), func(r recorded) int { return r.status })
	require.Equal(t, []int{http.StatusOK, http.StatusTooManyRequests, http.StatusTooManyRequests, http.StatusOK}, statuses)
}

// The token function is asked before every attempt, so a retry carries a
// rotated token; when it fails, nothing is sent.
func TestATokenFuncIsAskedBeforeEveryAttempt(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	tokens := []string{agent.token(t), who{org: orgB, sub: "rotated", roles: agent.roles}.token(t)}
	asked := 0
	rec := &recorder{}
	c := newClient(t, proxy.URL(), agent, rec, client.WithUserAgent("test-agent/2"), client.WithTokenFunc(func(context.Context) (string, error) {
		if asked == len(tokens) {
			return "", errors.New("the token source is down")
		}
		asked++
		return tokens[asked-1], nil
	}))

	proxy.answerUnavailable(1)
	me, err := c.Whoami(ctx)
	require.NoError(t, err)
	require.Equal(t, orgB, me.OrgID, "the retry carried the second token")
	for _, r := range rec.requests(http.MethodGet, "/v1/whoami") {
		require.Equal(t, "test-agent/2", r.header.Get("User-Agent"))
	}

	_, err = c.Whoami(ctx)
	require.ErrorContains(t, err, "the token source is down")
	require.Len(t, rec.requests(http.MethodGet, "/v1/whoami"), 2, "nothing sent without a token")
}

// A Retry-After that ends past the call's deadline is not waited for: the
// answer is returned at once, the typed *Error with its RetryAfter — not a
// deadline error after a wait that could not end in a retry.
func TestARetryAfterPastTheDeadlineReturnsTheAnswerAtOnce(t *testing.T) {
	// One request every 2 s: the second call comes well within 2 s of the
	// first, however slow the machine, and is told to wait a second or two.
	e := startEngine(t, func(c *service.Config) { c.API.OrgRate, c.API.OrgBurst = 0.5, 1 })
	rec := &recorder{}
	c := newClient(t, e.url, agent, rec) // (MaxRetryAfter: the default 30 s)
	_, err := c.Whoami(context.Background())
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var final *http.Response
	started := time.Now()
	_, err = c.Whoami(ctx, client.WithResponse(func(r *http.Response) { final = r }))
	var limited *client.Error
	require.ErrorAs(t, err, &limited)
	require.True(t, client.IsRateLimited(err))
	require.GreaterOrEqual(t, limited.RetryAfter, time.Second)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the answer, not the wait's end: %v", err)
	require.NoError(t, ctx.Err(), "returned before the deadline")
	require.Less(t, time.Since(started), 500*time.Millisecond)
	require.NotNil(t, final, "WithResponse saw the 429")
	require.Equal(t, http.StatusTooManyRequests, final.StatusCode)
	require.Len(t, rec.requests(http.MethodGet, "/v1/whoami"), 2, "not retried")
}

// A delete whose answer was lost is retried, and the retry meets the
// first attempt's effect: a 404. The call succeeds — the object is gone,
// as asked. A 404 to a delete's first attempt stays an error.
func TestADeleteWhoseAnswerWasLostSucceedsOnTheRetrysNotFound(t *testing.T) {
	e := startEngine(t, allowLocalHTTP)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	direct := newClient(t, e.url, admin, nil)
	deletes := []struct {
		name        string
		path        string
		create      func() error
		del         func(c *client.Client) error
		stillExists func() error
	}{
		{
			name: "a webhook", path: "/v1/approvals/webhooks/ops",
			create: func() error {
				_, err := direct.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: "http://127.0.0.1:9/hook", Format: "json"})
				return err
			},
			del:         func(c *client.Client) error { return c.ApprovalWebhooks.Delete(ctx, "ops") },
			stillExists: func() error { _, err := direct.ApprovalWebhooks.Get(ctx, "ops"); return err },
		},
		{
			name: "a tool policy", path: "/v1/agents/agent-1/tool-policies/git",
			create: func() error {
				_, err := direct.ToolPolicies.Put(ctx, "agent-1", "git", client.ToolPolicyRequest{Approval: "always"})
				return err
			},
			del: func(c *client.Client) error { return c.ToolPolicies.Delete(ctx, "agent-1", "git", nil) },
			stillExists: func() error {
				for p, err := range direct.ToolPolicies.List(ctx, "agent-1", client.PageParams{}) {
					if err != nil || p.ToolName == "git" {
						return err
					}
				}
				return &client.Error{Status: http.StatusNotFound}
			},
		},
	}
	for _, tc := range deletes {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.create())
			require.NoError(t, tc.stillExists())
			rec := &recorder{}
			c := newClient(t, proxy.URL(), admin, rec)

			proxy.loseNextAnswer()
			require.NoError(t, tc.del(c), "the first attempt deleted it")
			require.True(t, client.IsNotFound(tc.stillExists()), "deleted")
			statuses := ids(rec.requests(http.MethodDelete, tc.path), func(r recorded) int { return r.status })
			require.Equal(t, []int{0, http.StatusNotFound}, statuses, "the answer lost, then the retry's 404")

			err := tc.del(c)
			require.True(t, client.IsNotFound(err), "nothing to delete: %v", err)
			var maybe *client.MaybeAppliedError
			require.False(t, errors.As(err, &maybe))
			require.Len(t, rec.requests(http.MethodDelete, tc.path), 3, "a first attempt's 404 is not retried")
		})
	}
}
