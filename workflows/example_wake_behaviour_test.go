package workflows_test

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/workflows"
)

// The example's FetchWorkflow cancels its wake-up when it stops waiting —
// timed out, or the workflow canceled — so that the work does not run and
// spend for nobody; a canceled workflow's ctx runs no activity, hence the
// disconnected context it cancels from. Cancellation is a canceled error.
func TestFetchWorkflowCancelsItsWakeupWhenItStopsWaiting(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cancel   bool
		checkErr func(t *testing.T, err error)
	}{
		{"timed out", false, func(t *testing.T, err error) { require.True(t, workflows.IsTimeout(err), "%v", err) }},
		{"canceled", true, func(t *testing.T, err error) { require.True(t, temporal.IsCanceledError(err), "%v", err) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/fetch-test"})
			a := &Activities{}
			env.RegisterActivity(a)
			env.OnActivity(a.CreateWakeup, mock.Anything, mock.Anything).Return("wk-1", nil)
			env.OnActivity(a.CancelWakeup, mock.Anything, "wk-1").Return(nil).Once()
			if tc.cancel {
				env.RegisterDelayedCallback(env.CancelWorkflow, time.Hour)
			}

			env.ExecuteWorkflow(FetchWorkflow, "https://api.example.com/report")

			require.True(t, env.IsWorkflowCompleted())
			tc.checkErr(t, env.GetWorkflowError())
			env.AssertExpectations(t)
		})
	}
}

// An attempt whose answer is lost may have created the wake-up, whatever
// a later attempt gets — here a 401 (a token that expired meanwhile):
// CreateWakeup returns it retryable, not as the non-retryable
// WakeupInvalid a 4xx otherwise is (errors.As sees through the
// *client.MaybeAppliedError to the 401). Every attempt sends the same
// Idempotency-Key, a hash well under the API's 255 bytes.
func TestCreateWakeupRetriesALostAnswerWhateverTheRetryGot(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 { // the answer is lost
			conn, _, err := w.(http.Hijacker).Hijack()
			require.NoError(t, err)
			conn.Close()
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"type":"about:blank","title":"Unauthorized","status":401,"detail":"token expired"}`)
	}))
	defer srv.Close()
	rc, err := reveille.New(srv.URL, reveille.WithToken("t"),
		reveille.WithRetry(reveille.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	require.NoError(t, err)

	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	a := &Activities{Reveille: rc}
	env.RegisterActivity(a)
	_, err = env.ExecuteActivity(a.CreateWakeup, "https://api.example.com/report")

	// (As Temporal carries it: an ApplicationError of the error's text.)
	require.ErrorContains(t, err, "may have been applied")
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.False(t, appErr.NonRetryable(), "a lost answer must be retried: %v", err)
	require.NotEqual(t, "WakeupInvalid", appErr.Type())
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])
	require.Len(t, keys[0], 64)
	_, err = hex.DecodeString(keys[0])
	require.NoError(t, err)
}

// The example's wake, recorded 30 s before its 24 h deadline, reaches the
// workflow in the same task as the timer (its worker was down across the
// deadline): FetchWorkflow must return the body, not give up, cancel a
// wake-up that succeeded and fail with ErrTimeout.
func TestFetchWorkflowTakesAWakeThatCameBeforeItsDeadlineWhenTheWorkerWasAway(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/fetch-test"})
	a := &Activities{}
	env.RegisterActivity(a)
	env.OnActivity(a.CreateWakeup, mock.Anything, mock.Anything).Return("wk-1", nil)
	raw := []byte(`{"org_id":"org-a","wakeup_id":"wk-1","outcome":"succeeded","result":{"status":200,"body":{"ok":true}}}`)
	env.RegisterDelayedCallback(func() { env.SignalWorkflowSkippingWorkflowTask("wake", json.RawMessage(raw)) }, 24*time.Hour-30*time.Second)

	env.ExecuteWorkflow(FetchWorkflow, "https://api.example.com/report")

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var body json.RawMessage
	require.NoError(t, env.GetWorkflowResult(&body))
	require.JSONEq(t, `{"ok":true}`, string(body))
}
