package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A failing onComplete hook shows in reveille_workpool_hook_calls_total{pool,
// result="failed"}; the log line an operator paged on that series looks
// for must name the pool too, as every other per-work failure line does
// ("work failed for good", "an attempt's result was refused"). It names
// the hook, the work id and the org, not the pool: with several pools, the
// alert's pool cannot be matched to its log lines.
func TestAFailingHooksLogLineNamesItsPool(t *testing.T) {
	t.Parallel()
	var logs testkit.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 2, "billing": 2}, Logger: logger})
	m.RegisterHook("broken", func(context.Context, pgx.Tx, Completion) error { return errors.New("downstream unavailable") })
	_, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "billing", Handler: "noop",
		OnComplete: &OnComplete{Hook: "broken"}})
	require.NoError(t, err)

	var line map[string]any
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "onComplete hook failed") {
				return json.Unmarshal([]byte(l), &line) == nil
			}
		}
		return false
	}, testWait, testTick)
	require.Equal(t, "billing", line["pool"], "the hook failure's log line: %v", line)
}
