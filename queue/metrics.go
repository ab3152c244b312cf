package queue

import (
	"github.com/prometheus/client_golang/prometheus"
)

type dispatchMetrics struct {
	results         *prometheus.CounterVec
	handoffs        *prometheus.CounterVec
	sendSeconds     prometheus.Histogram
	deliverySeconds prometheus.Histogram
}

func newDispatchMetrics(reg prometheus.Registerer) *dispatchMetrics {
	m := &dispatchMetrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_queue_signal_sends_total", Help: "Signal sends by result: delivered, retry, failed, recovered (the workflow had closed, and its history shows it got the signal from an earlier send whose delivered record was lost), or released (claimed, but still waiting for a send slot when the dispatcher stopped: not sent, made due again at once for any dispatcher).",
		}, []string{"result"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_queue_signal_handoffs_total",
			Help: "Messages handed to this process's dispatcher after their commit, by fate: sent (taken into the send pipeline at once), released (still waiting when the dispatcher stopped: made due again at once for any dispatcher), expired (lease too short by the time there was room or a send slot) or dropped (dispatcher stopped or queue full); the last two are sent after their lease by a due-poll.",
		}, []string{"result"}),
		sendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "reveille_queue_signal_send_seconds", Help: "Latency of one SignalWorkflow call.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		deliverySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "reveille_queue_signal_delivery_seconds", Help: "From the message's commit to Temporal accepting the signal.",
			// 0.5 ms … ~70 min: a Temporal outage of minutes stays in a
			// finite bucket (it stopped at ~4 min)
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 24),
		}),
	}
	// Every series is there from the start, at 0: an alert on a rate or on
	// an absent series needs it before the first event.
	for _, r := range []string{"delivered", "retry", "failed", "recovered", "released"} {
		m.results.WithLabelValues(r)
	}
	for _, r := range []string{"sent", "released", "expired", "dropped"} {
		m.handoffs.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.results, m.handoffs, m.sendSeconds, m.deliverySeconds)
	}
	return m
}
