package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// sendBody posts body as is; chunked leaves out Content-Length, so that the
// limit is met while the body is read rather than up front.
func sendBody(t *testing.T, h http.Handler, path, tok, contentType string, body []byte, chunked bool) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	if chunked {
		req.ContentLength = -1
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

// chunksBody is a JSON append of chunks, padded with trailing whitespace to
// size bytes (0: no padding).
func chunksBody(t *testing.T, size int, chunks ...[]byte) []byte {
	t.Helper()
	list := make([]map[string]string, len(chunks))
	for i, c := range chunks {
		list[i] = map[string]string{"data_base64": base64.StdEncoding.EncodeToString(c)}
	}
	return padJSON(t, map[string]any{"chunks": list}, size)
}

func padJSON(t *testing.T, v any, size int) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	if size == 0 {
		return b
	}
	require.LessOrEqual(t, len(b), size, "the body fits the size asked for")
	return append(b, bytes.Repeat([]byte(" "), size-len(b))...)
}

func manyChunks(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte{byte(i)}
	}
	return out
}

// Each limit lets a request exactly at it through and refuses one unit more
// with a 413 naming the field, storing nothing of the refused request.
func TestRequestsAtALimitPassAndOneMoreIs413StoringNothing(t *testing.T) {
	const maxChunk, maxRequest, maxBody = 1024, 4096, 256
	small := newStreamServer(t, streams.Config{MaxChunk: maxChunk, MaxRequest: maxRequest})
	defaults := newStreamServer(t, streams.Config{})
	mandateServer := newTestServer(t, withMandates(t), func(c *Config, _ *Services) { c.MaxBody = maxBody })
	agent, admin := agentToken(t, "org-a"), token(t, "org-a", RoleAdmin)
	const octet, jsonType = "application/octet-stream", "application/json"

	streamTail := func(s streamServer, name string) func(t *testing.T) any {
		return func(t *testing.T) any { return s.info(t, agent, name)["tail_index"] }
	}
	mandateCount := func(t *testing.T) any {
		r := do(t, mandateServer.Handler(), http.MethodGet, "/v1/mandates", admin, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		return len(r.JSON(t)["items"].([]any))
	}
	mandateBody := func(agent string, size int) []byte {
		return padJSON(t, map[string]any{"agent_id": agent, "scope": "llm", "budget": 1}, size)
	}
	cases := []struct {
		name     string
		h        http.Handler
		path     string
		tok      string
		ct       string
		chunked  bool
		at, over []byte
		field    string                 // what the 413 names
		state    func(t *testing.T) any // unchanged by the refused request
	}{
		{
			name: "REVEILLE_STREAM_MAX_CHUNK, raw chunk", h: small.Handler(), path: streamBase + "raw/chunks", tok: agent, ct: octet,
			at: make([]byte, maxChunk), over: make([]byte, maxChunk+1), field: "body", state: streamTail(small, "raw"),
		},
		{
			name: "REVEILLE_STREAM_MAX_CHUNK, JSON chunk", h: small.Handler(), path: streamBase + "json/chunks", tok: agent, ct: jsonType,
			at:    chunksBody(t, 0, []byte("ok"), make([]byte, maxChunk)),
			over:  chunksBody(t, 0, []byte("ok"), make([]byte, maxChunk+1)),
			field: "chunks[1]", state: streamTail(small, "json"),
		},
		{
			name: "REVEILLE_STREAM_MAX_REQUEST", h: small.Handler(), path: streamBase + "request/chunks", tok: agent, ct: jsonType,
			at:    chunksBody(t, maxRequest, make([]byte, maxChunk), make([]byte, maxChunk)),
			over:  chunksBody(t, maxRequest+1, make([]byte, maxChunk), make([]byte, maxChunk)),
			field: "body", state: streamTail(small, "request"),
		},
		{
			name: "REVEILLE_STREAM_MAX_REQUEST, no Content-Length", h: small.Handler(), path: streamBase + "chunked/chunks", tok: agent, ct: jsonType,
			chunked: true,
			at:      chunksBody(t, maxRequest, make([]byte, maxChunk), make([]byte, maxChunk)),
			over:    chunksBody(t, maxRequest+1, make([]byte, maxChunk), make([]byte, maxChunk)),
			field:   "body", state: streamTail(small, "chunked"),
		},
		{
			name: "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST (default 1000)", h: defaults.Handler(), path: streamBase + "many/chunks", tok: agent, ct: jsonType,
			at: chunksBody(t, 0, manyChunks(1000)...), over: chunksBody(t, 0, manyChunks(1001)...), field: "chunks", state: streamTail(defaults, "many"),
		},
		{
			name: "REVEILLE_MAX_BODY", h: mandateServer.Handler(), path: "/v1/mandates", tok: admin, ct: jsonType,
			at: mandateBody("at", maxBody), over: mandateBody("over", maxBody+1), field: "body", state: mandateCount,
		},
		{
			name: "REVEILLE_MAX_BODY, no Content-Length", h: mandateServer.Handler(), path: "/v1/mandates", tok: admin, ct: jsonType, chunked: true,
			at: mandateBody("at-chunked", maxBody), over: mandateBody("over-chunked", maxBody+1), field: "body", state: mandateCount,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := sendBody(t, tc.h, tc.path, tc.tok, tc.ct, tc.at, tc.chunked)
			require.Equal(t, http.StatusCreated, r.Status, "exactly at the limit passes; body: %s", r.Body)
			before := tc.state(t)
			sendBody(t, tc.h, tc.path, tc.tok, tc.ct, tc.over, tc.chunked).requireProblem(t, http.StatusRequestEntityTooLarge, tc.field)
			require.Equal(t, before, tc.state(t), "the refused request stored nothing")
		})
	}
}

// The body sent to an operation that takes none is never read as the next
// request on the connection, however long it is: over a real connection,
// a body holding a request of its own gets one answer (the connection is
// closed after a long one, the short one is drained and the connection
// reused for the next real request).
func TestABodySentToAnOperationWithoutOneIsNeverReadAsTheNextRequest(t *testing.T) {
	s := newTestServer(t)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	smuggled := "GET /v1/whoami HTTP/1.1\r\nHost: x\r\nX-Smuggled: yes\r\n\r\n"
	for _, tc := range []struct {
		name    string
		padding int
	}{{"a body past what the server drains", 300_000}, {"a short body", 10}} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
			require.NoError(t, err)
			defer conn.Close()
			body := smuggled + strings.Repeat("a", tc.padding)
			req := fmt.Sprintf("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			follow := "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
			go func() { _, _ = io.WriteString(conn, req+follow) }()
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			br := bufio.NewReader(conn)
			var statuses []int
			for {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				statuses = append(statuses, resp.StatusCode)
			}
			require.NotEmpty(t, statuses)
			for _, st := range statuses {
				require.Equal(t, http.StatusOK, st, "only /healthz answered, never the smuggled /v1/whoami (401): %v", statuses)
			}
			require.LessOrEqual(t, len(statuses), 2, "the first request and at most the real one after it")
		})
	}
}

// A timestamp a client sends (run_at, valid_until) is RFC 3339 with any
// offset; one whose UTC instant falls outside the years 0000–9999, which
// the API's own RFC 3339 answers cannot spell, is a 400 naming the field
// — not stored and then answered with a 500, leaving a row that fails
// every read that meets it (GET /v1/mandates for the whole org).
func TestATimestampBeyondYear9999InUTCIsRefusedNotStored(t *testing.T) {
	s := newTestServer(t, withWorkpool(t), withMandates(t))
	h, admin := s.Handler(), token(t, "org-a", RoleAdmin)
	for _, ts := range []string{"9999-12-31T23:59:59-01:00", "0000-01-01T00:00:00+01:00"} {
		t.Run(ts, func(t *testing.T) {
			before := workCount(t, s)
			do(t, h, http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo", "run_at": ts}).
				requireProblem(t, http.StatusBadRequest, "run_at")
			require.Equal(t, before, workCount(t, s), "the refused work was not enqueued")

			do(t, h, http.MethodPost, "/v1/mandates", admin, map[string]any{"agent_id": "a-" + ts, "scope": "s", "budget": 1, "valid_until": ts}).
				requireProblem(t, http.StatusBadRequest, "valid_until")
			r := do(t, h, http.MethodGet, "/v1/mandates", admin, nil)
			require.Equal(t, http.StatusOK, r.Status, "the org's mandates still list: %s", r.Body)
			for _, m := range r.JSON(t)["items"].([]any) {
				require.NotEqual(t, "a-"+ts, m.(map[string]any)["agent_id"], "the refused mandate was not created")
			}

			r = do(t, h, http.MethodPost, "/v1/mandates", admin, map[string]any{"agent_id": "b-" + ts, "scope": "s", "budget": 1})
			require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
			id := r.JSON(t)["id"].(string)
			do(t, h, http.MethodPatch, "/v1/mandates/"+id, admin, map[string]any{"valid_until": ts}).
				requireProblem(t, http.StatusBadRequest, "valid_until")
			r = do(t, h, http.MethodGet, "/v1/mandates/"+id, admin, nil)
			require.Equal(t, http.StatusOK, r.Status, "the mandate still reads: %s", r.Body)
			require.Nil(t, r.JSON(t)["valid_until"], "the refused PATCH changed nothing")
		})
	}
}

// Work enqueued to a pool that does not exist is a 400 naming pool
// whatever the name's length: a name past Postgres' NOTIFY payload limit
// (8000 bytes), which no pool can have (pool names are at most 63
// characters), failed the enqueue's statement instead (500).
func TestWorkForAnUnknownPoolIsA400HoweverLongItsName(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", RoleAdmin)
	for _, n := range []int{64, 8000} {
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/"+strings.Repeat("p", n)+"/work", admin, map[string]any{"handler": "echo"})
		r.requireProblem(t, http.StatusBadRequest, "pool")
	}
	require.Zero(t, workCount(t, s))
}

// A tool call's input is shown again inside the lists' items
// ({items: [{input}]}, {items: [{payload: {input}}]}): an input nested so
// deep that the list nests past what JSON decoders read (encoding/json,
// and so the Go client and kin-openapi: 10,000) is refused with a 400
// naming input — accepted, it made the org's approvals inbox and the
// session's events unreadable while it was listed.
func TestAToolCallInputIsNeverNestedSoDeepThatTheListsShowingItCannotBeDecoded(t *testing.T) {
	f := newApprovalsFixture(t)
	r := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, `{"agent_id":"a1","tool_name":"t","input":[[1]]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	const depth = 9999 // the body {"input": …} nests 10,000 deep: the decoder's limit
	input := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	r = do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, `{"agent_id":"a1","tool_name":"t","input":`+input+`}`)
	if r.Status != http.StatusOK {
		r.requireProblem(t, http.StatusBadRequest, "input")
	}
	for _, path := range []string{"/v1/tool-approvals", "/v1/sessions/s1/events"} {
		r := do(t, f.h, http.MethodGet, path, f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		var v any
		require.NoError(t, json.Unmarshal(r.Body, &v), "GET %s answers JSON a client can decode", path)
	}
}
