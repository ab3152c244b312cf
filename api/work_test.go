package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
)

// withWorkpool runs a workpool (pools default and wakeup) with an "echo"
// handler that returns its args, a "fail" handler and a "block" handler
// that waits for its context.
func withWorkpool(t *testing.T) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		m, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t), Cooldown: 50 * time.Millisecond,
			LeaderRetry: 50 * time.Millisecond, StopGrace: time.Second})
		require.NoError(t, err)
		m.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		m.Register("fail", func(context.Context, workpool.Job) (json.RawMessage, error) {
			return nil, workpool.NonRetryable(errors.New("nope"))
		})
		m.Register("block", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		require.NoError(t, m.Start(context.Background()))
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		sv.Workpool = m
	}
}

func workCount(t *testing.T, s *Server) int {
	t.Helper()
	var n int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work`).Scan(&n))
	return n
}

// waitWork polls GET /v1/work/{id} until the work is finished.
func waitWork(t *testing.T, s *Server, tok, id string) map[string]any {
	t.Helper()
	var w map[string]any
	require.Eventually(t, func() bool {
		r := do(t, s.Handler(), http.MethodGet, "/v1/work/"+id, tok, nil)
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		w = r.JSON(t)
		return w["state"] == "finished"
	}, testWait, pollEvery)
	return w
}

func TestWorkEnqueueRunsAndReportsTheResult(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")

	// run_at a second ahead: the answer reads the item after the commit,
	// when a running loop may already have started work due at once.
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{
		"handler": "echo", "args": map[string]any{"k": "v"}, "retry": map[string]any{"max_attempts": 2}, "timeout_ms": 5000,
		"run_at": time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano),
	})

	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	created := r.JSON(t)
	require.Equal(t, "pending", created["state"])
	require.Equal(t, "default", created["pool"])
	require.Equal(t, "echo", created["handler"])
	require.EqualValues(t, 0, created["previous_attempts"])
	require.NotContains(t, created, "outcome")
	w := waitWork(t, s, admin, created["id"].(string))
	require.Equal(t, "succeeded", w["outcome"])
	require.Equal(t, map[string]any{"k": "v"}, w["result"])
	require.EqualValues(t, 1, w["attempts"])
	require.NotEmpty(t, w["finished_at"])
	require.NotContains(t, w, "error")
}

func TestWorkAFinalFailureReportsTheError(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")

	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "fail"})
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))

	w := waitWork(t, s, admin, r.JSON(t)["id"].(string))
	require.Equal(t, "failed", w["outcome"])
	require.Equal(t, "nope", w["error"])
	require.NotContains(t, w, "result")
}

func TestWorkEnqueueHonoursIdempotencyKey(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	body := map[string]any{"handler": "echo", "run_at": time.Now().Add(time.Hour).Format(time.RFC3339)}

	first := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")
	again := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")

	require.Equal(t, http.StatusCreated, first.Status)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, first.JSON(t)["id"], again.JSON(t)["id"])
	require.Equal(t, 1, workCount(t, s))
}

func TestWorkEnqueueBadInputIsA400NamingTheFieldAndWritesNothing(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	cases := []struct {
		path  string
		body  any
		field string
	}{
		{"/v1/pools/nope/work", map[string]any{"handler": "echo"}, "pool"},
		{"/v1/pools/wakeup/work", map[string]any{"handler": "echo"}, "pool"},
		{"/v1/pools/default/work", map[string]any{"handler": "nope"}, "handler"},
		{"/v1/pools/default/work", map[string]any{}, "handler"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "run_at": "tomorrow"}, "run_at"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "retry": map[string]any{"max_attempts": -1}}, "retry.max_attempts"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "retry": map[string]any{"max_attempts": 2, "initial_backoff_ms": -1}}, "retry.initial_backoff_ms"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "retry": map[string]any{"max_attempts": 2, "base": 0.5}}, "retry.base"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "timeout_ms": 0}, "timeout_ms"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "timeout_ms": "soon"}, "timeout_ms"},
		{"/v1/pools/default/work", map[string]any{"handler": "echo", "priority": 1}, "priority"},
	}
	for _, tc := range cases {
		r := do(t, s.Handler(), http.MethodPost, tc.path, admin, tc.body)
		r.requireProblem(t, http.StatusBadRequest, tc.field)
	}
	require.Zero(t, workCount(t, s))
}

func TestWorkEnqueueOversizeArgsIsA413(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	big := `{"handler":"echo","args":"` + strings.Repeat("x", 1<<20) + `"}`

	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-a", "admin"), big)

	r.requireProblem(t, http.StatusRequestEntityTooLarge)
	require.Zero(t, workCount(t, s))
}

func TestWorkPlainEnqueueNeedsTheAdminRole(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))

	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-a", "agent"), map[string]any{"handler": "echo"})

	r.requireProblem(t, http.StatusForbidden)
	require.Zero(t, workCount(t, s))
}

func TestWorkOfAnotherOrgIsA404(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-a", "admin"), map[string]any{"handler": "echo"})
	id := r.JSON(t)["id"].(string)
	other := token(t, "org-b", "admin")

	do(t, s.Handler(), http.MethodGet, "/v1/work/"+id, other, nil).requireProblem(t, http.StatusNotFound)
	do(t, s.Handler(), http.MethodPost, "/v1/work/"+id+"/cancel", other, nil).requireProblem(t, http.StatusNotFound)
	do(t, s.Handler(), http.MethodGet, "/v1/work/not-a-uuid", other, nil).requireProblem(t, http.StatusNotFound)
	r = do(t, s.Handler(), http.MethodGet, "/v1/work/"+id, token(t, "org-a", "agent"), nil)
	require.Equal(t, http.StatusOK, r.Status, "an agent of the org may read it")
}

func TestAnIDInAnotherFormThanTheAPIWritesNamesNothing(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	id := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo"}).JSON(t)["id"].(string)
	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/work/"+strings.ToUpper(id), admin, nil).Status,
		"hex digits in either case")
	for _, other := range []string{"%7B" + id + "%7D", "urn:uuid:" + id, strings.ReplaceAll(id, "-", "")} {
		t.Run(other, func(t *testing.T) {
			do(t, s.Handler(), http.MethodGet, "/v1/work/"+other, admin, nil).requireProblem(t, http.StatusNotFound)
		})
	}
}

func TestWorkCancelOfRunningWorkFinishesItCanceled(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	id := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "block"}).JSON(t)["id"].(string)
	require.Eventually(t, func() bool {
		return do(t, s.Handler(), http.MethodGet, "/v1/work/"+id, admin, nil).JSON(t)["state"] == "running"
	}, testWait, pollEvery)

	r := do(t, s.Handler(), http.MethodPost, "/v1/work/"+id+"/cancel", admin, nil)

	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.Equal(t, id, r.JSON(t)["id"])
	w := waitWork(t, s, admin, id)
	require.Equal(t, "canceled", w["outcome"])
	r = do(t, s.Handler(), http.MethodPost, "/v1/work/"+id+"/cancel", admin, nil)
	require.Equal(t, http.StatusOK, r.Status, "canceling finished work is a no-op")
	require.Equal(t, "canceled", r.JSON(t)["outcome"])
}

func TestWorkCancelBeforeItRunsFinishesItCanceled(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	id := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo", "run_at": later}).JSON(t)["id"].(string)

	r := do(t, s.Handler(), http.MethodPost, "/v1/work/"+id+"/cancel", admin, nil)

	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	w := waitWork(t, s, admin, id)
	require.Equal(t, "canceled", w["outcome"])
	require.EqualValues(t, 0, w["attempts"])
	require.Equal(t, later, w["run_at"])
}

func TestPoolsListAndGetShowTheCallersCounts(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	later := time.Now().Add(time.Hour).Format(time.RFC3339)
	for range 3 {
		do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo", "run_at": later})
	}

	r := do(t, s.Handler(), http.MethodGet, "/v1/pools", admin, nil)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	list := r.JSON(t)
	require.Contains(t, list, "next_cursor")
	require.Nil(t, list["next_cursor"])
	var names []string
	for _, p := range list["items"].([]any) {
		names = append(names, p.(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"default", "wakeup"}, names)

	p := do(t, s.Handler(), http.MethodGet, "/v1/pools/default", admin, nil).JSON(t)
	require.EqualValues(t, 25, p["max_parallelism"])
	require.EqualValues(t, 3, p["pending"])
	require.EqualValues(t, 0, p["running"])
	require.EqualValues(t, 0, p["oldest_pending_age_s"], "none of the pending work is due")
	require.Contains(t, []any{"running", "scheduled", "idle"}, p["run_status"].(map[string]any)["kind"])
	require.Contains(t, p, "report")
	other := do(t, s.Handler(), http.MethodGet, "/v1/pools/default", token(t, "org-b", "admin"), nil).JSON(t)
	require.EqualValues(t, 0, other["pending"], "another org's work is not counted")
	do(t, s.Handler(), http.MethodGet, "/v1/pools/nope", admin, nil).requireProblem(t, http.StatusNotFound)
	do(t, s.Handler(), http.MethodGet, "/v1/pools", token(t, "org-a", "agent"), nil).requireProblem(t, http.StatusForbidden)
}

func TestPoolsPatchChangesTheLimitForOperatorsOnly(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	operator := token(t, "ops-org", "operator")

	r := do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{"max_parallelism": 3})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.EqualValues(t, 3, r.JSON(t)["max_parallelism"])
	r = do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{"max_parallelism_per_org": 2})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.EqualValues(t, 2, r.JSON(t)["max_parallelism_per_org"])
	r = do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{"max_parallelism_per_org": nil})
	require.Nil(t, r.JSON(t)["max_parallelism_per_org"])

	do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{"max_parallelism": 0}).requireProblem(t, http.StatusBadRequest, "max_parallelism")
	do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{"max_parallelism": 10001}).requireProblem(t, http.StatusBadRequest, "max_parallelism")
	do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, map[string]any{}).requireProblem(t, http.StatusBadRequest, "max_parallelism")
	do(t, s.Handler(), http.MethodPatch, "/v1/pools/nope", operator, map[string]any{"max_parallelism": 3}).requireProblem(t, http.StatusNotFound)
	do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", token(t, "org-a", "admin"), map[string]any{"max_parallelism": 9}).requireProblem(t, http.StatusForbidden)
	// An operator role outside REVEILLE_OPERATOR_ORGS counts for nothing.
	do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", token(t, "org-a", "operator"), map[string]any{"max_parallelism": 9}).requireProblem(t, http.StatusForbidden)
	p := do(t, s.Handler(), http.MethodGet, "/v1/pools/default", token(t, "org-a", "admin"), nil).JSON(t)
	require.EqualValues(t, 3, p["max_parallelism"])
}

// A PATCH applies all its fields or none: a valid max_parallelism next to
// an invalid max_parallelism_per_org changes nothing.
func TestPoolPatchWithOneInvalidFieldChangesNothing(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	operator := token(t, "ops-org", "operator")
	before := do(t, s.Handler(), http.MethodGet, "/v1/pools/default", token(t, "org-a", "admin"), nil).JSON(t)

	for _, body := range []map[string]any{
		{"max_parallelism": 7, "max_parallelism_per_org": 0},
		{"max_parallelism": 7, "max_parallelism_per_org": 10001},
	} {
		do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator, body).
			requireProblem(t, http.StatusBadRequest, "max_parallelism_per_org")
	}

	after := do(t, s.Handler(), http.MethodGet, "/v1/pools/default", token(t, "org-a", "admin"), nil).JSON(t)
	require.Equal(t, before["max_parallelism"], after["max_parallelism"])
	require.Equal(t, before["max_parallelism_per_org"], after["max_parallelism_per_org"])
}

// A problem that names several fields gives each its own reason, in the
// detail text as in errors[]: one message for all would claim the first
// field's reason for the others.
func TestAProblemNamingSeveralFieldsGivesEachItsOwnReason(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	operator := token(t, "ops-org", "operator")
	p := do(t, s.Handler(), http.MethodPatch, "/v1/pools/default", operator,
		map[string]any{"max_parallelism": 0, "org_weights": map[string]any{"org-a": 0}, "max_parallelism_per_org": -1}).
		requireProblem(t, http.StatusBadRequest, "max_parallelism", "org_weights.org-a", "max_parallelism_per_org")
	detail := p["detail"].(string)
	for _, e := range p["errors"].([]any) {
		f := e.(map[string]any)
		require.Contains(t, detail, f["field"].(string)+": "+f["detail"].(string))
	}
	require.Contains(t, detail, "or null for no cap", "the per-org cap's own reason")
}

// The HTTP layer keeps no record of a 5xx answer, so a retry after a 5xx
// that followed the commit reaches the pool again: the pool's own key
// makes it return the first work. (The record is deleted here as the HTTP
// layer deletes it after a 5xx.)
func TestWorkEnqueueWithAKeyEnqueuesOnceWhenTheHTTPRecordIsGone(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	body := map[string]any{"handler": "echo", "args": map[string]any{"n": 1}}
	forgetHTTPRecord := func() {
		_, err := s.svc.DB.Exec(context.Background(), `DELETE FROM idempotency_keys`)
		require.NoError(t, err)
	}

	first := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status, string(first.Body))
	forgetHTTPRecord()
	again := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")

	require.Equal(t, http.StatusCreated, again.Status, string(again.Body))
	require.Equal(t, first.JSON(t)["id"], again.JSON(t)["id"])
	require.Equal(t, 1, workCount(t, s))

	forgetHTTPRecord()
	other := map[string]any{"handler": "echo", "args": map[string]any{"n": 2}}
	do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, other, "Idempotency-Key", "k1").
		requireProblem(t, http.StatusUnprocessableEntity)
	require.Equal(t, 1, workCount(t, s))
}

// A retry that reaches the pool after the first work finished and its
// record was purged (the pool's key outlives it) enqueues nothing and
// names the work it enqueued. (Both records are deleted here as the HTTP
// layer deletes its own after a 5xx and the purge deletes the work's.)
func TestWorkEnqueueRetryAfterTheWorkWasPurgedIs409NamingTheFirstWork(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	body := map[string]any{"handler": "echo", "args": map[string]any{"n": 1}}
	first := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, first.Status, string(first.Body))
	id := first.JSON(t)["id"].(string)
	waitWork(t, s, admin, id)
	_, err := s.svc.DB.Exec(context.Background(), `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	_, err = s.svc.DB.Exec(context.Background(), `DELETE FROM workpool_work WHERE id = $1`, id)
	require.NoError(t, err)

	again := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body, "Idempotency-Key", "k1")

	p := again.requireProblem(t, http.StatusConflict)
	require.Equal(t, ProblemTypeBase+"idempotency-key-used", p["type"])
	require.Equal(t, id, p["work_id"])
	require.Zero(t, workCount(t, s))
	other := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-b", "admin"), body, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, other.Status, "another org's key is its own: %s", other.Body)
}
