//go:build faults

package faults

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// wakeMany parks n workflows and creates their wake-ups through the
// replicas in turn, each running workMS of work, concurrently.
func (e *env) wakeMany(clients []*client.Client, n, workMS int) []parked {
	e.t.Helper()
	ws := make([]parked, n)
	for i := range ws {
		ws[i].workflowID, ws[i].run = e.park()
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range ws {
		wg.Go(func() {
			created, err := clients[i%len(clients)].Wakeups.Create(context.Background(), e.wakeRequest(ws[i].workflowID, workMS))
			ws[i].wakeupID, errs[i] = created.ID, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(e.t, err)
	}
	return ws
}

// SIGKILL in the middle of running work: with the other replica alive it
// recovers the dead one's work after the heartbeat timeout; with both
// killed and restarted, the new processes do. Either way every wake-up
// ends with one outcome, delivered; the workflow is woken once; the pool
// limit holds throughout; no spend is debited twice.
func TestKilledReplicasLoseNoWake(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(e *env)
	}{
		{name: "one killed, the other alive", fault: func(e *env) {
			e.replicas[0].kill()
		}},
		{name: "both killed, then restarted", fault: func(e *env) {
			e.replicas[0].kill()
			e.replicas[1].kill()
			time.Sleep(time.Second)
			e.replicas[0].start()
			e.replicas[1].start()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			clients := []*client.Client{e.client(0), e.client(1)}
			e.fund(clients[0], 1000)
			ws := e.wakeMany(clients, 12, 1500)
			e.waitRunning(poolLimit)

			tc.fault(e)

			e.requireWoken(ws)
			require.EqualValues(t, 12, e.count(`SELECT spent FROM mandates WHERE org_id = $1`, org), "twelve spends of 1")
		})
	}
}

// A wake-up whose work has a single attempt (no retry policy), cut by the
// death of the replicas while it runs, resolves failed with the recovery's
// error and wakes its workflow with it (docs/wakeup.md § "A replica dies
// while the work runs"): nothing waits for an attempt that never returns.
func TestASingleAttemptCutByAKillWakesItsWorkflowFailed(t *testing.T) {
	e := newEnv(t)
	c := e.client(0)
	e.fund(c, 10)
	wf, run := e.park()
	req := e.wakeRequest(wf, 60_000) // it would run a minute
	req.Work.Retry = nil
	created, err := c.Wakeups.Create(context.Background(), req)
	require.NoError(t, err)
	e.waitRunning(1)

	e.replicas[0].kill()
	e.replicas[1].kill()
	time.Sleep(time.Second)
	e.replicas[0].start()
	e.replicas[1].start()

	e.requireWoken([]parked{{workflowID: wf, run: run, wakeupID: created.ID}})
	var outcome, text string
	require.NoError(t, e.db.QueryRow(context.Background(), `SELECT outcome, coalesce(error, '') FROM wakeups WHERE org_id = $1 AND id = $2`,
		org, created.ID).Scan(&outcome, &text))
	require.Equal(t, "failed", outcome)
	require.Contains(t, text, "stopped heartbeating")
}
