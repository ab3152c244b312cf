package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
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

// REVEILLE_WRITE_TIMEOUT cuts off "a client that stops reading"; "an SSE
// stream has no overall limit, each of its writes (events, keep-alives)
// gets this long" (README). A reader that reads steadily — each event
// reaches it in a fraction of the write timeout — must not be cut off
// while it catches up on a backlog.
func TestASteadySSEReaderIsNotCutOffWhileItCatchesUp(t *testing.T) {
	// A write timeout of 1 s: the whole backlog takes the reader below over
	// 2 s, each 64 KiB of it some 40 ms.
	s := newTestServer(t, withStreams(t, streams.Config{}), func(c *Config, _ *Services) { c.WriteTimeout = time.Second })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, smallBufListener{ln}) }()
	t.Cleanup(func() { cancel(); <-done })
	tok := agentToken(t, "org-a")

	const n = 40
	chunk := make([]byte, 64<<10) // 87 KiB of base64 per event
	for i := range n {
		chunk[0] = byte(i)
		r := do(t, s.Handler(), http.MethodPost, streamBase+"big/chunks", tok, chunk, "Content-Type", "application/octet-stream")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	r := do(t, s.Handler(), http.MethodPost, streamBase+"big/close", tok, nil)
	require.Equal(t, http.StatusNoContent, r.Status)

	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(16 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+streamBase+"big/sse", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	// Read at about 1.5 MB/s: each 87 KiB event in tens of milliseconds, a
	// fraction of the 1 s write timeout; only the whole catch-up batch
	// (3.5 MB) takes longer than that.
	rd := bufio.NewReaderSize(res.Body, 4<<10)
	buf := make([]byte, 4<<10)
	var got strings.Builder
	var readErr error
	started := time.Now()
	for i := 0; ; i++ {
		k, err := rd.Read(buf)
		got.Write(buf[:k])
		if err != nil {
			readErr = err
			break
		}
		if i%8 == 7 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	ids := strings.Count(got.String(), "id: ")
	require.True(t, strings.Contains(got.String(), "event: end"),
		"the stream was cut after %s, %d of %d events, %d bytes in (%v): the reader never stopped reading",
		time.Since(started).Round(time.Millisecond), ids, n, got.Len(), readErr)
}

// Stopping the streams service ends every live tail ("so a graceful
// shutdown is not held up by live tails"; internal/service drains the API
// while the hub stops for that reason). A tail still catching up on a
// backlog goes on reading and sending it to the end instead, holding the
// drain for as long as its client keeps reading (up to the API's whole
// ShutdownTimeout).
func TestStoppingTheStreamsServiceEndsATailThatIsCatchingUp(t *testing.T) {
	// 128 KiB per read: the backlog is sent in batches of two chunks.
	s := newTestServer(t, withStreams(t, streams.Config{MaxChunk: 64 << 10, MaxRequest: 128 << 10}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, smallBufListener{ln}) }()
	t.Cleanup(func() { cancel(); <-done })
	tok := agentToken(t, "org-a")

	const n = 30
	chunk := make([]byte, 64<<10)
	for i := range n {
		chunk[0] = byte(i)
		r := do(t, s.Handler(), http.MethodPost, streamBase+"big/chunks", tok, chunk, "Content-Type", "application/octet-stream")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	r := do(t, s.Handler(), http.MethodPost, streamBase+"big/close", tok, nil)
	require.Equal(t, http.StatusNoContent, r.Status)

	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(16 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+streamBase+"big/sse", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	// A steady reader, ~1 MB/s.
	rd := bufio.NewReaderSize(res.Body, 4<<10)
	buf := make([]byte, 4<<10)
	var got strings.Builder
	stopped := false
	var afterStop int // bytes read after the Stop returned
	for i := 0; ; i++ {
		k, err := rd.Read(buf)
		got.Write(buf[:k])
		if stopped {
			afterStop += k
		}
		if err != nil {
			break
		}
		if !stopped && strings.Count(got.String(), "id: ") >= 2 {
			stopCtx, stopCancel := context.WithTimeout(context.Background(), testWait)
			require.NoError(t, s.svc.Streams.Stop(stopCtx))
			stopCancel()
			stopped = true
		}
		if i%8 == 7 {
			time.Sleep(30 * time.Millisecond)
		}
	}
	require.True(t, stopped)
	require.False(t, strings.Contains(got.String(), "event: end"),
		"the tail went on after the service stopped: %d of %d events and the end, %d bytes after the Stop returned",
		strings.Count(got.String(), "id: "), n, afterStop)
}

// As TestStoppingTheStreamsServiceEndsATailThatIsCatchingUp, for the
// approvals event stream: stopping the inbox ends a reader still catching
// up on the org's log. It went on reading and sending page after page to
// the end, holding the graceful shutdown for as long as its client read.
func TestStoppingTheInboxEndsAnEventStreamThatIsCatchingUp(t *testing.T) {
	s := newTestServer(t, withInbox(t, time.Minute))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, smallBufListener{ln}) }()
	t.Cleanup(func() { cancel(); <-done })

	// 3,000 events of about 1 KiB: 30 pages of the stream's reads.
	const n = 3000
	approval := json.RawMessage(fmt.Sprintf(`{"note": %q}`, strings.Repeat("x", 1000)))
	evs := make([]inbox.Event, 0, 500)
	for range n / 500 {
		evs = evs[:0]
		for range 500 {
			evs = append(evs, inbox.Event{OrgID: "org-a", Type: inbox.TypeRequested, Kind: inbox.KindToolCall, ApprovalID: uuid.New(), Approval: approval})
		}
		_, err := s.svc.Inbox.AppendAll(ctx, s.svc.DB, evs)
		require.NoError(t, err)
	}

	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(16 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/v1/approvals/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+subToken(t, "org-a", "alice", "", RoleApprover))
	req.Header.Set("Last-Event-ID", "0") // from the log's start
	res, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	// A steady reader, ~1 MB/s; the inbox stops after its first 200 events.
	rd := bufio.NewReaderSize(res.Body, 4<<10)
	buf := make([]byte, 4<<10)
	var got strings.Builder
	stopped := false
	for i := 0; ; i++ {
		k, err := rd.Read(buf)
		got.Write(buf[:k])
		if err != nil {
			break
		}
		if !stopped && strings.Count(got.String(), "event: requested") >= 200 {
			stopCtx, stopCancel := context.WithTimeout(context.Background(), testWait)
			require.NoError(t, s.svc.Inbox.Stop(stopCtx))
			stopCancel()
			stopped = true
		}
		if i%8 == 7 {
			time.Sleep(30 * time.Millisecond)
		}
	}
	require.True(t, stopped)
	require.Less(t, strings.Count(got.String(), "event: requested"), n, "the stream went on to the log's end after the inbox stopped")
}
