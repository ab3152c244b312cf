package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A run_at the document accepts (years 0000–9999; Go's zero time.Time,
// 0001-01-01T00:00:00Z, is what a Go client sends for "no time set") is
// pending and ready; the pool's oldest_pending_age_s must be its age.
// (It was 9223372036.854776 s: time.Duration, ±292 years,
// saturated, so every run_at before ~1734 read as the same wrong age.)
func TestThePoolsOldestPendingAgeOfARunAtCenturiesAgoIsItsAge(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	h := s.Handler()
	tok := subToken(t, "ops-org", "ops", "", AllRoles...)
	require.Equal(t, http.StatusOK, do(t, h, "POST", "/v1/pools/default/pause", tok, nil).Status) // so it stays pending
	runAt := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	r := do(t, h, "POST", "/v1/pools/default/work", tok, map[string]any{"handler": "echo", "run_at": runAt.Format(time.RFC3339)})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	pool := do(t, h, "GET", "/v1/pools/default", tok, nil)
	require.Equal(t, http.StatusOK, pool.Status, "%s", pool.Body)
	got := pool.JSON(t)["oldest_pending_age_s"].(float64)
	want := float64(time.Now().Unix() - runAt.Unix()) // ≈ 6.39e10 s
	require.InDelta(t, want, got, 60, "oldest_pending_age_s of a pending item with run_at %s (body %s)", runAt.Format(time.RFC3339), pool.Body)
}
