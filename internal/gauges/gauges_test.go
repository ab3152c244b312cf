package gauges_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/gauges"
	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// The rows are written directly: each state the gauges tell apart is a
// row shape, and the domain services would need Temporal, a pool loop and
// a human to reach some of them (undeliverable, retrying).
func seed(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	msg := func(org, status, lastError string, signal bool, age time.Duration) {
		var wf *string
		if signal {
			s := org + "/wf"
			wf = &s
		}
		exec(`INSERT INTO queue_messages (id, org_id, queue, idempotency_key, status, signal_workflow_id, signal_name, last_error, created_at)
			VALUES ($1, $2, 'wakeup', $7, $3, $4, 'wake', NULLIF($5, ''), now() - $6::interval)`,
			uuid.New(), org, status, wf, lastError, age, uuid.NewString())
	}
	msg("org-a", "pending", "", true, 90*time.Second)
	msg("org-b", "pending", "", true, time.Second)
	msg("org-a", "pending", "unavailable", true, 10*time.Second)
	msg("org-a", "failed", "workflow not found", true, time.Hour)
	msg("org-a", "delivered", "", true, 2*time.Hour) // delivered: in no gauge
	msg("org-a", "pending", "", false, 3*time.Hour)  // no signal: not the outbox's
	wakeup := func(org, state, outcome string) {
		exec(`INSERT INTO wakeups (id, org_id, agent_id, workflow_id, signal, scope, cost, pool, work, state, outcome)
			VALUES ($1, $2, 'a', $2 || '/wf', 'wake', 's', 1, 'wakeup', '{}', $3, NULLIF($4, ''))`, uuid.New(), org, state, outcome)
	}
	wakeup("org-a", "awaiting_approval", "")
	wakeup("org-b", "enqueued", "")
	wakeup("org-a", "enqueued", "")
	wakeup("org-a", "resolved", "succeeded")
	for _, state := range []string{"pending", "pending", "approved"} {
		exec(`INSERT INTO mandate_approvals (id, org_id, agent_id, scope, cost, state, expires_at) VALUES ($1, 'org-a', 'a', 's', 1, $2, now() + interval '1h')`,
			uuid.New(), state)
	}
	exec(`INSERT INTO tool_approvals (id, org_id, session_id, agent_id, tool_name, status, expires_at) VALUES ($1, 'org-b', 's', 'a', 'deploy', 'pending', now() + interval '1h')`, uuid.New())
}

func TestRefreshReadsTheOutboxTheOpenWakeupsAndThePendingApprovalsOfEveryOrg(t *testing.T) {
	db := testkit.NewPool(t)
	seed(t, db)
	reg := prometheus.NewRegistry()
	c := gauges.New(db, gauges.Config{Registry: reg})
	require.NoError(t, c.Refresh(context.Background()))

	for _, tc := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"reveille_signal_outbox_messages", map[string]string{"state": "pending"}, 2},
		{"reveille_signal_outbox_messages", map[string]string{"state": "retrying"}, 1},
		{"reveille_signal_outbox_messages", map[string]string{"state": "undeliverable"}, 1},
		{"reveille_wakeups_open", map[string]string{"state": "awaiting_approval"}, 1},
		{"reveille_wakeups_open", map[string]string{"state": "funded"}, 0},
		{"reveille_wakeups_open", map[string]string{"state": "enqueued"}, 2},
		{"reveille_pending_approvals", map[string]string{"kind": "spend"}, 2},
		{"reveille_pending_approvals", map[string]string{"kind": "tool"}, 1},
	} {
		t.Run(tc.metric+"/"+labelString(tc.labels), func(t *testing.T) {
			require.Equal(t, tc.want, gaugeValue(t, reg, tc.metric, tc.labels))
		})
	}
	// The oldest unsent signal is the 90 s old one, not the failed or the
	// unsignalled ones (older still); the statement's now() is the
	// transaction's, so the age is at least 90 s, and well under the next.
	oldest := gaugeValue(t, reg, "reveille_signal_outbox_oldest_pending_seconds", nil)
	require.GreaterOrEqual(t, oldest, 90.0)
	require.Less(t, oldest, 600.0)
}

func TestRefreshOfAnEmptyOutboxReadsZeroes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := gauges.New(testkit.NewPool(t), gauges.Config{Registry: reg})
	require.NoError(t, c.Refresh(context.Background()))
	require.Zero(t, gaugeValue(t, reg, "reveille_signal_outbox_oldest_pending_seconds", nil))
	require.Zero(t, gaugeValue(t, reg, "reveille_signal_outbox_messages", map[string]string{"state": "pending"}))
	require.Zero(t, gaugeValue(t, reg, "reveille_wakeups_open", map[string]string{"state": "enqueued"}))
}

func labelString(l map[string]string) string {
	for k, v := range l {
		return k + "=" + v
	}
	return ""
}

// gaugeValue reads one series of a gauge from the registry.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	require.FailNow(t, "no such series", "%s %v", name, labels)
	return 0
}
