package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

// withStreams gives the test server a started streams service (cfg's zero
// fields take the defaults).
func withStreams(t *testing.T, cfg streams.Config) func(*Config, *Services) {
	return func(_ *Config, svc *Services) {
		if cfg.Logger == nil {
			cfg.Logger = testkit.Logger(t)
		}
		st, err := streams.New(svc.DB, cfg)
		require.NoError(t, err)
		require.NoError(t, st.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
		svc.Streams = st
	}
}

// streamServer is a test server with streams, reachable over real HTTP
// (for SSE) as well as through its handler.
type streamServer struct {
	*Server
	url string
}

func newStreamServer(t *testing.T, cfg streams.Config) streamServer {
	t.Helper()
	s := newTestServer(t, withStreams(t, cfg))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return streamServer{Server: s, url: srv.URL}
}

const streamBase = "/v1/runs/run-1/streams/"

func (s streamServer) post(t *testing.T, tok, name string, body []byte, headers ...string) response {
	t.Helper()
	return do(t, s.Handler(), http.MethodPost, streamBase+name+"/chunks", tok, body, append([]string{"Content-Type", "application/octet-stream"}, headers...)...)
}

func (s streamServer) postJSON(t *testing.T, tok, name string, chunks ...[]byte) response {
	t.Helper()
	list := []map[string]string{}
	for _, c := range chunks {
		list = append(list, map[string]string{"data_base64": base64.StdEncoding.EncodeToString(c)})
	}
	return do(t, s.Handler(), http.MethodPost, streamBase+name+"/chunks", tok, map[string]any{"chunks": list})
}

func (s streamServer) closeStream(t *testing.T, tok, name string) {
	t.Helper()
	r := do(t, s.Handler(), http.MethodPost, streamBase+name+"/close", tok, nil)
	require.Equal(t, http.StatusNoContent, r.Status, "body: %s", r.Body)
}

func (s streamServer) info(t *testing.T, tok, name string) map[string]any {
	t.Helper()
	r := do(t, s.Handler(), http.MethodGet, streamBase+name, tok, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	return r.JSON(t)
}

type chunkPage struct {
	Items []struct {
		Index      int64  `json:"index"`
		DataBase64 string `json:"data_base64"`
	} `json:"items"`
	NextCursor *string `json:"next_cursor"`
	HasMore    bool    `json:"has_more"`
}

func (s streamServer) page(t *testing.T, tok, name, query string) chunkPage {
	t.Helper()
	r := do(t, s.Handler(), http.MethodGet, streamBase+name+"/chunks?"+query, tok, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var p chunkPage
	require.NoError(t, json.Unmarshal(r.Body, &p))
	require.NotNil(t, p.Items, "items is a list, never null")
	require.NotNil(t, p.NextCursor, "next_cursor is always the next index")
	return p
}

func (p chunkPage) data(t *testing.T) []string {
	t.Helper()
	out := make([]string, len(p.Items))
	for i, it := range p.Items {
		b, err := base64.StdEncoding.DecodeString(it.DataBase64)
		require.NoError(t, err)
		out[i] = string(b)
	}
	return out
}

func agentToken(t *testing.T, org string) string { return token(t, org, RoleAgent) }

func TestStreamChunksAppendAsOneRawChunkOrAJSONBatch(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	r := s.post(t, tok, "out", []byte("first"))
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"first_index": 0.0, "last_index": 0.0}, r.JSON(t))

	r = s.postJSON(t, tok, "out", []byte("a"), []byte("b"), []byte("c"))
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"first_index": 1.0, "last_index": 3.0}, r.JSON(t))

	require.Equal(t, map[string]any{"tail_index": 3.0, "done": false}, s.info(t, tok, "out"))
	require.Equal(t, []string{"first", "a", "b", "c"}, s.page(t, tok, "out", "").data(t))

	r = s.post(t, tok, "out", nil)
	require.Equal(t, http.StatusCreated, r.Status, "an empty raw body is one empty chunk: %s", r.Body)
	require.Equal(t, map[string]any{"first_index": 4.0, "last_index": 4.0}, r.JSON(t))
	require.Equal(t, []string{"first", "a", "b", "c", ""}, s.page(t, tok, "out", "").data(t))
}

func TestConcurrentRESTWritersGetGapFreeIndexes(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	const writers, each = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r := s.post(t, tok, "out", fmt.Appendf(nil, "%d-%d", w, i))
				require.Equal(t, http.StatusCreated, r.Status)
			}
		})
	}
	wg.Wait()
	p := s.page(t, tok, "out", "limit=500")
	require.Len(t, p.Items, writers*each)
	seen := map[string]bool{}
	for i, it := range p.Items {
		require.EqualValues(t, i, it.Index)
		seen[p.data(t)[i]] = true
	}
	require.Len(t, seen, writers*each, "every chunk once")
}

func TestStreamPagingByCursorAndStartIndexCoversEveryChunkOnce(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")

	empty := s.page(t, tok, "empty", "limit=10")
	require.Empty(t, empty.Items)
	require.Equal(t, "0", *empty.NextCursor)
	require.False(t, empty.HasMore)

	for _, n := range []int{20, 25} { // an exact multiple of the limit, and not
		name := fmt.Sprint("n", n)
		batch := make([][]byte, n)
		for i := range batch {
			batch[i] = fmt.Appendf(nil, "c%d", i)
		}
		require.Equal(t, http.StatusCreated, s.postJSON(t, tok, name, batch...).Status)

		var got []string
		query := "limit=10"
		for pages := 1; ; pages++ {
			p := s.page(t, tok, name, query)
			got = append(got, p.data(t)...)
			require.Equal(t, fmt.Sprint(len(got)), *p.NextCursor)
			if !p.HasMore {
				require.Equal(t, (n+9)/10, pages)
				break
			}
			query = "limit=10&cursor=" + *p.NextCursor
		}
		require.Len(t, got, n)
		for i, d := range got {
			require.Equal(t, fmt.Sprintf("c%d", i), d)
		}
		end := s.page(t, tok, name, "cursor="+fmt.Sprint(n))
		require.Empty(t, end.Items)
		require.Equal(t, fmt.Sprint(n), *end.NextCursor, "at the end the cursor stays put")
		require.False(t, end.HasMore)
	}

	p := s.page(t, tok, "n25", "start_index=5&limit=10")
	require.Equal(t, "c5", p.data(t)[0])
	require.Len(t, p.Items, 10)
	require.Equal(t, "15", *p.NextCursor)
	require.True(t, p.HasMore)
	require.Len(t, s.page(t, tok, "n25", "").Items, 25, "the default limit is 50")
}

func TestBadPagingParametersAre400NamingThem(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	for query, field := range map[string]string{
		"cursor=abc":                      "cursor",
		"cursor=-1":                       "cursor",
		"start_index=x":                   "start_index",
		"start_index=-2":                  "start_index",
		"start_index=9223372036854775807": "start_index",
		"start_index=9007199254740992":    "start_index",
		"cursor=1&start_index=1":          "start_index",
		"limit=0":                         "limit",
		"limit=501":                       "limit",
		"limit=ten":                       "limit",
	} {
		r := do(t, s.Handler(), http.MethodGet, streamBase+"out/chunks?"+query, tok, nil)
		r.requireProblem(t, http.StatusBadRequest, field)
	}
	r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?cursor=***", tok, nil)
	r.requireProblem(t, http.StatusBadRequest, "cursor")
	r = do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?limit=0", tok, nil)
	r.requireProblem(t, http.StatusBadRequest, "limit")
}

// A names cursor is a name this API returned, base64url-encoded: one that
// decodes to what no stream name can be is refused as a bad cursor, not
// handed to Postgres (which refuses bytes that are not UTF-8, and NUL).
func TestAStreamNamesCursorThatCouldNotBeANameIs400NamingIt(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	require.Equal(t, http.StatusCreated, s.post(t, tok, "a", []byte("x")).Status)
	cursor := base64.RawURLEncoding.EncodeToString
	cases := []struct {
		name, cursor string
	}{
		{"not base64url", "***"},
		{"a byte that is not UTF-8 (0xFF)", "_w"},
		{"NUL", "AA"},
		{"a name with NUL in it", cursor([]byte("a\x00b"))},
		{"a control character", cursor([]byte("a\x01"))},
		{"a slash, which no name holds", cursor([]byte("a/b"))},
		{"longer than any name", cursor([]byte(strings.Repeat("n", streams.MaxIDLength+1)))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?cursor="+tc.cursor, tok, nil)
			p := r.requireProblem(t, http.StatusBadRequest, "cursor")
			require.Equal(t, "invalid cursor: is not a cursor this API returned", p["detail"])
		})
	}
	t.Run("the longest name is a cursor", func(t *testing.T) {
		r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?cursor="+cursor([]byte(strings.Repeat("é", streams.MaxIDLength))), tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	})
}

func TestListingAStreamsNamesPagesWithANullCursorAtTheEnd(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	for _, name := range []string{"c", "a", "b"} {
		require.Equal(t, http.StatusCreated, s.post(t, tok, name, []byte("x")).Status)
	}
	r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?limit=2", tok, nil)
	require.Equal(t, http.StatusOK, r.Status)
	first := r.JSON(t)
	require.Equal(t, []any{"a", "b"}, first["items"])
	require.NotNil(t, first["next_cursor"])
	r = do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams?limit=2&cursor="+first["next_cursor"].(string), tok, nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, map[string]any{"items": []any{"c"}, "next_cursor": nil}, r.JSON(t))

	r = do(t, s.Handler(), http.MethodGet, "/v1/runs/no-such-run/streams", tok, nil)
	require.Equal(t, map[string]any{"items": []any{}, "next_cursor": nil}, r.JSON(t))
}

func TestWritingToAClosedStreamIs409AndClosingIsIdempotent(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	require.Equal(t, http.StatusCreated, s.post(t, tok, "out", []byte("x")).Status)
	s.closeStream(t, tok, "out")
	s.closeStream(t, tok, "out")
	s.post(t, tok, "out", []byte("late")).requireProblem(t, http.StatusConflict)
	s.postJSON(t, tok, "out", []byte("late")).requireProblem(t, http.StatusConflict)
	require.Equal(t, map[string]any{"tail_index": 0.0, "done": true}, s.info(t, tok, "out"))
}

func TestClosingAnAbsentStreamCreatesItEmptyAndClosed(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": false}, s.info(t, tok, "ghost"))
	s.closeStream(t, tok, "ghost")
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": true}, s.info(t, tok, "ghost"))
	r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams", tok, nil)
	require.Equal(t, []any{"ghost"}, r.JSON(t)["items"])
	s.post(t, tok, "ghost", []byte("x")).requireProblem(t, http.StatusConflict)
}

func TestAnotherOrgsRunBehavesAsAbsentOnEveryEndpoint(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	mine, theirs := agentToken(t, "org-a"), agentToken(t, "org-b")
	require.Equal(t, http.StatusCreated, s.post(t, theirs, "out", []byte("secret")).Status)

	// A reader of org A follows the same run and name from before any write.
	sse := openSSE(t, s, mine, "out")
	require.Equal(t, http.StatusCreated, s.post(t, theirs, "out", []byte("secret-2")).Status)
	s.closeStream(t, theirs, "out")

	r := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams", mine, nil)
	require.Equal(t, map[string]any{"items": []any{}, "next_cursor": nil}, r.JSON(t))
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": false}, s.info(t, mine, "out"))
	p := s.page(t, mine, "out", "")
	require.Empty(t, p.Items)
	require.Equal(t, "0", *p.NextCursor)
	require.False(t, p.HasMore)

	// Org A's own stream of the same name is independent of B's closed one.
	r = s.post(t, mine, "out", []byte("mine"))
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"first_index": 0.0, "last_index": 0.0}, r.JSON(t))
	s.closeStream(t, mine, "out")
	// Had B's chunks or close leaked, they would come first.
	require.Equal(t, sseEvent{ID: "0", Data: b64("mine")}, sse.next(t))
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 0}`}, sse.next(t))
	sse.requireEOF(t)
	require.Equal(t, []string{"secret", "secret-2"}, s.page(t, theirs, "out", "").data(t))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestBinaryChunksRoundTripOverRESTAndSSE(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	raw := []byte{0x00, 'a', 0xff, 0xfe, 0x00, 0xc3, 0x28, '\n', '\r'}
	require.Equal(t, http.StatusCreated, s.post(t, tok, "bin", raw).Status)
	require.Equal(t, http.StatusCreated, s.postJSON(t, tok, "bin", []byte{0x80, 0x00}, []byte{}).Status)
	s.closeStream(t, tok, "bin")

	p := s.page(t, tok, "bin", "")
	require.Equal(t, []string{string(raw), "\x80\x00", ""}, p.data(t))
	sse := openSSE(t, s, tok, "bin")
	for i, want := range [][]byte{raw, {0x80, 0x00}, {}} {
		ev := sse.next(t)
		require.Equal(t, fmt.Sprint(i), ev.ID)
		got, err := base64.StdEncoding.DecodeString(ev.Data)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	require.Equal(t, "end", sse.next(t).Event)
}

func TestOversizeChunksAndRequestsAre413(t *testing.T) {
	s := newStreamServer(t, streams.Config{MaxChunk: 1024, MaxRequest: 4096})
	tok := agentToken(t, "org-a")
	require.Equal(t, http.StatusCreated, s.post(t, tok, "out", make([]byte, 1024)).Status, "exactly the limit is fine")
	s.post(t, tok, "out", make([]byte, 1025)).requireProblem(t, http.StatusRequestEntityTooLarge)
	s.postJSON(t, tok, "out", []byte("ok"), make([]byte, 1025)).requireProblem(t, http.StatusRequestEntityTooLarge)
	s.postJSON(t, tok, "out", make([]byte, 1000), make([]byte, 1000), make([]byte, 1000), make([]byte, 1000)).
		requireProblem(t, http.StatusRequestEntityTooLarge) // base64 makes it over 4096 bytes
	s.post(t, tok, "out", make([]byte, 5000)).requireProblem(t, http.StatusRequestEntityTooLarge)

	// A body without Content-Length over the limit fails as it is read.
	req := httptest.NewRequest(http.MethodPost, streamBase+"out/chunks", strings.NewReader(strings.Repeat("x", 5000)))
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "body: %s", rec.Body)

	require.Equal(t, map[string]any{"tail_index": 0.0, "done": false}, s.info(t, tok, "out"), "only the first append was stored")
}

func TestBadJSONAppendsAre400NamingTheFieldAndStoreNothing(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	path := streamBase + "out/chunks"
	cases := []struct {
		body  string
		field string
	}{
		{`{"chunks": [{"data_base64": "aGk="}, {"data_base64": "not base64!"}]}`, "chunks[1].data_base64"},
		{`{"chunks": [{"data_base64": "aGk"}]}`, "chunks[0].data_base64"},
		{`{"chunks": [{"data_base64": "aGVs\nbG8="}]}`, "chunks[0].data_base64"},
		{`{"chunks": [{"data_base64": "aGVs\r\nbG8="}]}`, "chunks[0].data_base64"},
		{`{"chunks": [{"data_base64": "aGk="}, {}]}`, "chunks[1].data_base64"},
		{`{"chunks": []}`, "chunks"},
		{`{}`, "chunks"},
		{`{"chunks": [{"data_base64": 5}]}`, "chunks[0].data_base64"},
		{`{"chunks": [{"data_base64": "aGk=", "extra": 1}]}`, "chunks[0].extra"},
	}
	for _, c := range cases {
		do(t, s.Handler(), http.MethodPost, path, tok, c.body).requireProblem(t, http.StatusBadRequest, c.field)
	}
	do(t, s.Handler(), http.MethodPost, path, tok, `{"chunks": [`).requireProblem(t, http.StatusBadRequest)
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": false}, s.info(t, tok, "out"))
}

func TestAppendsOfOtherMediaTypesAre415(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		r := do(t, s.Handler(), http.MethodPost, streamBase+"out/chunks", tok, nil, "Content-Type", ct)
		r.requireProblem(t, http.StatusUnsupportedMediaType, "Content-Type")
	}
}

func TestACompressedBodyIs415NamingContentEncodingAndStoresNothing(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	for _, enc := range []string{"gzip", "br", "GZIP"} {
		s.post(t, tok, "out", []byte("\x1f\x8b-not-decoded"), "Content-Encoding", enc).
			requireProblem(t, http.StatusUnsupportedMediaType, "Content-Encoding")
		do(t, s.Handler(), http.MethodPost, streamBase+"out/chunks", tok, map[string]any{"chunks": []string{"eA=="}}, "Content-Encoding", enc).
			requireProblem(t, http.StatusUnsupportedMediaType, "Content-Encoding")
	}
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": false}, s.info(t, tok, "out"))
	ok := s.post(t, tok, "out", []byte("x"), "Content-Encoding", "identity")
	require.Equal(t, http.StatusCreated, ok.Status, "identity is no encoding: %s", ok.Body)
}

// A 415 is a malformed request, refused before anything was stored: it is
// not kept under its Idempotency-Key, so the request sent again with the
// right Content-Type (the same body, so the same fingerprint) appends.
func TestAnAppendRefusedWith415IsNotReplayedToItsCorrectedRetry(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	s.post(t, tok, "out", []byte("x"), "Idempotency-Key", "ct-k1", "Content-Type", "text/plain").
		requireProblem(t, http.StatusUnsupportedMediaType, "Content-Type")
	fixed := s.post(t, tok, "out", []byte("x"), "Idempotency-Key", "ct-k1")
	require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
	require.Empty(t, fixed.Header.Get("Idempotent-Replayed"))
	require.Equal(t, []string{"x"}, s.page(t, tok, "out", "").data(t))
	again := s.post(t, tok, "out", []byte("x"), "Idempotency-Key", "ct-k1")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "the 201 is kept")
}

func TestInvalidRunIDsAndNamesAre400NamingThem(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	long := strings.Repeat("r", 201)
	for path, field := range map[string]string{
		"/v1/runs/" + long + "/streams/out/chunks": "run_id",
		"/v1/runs/run-1/streams/a%01b/chunks":      "name",
		"/v1/runs/run-1/streams/a%2Fb/chunks":      "name",
		"/v1/runs/a%2Fb/streams/out/chunks":        "run_id",
		"/v1/runs/run-1/streams/a%ffb/chunks":      "name",
	} {
		do(t, s.Handler(), http.MethodPost, path, tok, []byte("x"), "Content-Type", "application/octet-stream").
			requireProblem(t, http.StatusBadRequest, field)
		do(t, s.Handler(), http.MethodGet, path, tok, nil).requireProblem(t, http.StatusBadRequest, field)
	}
	do(t, s.Handler(), http.MethodGet, "/v1/runs/"+long+"/streams", tok, nil).requireProblem(t, http.StatusBadRequest, "run_id")
	do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams/a%0Ab/sse", tok, nil).requireProblem(t, http.StatusBadRequest, "name")

	// Escaped but valid: spaces, percent signs and non-ASCII letters.
	r := s.post(t, tok, "a%20b%25c%C3%A9", []byte("x"))
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	list := do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams", tok, nil)
	require.Equal(t, []any{"a b%cé"}, list.JSON(t)["items"])
}

func TestStreamRoutesEnforceRoles(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	agent, approver, admin := agentToken(t, "org-a"), token(t, "org-a", RoleApprover), token(t, "org-a", RoleAdmin)
	require.Equal(t, http.StatusCreated, s.post(t, agent, "out", []byte("x")).Status)

	s.post(t, approver, "out", []byte("x")).requireProblem(t, http.StatusForbidden)
	do(t, s.Handler(), http.MethodPost, streamBase+"out/close", approver, nil).requireProblem(t, http.StatusForbidden)
	for _, path := range []string{"/v1/runs/run-1/streams", streamBase + "out", streamBase + "out/chunks", streamBase + "out/sse"} {
		do(t, s.Handler(), http.MethodGet, path, admin, nil).requireProblem(t, http.StatusForbidden)
		do(t, s.Handler(), http.MethodGet, path, "", nil).requireProblem(t, http.StatusUnauthorized)
	}
	s.post(t, admin, "out", []byte("x")).requireProblem(t, http.StatusForbidden)

	require.Equal(t, map[string]any{"tail_index": 0.0, "done": false}, s.info(t, approver, "out"))
	require.Equal(t, []string{"x"}, s.page(t, approver, "out", "").data(t))
	s.closeStream(t, agent, "out")
	sse := openSSE(t, s, approver, "out")
	require.Equal(t, sseEvent{ID: "0", Data: b64("x")}, sse.next(t))
	require.Equal(t, "end", sse.next(t).Event)
}

func TestAnAppendRetriedWithItsIdempotencyKeyIsStoredOnce(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	first := s.post(t, tok, "out", []byte("once"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	again := s.post(t, tok, "out", []byte("once"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, first.Body, again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	s.post(t, tok, "out", []byte("different"), "Idempotency-Key", "k1").requireProblem(t, http.StatusUnprocessableEntity)
	require.Equal(t, []string{"once"}, s.page(t, tok, "out", "").data(t))
}

// The response to a committed append is lost before the Idempotency-Key
// record is kept (the replica died): the retry still appends nothing.
func TestAnAppendWhoseResponseWasLostIsNotRepeatedByItsRetry(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	first := s.post(t, tok, "out", []byte("once"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	_, err := s.svc.DB.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	again := s.post(t, tok, "out", []byte("once"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, again.Status)
	require.Empty(t, again.Header.Get("Idempotent-Replayed"), "not a replay by the middleware")
	require.JSONEq(t, string(first.Body), string(again.Body))
	require.Equal(t, []string{"once"}, s.page(t, tok, "out", "").data(t))
}

// Another caller of the org with the same key, or the same caller once
// the key's HTTP record is gone, sending other chunks: a 409, and its
// chunks are not silently dropped behind a 201 with the first append's
// indexes.
func TestAnAppendKeyUsedAgainForOtherChunksIsA409(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	other, err := SignToken(testSecret, TokenSpec{OrgID: "org-a", Sub: "another-caller", Roles: []string{"agent"}, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, s.post(t, tok, "out", []byte("from-a"), "Idempotency-Key", "k1").Status)

	p := s.post(t, other, "out", []byte("from-b"), "Idempotency-Key", "k1").requireProblem(t, http.StatusConflict)
	require.Contains(t, p["type"], "idempotency-key-used")
	_, err = s.svc.DB.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	s.post(t, tok, "out", []byte("second"), "Idempotency-Key", "k1").requireProblem(t, http.StatusConflict)
	require.Equal(t, []string{"from-a"}, s.page(t, tok, "out", "").data(t))
	// (the same chunks under the key are still its retry, from either caller)
	require.Equal(t, http.StatusCreated, s.post(t, other, "out", []byte("from-a"), "Idempotency-Key", "k1").Status)
}

func TestStreamRoutesAreAbsentWithoutTheStreamsService(t *testing.T) {
	s := newTestServer(t)
	do(t, s.Handler(), http.MethodGet, "/v1/runs/run-1/streams", agentToken(t, "org-a"), nil).requireProblem(t, http.StatusNotFound)
}

// --- Server-Sent Events ---

type sseEvent struct {
	ID, Event, Data string
	Comment         string
}

// sseReader parses an event stream in the background, so that a test waits
// for each event with a bound instead of blocking on a read.
type sseReader struct {
	resp   *http.Response
	events chan sseEvent
}

func openSSE(t *testing.T, s streamServer, tok, name string, headers ...string) *sseReader {
	t.Helper()
	return openSSEURL(t, s.url+streamBase+name+"/sse", tok, headers...)
}

func openSSEURL(t *testing.T, url, tok string, headers ...string) *sseReader {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	r := &sseReader{resp: resp, events: make(chan sseEvent, 1024)}
	go r.read()
	return r
}

func (r *sseReader) read() {
	defer close(r.events)
	sc := bufio.NewScanner(r.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev != (sseEvent{}) {
				r.events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			r.events <- sseEvent{Comment: strings.TrimSpace(line[1:])}
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.ID = value
			case "event":
				ev.Event = value
			case "data":
				ev.Data = value
			}
		}
	}
}

// next returns the next event, skipping keep-alive comments.
func (r *sseReader) next(t *testing.T) sseEvent {
	t.Helper()
	deadline := time.After(testWait) // keep-alives do not extend it
	for {
		select {
		case ev, ok := <-r.events:
			require.True(t, ok, "the event stream ended early")
			if ev.Comment == "" {
				return ev
			}
		case <-deadline:
			t.Fatal("no event")
		}
	}
}

func (r *sseReader) requireEOF(t *testing.T) {
	t.Helper()
	select {
	case ev, ok := <-r.events:
		require.False(t, ok, "unexpected event %+v after the end", ev)
	case <-time.After(testWait):
		t.Fatal("the event stream did not end")
	}
}

func (r *sseReader) close() { r.resp.Body.Close() }

func TestAnSSEReaderThatReconnectsWithLastEventIDGetsTheRestExactlyOnce(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	for i := range 10 {
		require.Equal(t, http.StatusCreated, s.post(t, tok, "out", fmt.Appendf(nil, "c%d", i)).Status)
	}
	first := openSSE(t, s, tok, "out")
	for i := range 5 {
		require.Equal(t, sseEvent{ID: fmt.Sprint(i), Data: b64(fmt.Sprintf("c%d", i))}, first.next(t))
	}
	first.close()

	// Closing the connection does not affect the run: writing goes on.
	for i := 10; i < 15; i++ {
		require.Equal(t, http.StatusCreated, s.post(t, tok, "out", fmt.Appendf(nil, "c%d", i)).Status)
	}
	require.Equal(t, map[string]any{"tail_index": 14.0, "done": false}, s.info(t, tok, "out"))
	s.closeStream(t, tok, "out")

	second := openSSEURL(t, s.url+streamBase+"out/sse?start_index=0", tok, "Last-Event-ID", "4")
	for i := 5; i < 15; i++ {
		require.Equal(t, sseEvent{ID: fmt.Sprint(i), Data: b64(fmt.Sprintf("c%d", i))}, second.next(t), "Last-Event-ID wins over start_index")
	}
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 14}`}, second.next(t))
	second.requireEOF(t)
}

func TestAnSSEReaderAttachedBeforeAnyChunkSeesEveryChunkLive(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	sse := openSSE(t, s, tok, "live")
	for i := range 10 {
		// The next chunk is written only after the previous one arrived.
		require.Equal(t, http.StatusCreated, s.post(t, tok, "live", fmt.Appendf(nil, "t%d", i)).Status)
		require.Equal(t, sseEvent{ID: fmt.Sprint(i), Data: b64(fmt.Sprintf("t%d", i))}, sse.next(t))
	}
	require.Equal(t, http.StatusCreated, s.postJSON(t, tok, "live", []byte("x"), []byte("y")).Status)
	require.Equal(t, "10", sse.next(t).ID)
	require.Equal(t, "11", sse.next(t).ID)
	s.closeStream(t, tok, "live")
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 11}`}, sse.next(t))
	sse.requireEOF(t)
}

func TestAnSSEReaderStartsAtStartIndex(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	require.Equal(t, http.StatusCreated, s.postJSON(t, tok, "out", []byte("a"), []byte("b"), []byte("c")).Status)
	s.closeStream(t, tok, "out")
	sse := openSSEURL(t, s.url+streamBase+"out/sse?start_index=2", tok)
	require.Equal(t, sseEvent{ID: "2", Data: b64("c")}, sse.next(t))
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 2}`}, sse.next(t))
	sse.requireEOF(t)

	past := openSSEURL(t, s.url+streamBase+"out/sse", tok, "Last-Event-ID", "2")
	require.Equal(t, sseEvent{Event: "end", Data: `{"tail_index": 2}`}, past.next(t), "a reader that has everything gets only the end")
	past.requireEOF(t)
}

func TestAnIdleSSEStreamSendsKeepAliveComments(t *testing.T) {
	s := newStreamServer(t, streams.Config{KeepAlive: 20 * time.Millisecond})
	sse := openSSE(t, s, agentToken(t, "org-a"), "quiet")
	select {
	case ev := <-sse.events:
		require.Equal(t, sseEvent{Comment: "keep-alive"}, ev)
	case <-time.After(testWait):
		t.Fatal("no keep-alive")
	}
}

// A chunk whose notification was lost (its writer died between commit and
// NOTIFY: here it is written without one) reaches an idle reader by the
// next keep-alive.
func TestAnSSEReaderCatchesUpOnAChunkWhoseNotificationWasLost(t *testing.T) {
	s := newStreamServer(t, streams.Config{KeepAlive: 20 * time.Millisecond})
	tok := agentToken(t, "org-a")
	require.Equal(t, http.StatusCreated, s.postJSON(t, tok, "out", []byte("c0")).Status)
	sse := openSSE(t, s, tok, "out")
	require.Equal(t, sseEvent{ID: "0", Data: b64("c0")}, sse.next(t))

	_, err := s.svc.DB.Exec(context.Background(), `
		WITH st AS (
		  UPDATE streams SET chunk_count = chunk_count + 1, byte_count = byte_count + 2
		  WHERE org_id = 'org-a' AND run_id = 'run-1' AND name = 'out'
		  RETURNING id, chunk_count - 1 AS idx, byte_count - 2 AS start)
		INSERT INTO stream_chunks (stream_id, chunk_index, org_id, byte_start, data)
		SELECT id, idx, 'org-a', start, 'c1'::bytea FROM st`)
	require.NoError(t, err)

	require.Equal(t, sseEvent{ID: "1", Data: b64("c1")}, sse.next(t))
}

func TestBadSSEPositionsAre400(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", tok, nil, "Last-Event-ID", "abc").requireProblem(t, http.StatusBadRequest, "Last-Event-ID")
	do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", tok, nil, "Last-Event-ID", "-1").requireProblem(t, http.StatusBadRequest, "Last-Event-ID")
	do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", tok, nil, "Last-Event-ID", "9223372036854775807").requireProblem(t, http.StatusBadRequest, "Last-Event-ID")
	do(t, s.Handler(), http.MethodGet, streamBase+"out/sse?start_index=-1", tok, nil).requireProblem(t, http.StatusBadRequest, "start_index")
	// the last id a chunk can have is a place to resume after, not a 400
	// naming a parameter the client never sent
	openSSEURL(t, s.url+streamBase+"out/sse", tok, "Last-Event-ID", fmt.Sprint(int64(streams.MaxIndex)))
}

func TestSSEIsUnavailableWhileTheHubIsDown(t *testing.T) {
	s := newTestServer(t, func(_ *Config, svc *Services) {
		st, err := streams.New(svc.DB, streams.Config{Logger: testkit.Logger(t)})
		require.NoError(t, err)
		svc.Streams = st // never started
	})
	do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", agentToken(t, "org-a"), nil).requireProblem(t, http.StatusServiceUnavailable)
}

func TestStoppingTheStreamsServiceEndsOpenSSEStreams(t *testing.T) {
	s := newStreamServer(t, streams.Config{})
	tok := agentToken(t, "org-a")
	sse := openSSE(t, s, tok, "out")
	require.Equal(t, http.StatusCreated, s.post(t, tok, "out", []byte("x")).Status)
	require.Equal(t, "0", sse.next(t).ID)
	require.NoError(t, s.svc.Streams.Stop(context.Background()))
	sse.requireEOF(t) // so a graceful shutdown is not held up by live tails
}

func TestAHundredIdleSSEReadersDoNotHoldUpAWriter(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newStreamServer(t, streams.Config{Registry: reg})
	tok := agentToken(t, "org-a")
	// Readers that never read: once their socket buffers fill, their
	// handlers block in Write; nothing else may.
	idle := make([]*sseReader, 100)
	for i := range idle {
		idle[i] = openIdleSSE(t, s.url+streamBase+"out/sse", tok)
	}
	live := openSSE(t, s, tok, "out")
	require.Equal(t, 101.0, liveSubscribers(t, reg))

	chunk := make([]byte, 32<<10)
	const n = 60
	for i := range n {
		chunk[0] = byte(i)
		require.Equal(t, http.StatusCreated, s.post(t, tok, "out", chunk).Status)
	}
	s.closeStream(t, tok, "out")
	for i := range n {
		require.Equal(t, fmt.Sprint(i), live.next(t).ID)
	}
	require.Equal(t, "end", live.next(t).Event)

	// A disconnect frees everything.
	for _, r := range idle {
		r.close()
	}
	require.Eventually(t, func() bool { return liveSubscribers(t, reg) == 0 }, testWait, pollEvery)
}

// openIdleSSE opens an event stream and never reads its body.
func openIdleSSE(t *testing.T, url, tok string) *sseReader {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return &sseReader{resp: resp}
}

func liveSubscribers(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "reveille_streams_live_subscribers" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// An SSE reader that caught up on a large backlog and then idles does not
// keep the encoded backlog in memory for as long as it stays connected:
// each held its largest catch-up's buffer (8 MiB of chunks, ~11 MiB of
// events), and an org may hold a thousand tails per replica. (Run alone:
// the package's parallel tests wait for it, so the heap is its own.)
func TestAnIdleSSEReaderDoesNotHoldItsCatchUpBuffer(t *testing.T) {
	s := newStreamServer(t, streams.Config{KeepAlive: time.Hour})
	tok := agentToken(t, "org-a")
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 8 {
		require.Equal(t, http.StatusCreated, s.post(t, tok, "big", chunk).Status)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const readers = 10
	for range readers {
		sse := openSSE(t, s, tok, "big")
		for j := range 8 {
			require.Equal(t, fmt.Sprint(j), sse.next(t).ID)
		}
	}
	// (each handler drops its buffer as it starts to wait for the next
	// chunk; the readers' own scanners hold ~2 MiB each)
	require.Eventually(t, func() bool {
		return int64(heap())-int64(before) < readers*3<<20
	}, 10*time.Second, 50*time.Millisecond, "%d idle SSE readers hold more than 3 MiB each", readers)
}

// A live tail asked of a replica whose streams have stopped (it is
// stopping) is 503 `unavailable` with a short Retry-After, logged as what
// it is — not as the database out of reach.
func TestALiveTailAskedWhileTheServerStopsIs503WithRetryAfter(t *testing.T) {
	var logs testkit.LogBuffer
	s := newTestServer(t, withStreams(t, streams.Config{}), func(c *Config, _ *Services) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	require.NoError(t, s.svc.Streams.Stop(context.Background()))

	r := do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", agentToken(t, "org-a"), nil)
	r.requireProblem(t, http.StatusServiceUnavailable)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Contains(t, logs.String(), "request refused: live tails are unavailable while the server starts or stops")
	require.NotContains(t, logs.String(), "the database cannot be reached")
}
