package service_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
)

// documentedMetrics are the metric names of docs/operations.md's metrics
// table. A cell may shorten names after its first one to their last
// segments ("`reveille_workpool_succeeded_total`, `_failed_total`"): those
// take the first name's prefix.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	names := regexp.MustCompile("`(reveille_[a-z_]+|_[a-z_]+)`")
	var out []string
	for line := range strings.SplitSeq(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `reveille_") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		var base string
		for _, m := range names.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if strings.HasPrefix(name, "_") {
				segments := strings.Split(base, "_")
				keep := len(segments) - strings.Count(name, "_")
				name = strings.Join(segments[:keep], "_") + name
			} else {
				base = name
			}
			out = append(out, name)
		}
	}
	require.Greater(t, len(out), 40, "the metrics table was not found")
	return out
}

// notAtStart are the documented metrics a fresh replica may not show yet,
// and why.
var notAtStart = map[string]string{
	// A series per method, route and status: which statuses a route will
	// answer is not known ahead (the first scrape's own series is counted
	// once it is answered).
	"reveille_http_requests_total":           "labels not known ahead",
	"reveille_http_request_duration_seconds": "labels not known ahead",
}

// Every metric docs/operations.md lists is on /metrics from the start,
// before its first event: an alert on rate(x) > 0, or on the series being
// absent, needs the series to exist at 0. Labels are made for their known
// values (pools, reasons, results), never per org. The gauges read from
// the database are there after their first read, which Start begins at
// once.
func TestAFreshServiceExposesEveryDocumentedMetric(t *testing.T) {
	svc, err := service.New(context.Background(), testConfig(t))
	require.NoError(t, err)
	addr := run(t, svc)
	documented := documentedMetrics(t)

	var missing []string
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode)
		missing = missing[:0]
		for _, name := range documented {
			if _, ok := notAtStart[name]; !ok && !strings.Contains(string(body), "\n# TYPE "+name+" ") {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	}, 10*time.Second, 100*time.Millisecond, "documented but not on /metrics: %v", &missing)
}
