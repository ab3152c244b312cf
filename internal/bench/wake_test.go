package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

// restEnv is the part of the wake bench's engine that its REST phase
// uses — the service on a run's database, the bench handler, a mandate of
// budget for the bench agent — without Temporal: its client is lazy, and
// no signal needs to arrive here.
func restEnv(t *testing.T, budget int64) *wakeEnv {
	t.Helper()
	ctx := context.Background()
	env := &wakeEnv{logger: testkit.Logger(t), agent: "bench-agent-rest", restHold: make(chan struct{})}
	t.Cleanup(func() { env.tearDown(false) })
	var err error
	env.where, err = setUp(ctx, service.Config{DatabaseURL: testkit.ServerURL(t)}, "wake", "", false)
	require.NoError(t, err)
	cfg, secret := serviceConfig(service.Config{}, env.where, env.logger)
	cfg.TemporalAddress, env.secret = "127.0.0.1:1", secret
	env.svc, err = service.New(ctx, cfg)
	require.NoError(t, err)
	env.svc.Workpool().Register(wakeBenchHandler, env.benchHandler)
	env.running, err = start(ctx, env.svc)
	require.NoError(t, err)
	env.apiURL = "http://" + env.running.addr
	_, err = env.svc.Mandates().Create(ctx, wakeBenchOrg, mandates.CreateParams{AgentID: env.agent, Scope: wakeBenchScope, Budget: budget})
	require.NoError(t, err)
	return env
}

// asAdmin is a client of env's API with the bench org's admin token.
func asAdmin(t *testing.T, env *wakeEnv) *reveille.Client {
	t.Helper()
	tok, err := api.SignToken(env.secret, api.TokenSpec{OrgID: wakeBenchOrg, Sub: "bench-test", Roles: []string{api.RoleAdmin}, TTL: time.Hour})
	require.NoError(t, err)
	c, err := reveille.New(env.apiURL, reveille.WithToken(tok))
	require.NoError(t, err)
	return c
}

func TestTheWakeBenchsRestPhaseCreatesOneWakeupPerRequest(t *testing.T) {
	const n, concurrency = 10, 3
	warm := 2 * concurrency
	env := restEnv(t, 100)
	res, err := env.restEnqueue(context.Background(), n, concurrency, true)
	require.NoError(t, err)
	require.Len(t, res.latencies, n)

	workflows := map[string]bool{}
	for w, err := range asAdmin(t, env).Wakeups.List(context.Background(), reveille.WakeupListParams{AgentID: env.agent}) {
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(w.WorkflowID, wakeBenchOrg+"/rest-"), w.WorkflowID)
		require.Equal(t, wakeBenchScope, w.Scope)
		require.EqualValues(t, 1, w.Cost)
		require.False(t, workflows[w.WorkflowID], "one wake-up per workflow: %s", w.WorkflowID)
		workflows[w.WorkflowID] = true
	}
	require.Len(t, workflows, warm+n, "the warm-up's and the measured requests, each once")
}

// A failed request ends the phase with the API's problem, and nothing is
// sent after it.
func TestTheWakeBenchsRestPhaseEndsAtTheFirstRefusal(t *testing.T) {
	env := restEnv(t, 3) // less than the warm-up alone spends
	_, err := env.restEnqueue(context.Background(), 10, 1, true)
	require.True(t, reveille.IsSpendRefused(err), "%v", err)

	var spends int
	for m, err := range asAdmin(t, env).Mandates.List(context.Background(), reveille.MandateListParams{AgentID: env.agent}) {
		require.NoError(t, err)
		spends += int(m.Spent)
	}
	require.Equal(t, 3, spends, "the requests before the refusal spent, and nothing after it was sent")
}
