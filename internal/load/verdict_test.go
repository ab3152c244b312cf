package load

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/testkit"
)

// A run whose wake-ups the engine never accepted fails (engine load exits
// 1), as a run that lost one does: before, every request refused (say a
// token of the wrong org, 403) gave errors=N and exit status 0. The API
// here is a stand-in that refuses every call: the refusal is the fault, and
// this package's own Temporal workflows are not needed to see it counted
// (the e2e package runs the load against the real service).
func TestARunWhoseRequestsFailedForGoodFails(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"type":"about:blank","title":"Forbidden","status":403,"detail":"the token's org is not this one"}`)
	}))
	t.Cleanup(api.Close)
	c, err := reveille.New(api.URL, reveille.WithToken("t"))
	require.NoError(t, err)
	tg, err := newTarget("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(tg.Close)
	cfg := Config{Wakeups: 3, Clients: 1, RefuseEvery: -1, CancelEvery: -1, Deadline: time.Minute, Progress: time.Hour,
		Out: io.Discard, Logger: testkit.Logger(t)}
	r := &run{cfg: cfg, id: "x", org: "org", agent: "a",
		apis: []apiPair{{agent: c, approver: c}}, tc: startsWorkflows{}, target: tg, recorder: newRecorder()}
	rep := r.drive(context.Background())
	require.Equal(t, 3, rep.Errors)
	err = rep.verdict(cfg.Deadline)
	require.ErrorIs(t, err, ErrRequestsFailed)
	require.NotErrorIs(t, err, ErrLost)
	require.ErrorContains(t, err, "3 of 3 wake-ups were never accepted")
}

func TestTheVerdictNamesEveryKindOfFailure(t *testing.T) {
	for _, tc := range []struct {
		name          string
		rep           Report
		lost, refused bool
	}{
		{name: "all woken is a pass", rep: Report{Wakeups: 5, Accepted: 5, Woken: 5}},
		{name: "an interrupted run is no failure of the engine", rep: Report{Wakeups: 5, Accepted: 2, Woken: 1, Interrupted: 1}},
		{name: "a lost wake-up", rep: Report{Wakeups: 5, Accepted: 5, Woken: 4, Lost: 1}, lost: true},
		{name: "a wrong outcome", rep: Report{Wakeups: 5, Accepted: 5, Woken: 5, WrongOutcomes: 1}, lost: true},
		{name: "a request failed for good", rep: Report{Wakeups: 5, Accepted: 4, Woken: 4, Errors: 1}, refused: true},
		{name: "both", rep: Report{Wakeups: 5, Accepted: 4, Woken: 3, Lost: 1, Errors: 1}, lost: true, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rep.verdict(time.Minute)
			if !tc.lost && !tc.refused {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.lost, errors.Is(err, ErrLost), "%v", err)
			require.Equal(t, tc.refused, errors.Is(err, ErrRequestsFailed), "%v", err)
		})
	}
}
