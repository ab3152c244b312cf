package workflows_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/workflows"
)

// wakeSignal is the signal name the workflow parks on; the wake-up names it.
const wakeSignal = "wake"

// FetchWorkflow asks Reveille for a wake-up whose work fetches url, parks
// until the wake-up resolves, and returns the response body.
func FetchWorkflow(ctx workflow.Context, url string) (json.RawMessage, error) {
	ctx = workflows.WithWakeDedupe(ctx) // signals arrive at least once
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var a *Activities
	var wakeupID string
	if err := workflow.ExecuteActivity(actx, a.CreateWakeup, url).Get(ctx, &wakeupID); err != nil {
		return nil, err
	}

	wake, err := workflows.AwaitWakeFor(ctx, wakeSignal, wakeupID, 24*time.Hour)
	if err != nil {
		// workflows.ErrTimeout (the work may still finish) or the workflow
		// was canceled (workflow.ErrCanceled: temporal.IsCanceledError).
		// Either way nobody will read the result: cancel the wake-up so
		// its work neither runs nor spends for nothing. From a
		// disconnected context, since a canceled ctx runs no activity.
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		dctx = workflow.WithActivityOptions(dctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
		if cerr := workflow.ExecuteActivity(dctx, a.CancelWakeup, wakeupID).Get(dctx, nil); cerr != nil {
			workflow.GetLogger(ctx).Warn("could not cancel the wake-up", "wakeup_id", wakeupID, "error", cerr)
		}
		return nil, err
	}
	switch wake.Outcome {
	case workflows.OutcomeSucceeded:
		var res struct { // the http handler's result: {status, headers, body}
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"` // JSON when it parsed, else a string
		}
		if err := json.Unmarshal(wake.Result, &res); err != nil {
			return nil, err
		}
		return res.Body, nil
	case workflows.OutcomeFailed: // wake.Error: the last attempt's error
		return nil, fmt.Errorf("fetch failed: %s", wake.Error)
	case workflows.OutcomeCanceled: // someone canceled the wake-up (POST /v1/wakeups/{id}/cancel)
		return nil, fmt.Errorf("fetch canceled: %s", wake.Error)
	case workflows.OutcomeDenied: // over budget, and a human denied the spend (or let it expire)
		return nil, fmt.Errorf("fetch not funded: %s", wake.Error)
	}
	return nil, fmt.Errorf("unknown outcome %q", wake.Outcome)
}

// Activities call Reveille's REST API with a token of the workflow's org.
type Activities struct {
	Reveille *reveille.Client
}

// CreateWakeup creates the wake-up, signalled to this workflow run (the
// run id, since FetchWorkflow never starts a new run while it waits: a
// workflow that continues as new, or may be reset or retried, names its id
// only — a closed run's signal is undeliverable, lost to the new run). The
// Idempotency-Key is derived from the run's and the activity's id, so a
// retried activity spends once; hashed, since a key is at most 255 bytes
// and a workflow id alone may be 1000.
func (a *Activities) CreateWakeup(ctx context.Context, url string) (string, error) {
	info := activity.GetInfo(ctx)
	run := info.WorkflowExecution
	key := sha256.Sum256([]byte(run.ID + "/" + run.RunID + "/" + info.ActivityID))
	w, err := a.Reveille.Wakeups.Create(ctx, reveille.WakeupRequest{
		AgentID: "agent-1", WorkflowID: run.ID, RunID: run.RunID, Signal: wakeSignal,
		Scope: "fetch", Cost: 1,
		Work: reveille.WakeupWork{Handler: "http", Args: map[string]string{"url": url},
			// Without a retry policy the work has one attempt: a replica
			// killed while it runs fails it.
			Retry: &reveille.RetryConfig{MaxAttempts: 5, InitialBackoffMS: 1000}},
	}, reveille.WithIdempotencyKey(hex.EncodeToString(key[:])))
	var maybe *reveille.MaybeAppliedError
	var apiErr *reveille.Error
	switch {
	case errors.As(err, &maybe):
		// An attempt's answer was lost: the wake-up may exist whatever the
		// last attempt said — a retry's 401 or 400 included, which errors.As
		// below would see through this error. Retried by Temporal with the
		// same key, it is answered as it first was. So first, and retryable.
		return "", err
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusPaymentRequired:
		// Over budget: a human decides, and the wake-up wakes the
		// workflow either way (denied, or the work's outcome).
		return apiErr.WakeupID, nil
	case errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests:
		return "", temporal.NewNonRetryableApplicationError(err.Error(), "WakeupInvalid", err)
	case err != nil:
		return "", err // retried by Temporal
	}
	return w.ID, nil
}

// CancelWakeup cancels the wake-up's work, or its pending approval request
// (POST /v1/wakeups/{id}/cancel); one already settled is left as it is. A
// cancel is safe to repeat, so the client and Temporal may both retry it.
func (a *Activities) CancelWakeup(ctx context.Context, wakeupID string) error {
	_, err := a.Reveille.Wakeups.Cancel(ctx, wakeupID)
	var maybe *reveille.MaybeAppliedError
	var apiErr *reveille.Error
	if !errors.As(err, &maybe) && errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests {
		return temporal.NewNonRetryableApplicationError(err.Error(), "WakeupCancelRefused", err)
	}
	return err
}

// An agent's own worker: its own task queue (not workflows.TaskQueue, which
// the engine's worker polls), the workflow started with an id in the
// token's org ("<org_id>/…").
func ExampleAwaitWakeFor() {
	tc, err := client.Dial(client.Options{HostPort: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	defer tc.Close()
	rc, err := reveille.New("http://localhost:8080", reveille.WithToken("<JWT of dev-org, role agent>"))
	if err != nil {
		log.Fatal(err)
	}

	w := worker.New(tc, "agents", worker.Options{})
	w.RegisterWorkflow(FetchWorkflow)
	w.RegisterActivity(&Activities{Reveille: rc})
	if err := w.Start(); err != nil {
		log.Fatal(err)
	}
	defer w.Stop()

	run, err := tc.ExecuteWorkflow(context.Background(),
		client.StartWorkflowOptions{ID: "dev-org/fetch-1", TaskQueue: "agents"}, FetchWorkflow, "https://api.example.com/report")
	if err != nil {
		log.Fatal(err)
	}
	var body json.RawMessage
	if err := run.Get(context.Background(), &body); err != nil {
		log.Fatal(err)
	}
	log.Printf("fetched: %s", body)
}
