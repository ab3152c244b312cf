package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// poolsFixture is a server with a running workpool and the tokens the
// pool routes take.
type poolsFixture struct {
	t        *testing.T
	s        *Server
	h        http.Handler
	operator string
	// operatorAdmin may also read the pool (GET needs admin), which it sees
	// with the loop's run status.
	operatorAdmin string
	admin         string
}

func newPoolsFixture(t *testing.T, mutate ...func(*Config, *Services)) *poolsFixture {
	t.Helper()
	s := newTestServer(t, append([]func(*Config, *Services){withWorkpool(t)}, mutate...)...)
	return &poolsFixture{t: t, s: s, h: s.Handler(), operator: token(t, "ops-org", "operator"),
		operatorAdmin: token(t, "ops-org", "operator", "admin"), admin: token(t, "org-a", "admin")}
}

// gate registers a handler that runs until release is called (or its
// work is canceled), and records the work it starts, in order.
func (f *poolsFixture) gate() (release func(), started func() []string) {
	ch := make(chan struct{})
	var (
		mu  sync.Mutex
		ids []string
	)
	f.s.svc.Workpool.Register("gate", func(ctx context.Context, j workpool.Job) (json.RawMessage, error) {
		mu.Lock()
		ids = append(ids, j.ID.String())
		mu.Unlock()
		select {
		case <-ch:
			return j.Args, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	var once bool
	release = func() {
		if !once {
			once = true
			close(ch)
		}
	}
	f.t.Cleanup(release)
	return release, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ids...)
	}
}

func (f *poolsFixture) enqueue(tok string, body map[string]any) string {
	f.t.Helper()
	r := do(f.t, f.h, http.MethodPost, "/v1/pools/default/work", tok, body)
	require.Equal(f.t, http.StatusCreated, r.Status, string(r.Body))
	return r.JSON(f.t)["id"].(string)
}

func (f *poolsFixture) workState(tok, id string) string {
	f.t.Helper()
	r := do(f.t, f.h, http.MethodGet, "/v1/work/"+id, tok, nil)
	require.Equal(f.t, http.StatusOK, r.Status, string(r.Body))
	return r.JSON(f.t)["state"].(string)
}

func (f *poolsFixture) waitState(tok, id, state string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.workState(tok, id) == state }, testWait, pollEvery, "work %s never became %s", id, state)
}

func (f *poolsFixture) pool(tok string) map[string]any {
	f.t.Helper()
	r := do(f.t, f.h, http.MethodGet, "/v1/pools/default", tok, nil)
	require.Equal(f.t, http.StatusOK, r.Status, string(r.Body))
	return r.JSON(f.t)
}

// waitRunStatus polls the pool until its loop published the run status
// (an operator's view), then returns the pool as the admin's org sees it,
// whose own run status — the fixture's work is all its org's — is the same.
func (f *poolsFixture) waitRunStatus(kind string, saturated bool) map[string]any {
	f.t.Helper()
	matches := func(p map[string]any) bool {
		rs := p["run_status"].(map[string]any)
		return rs["kind"] == kind && rs["saturated"] == saturated
	}
	require.Eventually(f.t, func() bool { return matches(f.pool(f.operatorAdmin)) },
		testWait, pollEvery, "the pool never published %s (saturated %v)", kind, saturated)
	p := f.pool(f.admin)
	require.True(f.t, matches(p), "the org's own run status: %v", p["run_status"])
	return p
}

func (f *poolsFixture) post(path, tok string) response {
	f.t.Helper()
	return do(f.t, f.h, http.MethodPost, path, tok, nil)
}

func TestPoolPause_WorkEnqueuedWhilePausedStartsOnlyOnResume(t *testing.T) {
	f := newPoolsFixture(t)

	r := f.post("/v1/pools/default/pause", f.operator)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.Equal(t, true, r.JSON(t)["paused"])
	id := f.enqueue(f.admin, map[string]any{"handler": "echo", "args": map[string]any{"n": 1}})

	// A paused pool with waiting work publishes "scheduled": once it does,
	// its loop has seen the work and left it.
	p := f.waitRunStatus("scheduled", false)
	require.Equal(t, true, p["paused"])
	require.EqualValues(t, 1, p["pending"])
	require.Equal(t, "pending", f.workState(f.admin, id))

	r = f.post("/v1/pools/default/resume", f.operator)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.Equal(t, false, r.JSON(t)["paused"])
	w := waitWork(t, f.s, f.admin, id)
	require.Equal(t, "succeeded", w["outcome"])
}

func TestPoolPause_RunningWorkFinishesAndCancelsProceedDuringAPause(t *testing.T) {
	f := newPoolsFixture(t)
	release, _ := f.gate()
	finishing := f.enqueue(f.admin, map[string]any{"handler": "gate"})
	canceled := f.enqueue(f.admin, map[string]any{"handler": "gate"})
	f.waitState(f.admin, finishing, "running")
	f.waitState(f.admin, canceled, "running")

	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/pause", f.operator).Status)
	waiting := f.enqueue(f.admin, map[string]any{"handler": "echo"})
	require.Equal(t, http.StatusOK, f.post("/v1/work/"+canceled+"/cancel", f.admin).Status)
	require.Equal(t, "canceled", waitWork(t, f.s, f.admin, canceled)["outcome"], "a cancelation proceeds")
	release()
	require.Equal(t, "succeeded", waitWork(t, f.s, f.admin, finishing)["outcome"], "running work finishes")
	f.waitRunStatus("scheduled", false)
	require.Equal(t, "pending", f.workState(f.admin, waiting), "nothing new starts")
}

func TestPoolPause_APausedPoolIsNotReportedSaturated(t *testing.T) {
	f := newPoolsFixture(t)
	_, _ = f.gate()
	r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"max_parallelism": 1})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	f.enqueue(f.admin, map[string]any{"handler": "gate"})
	f.enqueue(f.admin, map[string]any{"handler": "gate"})
	f.waitRunStatus("scheduled", true) // before the pause: its one slot is taken

	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/pause", f.operator).Status)

	p := f.waitRunStatus("scheduled", false)
	require.Equal(t, true, p["paused"])
	require.EqualValues(t, 1, p["running"])
	require.EqualValues(t, 1, p["pending"])
}

func TestPoolPause_IsAnIdempotentOperatorCall(t *testing.T) {
	f := newPoolsFixture(t)
	for _, tc := range []struct {
		name, path, tok string
		status          int
		paused          bool
	}{
		{"pause", "/v1/pools/default/pause", f.operator, http.StatusOK, true},
		{"pause again", "/v1/pools/default/pause", f.operator, http.StatusOK, true},
		{"an admin may not resume", "/v1/pools/default/resume", f.admin, http.StatusForbidden, true},
		{"an operator outside the operator orgs may not", "/v1/pools/default/resume", token(t, "org-a", "operator"), http.StatusForbidden, true},
		{"an unknown pool", "/v1/pools/nope/resume", f.operator, http.StatusNotFound, true},
		{"resume", "/v1/pools/default/resume", f.operator, http.StatusOK, false},
		{"resume again", "/v1/pools/default/resume", f.operator, http.StatusOK, false},
		{"no token", "/v1/pools/default/pause", "", http.StatusUnauthorized, false},
	} {
		r := f.post(tc.path, tc.tok)
		if tc.status == http.StatusOK {
			require.Equal(t, tc.status, r.Status, "%s: %s", tc.name, r.Body)
		} else {
			r.requireProblem(t, tc.status)
		}
		require.Equal(t, tc.paused, f.pool(f.admin)["paused"], tc.name)
	}
}

// Keyed work over REST: a key of limit 1 runs its items one at a time in
// run_at order, while another key and unkeyed work run beside it.
func TestWorkConcurrencyKeyOfLimitOneRunsItsItemsInTurnWhileOtherKeysRun(t *testing.T) {
	f := newPoolsFixture(t)
	_, _ = f.gate()
	// Paused while enqueuing, so that the start sees every item at once.
	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/pause", f.operator).Status)
	base := time.Now().Add(-time.Minute).UTC()
	at := func(i int) string { return base.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano) }
	var serial []string
	for i := range 3 { // queued in reverse: run_at, not arrival, orders them
		serial = append([]string{f.enqueue(f.admin, map[string]any{"handler": "gate", "concurrency_key": "customer-7", "key_limit": 1,
			"run_at": at(2 - i)})}, serial...)
	}
	other := f.enqueue(f.admin, map[string]any{"handler": "gate", "concurrency_key": "customer-8", "key_limit": 1, "run_at": at(5)})
	plain := f.enqueue(f.admin, map[string]any{"handler": "gate", "run_at": at(6)})
	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/resume", f.operator).Status)

	for i, id := range serial {
		f.waitState(f.admin, id, "running")
		f.waitState(f.admin, other, "running")
		f.waitState(f.admin, plain, "running")
		p := f.pool(f.admin)
		require.EqualValues(t, 3, p["running"], "one item of customer-7 at a time, beside customer-8's and the unkeyed one")
		require.EqualValues(t, len(serial)-1-i, p["blocked_by_key"])
		for _, later := range serial[i+1:] {
			require.Equal(t, "pending", f.workState(f.admin, later))
		}
		require.Equal(t, http.StatusOK, f.post("/v1/work/"+id+"/cancel", f.admin).Status)
		require.Equal(t, "canceled", waitWork(t, f.s, f.admin, id)["outcome"])
	}
}

// pausedThreeToOne gives the default pool slots and org-heavy the weight 3
// (org-light keeps 1) and pauses it; it returns the two orgs' admin tokens
// and the pool as the PATCH answered.
func (f *poolsFixture) pausedThreeToOne(t *testing.T, slots int) (heavy, light string, patched map[string]any) {
	t.Helper()
	heavy, light = token(t, "org-heavy", "admin"), token(t, "org-light", "admin")
	r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator,
		map[string]any{"max_parallelism": slots, "org_weights": map[string]any{"org-heavy": 3}})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/pause", f.operator).Status)
	return heavy, light, r.JSON(t)
}

// Weights over REST: with org weights 3:1 and a backlog in both orgs, the
// starts split 3:1 — the first fill exactly, and as attempts finish one by
// one the refills keep each org's slots within one of its share.
func TestPoolOrgWeightsThreeToOneSplitStartsThreeToOne(t *testing.T) {
	f := newPoolsFixture(t)
	_, started := f.gate()
	heavy, light, patched := f.pausedThreeToOne(t, 4)
	require.Equal(t, map[string]any{"org-heavy": 3.0}, patched["org_weights"])
	base := time.Now().Add(-time.Minute).UTC()
	tokOf := map[string]string{}
	for i := range 20 { // interleaved: in run_at order the orgs alternate
		for j, tok := range []string{light, heavy} {
			at := base.Add(time.Duration(2*i+j) * time.Millisecond).Format(time.RFC3339Nano)
			tokOf[f.enqueue(tok, map[string]any{"handler": "gate", "run_at": at})] = tok
		}
	}
	require.EqualValues(t, 3, f.pool(heavy)["weight"])
	require.EqualValues(t, 1, f.pool(light)["weight"])
	// refilled waits until every slot is taken again and returns the
	// heavy org's share of them.
	refilled := func() int {
		t.Helper()
		var h float64
		require.Eventually(t, func() bool {
			h = f.pool(heavy)["running"].(float64)
			return h+f.pool(light)["running"].(float64) == 4
		}, testWait, pollEvery, "the slots were never refilled")
		return int(h)
	}

	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/resume", f.operator).Status)
	require.Equal(t, 3, refilled(), "the first fill splits 3:1")
	// Attempts of equal length: the one started first finishes first, and
	// the loop fills its slot.
	for i := range 12 {
		// A start commits before its handler runs: wait for the handler.
		require.Eventually(t, func() bool { return len(started()) > i }, testWait, pollEvery)
		id := started()[i]
		require.Equal(t, http.StatusOK, f.post("/v1/work/"+id+"/cancel", tokOf[id]).Status)
		waitWork(t, f.s, tokOf[id], id)
		require.InDelta(t, 3, refilled(), 1, "after refill %d the heavy org holds its share within one", i)
	}
	count := map[string]int{}
	for name, tok := range map[string]string{"heavy": heavy, "light": light} {
		count[name] = 20 - int(f.pool(tok)["pending"].(float64))
	}
	require.Equal(t, 16, count["heavy"]+count["light"], "4 first, then one per finished attempt")
	require.InDelta(t, 3.0, float64(count["heavy"])/float64(count["light"]), 0.75, "starts split 3:1: %v", count)
}

// Weights over REST in a pool of one slot: no org holds a slot when the
// next start is picked, so the turns are counted in starts — the heavy org
// takes three for every one of the light org's, although the light org's
// whole backlog was queued first.
func TestPoolOrgWeightsThreeToOneInOneSlotSplitStartsThreeToOne(t *testing.T) {
	f := newPoolsFixture(t)
	_, started := f.gate()
	heavy, light, _ := f.pausedThreeToOne(t, 1)
	orgOf, tokOf := map[string]string{}, map[string]string{}
	for _, org := range []struct{ name, tok string }{{"light", light}, {"heavy", heavy}} {
		for range 12 {
			id := f.enqueue(org.tok, map[string]any{"handler": "gate"})
			orgOf[id], tokOf[id] = org.name, org.tok
		}
	}
	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/resume", f.operator).Status)
	var order []string
	for i := range 16 {
		require.Eventually(t, func() bool { return len(started()) > i }, testWait, pollEvery)
		id := started()[i]
		order = append(order, orgOf[id])
		require.Equal(t, http.StatusOK, f.post("/v1/work/"+id+"/cancel", tokOf[id]).Status)
		waitWork(t, f.s, tokOf[id], id)
	}
	heavyStarts := 0
	for _, o := range order {
		if o == "heavy" {
			heavyStarts++
		}
	}
	require.InDelta(t, 12, heavyStarts, 1, "starts split 3:1: %v", order)
}

// A PATCH applies all its fields in one transaction or none: any bad value
// is a 400 naming it, and nothing of the rest is written.
func TestPoolPatchWithABadWeightNamesItAndWritesNothing(t *testing.T) {
	f := newPoolsFixture(t)
	r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator,
		map[string]any{"max_parallelism": 7, "max_parallelism_per_org": 2, "org_weights": map[string]any{"org-5": 2}})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	before := r.JSON(t)

	for _, tc := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"max_parallelism": 9, "org_weights": map[string]any{"org-6": 4, "org-7": 0}}, "org_weights.org-7"},
		{map[string]any{"max_parallelism": 9, "org_weights": map[string]any{"org-7": 101}}, "org_weights.org-7"},
		{map[string]any{"max_parallelism": 9, "org_weights": map[string]any{"org-7": "3"}}, "org_weights.org-7"},
		{map[string]any{"max_parallelism": 9, "org_weights": map[string]any{"org-7": 2.5}}, "org_weights.org-7"},
		{map[string]any{"max_parallelism_per_org": 3, "org_weights": map[string]any{"": 2}}, "org_weights."},
		{map[string]any{"max_parallelism_per_org": 3, "org_weights": map[string]any{"   ": 2}}, "org_weights.   "},
		{map[string]any{"max_parallelism": 9, "org_weights": []any{1}}, "org_weights"},
		{map[string]any{"org_weights": map[string]any{"org-6": 4}, "max_parallelism_per_org": 0}, "max_parallelism_per_org"},
		{map[string]any{"org_weights": nil, "max_parallelism": 0}, "max_parallelism"},
		{map[string]any{"org_weights": map[string]any{"org-6": 4}, "max_parallelism": nil}, "max_parallelism"},
		{map[string]any{"max_parallelism": nil}, "max_parallelism"},
		{map[string]any{"max_parallelism": 5, "MAX_PARALLELISM": nil, "org_weights": map[string]any{"org-6": 4}}, "MAX_PARALLELISM"},
		{map[string]any{"org_weights": map[string]any{"org-6": 4}, "paused": true}, "paused"},
	} {
		do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
		r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"org_weights": map[string]any{}})
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		after := r.JSON(t)
		for _, k := range []string{"max_parallelism", "max_parallelism_per_org", "org_weights", "paused"} {
			require.Equal(t, before[k], after[k], "%v wrote %s", tc.body, k)
		}
	}
	// A body of null is no object (it read as one without a field).
	p := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, " null ", "Content-Type", "application/json").
		requireProblem(t, http.StatusBadRequest, "body")
	require.Equal(t, "invalid body: must be a JSON object", p["detail"])
}

func TestPoolPatchSetsRemovesAndClearsOrgWeights(t *testing.T) {
	f := newPoolsFixture(t)
	patch := func(weights any) map[string]any {
		t.Helper()
		r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"org_weights": weights})
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		return r.JSON(t)
	}
	weightsOf := func(p map[string]any) map[string]any {
		w, _ := p["org_weights"].(map[string]any)
		return w
	}

	require.Equal(t, map[string]any{"org-a": 3.0, "org-b": 100.0}, weightsOf(patch(map[string]any{"org-a": 3, "org-b": 100})))
	require.EqualValues(t, 3, f.pool(f.admin)["weight"], "the caller's org's weight")
	require.Equal(t, map[string]any{"org-b": 100.0}, weightsOf(patch(map[string]any{"org-a": nil})), "null gives one org the default")
	require.Equal(t, map[string]any{"org-b": 100.0}, weightsOf(patch(map[string]any{})), "orgs not named keep their weights")
	cleared := patch(nil)
	require.Contains(t, cleared, "org_weights", "an operator's answer always holds the weights")
	require.Empty(t, weightsOf(cleared), "null gives every org the default")
	require.EqualValues(t, 1, f.pool(f.admin)["weight"])
	require.NotContains(t, f.pool(f.admin), "org_weights", "an admin's answer holds no other org's weight")
}

// null for concurrency_key or key_limit is the same as leaving it out (an
// empty key too), and the document says so: the test server's contract
// check refuses a request the document does not describe.
func TestWorkEnqueueWithNullKeyFieldsIsWorkWithoutAKey(t *testing.T) {
	f := newPoolsFixture(t)
	for _, body := range []map[string]any{
		{"handler": "echo", "concurrency_key": nil, "key_limit": nil},
		{"handler": "echo", "concurrency_key": ""},
	} {
		r := do(t, f.h, http.MethodPost, "/v1/pools/default/work", f.admin, body)
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		require.NotContains(t, r.JSON(t), "concurrency_key")
	}
	r := do(t, f.h, http.MethodPost, "/v1/pools/default/work", f.admin, map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": nil})
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	require.EqualValues(t, 1, r.JSON(t)["key_limit"], "a null limit is the default, 1")
}

func TestWorkEnqueueBadConcurrencyKeyOrKeyLimitIsA400AndWritesNothing(t *testing.T) {
	f := newPoolsFixture(t)
	for _, tc := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"handler": "echo", "concurrency_key": strings.Repeat("k", 201)}, "concurrency_key"},
		{map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": 0}, "key_limit"},
		{map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": -1}, "key_limit"},
		{map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": 10001}, "key_limit"},
		{map[string]any{"handler": "echo", "key_limit": 2}, "key_limit"},
		{map[string]any{"handler": "echo", "concurrency_key": 7}, "concurrency_key"},
		{map[string]any{"handler": "echo", "concurrency_key": "   "}, "concurrency_key"},
	} {
		do(t, f.h, http.MethodPost, "/v1/pools/default/work", f.admin, tc.body).requireProblem(t, http.StatusBadRequest, tc.field)
	}
	require.Zero(t, workCount(t, f.s))
	f.enqueue(f.admin, map[string]any{"handler": "echo", "concurrency_key": strings.Repeat("é", 200), "key_limit": 10000})
}

// withWakeupsOnWorkpool runs wake-ups on the test's running workpool.
func withWakeupsOnWorkpool(t *testing.T) func(*Config, *Services) {
	return func(c *Config, sv *Services) {
		withMandates(t)(c, sv)
		sv.Wakeups = wakeup.New(sv.DB, sv.Workpool, sv.Mandates, wakeup.Config{Logger: testkit.Logger(t)})
	}
}

func TestWakeupWorkTakesAConcurrencyKey(t *testing.T) {
	f := newPoolsFixture(t, withWakeupsOnWorkpool(t))
	agent := subToken(t, "org-a", "rt", "a1", RoleAgent)
	r := do(t, f.h, http.MethodPost, "/v1/mandates", f.admin, map[string]any{"agent_id": "a1", "scope": "llm", "budget": 100})
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	body := func(work map[string]any) map[string]any {
		return map[string]any{"agent_id": "a1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "cost": 1,
			"work": work}
	}

	for _, tc := range []struct {
		work  map[string]any
		field string
	}{
		{map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": 0}, "work.key_limit"},
		{map[string]any{"handler": "echo", "concurrency_key": "k", "key_limit": 10001}, "work.key_limit"},
		{map[string]any{"handler": "echo", "concurrency_key": strings.Repeat("k", 201)}, "work.concurrency_key"},
		{map[string]any{"handler": "echo", "key_limit": 2}, "work.key_limit"},
	} {
		do(t, f.h, http.MethodPost, "/v1/wakeups", agent, body(tc.work)).requireProblem(t, http.StatusBadRequest, tc.field)
	}
	var wakeups int
	require.NoError(t, f.s.svc.DB.QueryRow(context.Background(), `SELECT count(*) FROM wakeups`).Scan(&wakeups))
	require.Zero(t, wakeups, "nothing written, nothing spent")

	work := map[string]any{"handler": "echo", "concurrency_key": "customer-7", "key_limit": 2}
	r = do(t, f.h, http.MethodPost, "/v1/wakeups", agent, body(work), "Idempotency-Key", "w-1")
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	id := r.JSON(t)["id"].(string)
	var workID string
	require.Eventually(t, func() bool {
		w := do(t, f.h, http.MethodGet, "/v1/wakeups/"+id, agent, nil).JSON(t)
		workID, _ = w["work_id"].(string)
		return workID != ""
	}, testWait, pollEvery)
	var (
		key   string
		limit int
	)
	require.NoError(t, f.s.svc.DB.QueryRow(context.Background(),
		`SELECT concurrency_key, key_limit FROM workpool_work WHERE id = $1 AND org_id = 'org-a'`, workID).Scan(&key, &limit))
	require.Equal(t, "customer-7", key)
	require.Equal(t, 2, limit)
}

// A work item shows the key it was enqueued with, and its limit; unkeyed
// work shows neither.
func TestWorkShowsItsConcurrencyKeyAndLimit(t *testing.T) {
	f := newPoolsFixture(t)
	_, _ = f.gate()
	require.Equal(t, http.StatusOK, f.post("/v1/pools/default/pause", f.operator).Status)
	for _, c := range []struct {
		name string
		body map[string]any
		want map[string]any // the key fields expected, absent when nil
	}{
		{"keyed with a limit", map[string]any{"handler": "gate", "concurrency_key": "customer-7", "key_limit": 3},
			map[string]any{"concurrency_key": "customer-7", "key_limit": 3.0}},
		{"keyed without a limit", map[string]any{"handler": "gate", "concurrency_key": "customer-8"},
			map[string]any{"concurrency_key": "customer-8", "key_limit": 1.0}},
		{"unkeyed", map[string]any{"handler": "gate"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := f.enqueue(f.admin, c.body)
			r := do(t, f.h, http.MethodGet, "/v1/work/"+id, f.admin, nil)
			require.Equal(t, http.StatusOK, r.Status, string(r.Body))
			got := map[string]any{}
			for _, k := range []string{"concurrency_key", "key_limit"} {
				if v, ok := r.JSON(t)[k]; ok {
					got[k] = v
				}
			}
			if c.want == nil {
				require.Empty(t, got)
				return
			}
			require.Equal(t, c.want, got)
		})
	}
}

// An operation that takes no body never reads one, so an oversize body is
// not refused there (a 413 is not among its declared answers); one that
// takes a body still refuses it. The operations without a body come from
// the OpenAPI document.
func TestPoolPause_AnOversizeBodyToAnOperationWithoutOneIsNotRefused(t *testing.T) {
	f := newPoolsFixture(t)
	big := []byte(`{"x":"` + strings.Repeat("x", 2<<20) + `"}`)
	require.True(t, f.s.bodyless["POST /v1/pools/:pool/pause"])
	require.False(t, f.s.bodyless["POST /v1/pools/:pool/work"])

	r := sendBody(t, f.h, "/v1/pools/default/pause", f.operator, "application/json", big, false)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	require.Equal(t, true, r.JSON(t)["paused"])
	sendBody(t, f.h, "/v1/pools/default/work", f.admin, "application/json", big, false).
		requireProblem(t, http.StatusRequestEntityTooLarge, "body")

	// nor is it read to fingerprint an Idempotency-Key: a retry that sends
	// another (ignored) body is the same request
	id := f.enqueue(f.admin, map[string]any{"handler": "echo", "args": map[string]any{}})
	cancel := func(body []byte) response {
		req := httptest.NewRequest(http.MethodPost, "/v1/work/"+id+"/cancel", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+f.admin)
		req.Header.Set("Idempotency-Key", "cancel-1")
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	}
	first := cancel(big)
	require.Less(t, first.Status, 300, string(first.Body))
	again := cancel([]byte(`{"other": true}`))
	require.Equal(t, first.Status, again.Status, string(again.Body))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
}

// A pool's run status shows a caller no other org's work: the loop's comes
// of every org's (another org's timed wake-up to the millisecond, or its
// work filling the pool), so an admin sees what the loop would publish
// were its org's work all there is; an operator, whose settings span
// orgs, sees the loop's.
func TestAPoolsRunStatusShowsACallerNoOtherOrgsWork(t *testing.T) {
	f := newPoolsFixture(t)
	release, _ := f.gate()
	r := do(t, f.h, http.MethodPatch, "/v1/pools/default", f.operator, map[string]any{"max_parallelism": 1})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	other := token(t, "org-b", "admin")
	runStatus := func(tok string) map[string]any { return f.pool(tok)["run_status"].(map[string]any) }
	idle := map[string]any{"kind": "idle"}

	later := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	f.enqueue(f.admin, map[string]any{"handler": "echo", "run_at": later.Format(time.RFC3339Nano)})
	require.Equal(t, map[string]any{"kind": "scheduled", "saturated": false, "at": later.Format(time.RFC3339Nano)}, runStatus(f.admin))
	require.Equal(t, idle, runStatus(other), "another org's timed work shows")

	running := f.enqueue(f.admin, map[string]any{"handler": "gate"})
	f.waitState(f.admin, running, "running")
	f.enqueue(f.admin, map[string]any{"handler": "gate"})
	require.Equal(t, map[string]any{"kind": "scheduled", "saturated": true, "at": later.Format(time.RFC3339Nano)}, runStatus(f.admin))
	require.Equal(t, idle, runStatus(other), "another org's work filling the pool shows")
	f.waitRunStatus("scheduled", true) // the loop's, to the operator

	b := f.enqueue(other, map[string]any{"handler": "echo"})
	require.Equal(t, map[string]any{"kind": "running"}, runStatus(other), "its own ready work, as if alone in the pool")
	release()
	require.Equal(t, "succeeded", waitWork(t, f.s, other, b)["outcome"])
	require.Equal(t, idle, runStatus(other))
}

func TestThePoolListPagesByNameAndRefusesABadLimitOrCursor(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	all := do(t, s.Handler(), http.MethodGet, "/v1/pools", admin, nil).JSON(t)["items"].([]any)
	require.GreaterOrEqual(t, len(all), 2)
	var names, paged []string
	for _, p := range all {
		names = append(names, p.(map[string]any)["name"].(string))
	}
	require.True(t, slices.IsSorted(names), "in name order: %v", names)
	path := "/v1/pools?limit=1"
	for range len(names) + 1 {
		body := do(t, s.Handler(), http.MethodGet, path, admin, nil).JSON(t)
		items := body["items"].([]any)
		require.Len(t, items, 1)
		paged = append(paged, items[0].(map[string]any)["name"].(string))
		next, _ := body["next_cursor"].(string)
		if next == "" {
			break
		}
		path = "/v1/pools?limit=1&cursor=" + url.QueryEscape(next)
	}
	require.Equal(t, names, paged, "each pool once")
	for _, q := range []string{"limit=0", "limit=501", "limit=abc"} {
		do(t, s.Handler(), http.MethodGet, "/v1/pools?"+q, admin, nil).requireProblem(t, http.StatusBadRequest, "limit")
	}
	do(t, s.Handler(), http.MethodGet, "/v1/pools?cursor=%25", admin, nil).requireProblem(t, http.StatusBadRequest, "cursor")
}
