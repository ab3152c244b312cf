package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
)

// The fair-share bar's ratio is the median of each round's fair rate over
// its own round's single-org rate: the two medians taken apart may come
// from different rounds. With docs/benchmarks.md's "after (3fae9a5)" row
// (rounds 9,547/7,056, 13,002/8,040, 9,906/6,105) the rounds' ratios are
// 0.74, 0.62 and 0.62, median 0.62 (8,040/13,002); the medians' ratio, printed then,
// was 0.71.
func TestTheFairShareRatioIsTheMedianOfEachRoundsOwnRatio(t *testing.T) {
	single := []fairPhase{{rate: 9547}, {rate: 13002}, {rate: 9906}}
	fair := []fairPhase{{rate: 7056}, {rate: 8040}, {rate: 6105}}
	require.InDelta(t, 0.6184, fairRatio(single, fair), 0.0005)
	require.InDelta(t, 0.6787, fairRatio(single[:2], fair[:2]), 0.0005, "of two rounds, the mean of their ratios")
}

// captureStdout runs f with os.Stdout redirected and returns what it printed.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	defer func() { os.Stdout = old }()
	f()
	_ = w.Close()
	os.Stdout = old
	return string(<-done)
}

// The rest bench reads "requests per shared commit" from /metrics on the
// bench's own API: with REVEILLE_OPS_ADDR set where engine bench runs,
// /metrics moved to the ops listener, the API's 404 page read as an empty
// histogram, and the figure left the result line without a word.
func TestTheRestBenchReportsRequestsPerCommitWhenAnOpsAddressIsConfigured(t *testing.T) {
	admin := testkit.ServerURL(t)
	for _, ops := range []string{"", "127.0.0.1:0"} {
		t.Run("ops="+ops, func(t *testing.T) {
			var err error
			out := captureStdout(t, func() {
				cfg := service.Config{DatabaseURL: admin}
				cfg.API.OpsAddr = ops
				err = Rest(context.Background(), RestConfig{Service: cfg, Route: RestSpend,
					Clients: 4, Agents: 2, Duration: 300 * time.Millisecond})
			})
			require.NoError(t, err)
			require.Contains(t, out, "route=spend")
			require.True(t, bytes.Contains([]byte(out), []byte("requests per shared commit")), "the spend line lacks its per-commit figure:\n%s", out)
		})
	}
}
