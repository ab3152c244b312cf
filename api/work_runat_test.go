package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run_at 0001-01-01T00:00:00Z is a valid RFC 3339 timestamp in the range
// the API accepts (years 0000–9999), and a past one: the work is enqueued
// with it, as with any other past run_at (1970, 0000-06-01).
func TestWorkRunAtOfYearOneIsKeptAsGiven(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	for _, at := range []string{"0001-01-01T00:00:00Z", "0001-01-01T01:00:00+01:00"} {
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "block", "run_at": at})
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		require.Equal(t, "0001-01-01T00:00:00Z", r.JSON(t)["run_at"], "run_at %s", at)
	}
}

// A key's items run in run_at order: an item due in year 1 runs before
// one due in 1970, whichever was enqueued first.
func TestWorkKeyOrderHonoursARunAtOfYearOne(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	enqueue := func(body map[string]any) string {
		body["concurrency_key"] = "k"
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body)
		require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
		return r.JSON(t)["id"].(string)
	}
	holder := enqueue(map[string]any{"handler": "block"})
	require.Eventually(t, func() bool {
		return do(t, s.Handler(), http.MethodGet, "/v1/work/"+holder, admin, nil).JSON(t)["state"] == "running"
	}, testWait, pollEvery)
	in1970 := enqueue(map[string]any{"handler": "echo", "run_at": "1970-01-01T00:00:00Z"})
	inYear1 := enqueue(map[string]any{"handler": "echo", "run_at": "0001-01-01T00:00:00Z"})

	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodPost, "/v1/work/"+holder+"/cancel", admin, nil).Status)
	a, b := waitWork(t, s, admin, inYear1), waitWork(t, s, admin, in1970)
	ta, _ := time.Parse(time.RFC3339Nano, a["finished_at"].(string))
	tb, _ := time.Parse(time.RFC3339Nano, b["finished_at"].(string))
	require.True(t, ta.Before(tb), "the year-1 item ran first: year 1 finished %s (run_at %s), 1970 finished %s", ta, a["run_at"], tb)
}
