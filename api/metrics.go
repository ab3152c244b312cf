package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

type httpMetrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	rateLimited *prometheus.CounterVec
	connections prometheus.Gauge
	atLimit     *prometheus.CounterVec
}

func newHTTPMetrics(reg prometheus.Registerer) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_http_requests_total", Help: "HTTP requests by method, route pattern and status.",
		}, []string{"method", "route", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "reveille_http_request_duration_seconds", Help: "HTTP request latency by method and route pattern.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"method", "route"}),
		// By route, not by org: org ids are not a bounded label set (the
		// access log line of each 429 names the org).
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_http_rate_limited_total", Help: "Requests refused with 429 by the per-org rate limit, by route pattern.",
		}, []string{"route"}),
	}
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reveille_http_open_connections",
		Help: "Connections the API server holds open; at REVEILLE_MAX_CONNECTIONS a new one closes an idle one or waits.",
	})
	m.atLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reveille_http_connections_at_limit_total",
		Help: "New connections that found REVEILLE_MAX_CONNECTIONS open: closed_idle when the one idle the longest between requests was closed for it, waited when every one was busy and it waited to be served.",
	}, []string{"action"})
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.rateLimited, m.connections, m.atLimit} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("api: register the HTTP metrics: %w", err)
		}
	}
	return m, nil
}

// connState counts the server's open connections (http.Server.ConnState).
func (m *httpMetrics) connState(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		m.connections.Inc()
	case http.StateClosed, http.StateHijacked:
		m.connections.Dec()
	}
}

// observe records one answered request. route must be a route template
// or "unmatched", never the request's path: every label value is a new
// series, kept until the process ends.
func (m *httpMetrics) observe(method, route string, status int, elapsed time.Duration) {
	method = metricMethod(method)
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(method, route).Observe(elapsed.Seconds())
}

// metricMethod is the method label of a request: its method when it is one
// of net/http's, else "other". A request line may carry any token as its
// method, and unauthenticated clients sending thousands of made-up ones
// (each answered 405) otherwise made as many series, and /metrics grew
// without bound.
func metricMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

func newRequestID() string { return uuid.Must(uuid.NewV7()).String() }

// maxRequestIDBytes bounds a client's own X-Request-Id (a UUID is 36, a
// W3C trace id 32).
const maxRequestIDBytes = 128

// dropUnfitRequestID drops a client's X-Request-Id that is longer than
// maxRequestIDBytes or holds anything but visible ASCII, so that the
// request gets an id of its own: the id is echoed in the answer and
// written to every log line of the request, where a megabyte of it, or a
// forged line break, has no place.
func dropUnfitRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if id := h.Get(echo.HeaderXRequestID); id != "" && !fitRequestID(id) {
			h.Del(echo.HeaderXRequestID)
		}
		return next(c)
	}
}

func fitRequestID(id string) bool {
	if len(id) > maxRequestIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// dependencyUp is reveille_dependency_up{dependency}: 1 when the dependency
// answers, 0 when not. It asks at scrape time, as /readyz does, so that it
// tells the truth whether or not anything probes /readyz.
type dependencyUp struct {
	s    *Server
	desc *prometheus.Desc
}

func newDependencyUp(s *Server) *dependencyUp {
	return &dependencyUp{s: s, desc: prometheus.NewDesc("reveille_dependency_up",
		"Whether a dependency answers (1) or not (0): postgres (the replica is not ready without it) and temporal (signals wait in the outbox while it is down).",
		[]string{"dependency"}, nil)}
}

func (d *dependencyUp) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *dependencyUp) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, r := range d.s.checkDependencies(ctx, sameBound) {
		up := 1.0
		if r.err != nil {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, up, r.name)
	}
}
