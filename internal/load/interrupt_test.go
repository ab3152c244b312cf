package load

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/testkit"
)

// startsWorkflows is a Temporal client whose workflow starts succeed.
type startsWorkflows struct{ client.Client }

func (startsWorkflows) ExecuteWorkflow(context.Context, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	return nil, nil
}

// Interrupted (Ctrl-C) while a client's create was in flight: that
// wake-up was interrupted, no request of it failed. The run reports it as
// an error (and logs "load: wake-up failed … context canceled"), so an
// interrupted run against a healthy engine reads errors=<clients>.
func TestAnInterruptedRequestIsNotCountedAsAnError(t *testing.T) {
	inFlight, release := make(chan struct{}, 1), make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		select { // the engine is slow; the operator interrupts
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(api.Close)
	t.Cleanup(func() { close(release) })
	c, err := reveille.New(api.URL, reveille.WithToken("t"))
	require.NoError(t, err)
	tg, err := newTarget("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(tg.Close)
	r := &run{cfg: Config{Wakeups: 1, Clients: 1, RefuseEvery: -1, CancelEvery: -1, Deadline: time.Minute, Progress: time.Hour,
		Out: io.Discard, Logger: testkit.Logger(t)}, id: "x", org: "org", agent: "a",
		apis: []apiPair{{agent: c, approver: c}}, tc: startsWorkflows{}, target: tg, recorder: newRecorder()}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-inFlight; cancel() }()
	rep := r.drive(ctx)
	require.Zero(t, rep.Errors, "an interrupted wake-up is no failed request")
}
