//go:build faults

package faults

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// temporalOutage is how long Temporal stays stopped (issue 15: 30 s).
const temporalOutage = 30 * time.Second

// Temporal stopped while work completes: the work finishes, its signals
// wait in the outbox, and all arrive once Temporal is back. Meanwhile the
// replicas stay ready — /readyz 200, reporting temporal down — for they
// still take work.
func TestTemporalOutageQueuesTheSignals(t *testing.T) {
	e := newEnv(t)
	clients := []*client.Client{e.client(0), e.client(1)}
	e.fund(clients[0], 1000)
	ws := e.wakeMany(clients, 6, 1000)
	// Parked now; their wake-ups are asked for while Temporal is down.
	late := make([]parked, 2)
	for i := range late {
		late[i].workflowID, late[i].run = e.park()
	}

	stopped := time.Now()
	tempStack.stop()
	t.Cleanup(func() {
		if !tempStack.up() {
			require.NoError(t, tempStack.start())
		}
	})

	for _, r := range e.replicas {
		require.Eventually(t, func() bool {
			status, checks, _ := r.readyz()
			return status == http.StatusOK && strings.HasPrefix(checks["temporal"], "down: ") && checks["postgres"] == "ok"
		}, 20*time.Second, 100*time.Millisecond, "%s stays ready and reports temporal down", r.name)
	}
	// Work is still accepted meanwhile.
	for i := range late {
		created, err := clients[i%2].Wakeups.Create(t.Context(), e.wakeRequest(late[i].workflowID, 500))
		require.NoError(t, err, "a wake-up is accepted while Temporal is down")
		late[i].wakeupID = created.ID
	}
	ws = append(ws, late...)
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM wakeups WHERE org_id = $1 AND state = 'resolved'`, org) == int64(len(ws))
	}, temporalOutage, 100*time.Millisecond, "the work completes while Temporal is down")
	require.EqualValues(t, len(ws), e.count(`SELECT count(*) FROM queue_messages WHERE queue = 'wakeup' AND status = 'pending'`),
		"their signals wait in the outbox")
	for _, r := range e.replicas {
		status, checks, _ := r.readyz()
		require.Equal(t, http.StatusOK, status)
		require.True(t, strings.HasPrefix(checks["temporal"], "down: "), "%s: %v", r.name, checks)
	}
	metrics, err := clients[0].Metrics(t.Context())
	require.NoError(t, err)
	require.Contains(t, string(metrics), `reveille_dependency_up{dependency="temporal"} 0`)

	time.Sleep(time.Until(stopped.Add(temporalOutage)))
	require.NoError(t, tempStack.start())

	e.requireWoken(ws)
	for _, r := range e.replicas {
		require.Eventually(t, func() bool {
			status, checks, _ := r.readyz()
			return status == http.StatusOK && checks["temporal"] == "ok"
		}, 30*time.Second, 100*time.Millisecond)
	}
}
