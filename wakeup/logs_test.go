package wakeup

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/reveille/reveille/internal/testkit"
)

// messagesOf returns, in order, the messages of the lines logged into b
// naming wake-up id.
func messagesOf(b *testkit.LogBuffer, id string) []string {
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["wakeup_id"] == id {
			out = append(out, rec["msg"].(string))
		}
	}
	return out
}

// rejectingSignaler stands in for Temporal: it refuses the signals to
// workflow "o/rejected" as an invalid request (a fault that cannot be
// caused otherwise without a Temporal server) and accepts the others.
type rejectingSignaler struct{}

func (rejectingSignaler) SignalWorkflow(_ context.Context, workflowID, _, _ string, _ any) error {
	if workflowID == "o/rejected" {
		return serviceerror.NewInvalidArgument("rejected by the test")
	}
	return nil
}

// Every state change of a wake-up — created (funded or refused), its work
// finished, resolved with its signal queued, canceled, and its signal sent
// or undeliverable — is a debug line naming the wake-up's id.
func TestEveryStateChangeOfAWakeupIsADebugLineNamingItsID(t *testing.T) {
	for _, tc := range []struct {
		name       string
		workflowID string
		cost       int64
		cancel     bool
		want       []string
	}{
		{name: "funded, run, sent", workflowID: "o/wf", cost: 1,
			want: []string{"wake-up created, funded", "wake-up's work finished", "wake-up resolved, signal queued", "signal sent"}},
		{name: "refused, canceled, sent", workflowID: "o/wf", cost: 11, cancel: true,
			want: []string{"wake-up created, spend refused: awaiting approval", "wake-up resolved, signal queued", "wake-up canceled", "signal sent"}},
		{name: "funded, run, undeliverable", workflowID: "o/rejected", cost: 1,
			want: []string{"wake-up created, funded", "wake-up's work finished", "wake-up resolved, signal queued", "signal rejected; message failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testkit.LogBuffer{}
			logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			f := newFixtureWith(t, fixtureOptions{signals: rejectingSignaler{}, logger: logger})
			ctx := context.Background()
			p := params("")
			p.WorkflowID, p.Cost = tc.workflowID, tc.cost
			w, err := f.svc.Create(ctx, p)
			if tc.cancel {
				var refused *RefusedError
				require.ErrorAs(t, err, &refused)
				_, err = f.svc.Cancel(ctx, "o", AnyAgent, w.ID)
			}
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(messagesOf(logs, w.ID.String())) >= len(tc.want) }, testWait, testTick)
			// The cancel's own line and the signal's send both follow its commit,
			// in either order.
			require.ElementsMatch(t, tc.want, messagesOf(logs, w.ID.String()))
		})
	}
}
