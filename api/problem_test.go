package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

func TestEveryErrorIsProblemJSON(t *testing.T) {
	s := newTestServer(t)
	type input struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
		Inner struct {
			Flag bool `json:"flag"`
		} `json:"inner"`
	}
	s.Echo().POST("/v1/test/bind", func(c echo.Context) error {
		var in input
		if err := bind(c, &in); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, in)
	}, s.auth.middleware)
	tok := token(t, "org-a", "admin")
	h := s.Handler()

	do(t, h, "GET", "/no/such/route", "", nil).requireProblem(t, http.StatusNotFound)
	do(t, h, "DELETE", "/v1/whoami", tok, nil).requireProblem(t, http.StatusMethodNotAllowed)
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x"`).requireProblem(t, http.StatusBadRequest, "body")
	do(t, h, "POST", "/v1/test/bind", tok, `{"name": "x", "extra": 1}`).requireProblem(t, http.StatusBadRequest, "extra")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": "seven"}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"count": 1e40}`).requireProblem(t, http.StatusBadRequest, "count")
	do(t, h, "POST", "/v1/test/bind", tok, `{"inner": {"flag": "yes"}}`).requireProblem(t, http.StatusBadRequest, "inner.flag")
	do(t, h, "POST", "/v1/test/bind", tok, `{} {}`).requireProblem(t, http.StatusBadRequest, "body")
	do(t, h, "POST", "/v1/test/bind", tok, `[1]`).requireProblem(t, http.StatusBadRequest, "body")
	big := `{"name": "` + strings.Repeat("x", 2<<20) + `"}`
	do(t, h, "POST", "/v1/test/bind", tok, big).requireProblem(t, http.StatusRequestEntityTooLarge, "body")

	r := do(t, h, "POST", "/v1/test/bind", tok, `{"name": "ok", "count": 3}`)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
}

// Postgres text and jsonb hold neither NUL nor invalid UTF-8, jsonb no
// unpaired surrogate escapes and no number out of numeric's range: such
// bodies are 400s naming the field (they were 500s, or silently altered),
// and nothing is stored. Nor is a body whose numbers jsonb would give back
// 64 KiB longer than sent (1e131071 is 131,072 digits): a 400 naming the
// body.
func TestBodyTextPostgresCannotStoreIs400NamingTheField(t *testing.T) {
	s := newTestServer(t, withMandates(t), withWakeups(t), withWorkpool(t))
	admin, agent := token(t, "org-a", RoleAdmin), token(t, "org-a", RoleAgent)
	wakeup := func(pool, args string) string {
		return `{"agent_id": "a1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "cost": 0,
			"pool": "` + pool + `", "work": {"handler": "echo", "args": ` + args + `}}`
	}
	cases := []struct {
		path, tok, body, field string
	}{
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"k": "a\u0000b"}}`, "args.k"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": [1, {"k": ["\u0000"]}]}`, "args[1].k[0]"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": "\u0000"}`, "args"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"s": "\ud800"}}`, "args.s"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"n": 1e131072}}`, "args.n"},
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"n": 1e-16384}}`, "args.n"},
		{"/v1/pools/default/work", admin, "{\"handler\": \"echo\", \"args\": {\"k\": \"a\xffb\"}}", "body"},
		{"/v1/wakeups", agent, wakeup("default", `{"k": "\u0000"}`), "work.args.k"},
		{"/v1/wakeups", agent, wakeup(`a\u0000`, `{}`), "pool"},
		{"/v1/mandates", admin, "{\"agent_id\": \"a\xff\", \"scope\": \"llm\", \"budget\": 1}", "body"},
		{"/v1/mandates/spend", agent, `{"agent_id": "a1", "scope": "llm", "cost": 1, "reason": "\u0000"}`, "reason"},
		// (storable, but given back in plain notation: 100 × 131,072 digits
		// from 900 bytes, at every read of the args)
		{"/v1/pools/default/work", admin, `{"handler": "echo", "args": {"x": [` + strings.Repeat("1e131071, ", 99) + `1e131071]}}`, "body"},
		{"/v1/wakeups", agent, wakeup("default", `[`+strings.Repeat("1e131071, ", 99)+`1e131071]`), "body"},
	}
	for _, tc := range cases {
		do(t, s.Handler(), http.MethodPost, tc.path, tc.tok, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
	}
	for _, table := range []string{"workpool_work", "wakeups", "mandates", "mandate_approvals"} {
		var n int
		require.NoError(t, s.svc.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		require.Zero(t, n, table)
	}
}

func TestProblemExtensionsAreTopLevel(t *testing.T) {
	p := NewProblem(http.StatusPaymentRequired, "spend-refused", "no authority").With("approval_id", "a1")
	raw, err := p.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"https://reveille.dev/problems/spend-refused","title":"Payment Required","status":402,"detail":"no authority","approval_id":"a1"}`, string(raw))
}

// A client that hangs up (curl --max-time) is no failure of the server's:
// its request is recorded as 499 (nginx's "client closed request") in the
// access log and reveille_http_requests_total, with no problem body and no
// error line — only a debug one — whether it left before the handler read
// the database or while the handler waited on it; an append it left is not
// kept under its Idempotency-Key. A context.Canceled while the client is
// still there is a genuine failure: a 500, logged at error.
func TestARequestWhoseClientLeftIsRecorded499WithoutAnErrorLine(t *testing.T) {
	var logs testkit.LogBuffer
	s := newTestServer(t, withStreams(t, streams.Config{}), func(c *Config, _ *Services) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	s.Echo().GET("/v1/test/canceled-inside", func(echo.Context) error {
		return fmt.Errorf("a query under a context of its own: %w", context.Canceled)
	}, s.auth.middleware)
	tok := agentToken(t, "org-a")
	h := s.Handler()
	require.Equal(t, http.StatusCreated, do(t, h, http.MethodPost, streamBase+"out/chunks", tok, []byte("a"), "Content-Type", "application/octet-stream").Status)

	type leaving int
	const (
		stays leaving = iota
		leavesBeforeTheHandler
		leavesWhileTheHandlerWaitsOnTheDatabase
	)
	cases := []struct {
		name                string
		method, path, route string
		body                []byte
		headers             []string
		client              leaving
		want                int
		then                func(t *testing.T)
	}{
		{name: "a page of chunks left before the handler reads the database", method: http.MethodGet,
			path: streamBase + "out/chunks?limit=500", route: streamChunksPath, client: leavesBeforeTheHandler, want: statusClientClosedRequest},
		{name: "a live tail left before its first read", method: http.MethodGet,
			path: streamBase + "out/sse", route: streamPath + "/sse", client: leavesBeforeTheHandler, want: statusClientClosedRequest},
		{name: "a page of chunks left while the handler waits on the database", method: http.MethodGet,
			path: streamBase + "out/chunks?limit=500", route: streamChunksPath, client: leavesWhileTheHandlerWaitsOnTheDatabase, want: statusClientClosedRequest},
		{name: "a keyed append left while the handler waits on the database", method: http.MethodPost,
			path: streamBase + "out/chunks", route: streamChunksPath, body: []byte("b"),
			headers: []string{"Content-Type", "application/octet-stream", "Idempotency-Key", "gone-1"},
			client:  leavesWhileTheHandlerWaitsOnTheDatabase, want: statusClientClosedRequest,
			then: func(t *testing.T) {
				retry := do(t, h, http.MethodPost, streamBase+"out/chunks", tok, []byte("b"),
					"Content-Type", "application/octet-stream", "Idempotency-Key", "gone-1")
				require.Equal(t, http.StatusCreated, retry.Status, "body: %s", retry.Body)
				require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "the 499 was not kept under the key")
				r := do(t, h, http.MethodGet, streamBase+"out/chunks", tok, nil)
				require.Equal(t, http.StatusOK, r.Status)
				require.Len(t, r.JSON(t)["items"], 2, "the append is stored once: %s", r.Body)
			}},
		{name: "a readiness probe that left is not a 503", method: http.MethodGet,
			path: "/readyz", route: "/readyz", client: leavesBeforeTheHandler, want: statusClientClosedRequest},
		{name: "a context.Canceled while the client is there stays a 500", method: http.MethodGet,
			path: "/v1/test/canceled-inside", route: "/v1/test/canceled-inside", client: stays, want: http.StatusInternalServerError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status := strconv.Itoa(tc.want)
			before := requestsTotal(t, s, tc.method, tc.route, status)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequest(tc.method, tc.path, bytes.NewReader(tc.body)).WithContext(ctx)
			req.Header.Set("Authorization", "Bearer "+tok)
			for i := 0; i+1 < len(tc.headers); i += 2 {
				req.Header.Set(tc.headers[i], tc.headers[i+1])
			}
			rec := httptest.NewRecorder()
			switch tc.client {
			case stays:
				h.ServeHTTP(rec, req)
			case leavesBeforeTheHandler:
				cancel()
				h.ServeHTTP(rec, req)
			case leavesWhileTheHandlerWaitsOnTheDatabase:
				unlock := lockStreamTables(t, s)
				done := make(chan struct{})
				go func() { defer close(done); h.ServeHTTP(rec, req) }()
				require.Eventually(t, func() bool { return backendsWaitingOnALock(t, s) > 0 }, testWait, pollEvery)
				cancel()
				select {
				case <-done:
				case <-time.After(testWait):
					t.Fatal("the handler did not end when its client left")
				}
				unlock()
			}

			require.Equal(t, tc.want, rec.Code, "body: %s", rec.Body)
			require.Equal(t, before+1, requestsTotal(t, s, tc.method, tc.route, status))
			requestID := rec.Header().Get(echo.HeaderXRequestID)
			require.NotEmpty(t, requestID)
			lines := logLinesOf(t, &logs, requestID)
			require.Contains(t, lines, "INFO http request "+status, "the access log line")
			if tc.want == statusClientClosedRequest {
				require.Empty(t, rec.Body.String(), "no problem body for a client that is gone")
				require.NotContains(t, strings.Join(lines, "\n"), "ERROR")
				require.Contains(t, lines, "DEBUG client closed the request")
			} else {
				require.Contains(t, lines, "ERROR request failed")
			}
			if tc.then != nil {
				tc.then(t)
			}
		})
	}
}

// requestsTotal reads reveille_http_requests_total{method, route, status}.
func requestsTotal(t *testing.T, s *Server, method, route, status string) float64 {
	t.Helper()
	families, err := s.cfg.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "reveille_http_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method && labels["route"] == route && labels["status"] == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// logLinesOf lists the lines logged for one request as "LEVEL msg" (and
// the status, for an access log line).
func logLinesOf(t *testing.T, logs *testkit.LogBuffer, requestID string) []string {
	t.Helper()
	var out []string
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Level     string `json:"level"`
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
			Status    *int   `json:"status"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line %s", line)
		if rec.RequestID != requestID {
			continue
		}
		s := rec.Level + " " + rec.Msg
		if rec.Status != nil {
			s += " " + strconv.Itoa(*rec.Status)
		}
		out = append(out, s)
	}
	return out
}

// lockStreamTables holds the stream tables locked in a transaction of its
// own until the returned func, so that a handler that reads or writes
// them waits in Postgres.
func lockStreamTables(t *testing.T, s *Server) (unlock func()) {
	t.Helper()
	tx, err := s.svc.DB.Begin(context.Background())
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), "LOCK TABLE streams, stream_chunks IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	var once sync.Once
	unlock = func() { once.Do(func() { require.NoError(t, tx.Rollback(context.Background())) }) }
	t.Cleanup(unlock)
	return unlock
}

// backendsWaitingOnALock counts the test database's backends waiting for a
// lock.
func backendsWaitingOnALock(t *testing.T, s *Server) int {
	t.Helper()
	var n int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n))
	return n
}

// A Postgres out of reach is a 503 the client may retry, not a 500 that
// reads as a bug: the errors are real ones, from a pool whose server does
// not answer and from the codes a server shutting down sends.
func TestADatabaseOutOfReachIs503WithRetryAfter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	gone, err := pgxpool.New(context.Background(), "postgres://reveille@"+addr+"/reveille?connect_timeout=2")
	require.NoError(t, err)
	defer gone.Close()
	_, queryErr := gone.Exec(context.Background(), "SELECT 1")
	require.Error(t, queryErr)

	s := newTestServer(t)
	s.Echo().GET("/v1/test/db", func(c echo.Context) error {
		_, err := gone.Exec(c.Request().Context(), "SELECT 1")
		return fmt.Errorf("listing things: %w", err)
	}, s.auth.middleware)
	r := do(t, s.Handler(), "GET", "/v1/test/db", token(t, "org-a", "admin"), nil)
	r.requireProblem(t, http.StatusServiceUnavailable)
	require.Equal(t, "5", r.Header.Get("Retry-After"))
	require.Contains(t, string(r.Body), "/problems/unavailable")

	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"a connection refused", queryErr, http.StatusServiceUnavailable},
		{"the server shutting down", &pgconn.PgError{Code: "57P01"}, http.StatusServiceUnavailable},
		{"a connection failure", &pgconn.PgError{Code: "08006"}, http.StatusServiceUnavailable},
		{"a pooled connection the server closed", fmt.Errorf("listing things: %w", io.ErrUnexpectedEOF), http.StatusServiceUnavailable},
		{"a connection already closed", fmt.Errorf("listing things: %w", pgconn.ErrConnClosed), http.StatusServiceUnavailable},
		{"a unique violation", &pgconn.PgError{Code: "23505"}, http.StatusInternalServerError},
		{"any other error", errors.New("boom"), http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, problemFor(fmt.Errorf("wrapped: %w", tc.err)).Status)
		})
	}
}

// A problem echoing a long key of the request (an unknown field of 70,000
// characters) stays short: the field's path and its detail are cut, "…"
// marking the cut, so that the problem is not past what a client keeps of
// an error answer (the Go client kept 64 KiB: this one was 140 KB, and it
// lost its type and its fields). Found by review.
func TestAProblemEchoesALongKeyCutShort(t *testing.T) {
	s := newTestServer(t, withMandates(t))
	long := strings.Repeat("é", 35_000) // 70,000 bytes
	r := do(t, s.Handler(), http.MethodPost, "/v1/mandates", token(t, "org-a", RoleAdmin),
		`{"agent_id": "a1", "scope": "llm", "budget": 1, "`+long+`": 1}`)
	p := r.requireProblem(t, http.StatusBadRequest)
	require.Less(t, len(r.Body), 4096, "the problem's size")
	errs, _ := p["errors"].([]any)
	require.Len(t, errs, 1)
	field := errs[0].(map[string]any)["field"].(string)
	require.LessOrEqual(t, len(field), 256)
	require.True(t, strings.HasSuffix(field, "…"), field)
	require.True(t, strings.HasPrefix(long, strings.TrimSuffix(field, "…")), "cut on a character's boundary")
	require.True(t, utf8.ValidString(field))
	var n int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), "SELECT count(*) FROM mandates").Scan(&n))
	require.Zero(t, n)
}

// A query parameter's name is cut in a problem as a body's key is, and a
// problem names at most 100 fields, saying how many more there were: an
// http work's args of 10,000 unknown keys (100 KB) were answered 4.6 MB,
// past what the Go client keeps of an error answer. Found by review.
func TestAProblemNamesAtMostAHundredFieldsEachCutShort(t *testing.T) {
	t.Run("a long query parameter name", func(t *testing.T) {
		s := newTestServer(t)
		r := do(t, s.Handler(), http.MethodGet, "/v1/whoami?"+strings.Repeat("k", 300)+"=a;b", token(t, "org-a", RoleAdmin), nil)
		p := r.requireProblem(t, http.StatusBadRequest)
		errs, _ := p["errors"].([]any)
		require.Len(t, errs, 1)
		field := errs[0].(map[string]any)["field"].(string)
		require.LessOrEqual(t, len(field), 256)
		require.True(t, strings.HasSuffix(field, "…"), field)
		require.Less(t, len(r.Body), 4096)
	})
	t.Run("10,000 unknown args keys", func(t *testing.T) {
		s := newTestServer(t, withWakeups(t, func(m *workpool.Manager) {
			require.NoError(t, httpwork.Register(m, httpwork.Config{AllowedHosts: []string{"api.example.com"}}))
		}))
		args := map[string]any{"url": "https://api.example.com/x"}
		for i := range 10_000 {
			args[fmt.Sprintf("k%04d", i)] = 0
		}
		raw, err := json.Marshal(args)
		require.NoError(t, err)
		r := do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", RoleAgent),
			`{"agent_id":"a1","workflow_id":"org-a/wf-1","signal":"wake","scope":"llm","cost":5,"work":{"handler":"http","args":`+string(raw)+`}}`)
		p := r.requireProblem(t, http.StatusBadRequest, "work.args.k0000")
		errs, _ := p["errors"].([]any)
		require.Len(t, errs, 100)
		require.Contains(t, p["detail"], "; and 9900 more")
		require.Less(t, len(r.Body), 64<<10, "the problem's size")
	})
}
