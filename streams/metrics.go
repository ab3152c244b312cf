package streams

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/leader"
)

type metrics struct {
	chunks      prometheus.Counter
	bytes       prometheus.Counter
	subscribers prometheus.Gauge
	reconnects  prometheus.Counter
	purged      prometheus.Counter
	purgeErrs   prometheus.Counter // the retention loop's failed rounds
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		chunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_streams_chunks_appended_total", Help: "Chunks appended to run streams.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_streams_bytes_appended_total", Help: "Bytes of chunk data appended to run streams.",
		}),
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reveille_streams_live_subscribers", Help: "Live tails (SSE readers) following a stream on this replica.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_streams_listen_reconnects_total", Help: "Times the shared LISTEN connection was re-established after a failure.",
		}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_streams_purged_total", Help: "Closed streams purged after their retention period.",
		}),
		purgeErrs: leader.NewTaskErrors(RetentionLeadership),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.chunks, m.bytes, m.subscribers, m.reconnects, m.purged, m.purgeErrs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering streams metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) appended(chunks [][]byte) {
	var n int
	for _, c := range chunks {
		n += len(c)
	}
	m.chunks.Add(float64(len(chunks)))
	m.bytes.Add(float64(n))
}
