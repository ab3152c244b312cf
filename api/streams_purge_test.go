package api

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

// withTracedDB puts the services on a pool of the same database whose
// round trips rt notes.
func withTracedDB(t *testing.T, rt *testkit.RoundTrips) func(*Config, *Services) {
	return func(_ *Config, svc *Services) {
		cfg, err := pgxpool.ParseConfig(svc.DB.Config().ConnString())
		require.NoError(t, err)
		cfg.ConnConfig.Tracer = rt
		db, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(db.Close)
		svc.DB = db
	}
}

func streamReads(rt *testkit.RoundTrips) int {
	n := 0
	for _, s := range rt.Take() {
		if strings.HasPrefix(s, "SELECT s.chunk_count, s.done") {
			n++
		}
	}
	return n
}

// An SSE reader of a closed stream that retention is purging (its chunks
// deleted, its row not yet: the state between retention's statements)
// gets an end that tells it the stream's last index, at once; the handler
// does not query the table in a loop, neither then nor once the row is
// gone too.
func TestAnSSEReaderOfAStreamBeingPurgedIsToldAndTheServerDoesNotSpin(t *testing.T) {
	rt := &testkit.RoundTrips{}
	s := newTestServer(t, withTracedDB(t, rt), withStreams(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour}))
	srv := newHTTPStreamServer(t, s)
	tok := agentToken(t, "org-a")
	chunks := make([][]byte, 300)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "c%d", i)
	}
	require.Equal(t, 201, srv.postJSON(t, tok, "out", chunks...).Status)
	srv.closeStream(t, tok, "out")
	_, err := s.svc.DB.Exec(context.Background(), `DELETE FROM stream_chunks`)
	require.NoError(t, err)

	rt.Take()
	sse := openSSE(t, srv, tok, "out")
	time.Sleep(300 * time.Millisecond)
	_, err = s.svc.DB.Exec(context.Background(), `DELETE FROM streams`) // the purge's last statement
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	require.LessOrEqual(t, streamReads(rt), 3, "reads of the stream in 600 ms by one SSE handler")
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 299}`}, sse.next(t), "the reader learns where the stream ended")
	sse.requireEOF(t)
}

func newHTTPStreamServer(t *testing.T, s *Server) streamServer {
	t.Helper()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
	return streamServer{Server: s, url: hs.URL}
}

// A REST reader paging a closed stream that retention is purging (its
// chunks deleted, its row not yet) must not be told has_more with an empty
// page and a next_cursor equal to its own: a client following has_more
// (as the document says to) asks for the same page forever.
func TestAChunksPageOfAStreamBeingPurgedDoesNotPromiseMoreItCannotGive(t *testing.T) {
	s := newStreamServer(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour})
	tok := agentToken(t, "org-a")
	chunks := make([][]byte, 30)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "c%d", i)
	}
	require.Equal(t, 201, s.postJSON(t, tok, "out", chunks...).Status)
	s.closeStream(t, tok, "out")
	_, err := s.svc.DB.Exec(context.Background(), `DELETE FROM stream_chunks`) // retention's first statements
	require.NoError(t, err)

	query, cursor, pages := "limit=10", "0", 0
	for ; pages < 20; pages++ {
		p := s.page(t, tok, "out", query)
		if !p.HasMore {
			break
		}
		require.NotEqual(t, cursor, *p.NextCursor, "page %d (%s): has_more with %d items and the request's own cursor as next_cursor", pages, query, len(p.Items))
		cursor = *p.NextCursor
		query = "limit=10&cursor=" + cursor
	}
	require.Less(t, pages, 20, "a client following has_more never ends")
}
