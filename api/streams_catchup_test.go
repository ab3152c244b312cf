package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/streams"
)

// smallBufListener gives each accepted connection a small kernel send
// buffer, so that what the server writes reaches the client at the pace
// the client reads (as over a real network), not all at once into the
// loopback's megabytes of buffers.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// openSlowly serves s on small send buffers and opens path (an SSE route)
// as tok with a small receive buffer: a stream that then reaches the
// client at the pace it reads. extra are request headers, name and value.
func openSlowly(t *testing.T, s *Server, path, tok string, extra ...string) io.ReadCloser {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, smallBufListener{ln}) }()
	t.Cleanup(func() { cancel(); <-done })
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(16 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Body.Close() })
	require.Equal(t, http.StatusOK, res.StatusCode)
	return res.Body
}

// readSteadily reads body to its end in 4 KiB reads, pausing 20–30 ms
// every 8 of them (about 1–1.5 MB/s), calling after with what it read so
// far after each read; it returns what it read and the error that ended it.
func readSteadily(body io.Reader, pause time.Duration, after func(got string)) (string, error) {
	rd := bufio.NewReaderSize(body, 4<<10)
	buf := make([]byte, 4<<10)
	var got strings.Builder
	for i := 0; ; i++ {
		k, err := rd.Read(buf)
		got.Write(buf[:k])
		if err != nil {
			return got.String(), err
		}
		if after != nil {
			after(got.String())
		}
		if i%8 == 7 {
			time.Sleep(pause)
		}
	}
}

// appendClosedStream appends n chunks of 64 KiB (87 KiB of base64 in an
// event) to run-1's stream "big" and closes it.
func appendClosedStream(t *testing.T, s *Server, tok string, n int) {
	t.Helper()
	chunk := make([]byte, 64<<10)
	for i := range n {
		chunk[0] = byte(i)
		r := do(t, s.Handler(), http.MethodPost, streamBase+"big/chunks", tok, chunk, "Content-Type", "application/octet-stream")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	r := do(t, s.Handler(), http.MethodPost, streamBase+"big/close", tok, nil)
	require.Equal(t, http.StatusNoContent, r.Status)
}

// REVEILLE_WRITE_TIMEOUT cuts off "a client that stops reading"; "an SSE
// stream has no overall limit, each of its writes (events, keep-alives)
// gets this long" (README). A reader that reads steadily — each event
// reaches it in a fraction of the write timeout — must not be cut off
// while it catches up on a backlog. A batch of events (up to 8 MiB) was
// one write under one deadline.
func TestASteadySSEReaderIsNotCutOffWhileItCatchesUp(t *testing.T) {
	// A write timeout of 1 s: the whole backlog takes the reader below over
	// 2 s, each 64 KiB of it some 40 ms.
	s := newTestServer(t, withStreams(t, streams.Config{}), func(c *Config, _ *Services) { c.WriteTimeout = time.Second })
	tok := agentToken(t, "org-a")
	const n = 40
	appendClosedStream(t, s, tok, n)

	started := time.Now()
	got, readErr := readSteadily(openSlowly(t, s, streamBase+"big/sse", tok), 20*time.Millisecond, nil)
	require.True(t, strings.Contains(got, "event: end"),
		"the stream was cut after %s, %d of %d events, %d bytes in (%v): the reader never stopped reading",
		time.Since(started).Round(time.Millisecond), strings.Count(got, "id: "), n, len(got), readErr)
}

// Stopping the streams service ends every live tail ("so a graceful
// shutdown is not held up by live tails"; internal/service drains the API
// while the hub stops for that reason). A tail still catching up on a
// backlog went on reading and sending it to the end instead, holding the
// drain for as long as its client kept reading (up to the API's whole
// ShutdownTimeout).
func TestStoppingTheStreamsServiceEndsATailThatIsCatchingUp(t *testing.T) {
	// 128 KiB per read: the backlog is sent in batches of two chunks.
	s := newTestServer(t, withStreams(t, streams.Config{MaxChunk: 64 << 10, MaxRequest: 128 << 10}))
	tok := agentToken(t, "org-a")
	const n = 30
	appendClosedStream(t, s, tok, n)

	stopped := false
	got, _ := readSteadily(openSlowly(t, s, streamBase+"big/sse", tok), 30*time.Millisecond, func(got string) {
		if !stopped && strings.Count(got, "id: ") >= 2 {
			stopCtx, stopCancel := context.WithTimeout(context.Background(), testWait)
			defer stopCancel()
			require.NoError(t, s.svc.Streams.Stop(stopCtx))
			stopped = true
		}
	})
	require.True(t, stopped)
	require.False(t, strings.Contains(got, "event: end"),
		"the tail went on after the service stopped: %d of %d events and the end", strings.Count(got, "id: "), n)
}

// As TestStoppingTheStreamsServiceEndsATailThatIsCatchingUp, for the
// approvals event stream: stopping the inbox ends a reader still catching
// up on the org's log. It went on reading and sending page after page to
// the end, holding the graceful shutdown for as long as its client read.
func TestStoppingTheInboxEndsAnEventStreamThatIsCatchingUp(t *testing.T) {
	s := newTestServer(t, withInbox(t, time.Minute))
	// 3,000 events of about 1 KiB: 30 pages of the stream's reads.
	const n = 3000
	approval := json.RawMessage(fmt.Sprintf(`{"note": %q}`, strings.Repeat("x", 1000)))
	evs := make([]inbox.Event, 0, 500)
	for range n / 500 {
		evs = evs[:0]
		for range 500 {
			evs = append(evs, inbox.Event{OrgID: "org-a", Type: inbox.TypeRequested, Kind: inbox.KindToolCall, ApprovalID: uuid.New(), Approval: approval})
		}
		_, err := s.svc.Inbox.AppendAll(context.Background(), s.svc.DB, evs)
		require.NoError(t, err)
	}

	// The inbox stops after the first 200 events ("Last-Event-ID: 0": from
	// the log's start).
	stopped := false
	body := openSlowly(t, s, "/v1/approvals/events", subToken(t, "org-a", "alice", "", RoleApprover), "Last-Event-ID", "0")
	got, _ := readSteadily(body, 30*time.Millisecond, func(got string) {
		if !stopped && strings.Count(got, "event: requested") >= 200 {
			stopCtx, stopCancel := context.WithTimeout(context.Background(), testWait)
			defer stopCancel()
			require.NoError(t, s.svc.Inbox.Stop(stopCtx))
			stopped = true
		}
	})
	require.True(t, stopped)
	require.Less(t, strings.Count(got, "event: requested"), n, "the stream went on to the log's end after the inbox stopped")
}
