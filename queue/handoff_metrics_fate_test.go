package queue

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// Each message handed to the dispatcher has one fate in
// reveille_queue_signal_handoffs_total (sent, released, expired or
// dropped): the fates of n handoffs add up to n. A handoff taken into the
// pipeline and then left to the claims because its lease ran short while
// it waited for a send slot must not be counted "sent" and "expired" both.
func TestEachHandoffIsCountedUnderOneFate(t *testing.T) {
	db := testkit.NewPool(t)
	reg := prometheus.NewRegistry()
	cfg := DispatcherConfig{SendTimeout: 300 * time.Millisecond, HandoffLease: 600 * time.Millisecond, Concurrency: 1, BatchSize: 10,
		Registry: reg}
	writer := &slowSignaler{calls: map[string]int{}, d: 250 * time.Millisecond}
	d := startDispatcher(t, db, writer, cfg)
	other := &slowSignaler{calls: map[string]int{}, d: 10 * time.Millisecond}
	startDispatcher(t, db, other, DispatcherConfig{SendTimeout: cfg.SendTimeout, HandoffLease: cfg.HandoffLease, Concurrency: 1, BatchSize: 10})
	const n = 5
	var hs []*Handoff
	for i := range n {
		hs = append(hs, enqueueForHandoff(t, db, d, signalParams(fmt.Sprintf("o/f%d", i))))
	}
	for _, h := range hs {
		require.True(t, d.Handoff(h))
	}
	for i := range n {
		requireDelivered(t, db, fmt.Sprintf("o/f%d", i))
	}

	fates := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "reveille_queue_signal_handoffs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			fates[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	total := fates["sent"] + fates["released"] + fates["expired"] + fates["dropped"]
	require.Greater(t, fates["expired"], 0.0, "some handoffs waited out their lease (the scenario)")
	require.Equal(t, float64(n), total, "one fate per handoff: %v", fates)
}
