package demo

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const testOrg = "demo-org"

var testSecret = []byte("demo-test-secret-of-at-least-32-bytes")

// startEngine runs the whole service on a fresh database until the test
// ends and returns its API's URL. Temporal is absent (its client is lazy):
// these tests drive the demo's REST half, which needs no signal delivered.
// Work in pool "parked" runs handler "block", which never returns, so its
// wake-ups stay pending.
func startEngine(t *testing.T) string {
	t.Helper()
	cfg := service.Config{
		DatabaseURL:     testkit.NewDatabase(t),
		TemporalAddress: "127.0.0.1:1",
		API:             api.Config{Addr: "127.0.0.1:0", Auth: api.AuthConfig{Secrets: [][]byte{testSecret}}, ShutdownTimeout: 5 * time.Second},
		Workpool: workpool.Config{Pools: map[string]int{"default": 1, "wakeup": 1, "parked": 1},
			Cooldown: 50 * time.Millisecond, LeaderRetry: 50 * time.Millisecond, StopGrace: 100 * time.Millisecond},
		StopTimeout: 10 * time.Second,
		Logger:      testkit.Logger(t),
	}
	svc, err := service.New(context.Background(), cfg)
	require.NoError(t, err)
	svc.Workpool().Register("block", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, func(a net.Addr) { addr <- a.String() }) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		svc.Close()
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("the service ended before it listened: %v", err)
		return ""
	}
}

// newTestDemo is the demo's REST half against apiURL, its tokens signed
// with secret, for a fresh agent with its mandate.
func newTestDemo(t *testing.T, apiURL string, secret []byte) *demo {
	t.Helper()
	apis, err := newDemoAPIs(apiURL, secret, testOrg, "", "")
	require.NoError(t, err)
	return &demo{demoAPIs: apis, agent: "demo-agent-" + strings.ReplaceAll(t.Name(), "/", "-"), org: testOrg}
}

// parkedWakeup asks for a wake-up of workflow wf whose work never ends.
func parkedWakeup(t *testing.T, d *demo, wf string) string {
	t.Helper()
	w, err := d.agentRuntime.Wakeups.Create(context.Background(), reveille.WakeupRequest{
		AgentID: d.agent, WorkflowID: wf, Signal: "wake", Scope: demoScope, Cost: 1, Pool: "parked",
		Work: reveille.WakeupWork{Handler: "block"},
	})
	require.NoError(t, err)
	return w.ID
}

func TestTheDemosMandateIsCreatedOnceAndFoundThereOnARerun(t *testing.T) {
	ctx := context.Background()
	d := newTestDemo(t, startEngine(t), testSecret)
	require.NoError(t, d.ensureMandate(ctx))
	require.NoError(t, d.ensureMandate(ctx), "an agent that has its mandate already keeps it")

	var mandates []reveille.Mandate
	for m, err := range d.admin.Mandates.List(ctx, reveille.MandateListParams{AgentID: d.agent}) {
		require.NoError(t, err)
		mandates = append(mandates, m)
	}
	require.Len(t, mandates, 1)
	require.Equal(t, demoScope, mandates[0].Scope)
	require.EqualValues(t, 1000, mandates[0].Budget)
}

func TestTheDemoFindsTheWakeupOfItsWorkflow(t *testing.T) {
	ctx := context.Background()
	d := newTestDemo(t, startEngine(t), testSecret)
	require.NoError(t, d.ensureMandate(ctx))
	mine := parkedWakeup(t, d, testOrg+"/demo-mine")
	parkedWakeup(t, d, testOrg+"/demo-other") // newer, of another workflow

	got, err := d.awaitWakeup(ctx, testOrg+"/demo-mine")
	require.NoError(t, err)
	require.Equal(t, mine, got)
}

func TestTheDemoAnswersAPendingToolCallAsAHuman(t *testing.T) {
	ctx := context.Background()
	apiURL := startEngine(t)
	for _, decision := range []string{"approved", "denied"} {
		t.Run(decision, func(t *testing.T) {
			d := newTestDemo(t, apiURL, testSecret)
			session := testOrg + "/demo-tool-" + decision
			asked, err := d.agentRuntime.ToolApprovals.Request(ctx, session, reveille.ToolCallRequest{AgentID: d.agent, ToolName: "deploy", Input: map[string]string{"env": "staging"}})
			require.NoError(t, err)
			require.Equal(t, "pending", asked.Decision)

			events, err := d.answerToolCall(ctx, session, decision)
			require.NoError(t, err)
			require.Len(t, events, 2)
			require.Equal(t, `tool call "deploy" pending → approval `+asked.ApprovalID+" in the inbox (no policy decided)", events[0].what)
			require.Contains(t, events[1].what, "decision="+decision)

			got, err := d.approver.ToolApprovals.Get(ctx, asked.ApprovalID)
			require.NoError(t, err)
			require.Equal(t, decision, got.Status)
			require.Equal(t, "demo-approver", *got.ResolvedBy)
		})
	}
}

// A refusal the client cannot retry away (here: tokens the engine does not
// accept) ends the demo's wait for a wake-up or a tool call at once, with
// the API's problem, instead of polling until the case's time is up.
func TestTheDemoStopsWaitingAtARefusalOfTheAPI(t *testing.T) {
	d := newTestDemo(t, startEngine(t), []byte("not-the-engine-secret-but-32-bytes-long"))
	for _, wait := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"for a wake-up", func(ctx context.Context) error { _, err := d.awaitWakeup(ctx, testOrg+"/demo-x"); return err }},
		{"for a tool call", func(ctx context.Context) error {
			_, err := d.answerToolCall(ctx, testOrg+"/demo-x", "approved")
			return err
		}},
	} {
		t.Run(wait.name, func(t *testing.T) {
			// A bound for a wait that would go on: it then ends with the
			// context's error, not the API's.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := wait.call(ctx)
			require.True(t, reveille.IsUnauthorized(err), "%v", err)
		})
	}
}
