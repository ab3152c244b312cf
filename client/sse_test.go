package client_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

func chunkText(i int) string { return fmt.Sprintf("chunk-%02d", i) }

// inside cuts an answer in the middle of chunk i's data line: the event
// is half received.
func inside(i int) cut {
	line := "data: " + base64.StdEncoding.EncodeToString([]byte(chunkText(i)))
	return cut{pattern: []byte(line), offset: len(line) / 2}
}

// between cuts an answer right after the blank line that ends chunk i−1's
// event.
func between(i int) cut { return cut{pattern: fmt.Appendf(nil, "\n\nid: %d\n", i), offset: 2} }

// The live tail resumes a cut connection with Last-Event-ID from the last
// chunk it yielded: every chunk comes once, in order, wherever the cut.
func TestTailResumesAfterACutConnectionWithoutLossOrDuplicates(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	writer := newClient(t, e.url, agent, nil)
	const stored, total = 10, 20 // chunks before the tail starts, and in all

	cases := []struct {
		name string
		cuts []cut
		idle time.Duration
		// lastEventIDs are the Last-Event-ID headers of the connections.
		lastEventIDs []string
	}{
		{name: "between two events of the replay", cuts: []cut{between(5)}, lastEventIDs: []string{"", "4"}},
		{name: "inside an event of the replay", cuts: []cut{inside(5)}, lastEventIDs: []string{"", "4"}},
		{name: "inside an event pushed live", cuts: []cut{inside(15)}, lastEventIDs: []string{"", "14"}},
		{name: "before the end event", cuts: []cut{{pattern: []byte("event: end")}}, lastEventIDs: []string{"", "19"}},
		{name: "three times", cuts: []cut{inside(3), between(8), inside(15)}, lastEventIDs: []string{"", "2", "7", "14"}},
		{
			name: "a connection gone silent is taken for dead", idle: 200 * time.Millisecond,
			cuts: []cut{{pattern: inside(6).pattern, offset: inside(6).offset, stall: true}}, lastEventIDs: []string{"", "5"},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run := fmt.Sprint("run-", i)
			for i := range stored {
				_, err := writer.Streams.Append(ctx, run, "out", []byte(chunkText(i)))
				require.NoError(t, err)
			}
			rec := &recorder{}
			reader := newClient(t, proxy.URL(), approver, rec)
			proxy.cutAnswers(tc.cuts...)

			var got []string
			var indexes []int64
			for ch, err := range reader.Streams.Tail(ctx, run, "out", client.TailParams{IdleTimeout: tc.idle}) {
				require.NoError(t, err)
				got, indexes = append(got, string(ch.Data)), append(indexes, ch.Index)
				if ch.Index == stored-1 { // the replay is done: the rest comes live
					for i := stored; i < total; i++ {
						_, err := writer.Streams.Append(ctx, run, "out", []byte(chunkText(i)))
						require.NoError(t, err)
					}
					require.NoError(t, writer.Streams.Close(ctx, run, "out"))
				}
			}

			var want []string
			var wantIndexes []int64
			for i := range total {
				want, wantIndexes = append(want, chunkText(i)), append(wantIndexes, int64(i))
			}
			require.Equal(t, want, got)
			require.Equal(t, wantIndexes, indexes)
			conns := rec.requests(http.MethodGet, "/v1/runs/"+run+"/streams/out/sse")
			require.Equal(t, tc.lastEventIDs, ids(conns, func(r recorded) string { return r.header.Get("Last-Event-ID") }))
		})
	}
}

// A quiet stream behind a proxy that ends connections after a while is
// followed on: a connection that stayed open a while counts as healthy,
// though no event came on it, and ends the outage. A server that answers
// and hangs up at once, again and again, is an outage: given up on after
// the reconnect policy's MaxOutage, when it has one.
func TestTailFollowsAQuietStreamWhoseConnectionsAreCutAgainAndAgain(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	writer := newClient(t, e.url, agent, nil)
	_, err := writer.Streams.Append(ctx, "quiet", "out", []byte("first"))
	require.NoError(t, err)
	rec := &recorder{}
	reader := newClient(t, proxy.URL(), approver, rec)
	// (the proxy keeps the connection open and silent; the client's idle
	// timeout, past a second, takes it for dead)
	silentAfterHeaders := cut{pattern: []byte("\r\n\r\n"), offset: 4, stall: true}
	attempts := client.DefaultRetryPolicy.MaxAttempts
	var got []string
	done := make(chan struct{})
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for ch, err := range reader.Streams.Tail(tctx, "quiet", "out", client.TailParams{IdleTimeout: 1200 * time.Millisecond}) {
		require.NoError(t, err)
		got = append(got, string(ch.Data))
		if ch.Index == 0 {
			// (this connection ends at its next keep-alive; the next ones
			// stay open and silent)
			cuts := []cut{{pattern: []byte(": keep-alive")}}
			for range attempts + 1 {
				cuts = append(cuts, silentAfterHeaders)
			}
			proxy.cutAnswers(cuts...)
			// (the tail reconnects only while this body is not running)
			go func() {
				defer close(done)
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if _, pending := proxy.nextCut(); !pending {
						break
					}
				}
				if _, err := writer.Streams.Append(ctx, "quiet", "out", []byte("second")); err == nil {
					_ = writer.Streams.Close(ctx, "quiet", "out")
				}
			}()
		}
	}
	<-done
	_, pending := proxy.nextCut()
	require.False(t, pending, "every cut was made")
	require.Equal(t, []string{"first", "second"}, got)
	require.Greater(t, len(rec.requests(http.MethodGet, "/v1/runs/quiet/streams/out/sse")), attempts+2)

	t.Run("a server that hangs up at once is given up on after MaxOutage", func(t *testing.T) {
		hangUp := cut{pattern: []byte("\r\n\r\n"), offset: 4}
		cuts := make([]cut, 1000)
		for i := range cuts {
			cuts[i] = hangUp
		}
		proxy.cutAnswers(cuts...)
		defer proxy.clearCuts()
		rec := &recorder{}
		reader := newClient(t, proxy.URL(), approver, rec,
			client.WithReconnect(client.ReconnectPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxOutage: 500 * time.Millisecond}))
		var last error
		started := time.Now()
		for _, err := range reader.Streams.Tail(tctx, "open", "out", client.TailParams{}) {
			last = err
		}
		require.ErrorContains(t, last, "no healthy connection for")
		require.ErrorContains(t, last, "(ReconnectPolicy.MaxOutage 500ms): ")
		require.ErrorContains(t, last, "connection attempts failed in a row")
		require.ErrorIs(t, last, io.ErrUnexpectedEOF, "the last attempt's error")
		require.Less(t, time.Since(started), 5*time.Second)
		require.Greater(t, len(rec.requests(http.MethodGet, "/v1/runs/open/streams/out/sse")), attempts, "more attempts than a call's")
	})
}

// A tail gives up at once on an answer retrying cannot change, and
// connects again after one it can. WithResponse sees every connection's
// answer.
func TestTailRetriesOnlyWhatMaySucceed(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	proxy := newFaultProxy(t, e.url[len("http://"):])
	writer := newClient(t, e.url, agent, nil)
	_, err := writer.Streams.AppendBatch(ctx, "run", "out", [][]byte{[]byte("a"), []byte("b")})
	require.NoError(t, err)
	require.NoError(t, writer.Streams.Close(ctx, "run", "out"))

	cases := []struct {
		name        string
		as          who
		unavailable int
		start       int64
		want        []string
		wantStatus  int
		// answers are the connections' statuses, as WithResponse saw them.
		answers []int
	}{
		{name: "a load balancer's 503 is retried", as: approver, unavailable: 2, want: []string{"a", "b"},
			answers: []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK}},
		{name: "a 403 is not", as: admin, wantStatus: http.StatusForbidden, answers: []int{http.StatusForbidden}},
		{name: "a negative start index is the server's 400, not a gap", as: approver, start: -1,
			wantStatus: http.StatusBadRequest, answers: []int{http.StatusBadRequest}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			reader := newClient(t, proxy.URL(), tc.as, rec)
			proxy.answerUnavailable(tc.unavailable)
			var got []string
			var errs []error
			var answers []int
			seen := client.WithResponse(func(r *http.Response) {
				answers = append(answers, r.StatusCode)
				require.Equal(t, http.NoBody, r.Body, "the events are the iteration's")
			})
			for ch, err := range reader.Streams.Tail(ctx, "run", "out", client.TailParams{StartIndex: tc.start}, seen) {
				if err != nil {
					errs = append(errs, err)
					continue
				}
				got = append(got, string(ch.Data))
			}
			require.Equal(t, tc.want, got)
			if tc.wantStatus == 0 {
				require.Empty(t, errs)
			} else {
				require.Len(t, errs, 1, "an error ends the iteration")
				require.Equal(t, tc.wantStatus, client.StatusOf(errs[0]))
				require.NotErrorIs(t, errs[0], client.ErrStreamGap)
			}
			require.Len(t, rec.requests(http.MethodGet, "/v1/runs/run/streams/out/sse"), len(tc.answers))
			require.Equal(t, tc.answers, answers)
		})
	}
}

// A server (or a proxy) that takes the request and never answers is taken
// for dead after the idle timeout, as one gone silent mid-stream is: the
// reader connects again, and again — each attempt bounded by the idle
// timeout instead of hanging on the headers until the context ends — and
// gives up after the reconnect policy's MaxOutage.
func TestAStreamWhoseHeadersNeverComeIsTakenForDeadAfterTheIdleTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int32
	conns := make(chan net.Conn, 16)
	// The accept loop owns conns: it closes it once the listener is
	// closed, so no send can meet a closed channel; the cleanup drains it
	// meanwhile (a full buffer does not hold the loop back).
	t.Cleanup(func() {
		ln.Close()
		for c := range conns {
			c.Close()
		}
	})
	go func() {
		defer close(conns)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns <- conn // (read nothing, answer nothing)
		}
	}()
	c := newClient(t, "http://"+ln.Addr().String(), approver, nil,
		client.WithReconnect(client.ReconnectPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxOutage: time.Second}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	idle := 200 * time.Millisecond
	for name, follow := range map[string]func() (last error){
		"a tail": func() (last error) {
			for _, err := range c.Streams.Tail(ctx, "run", "out", client.TailParams{IdleTimeout: idle}) {
				last = err
			}
			return last
		},
		"approval events": func() (last error) {
			for _, err := range c.Approvals.Events(ctx, client.ApprovalEventsParams{IdleTimeout: idle}) {
				last = err
			}
			return last
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := accepted.Load()
			err := follow()
			require.ErrorContains(t, err, "no healthy connection for")
			require.ErrorContains(t, err, "connection attempts failed in a row")
			require.ErrorContains(t, err, "no answer within the idle timeout")
			require.NoError(t, ctx.Err(), "given up on before the context ended")
			// (a second of 200 ms waits for headers, and short backoffs)
			require.GreaterOrEqual(t, accepted.Load()-before, int32(3), "one connection per attempt")
		})
	}
}

// A stream's retry field sets how long a reader waits before it
// reconnects: a server (or a gateway in front of it) that asks for 1.5 s
// is not called again at once. Found by review.
func TestAReaderWaitsTheReconnectionTimeTheStreamSet(t *testing.T) {
	var mu sync.Mutex
	var times []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		n := len(times)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if n == 1 {
			fmt.Fprintf(w, "retry: 1500\nid: 0\ndata: AA==\n\n")
		} else {
			fmt.Fprintf(w, "id: 1\ndata: AA==\n\nevent: end\ndata: {\"tail_index\": 1}\n\n")
		}
		w.(http.Flusher).Flush()
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, client.WithToken("x"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for _, err := range c.Streams.Tail(ctx, "run", "s", client.TailParams{}) {
		require.NoError(t, err)
		n++
	}
	require.Equal(t, 2, n)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, times, 2)
	require.GreaterOrEqual(t, times[1].Sub(times[0]), 1500*time.Millisecond, "reconnected before the stream's retry: 1500")
}
