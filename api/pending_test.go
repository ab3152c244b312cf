package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// withCappedWorkpool runs a workpool whose orgs may each have maxPending
// unfinished items per pool, with a "block" handler that runs until its
// work is canceled, and the wake-up service (whose pool nothing runs).
func withCappedWorkpool(t *testing.T, maxPending int) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		m, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t), Cooldown: 50 * time.Millisecond,
			LeaderRetry: 50 * time.Millisecond, StopGrace: time.Second, MaxPendingPerOrg: maxPending,
			Pools: map[string]int{"default": 10}})
		require.NoError(t, err)
		m.Register("block", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		m.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		require.NoError(t, m.Start(context.Background()))
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		sv.Workpool = m
		// Wake-ups go to a pool no loop runs here, so their work stays pending.
		wakePool, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t), MaxPendingPerOrg: maxPending,
			Pools: map[string]int{"wakeup": 10}})
		require.NoError(t, err)
		wakePool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t)})
		sv.Wakeups = wakeup.New(sv.DB, wakePool, sv.Mandates, wakeup.Config{Logger: testkit.Logger(t)})
	}
}

func requireTooManyPending(t *testing.T, r response) {
	t.Helper()
	p := r.requireProblem(t, http.StatusTooManyRequests)
	require.Equal(t, ProblemTypeBase+"too-many-pending", p["type"])
	require.Equal(t, "5", r.Header.Get("Retry-After"))
}

func TestWorkEnqueuePastTheOrgsPendingCapIs429WithRetryAfterAndIsNotReplayed(t *testing.T) {
	s := newTestServer(t, withCappedWorkpool(t, 2))
	admin := token(t, "org-a", "admin")
	var ids []string
	for range 2 {
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "block"})
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		ids = append(ids, r.JSON(t)["id"].(string))
	}

	over := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo"}, "Idempotency-Key", "k1")

	requireTooManyPending(t, over)
	detail := over.JSON(t)["detail"].(string)
	require.Contains(t, detail, "org-a")
	require.Contains(t, detail, "default")
	require.Contains(t, detail, "2")
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", token(t, "org-b", "admin"), map[string]any{"handler": "echo"})
	require.Equal(t, http.StatusCreated, r.Status, "another org is not held back: %s", r.Body)

	// Room comes back as the org's work finishes; the 429 was not kept
	// under the key, so the retry with it is enqueued.
	do(t, s.Handler(), http.MethodPost, "/v1/work/"+ids[0]+"/cancel", admin, nil)
	require.Eventually(t, func() bool {
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "echo"}, "Idempotency-Key", "k1")
		if r.Status == http.StatusTooManyRequests {
			return false
		}
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		return true
	}, testWait, 50*time.Millisecond)
}

func TestWakeupPastTheOrgsPendingCapIs429BeforeAnythingIsSpent(t *testing.T) {
	s := newTestServer(t, withCappedWorkpool(t, 1))
	_, err := s.svc.Mandates.Create(context.Background(), "org-a", mandates.CreateParams{AgentID: "a1", Scope: "llm", Budget: 100})
	require.NoError(t, err)
	body := map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "cost": 5,
		"work": map[string]any{"handler": "echo"},
	}
	agent := token(t, "org-a", "agent")
	r := do(t, s.Handler(), http.MethodPost, "/v1/wakeups", agent, body)
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))

	requireTooManyPending(t, do(t, s.Handler(), http.MethodPost, "/v1/wakeups", agent, body))

	m, err := s.svc.Mandates.Find(context.Background(), "org-a", "a1", "llm")
	require.NoError(t, err)
	require.EqualValues(t, 5, m.Spent, "the refused wake-up spent nothing")
}
