package mandates

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A spend its batch took and committed is a decision, whether or not its
// caller waited for the answer: reveille_mandates_spends_total counts it
// (a retry of its key is a replay, not counted, so it is never counted at
// all otherwise).
func TestASpendDecidedAfterItsCallerLeftIsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, db := newTestService(t, Config{Registry: reg})
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	ctx := context.Background()
	// the spend's batch waits for the mandate's row
	tx := lockMandate(t, db, m.ID)

	left, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := s.Spend(left, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 7, IdempotencyKey: "k1"})
		assert.ErrorIs(t, err, context.Canceled)
	})
	b := s.batcher
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.inFlight) == 1 && len(b.pending) == 0
	}, testWait, pollEvery, "the spend's batch runs")
	cancel() // the caller gives up while its batch decides
	wg.Wait()
	require.NoError(t, tx.Rollback(ctx))
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.running == 0 && len(b.pending) == 0
	}, testWait, pollEvery, "the batch ended")
	require.EqualValues(t, 7, mustGet(t, s, "org-a", m).Spent, "the spend was decided and debited")

	got := spendsOK(t, reg)
	require.Equal(t, 1.0, got, "the committed debit is a spend decision")
	// its retry is a replay, and not counted: the decision is never counted
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 7, IdempotencyKey: "k1"})
	require.NoError(t, err)
	require.True(t, r.OK)
	require.Equal(t, 1.0, spendsOK(t, reg))
}

// spendsOK scrapes reveille_mandates_spends_total{result="ok"} from reg.
func spendsOK(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "reveille_mandates_spends_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == "ok" {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatal("no reveille_mandates_spends_total{result=\"ok\"}")
	return 0
}
