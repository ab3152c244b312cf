package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A live reader rides out a restart of the service — its connection cut,
// new ones refused for two seconds, far longer than a call's retries last
// (newClient's: 4 attempts, 10 to 50 ms apart) — and goes on where it
// stood: a tail yields every chunk once, approval events every event.
func TestALiveReaderRidesOutARestartLongerThanACallsRetries(t *testing.T) {
	e := startEngine(t)
	const down = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	writer := newClient(t, e.url, agent, nil)

	t.Run("a tail", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		rec := &recorder{}
		reader := newClient(t, proxy.URL(), approver, rec)
		_, err := writer.Streams.Append(ctx, "restarted", "out", []byte("chunk-0"))
		require.NoError(t, err)
		var got []string
		started := time.Now()
		for ch, err := range reader.Streams.Tail(ctx, "restarted", "out", client.TailParams{}) {
			require.NoError(t, err)
			got = append(got, string(ch.Data))
			if ch.Index == 0 {
				proxy.restart(t, down)
				for i := 1; i < 5; i++ {
					_, err := writer.Streams.Append(ctx, "restarted", "out", []byte(fmt.Sprint("chunk-", i)))
					require.NoError(t, err)
				}
				require.NoError(t, writer.Streams.Close(ctx, "restarted", "out"))
			}
		}
		require.Equal(t, []string{"chunk-0", "chunk-1", "chunk-2", "chunk-3", "chunk-4"}, got)
		require.GreaterOrEqual(t, time.Since(started), down)
		conns := rec.requests(http.MethodGet, "/v1/runs/restarted/streams/out/sse")
		require.Greater(t, len(conns), 1+client.DefaultRetryPolicy.MaxAttempts, "more attempts than a call makes")
	})

	t.Run("approval events", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		reader := newClient(t, proxy.URL(), approver, nil)
		refuse := func(agentID string) string {
			_, err := writer.Mandates.Spend(ctx, client.SpendRequest{AgentID: agentID, Scope: "s", Cost: 1})
			require.True(t, client.IsSpendRefused(err), "%v", err)
			var apiErr *client.Error
			require.ErrorAs(t, err, &apiErr)
			return apiErr.ApprovalID
		}
		var after int64
		want := []string{refuse("first")}
		var got []string
		for ev, err := range reader.Approvals.Events(ctx, client.ApprovalEventsParams{After: &after}) {
			require.NoError(t, err)
			got = append(got, ev.ApprovalID)
			if len(got) == 1 {
				proxy.restart(t, down)
				want = append(want, refuse("during"))
			}
			if len(got) == len(want) {
				break
			}
		}
		require.Equal(t, want, got)
	})
}

// Resuming a live reader does not depend on the calls' retry policy: with
// retries disabled (MaxAttempts 1), a tail cut again and again after
// healthy connections goes on. The failures the error counts are the
// attempts since the last healthy connection — not that one.
func TestALiveReaderResumesWithCallRetriesDisabled(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	writer := newClient(t, e.url, agent, nil)
	noRetries := client.WithRetry(client.RetryPolicy{MaxAttempts: 1})

	t.Run("cut three times", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		var want []string
		for i := range 20 {
			want = append(want, chunkText(i))
			_, err := writer.Streams.Append(ctx, "cut", "out", []byte(chunkText(i)))
			require.NoError(t, err)
		}
		require.NoError(t, writer.Streams.Close(ctx, "cut", "out"))
		rec := &recorder{}
		reader := newClient(t, proxy.URL(), approver, rec, noRetries)
		proxy.cutAnswers(inside(3), between(8), inside(15))
		var got []string
		for ch, err := range reader.Streams.Tail(ctx, "cut", "out", client.TailParams{}) {
			require.NoError(t, err)
			got = append(got, string(ch.Data))
		}
		require.Equal(t, want, got)
		require.Len(t, rec.requests(http.MethodGet, "/v1/runs/cut/streams/out/sse"), 4)
	})

	t.Run("the error counts the failures after the healthy connection", func(t *testing.T) {
		proxy := newFaultProxy(t, e.url[len("http://"):])
		_, err := writer.Streams.Append(ctx, "gone", "out", []byte("only"))
		require.NoError(t, err)
		rec := &recorder{}
		reader := newClient(t, proxy.URL(), approver, rec, noRetries,
			client.WithReconnect(client.ReconnectPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxOutage: 700 * time.Millisecond}))
		var got []string
		var last error
		for ch, err := range reader.Streams.Tail(ctx, "gone", "out", client.TailParams{}) {
			if err != nil {
				last = err
				continue
			}
			got = append(got, string(ch.Data))
			proxy.restart(t, time.Hour) // (down for good)
		}
		require.Equal(t, []string{"only"}, got)
		require.Error(t, last)
		m := regexp.MustCompile(`no healthy connection for \S+ \(ReconnectPolicy\.MaxOutage 700ms\): (\d+) connection attempts failed in a row: `).FindStringSubmatch(last.Error())
		require.NotNil(t, m, "%v", last)
		failed, _ := strconv.Atoi(m[1])
		conns := rec.requests(http.MethodGet, "/v1/runs/gone/streams/out/sse")
		require.Greater(t, failed, 1)
		require.Equal(t, len(conns)-1, failed, "every attempt but the healthy first one")
	})
}

// sseServer is a fake API whose answers to an event stream's connections
// are given in turn (the API cannot be made to answer a 503 with a
// Retry-After, a 410 or a redirect): each connection's time is recorded.
type sseServer struct {
	url     string
	mu      sync.Mutex
	answers []func(w http.ResponseWriter)
	at      []time.Time
}

func newSSEServer(t *testing.T, answers ...func(w http.ResponseWriter)) *sseServer {
	s := &sseServer{answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		i := len(s.at)
		s.at = append(s.at, time.Now())
		s.mu.Unlock()
		if i >= len(s.answers) {
			http.Error(w, "no more answers", http.StatusGone)
			return
		}
		s.answers[i](w)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *sseServer) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

func status(code int, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"title":"`+http.StatusText(code)+`","status":`+strconv.Itoa(code)+`}`)
	}
}

// oneChunkAndEnd is a whole stream of one chunk, "a".
func oneChunkAndEnd(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "id: 0\ndata: YQ==\n\nevent: end\ndata: {\"tail_index\": 0}\n\n")
}

// A 503's or 429's Retry-After is waited before the next connection —
// unless it ends past the context's deadline: the answer then ends the
// iteration at once.
func TestALiveReaderWaitsTheRetryAfterOfA503OrA429(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := newSSEServer(t, status(code, "1"), oneChunkAndEnd)
			c := newClient(t, srv.url, approver, nil)
			var got []string
			for ch, err := range c.Streams.Tail(context.Background(), "run", "out", client.TailParams{}) {
				require.NoError(t, err)
				got = append(got, string(ch.Data))
			}
			require.Equal(t, []string{"a"}, got)
			at := srv.times()
			require.Len(t, at, 2)
			require.GreaterOrEqual(t, at[1].Sub(at[0]), time.Second, "the Retry-After, not the 100 ms backoff")
		})
	}

	t.Run("past the deadline", func(t *testing.T) {
		srv := newSSEServer(t, status(http.StatusServiceUnavailable, "5"), oneChunkAndEnd)
		c := newClient(t, srv.url, approver, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		started := time.Now()
		var last error
		for _, err := range c.Streams.Tail(ctx, "run", "out", client.TailParams{}) {
			last = err
		}
		require.Equal(t, http.StatusServiceUnavailable, client.StatusOf(last), "%v", last)
		require.NotErrorIs(t, last, context.DeadlineExceeded)
		require.ErrorContains(t, last, "Retry-After (5s) ends past the context's deadline")
		require.Less(t, time.Since(started), time.Second)
		require.Len(t, srv.times(), 1)
	})
}

// An answer retrying cannot change ends a live reader at once, as a
// redirect (not followed) does: one connection, however long the context.
func TestALiveReaderGivesUpAtOnceOnAnAnswerRetryingCannotChange(t *testing.T) {
	cases := []struct {
		name   string
		answer func(w http.ResponseWriter)
		status int
	}{
		{"a 400", status(http.StatusBadRequest, ""), http.StatusBadRequest},
		{"a 401", status(http.StatusUnauthorized, ""), http.StatusUnauthorized},
		{"a 403", status(http.StatusForbidden, ""), http.StatusForbidden},
		{"a 404", status(http.StatusNotFound, ""), http.StatusNotFound},
		{"a 410", status(http.StatusGone, ""), http.StatusGone},
		{"a redirect", func(w http.ResponseWriter) {
			w.Header().Set("Location", "http://elsewhere.invalid/")
			w.WriteHeader(http.StatusFound)
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newSSEServer(t, tc.answer, oneChunkAndEnd)
			c := newClient(t, srv.url, approver, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var errs []error
			for _, err := range c.Approvals.Events(ctx, client.ApprovalEventsParams{}) {
				errs = append(errs, err)
			}
			require.Len(t, errs, 1)
			require.Equal(t, tc.status, client.StatusOf(errs[0]), "%v", errs[0])
			if tc.status == 0 {
				require.ErrorContains(t, errs[0], "answered 302 Found redirecting to \"http://elsewhere.invalid/\", not followed")
			}
			require.Len(t, srv.times(), 1)
			require.NoError(t, ctx.Err())
		})
	}
}
