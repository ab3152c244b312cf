package api

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// countingRoute registers an idempotent POST that counts its runs and waits
// on gate (when set) so that duplicates arrive while it is in flight.
func countingRoute(s *Server, runs *atomic.Int64, gate chan struct{}) {
	s.Echo().POST("/v1/test/things", func(c echo.Context) error {
		var in struct {
			Name string `json:"name"`
		}
		if err := bind(c, &in); err != nil {
			return err
		}
		n := runs.Add(1)
		if gate != nil {
			<-gate
		}
		if in.Name == "bad" {
			return Invalid("name", "bad name")
		}
		return c.JSON(http.StatusCreated, map[string]any{"name": in.Name, "run": n})
	}, s.auth.middleware, s.idempotent())
}

func TestIdempotencyReplaysTheFirstResponse(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")

	first := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	again := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, again.Status)
	require.JSONEq(t, string(first.Body), string(again.Body))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, runs.Load())

	t.Run("different body with the same key is 422", func(t *testing.T) {
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"y"}`, "Idempotency-Key", "k1").requireProblem(t, http.StatusUnprocessableEntity)
		require.EqualValues(t, 1, runs.Load())
	})
	t.Run("the same JSON spelt differently is the same request", func(t *testing.T) {
		for _, body := range []string{"{ \"name\" : \"x\" }\n", `{"name":"\u0078"}`} {
			r := do(t, s.Handler(), "POST", "/v1/test/things", tok, body, "Idempotency-Key", "k1")
			require.Equal(t, http.StatusCreated, r.Status, "%s: %s", body, r.Body)
			require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"), body)
		}
		require.EqualValues(t, 1, runs.Load())
		long := `{"name":"x"}` + strings.Repeat(" ", fingerprintJSONLimit)
		do(t, s.Handler(), "POST", "/v1/test/things", tok, long, "Idempotency-Key", "k1").requireProblem(t, http.StatusUnprocessableEntity)
		require.EqualValues(t, 1, runs.Load(), "a body past the limit counts byte for byte")
	})
	t.Run("another org's key is its own", func(t *testing.T) {
		r := do(t, s.Handler(), "POST", "/v1/test/things", token(t, "org-b", "admin"), `{"name":"x"}`, "Idempotency-Key", "k1")
		require.Equal(t, http.StatusCreated, r.Status)
		require.EqualValues(t, 2, runs.Load())
	})
	t.Run("a 400 is not kept: the same key runs again, corrected or not", func(t *testing.T) {
		// Bad input is refused before anything is done; keeping the 400
		// would meet a corrected retry with "key used with a different body".
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"bad"}`, "Idempotency-Key", "k2").requireProblem(t, http.StatusBadRequest, "name")
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"bad"}`, "Idempotency-Key", "k2").requireProblem(t, http.StatusBadRequest, "name")
		require.EqualValues(t, 4, runs.Load())
		fixed := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"fixed"}`, "Idempotency-Key", "k2")
		require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
		require.EqualValues(t, 5, runs.Load())
	})
	t.Run("no key, no replay", func(t *testing.T) {
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`)
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`)
		require.EqualValues(t, 7, runs.Load())
	})
	t.Run("a 415 is not kept: the same body sent again as JSON runs", func(t *testing.T) {
		before := runs.Load()
		do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k4", "Content-Type", "text/plain").
			requireProblem(t, http.StatusUnsupportedMediaType, "Content-Type")
		fixed := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k4")
		require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
		require.Empty(t, fixed.Header.Get("Idempotent-Replayed"))
		require.Equal(t, before+1, runs.Load())
	})
	t.Run("a key given twice or in another case is refused, not kept, and matches nothing kept", func(t *testing.T) {
		before := runs.Load()
		for _, tc := range []struct{ body, field string }{
			{`{"name":"y","name":"x"}`, "name"}, {`{"Name":"x"}`, "Name"}, {`{"name":"x","Name":"x"}`, "Name"},
		} {
			// (k1 was kept for {"name":"x"}: these bodies' values are not
			// its value, so they are not its replay)
			do(t, s.Handler(), "POST", "/v1/test/things", tok, tc.body, "Idempotency-Key", "k1").
				requireProblem(t, http.StatusUnprocessableEntity)
			do(t, s.Handler(), "POST", "/v1/test/things", tok, tc.body, "Idempotency-Key", "k3").
				requireProblem(t, http.StatusBadRequest, tc.field)
		}
		fixed := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k3")
		require.Equal(t, http.StatusCreated, fixed.Status, string(fixed.Body))
		require.Empty(t, fixed.Header.Get("Idempotent-Replayed"))
		require.Equal(t, before+1, runs.Load())
	})
}

func TestConcurrentDuplicatesRunTheHandlerOnce(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	gate := make(chan struct{})
	countingRoute(s, &runs, gate)
	tok := token(t, "org-a", "admin")

	const n = 8
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "same")
		}()
	}
	// Wait until the first request is inside the handler, then release it.
	require.Eventually(t, func() bool { return runs.Load() == 1 }, testWait, pollEvery)
	close(gate)
	wg.Wait()
	require.EqualValues(t, 1, runs.Load())
	for _, r := range results {
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		require.JSONEq(t, string(results[0].Body), string(r.Body))
	}
}

// A request that outlives its claim (abandoned after idempotencyAbandoned, then
// taken over by a retry) keeps nothing when it ends: the retry's response
// is the one replayed.
func TestARequestWhoseClaimWasTakenOverDoesNotOverwriteTheNewOne(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	gate := make(chan struct{})
	s.Echo().POST("/v1/test/slow", func(c echo.Context) error {
		var in struct {
			Name string `json:"name"`
		}
		if err := bind(c, &in); err != nil {
			return err
		}
		n := runs.Add(1)
		if in.Name == "slow" {
			<-gate
		}
		return c.JSON(http.StatusCreated, map[string]any{"name": in.Name, "run": n})
	}, s.auth.middleware, s.idempotent())
	tok := token(t, "org-a", "admin")
	slow := make(chan response, 1)
	go func() {
		slow <- do(t, s.Handler(), "POST", "/v1/test/slow", tok, `{"name":"slow"}`, "Idempotency-Key", "k")
	}()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, testWait, pollEvery)
	_, err := s.svc.DB.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = created_at - interval '3 minutes' WHERE key = 'k'`)
	require.NoError(t, err)

	retry := do(t, s.Handler(), "POST", "/v1/test/slow", tok, `{"name":"fast"}`, "Idempotency-Key", "k")
	require.Equal(t, http.StatusCreated, retry.Status, "the abandoned claim is taken over")
	close(gate)
	require.Equal(t, http.StatusCreated, (<-slow).Status)

	again := do(t, s.Handler(), "POST", "/v1/test/slow", tok, `{"name":"fast"}`, "Idempotency-Key", "k")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.JSONEq(t, string(retry.Body), string(again.Body), "the retry's response, not the slow one's")
}

// An Idempotency-Key is the caller's own: a response answers the caller
// that asked, so another caller of the same org sending the same key and
// body is not replayed it — here approver alice's 403 (her own request)
// must not become bob's answer.
func TestAnotherCallersKeyReplaysNothing(t *testing.T) {
	s, _ := newMandateServer(t)
	h := s.Handler()
	createMandate(t, h, token(t, "org-a", "admin"), "agent-1", "llm", 0)
	alice := subToken(t, "org-a", "alice", "", RoleAgent, RoleApprover)
	bob := subToken(t, "org-a", "bob", "", RoleApprover)
	refused := do(t, h, http.MethodPost, "/v1/mandates/spend", alice, `{"agent_id":"agent-1","scope":"llm","cost":4}`).requireProblem(t, http.StatusPaymentRequired)
	approve := "/v1/mandate-approvals/" + refused["approval_id"].(string) + "/approve"

	do(t, h, http.MethodPost, approve, alice, `{}`, "Idempotency-Key", "approve-it").requireProblem(t, http.StatusForbidden)
	r := do(t, h, http.MethodPost, approve, bob, `{}`, "Idempotency-Key", "approve-it")

	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "approved", r.JSON(t)["state"])
	again := do(t, h, http.MethodPost, approve, bob, `{}`, "Idempotency-Key", "approve-it")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "the caller's own retry is replayed")
	require.JSONEq(t, string(r.Body), string(again.Body))
}

// A record past the configured retention, not yet purged
// (internal/retention purges it), is no longer replayed: the request runs
// again and its response is kept afresh; a record inside it still is.
func TestARecordPastTheConfiguredRetentionIsNotReplayed(t *testing.T) {
	s := newTestServer(t, func(c *Config, _ *Services) { c.IdempotencyRetention = time.Hour })
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")
	first := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	age := func(d time.Duration) {
		_, err := s.svc.DB.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = now() - $1::interval, completed_at = now() - $1::interval`, d)
		require.NoError(t, err)
	}

	age(59 * time.Minute)
	again := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k1")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "inside the hour: replayed")
	age(61 * time.Minute)
	late := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k1")

	require.Equal(t, http.StatusCreated, late.Status)
	require.Empty(t, late.Header.Get("Idempotent-Replayed"), "past the hour: run again")
	require.EqualValues(t, 2, runs.Load())
}

// The window counts from the answer, not the claim: with a short
// retention (REVEILLE_IDEMPOTENCY_RETENTION may be 1s) a duplicate of a
// request still running past it took the key over and ran the handler
// again; it now waits for the first and is replayed its answer.
func TestAClaimOlderThanTheRetentionWhileItsRequestRunsIsNotTakenOver(t *testing.T) {
	s := newTestServer(t, func(c *Config, _ *Services) { c.IdempotencyRetention = time.Second })
	var runs atomic.Int64
	gate := make(chan struct{})
	countingRoute(s, &runs, gate)
	tok := token(t, "org-a", "admin")
	first := make(chan response, 1)
	go func() {
		first <- do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k")
	}()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, testWait, pollEvery)
	// the first request runs on past the retention (waited out: aging its
	// claim's time instead would fence its own answer out)
	var past bool
	require.Eventually(t, func() bool {
		require.NoError(t, s.svc.DB.QueryRow(context.Background(),
			`SELECT created_at < now() - interval '1100 milliseconds' FROM idempotency_keys`).Scan(&past))
		return past
	}, testWait, pollEvery)
	second := make(chan response, 1)
	go func() {
		second <- do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k")
	}()
	close(gate)
	a, b := <-first, <-second
	require.Equal(t, http.StatusCreated, a.Status)
	require.Equal(t, http.StatusCreated, b.Status)
	require.EqualValues(t, 1, runs.Load(), "the handler ran twice under one key; the second answer: %s", b.Body)
	require.Equal(t, "true", b.Header.Get("Idempotent-Replayed"))
	require.JSONEq(t, string(a.Body), string(b.Body))
}

// A JSON body sent without a Content-Type (which the API reads as JSON) is
// compared as a JSON value too: a retry re-serialised with other spacing
// was a 422 "used with a different request body".
func TestAJSONBodyWithoutAContentTypeIsComparedAsJSON(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")
	first := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", "k", "Content-Type", "")
	require.Equal(t, http.StatusCreated, first.Status, string(first.Body))
	again := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{ "name": "x" }`, "Idempotency-Key", "k", "Content-Type", "")
	require.Equal(t, http.StatusCreated, again.Status, string(again.Body))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, runs.Load())
}

// A replica that crashed mid-request leaves its claim in flight. A retry
// under the same key waits, and takes the claim over as soon as it is
// idempotencyAbandoned old — within one wait, not a 409 — because the
// first request's handler ran under idempotencyRunLimit: no live request
// is that old.
func TestARetryBehindACrashedReplicasClaimIsServedWithinOneWait(t *testing.T) {
	s := newTestServer(t)
	var deadline atomic.Value
	s.Echo().POST("/v1/test/crash", func(c echo.Context) error {
		d, _ := c.Request().Context().Deadline()
		deadline.Store(d)
		return c.JSON(http.StatusCreated, map[string]any{"ok": true})
	}, s.auth.middleware, s.idempotent())
	tok := token(t, "org-a", "admin")
	// The crashed request's claim: body {} under key k, never completed,
	// a second short of abandoned.
	sum := sha256.Sum256([]byte(`{}`))
	_, err := s.svc.DB.Exec(context.Background(), `
		INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at)
		VALUES ('org-a', $1, 'k', $2, now() - $3::interval)`,
		`sub "user-org-a" POST /v1/test/crash`, sum[:], fmt.Sprintf("%d milliseconds", (idempotencyAbandoned-time.Second).Milliseconds()))
	require.NoError(t, err)

	retry := do(t, s.Handler(), "POST", "/v1/test/crash", tok, `{}`, "Idempotency-Key", "k")

	require.Equal(t, http.StatusCreated, retry.Status, "the dead claim is taken over: %s", retry.Body)
	d, _ := deadline.Load().(time.Time)
	require.False(t, d.IsZero(), "the first request runs under a deadline")
	require.WithinDuration(t, time.Now().Add(idempotencyRunLimit), d, idempotencyRunLimit/2)
	require.Less(t, idempotencyRunLimit+idempotencyRecordLimit, idempotencyAbandoned, "no live request is abandoned")
	require.Less(t, idempotencyAbandoned, idempotencyWait, "a waiter outlasts a dead claim")
}

// A record written by a version that hashed the raw body (a replica not yet
// upgraded) still replays a retry that sends those bytes again.
func TestARecordHoldingTheRawBodysHashStillReplaysItsRetry(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")
	body := `{ "name": "x" }`
	sum := sha256.Sum256([]byte(body))
	_, err := s.svc.DB.Exec(context.Background(), `
		INSERT INTO idempotency_keys (org_id, route, key, request_hash, status_code, content_type, response_body, completed_at)
		VALUES ('org-a', $1, 'old', $2, 201, 'application/json', '{"name":"x","run":0}', now())`,
		`sub "user-org-a" POST /v1/test/things`, sum[:])
	require.NoError(t, err)

	r := do(t, s.Handler(), "POST", "/v1/test/things", tok, body, "Idempotency-Key", "old")
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Zero(t, runs.Load())
	do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"y"}`, "Idempotency-Key", "old").requireProblem(t, http.StatusUnprocessableEntity)
}

// Which bodies are the same request under one key: JSON bodies as values,
// anything else (another media type, a body too long to decode, keys that
// differ only in case) byte for byte.
func TestRequestFingerprintsCompareJSONAsValuesAndTheRestAsBytes(t *testing.T) {
	const js, bin = "application/json", "application/octet-stream"
	for _, tc := range []struct {
		name         string
		typeA, bodyA string
		typeB, bodyB string
		sameRequest  bool
	}{
		{"the same bytes", bin, "abc", bin, "abc", true},
		{"JSON in another key order", js, `{"a":1,"b":[true,null]}`, js, "{ \"b\": [true, null],\n \"a\": 1 }", true},
		{"JSON with a media type suffix", "application/merge-patch+json; charset=utf-8", `{"a":1,"b":2}`, js, `{"b":2,"a":1}`, true},
		{"an escape for the same character", js, `{"a":"x"}`, js, `{"a":"\u0078"}`, true},
		{"a repeated key: byte for byte (the handlers refuse it)", js, `{"a":1,"a":2}`, js, `{"a":2}`, false},
		{"a repeated key, nested", js, `{"b":[{"a":1,"a":2}]}`, js, `{"b":[{"a":2}]}`, false},
		{"another value", js, `{"a":1}`, js, `{"a":2}`, false},
		{"a number spelt otherwise", js, `{"a":1}`, js, `{"a":1.0}`, false},
		{"JSON sent as raw bytes (a stream append)", bin, `{"a":1,"b":2}`, bin, `{"b":2,"a":1}`, false},
		{"one sent as JSON, one as raw bytes", js, `{"a":1,"b":2}`, bin, `{"b":2,"a":1}`, false},
		{"keys that differ only in case", js, `{"name":"x","Name":"y"}`, js, `{"Name":"y","name":"x"}`, false},
		{"nested keys that differ only in case", js, `[{"K":1,"k":2}]`, js, `[{"k":2,"K":1}]`, false},
		{"the Kelvin sign folds to k", js, "{\"k\":1,\"\u212a\":2}", js, "{\"\u212a\":2,\"k\":1}", false},
		{"past the decoding limit", js, `{"a":1}` + strings.Repeat(" ", fingerprintJSONLimit), js, `{"a":1}`, false},
		{"not JSON", js, `{"a":`, js, `{"a": `, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := fingerprintRequest(tc.typeA, []byte(tc.bodyA))
			b := fingerprintRequest(tc.typeB, []byte(tc.bodyB))
			require.Equal(t, tc.sameRequest, b.matches(a))
			require.Equal(t, tc.sameRequest, a.matches(b))
		})
	}
}

// A record keeps the raw body's hash where replicas of earlier versions
// look for it, so that they match a byte-identical retry during a rolling
// upgrade; the value's hash goes beside it.
func TestARecordKeepsTheRawBodysHashForEarlierReplicas(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	body := `{ "name": "x" }`
	r := do(t, s.Handler(), "POST", "/v1/test/things", token(t, "org-a", "admin"), body, "Idempotency-Key", "k")
	require.Equal(t, http.StatusCreated, r.Status)
	var raw, value []byte
	require.NoError(t, s.svc.DB.QueryRow(context.Background(),
		`SELECT request_hash, request_json_hash FROM idempotency_keys WHERE org_id = 'org-a' AND key = 'k'`).Scan(&raw, &value))
	sum := sha256.Sum256([]byte(body))
	require.Equal(t, sum[:], raw)
	canonical := sha256.Sum256([]byte(`{"name":"x"}`))
	require.Equal(t, append(sum[:], canonical[:]...), value, "the value's hash, bound to the raw hash it was written with")

	// A replica of an earlier version that takes the record over (a new
	// request, {"name":"y"}, under the reused key) rewrites request_hash
	// only: the value hash left beside it no longer counts.
	other := sha256.Sum256([]byte(`{"name":"y"}`))
	_, err := s.svc.DB.Exec(context.Background(), `UPDATE idempotency_keys SET request_hash = $1 WHERE org_id = 'org-a' AND key = 'k'`, other[:])
	require.NoError(t, err)
	do(t, s.Handler(), "POST", "/v1/test/things", token(t, "org-a", "admin"), `{"name":"x"}`, "Idempotency-Key", "k").
		requireProblem(t, http.StatusUnprocessableEntity)
	require.EqualValues(t, 1, runs.Load())
}

// A handler that panics under an Idempotency-Key is answered 500 (the
// recover middleware), which is never kept: a retry under the key must run
// again at once, as after any other 5xx. The claim was left in flight
// (the panic unwound past its release), and the retry waited for it to be
// abandoned (45 s).
func TestIdempotency_AHandlerThatPanicsGivesTheKeyBack(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	s.Echo().POST("/v1/test/panics", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		return c.JSON(http.StatusCreated, map[string]any{"ok": true})
	}, s.auth.middleware, s.idempotent())
	tok := token(t, "org-a", "admin")

	first := do(t, s.Handler(), "POST", "/v1/test/panics", tok, `{}`, "Idempotency-Key", "k")
	require.Equal(t, http.StatusInternalServerError, first.Status, "body: %s", first.Body)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := httptest.NewRequest("POST", "/v1/test/panics", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	start := time.Now()
	s.Handler().ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, "the retry after a 500 runs again (waited %s): %s", time.Since(start).Round(time.Millisecond), rec.Body)
}

// An Idempotency-Key changes nothing of what a request is answered when it
// runs: a path that names nothing is 404 with the key as without it. The
// key's scope holds the request's path, and the claim is written before
// the handler checks the path, so a long path (here an approval id of 3000
// characters, which names no approval) failed the claim's insert — the
// primary key's index row was over Postgres' btree limit — and was a 500.
// A scope past 1 KiB is stored as its hash.
func TestIdempotency_ALongPathIsAnsweredAsWithoutAKey(t *testing.T) {
	s, _ := newMandateServer(t)
	h := s.Handler()
	tok := subToken(t, "org-a", "bob", "", RoleApprover)
	rnd := make([]byte, 3000)
	_, _ = cryptorand.Read(rnd)
	for i := range rnd {
		rnd[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[int(rnd[i])%62]
	}
	path := "/v1/mandate-approvals/" + string(rnd) + "/approve"

	without := do(t, h, http.MethodPost, path, tok, `{}`)
	without.requireProblem(t, http.StatusNotFound)
	with := do(t, h, http.MethodPost, path, tok, `{}`, "Idempotency-Key", "k1")
	require.Equal(t, without.Status, with.Status, "with an Idempotency-Key: %s", with.Body)
}

// A body Postgres cannot store (an unpaired surrogate escape, which the
// JSON decoder turns into U+FFFD as "\ufffd" itself decodes) is not a
// repeat of a kept request whose body holds U+FFFD: compared by value, it
// was replayed that request's 201 where a different body is a 422.
func TestABodyPostgresCannotStoreIsNotAReplayOfOneItDecodesLike(t *testing.T) {
	s := newTestServer(t)
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")
	first := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"\ufffd"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status)
	second := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"\ud800"}`, "Idempotency-Key", "k1")
	require.Empty(t, second.Header.Get("Idempotent-Replayed"), "replayed: %d %s", second.Status, second.Body)
	second.requireProblem(t, http.StatusUnprocessableEntity)
}

// A client that leaves while its key's claim is being written leaves no
// claim behind: the claim's insert committed on the server, its answer
// came back only after the client had gone, and the request, which never
// learned it had claimed the key, did not give it back — every retry under
// the key waited 45 s for the claim to be abandoned (a client's retry with
// a shorter deadline failed). The relay holds the insert's answer back
// while the client leaves. Found by review.
func TestAClientThatLeavesWhileItsKeyIsClaimedLeavesNoClaimBehind(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	direct := testkit.NewPoolFor(t, dsn)
	s := newTestServer(t, func(_ *Config, sv *Services) { sv.DB = testkit.NewPoolFor(t, relayed) })
	var runs atomic.Int64
	countingRoute(s, &runs, nil)
	tok := token(t, "org-a", "admin")

	key := "left-while-claiming-" + newRequestID()
	arrived, release := relay.HoldReplyTo(key)
	defer release()
	ctx, leave := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/v1/test/things", strings.NewReader(`{"name":"x"}`)).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", key)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}()
	select {
	case <-arrived: // the claim committed; its answer waits in the relay
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's answer never came back")
	}
	leave()
	select { // (the request may give up on the answer at once)
	case <-done:
	case <-time.After(2 * time.Second):
	}
	release()
	<-done
	require.Zero(t, runs.Load(), "the handler of a request whose client left does not run")

	var open int
	require.NoError(t, direct.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE key = $1 AND completed_at IS NULL`, key).Scan(&open))
	require.Zero(t, open, "the key's claim is given back")
	again := do(t, s.Handler(), "POST", "/v1/test/things", tok, `{"name":"x"}`, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, again.Status, "the retry runs at once: %s", again.Body)
}
