package e2e

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/load"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// engine load, small, against the service as serve wires it (its own
// database, this package's Temporal server): every wake-up it asks for —
// funded, refused then approved, canceled, behind a tool call — wakes its
// workflow with its outcome; and a wake-up whose signal never reaches
// Temporal is reported lost, with ErrLost.
func TestLoadCountsEveryWakeupWokenAndReportsTheLostOnes(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		wakeups, clients       int
		approvalsEvery         int
		swallowWakes           int64
		deadline               time.Duration
		wantLost, wantRefused  int
		wantCanceled, wantTool int
	}{
		{name: "every wake-up wakes its workflow", wakeups: 200, clients: 8, approvalsEvery: 10, deadline: time.Minute,
			wantRefused: 10, wantCanceled: 10, wantTool: 20},
		{name: "a wake signal that never reaches Temporal is lost", wakeups: 10, clients: 2, swallowWakes: 1, deadline: 3 * time.Second,
			wantLost: 1, wantRefused: 1, wantCanceled: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A lost signal cannot be caused otherwise: the dispatcher
			// retries every failed send until Temporal takes it, so this
			// signaler reports the first swallowWakes wake signals sent
			// without sending them.
			var swallowed atomic.Int64
			wrap := func(s queue.Signaler) queue.Signaler {
				return signalerFunc(func(ctx context.Context, wf, run, name string, arg any) error {
					if name == "wake" && swallowed.Add(1) <= tc.swallowWakes {
						return nil
					}
					return s.SignalWorkflow(ctx, wf, run, name, arg)
				})
			}
			url := startService(t, wrap)
			var out bytes.Buffer
			rep, err := load.Run(context.Background(), load.Config{
				APIs: []string{url}, Secret: string(secret), Org: org,
				TemporalAddress: temporalServer.GetFrontendHostPort(), Namespace: temporalServer.GetDefaultNamespace(),
				Wakeups: tc.wakeups, Clients: tc.clients, ApprovalsEvery: tc.approvalsEvery, RefuseEvery: 20, CancelEvery: 20, Deadline: tc.deadline,
				Progress: time.Hour, Out: &out, Logger: testkit.Logger(t),
			})
			if tc.wantLost > 0 {
				require.ErrorIs(t, err, load.ErrLost)
			} else {
				require.NoError(t, err, out.String())
			}
			require.Equal(t, tc.wakeups, rep.Accepted, out.String())
			require.Equal(t, tc.wakeups-tc.wantLost, rep.Woken, out.String())
			require.Equal(t, tc.wantLost, rep.Lost)
			require.Zero(t, rep.Errors, out.String())
			require.Zero(t, rep.WrongOutcomes)
			require.Equal(t, tc.wantRefused, rep.Refused)
			require.Equal(t, tc.wantCanceled, rep.Canceled)
			require.Equal(t, tc.wantTool, rep.ToolCalls)
			require.Contains(t, out.String(), rep.Line())
			require.True(t, strings.HasPrefix(rep.Line(), "load: wakeups="), rep.Line())
		})
	}
}

type signalerFunc func(ctx context.Context, workflowID, runID, name string, arg any) error

func (f signalerFunc) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	return f(ctx, workflowID, runID, name, arg)
}

// startService runs the service as serve builds it, on a fresh database
// and this package's Temporal server, with the http handler allowed to
// call local ports; it returns the API's URL and stops at the test's end.
func startService(t *testing.T, wrap func(queue.Signaler) queue.Signaler) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := service.New(ctx, service.Config{
		DatabaseURL: testkit.NewDatabase(t), TemporalAddress: temporalServer.GetFrontendHostPort(), Namespace: temporalServer.GetDefaultNamespace(),
		API:          api.Config{Addr: "127.0.0.1:0", Auth: api.AuthConfig{Secrets: [][]byte{secret}}},
		Workpool:     workpool.Config{Pools: map[string]int{"default": 10, "wakeup": 25}},
		HTTPWork:     httpwork.Config{AllowedHosts: []string{"127.0.0.1:*"}},
		WrapSignaler: wrap, StopTimeout: 10 * time.Second, Logger: testkit.Logger(t),
	})
	require.NoError(t, err)
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, func(a net.Addr) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		<-done
		svc.Close()
	})
	select {
	case a := <-addr:
		return "http://" + a.String()
	case err := <-done:
		require.FailNow(t, "the service ended before it listened", "%v", err)
	}
	return ""
}
