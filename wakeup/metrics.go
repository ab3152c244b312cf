package wakeup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/leader"
)

type metrics struct {
	created       *prometheus.CounterVec
	resolved      *prometheus.CounterVec
	reconciled    prometheus.Counter
	createBatch   prometheus.Histogram
	reconcileErrs prometheus.Counter // the reconciler's failed rounds and intents
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_wakeups_created_total", Help: "Wake-ups created, by gate result: funded or refused.",
		}, []string{"gate"}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_wakeups_resolved_total", Help: "Wake-ups resolved, by outcome.",
		}, []string{"outcome"}),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_wakeups_reconciled_total", Help: "Funded wake-ups the reconciler enqueued or settled after a failure between the two transactions.",
		}),
		createBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "reveille_wakeups_create_batch_size",
			Help:    "Wake-up requests per shared gate and enqueue (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		reconcileErrs: leader.NewTaskErrors(ReconcilerLeadership),
	}
	// Every series is there from the start, at 0: an alert on a rate or on
	// an absent series needs it before the first event.
	for _, gate := range []string{"funded", "refused"} {
		m.created.WithLabelValues(gate)
	}
	for _, outcome := range []string{OutcomeSucceeded, OutcomeFailed, OutcomeCanceled, OutcomeDenied} {
		m.resolved.WithLabelValues(outcome)
	}
	if reg != nil {
		reg.MustRegister(m.created, m.resolved, m.reconciled, m.createBatch, m.reconcileErrs)
	}
	return m
}
