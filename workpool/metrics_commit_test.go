package workpool

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// The executor's report transaction fails at its commit and is recorded
// again: the hook ran into one committed transaction, once, and
// reveille_workpool_hook_calls_total{result="ok"} must say 1.
func TestMetrics_AHookCallWhoseCommitFailedIsNotCounted(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	hookTable(t, db)
	ctx := context.Background()
	testkit.FailFirstCommit(t, db, "fail_first_hook_commit", "INSERT", "hook_calls", "")
	m.RegisterHook("record", recordHook)
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop", OnComplete: &OnComplete{Hook: "record"}})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	stopManager(t, m) // (counted after the commit the test has just seen)
	n, _ := hookCallsOf(t, db, id)
	require.Equal(t, 1, n, "one committed hook call")
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.hookCalls.WithLabelValues("default", "ok")),
		"the call in the rolled-back transaction is counted too")
}

// The loop's iteration that finishes canceled pending work fails at its
// commit and is run again: one item canceled, and
// reveille_workpool_canceled_total{pool} must say 1.
func TestMetrics_ACancelationWhoseIterationRolledBackIsNotCounted(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	hookTable(t, db)
	ctx := context.Background()
	testkit.FailFirstCommit(t, db, "fail_first_hook_commit", "INSERT", "hook_calls", "")
	m.RegisterHook("record", recordHook)
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		RunAt: time.Now().Add(time.Hour), OnComplete: &OnComplete{Hook: "record"}})
	require.NoError(t, err)
	require.NoError(t, m.Cancel(ctx, "org-1", id))
	requireFinished(t, m, "org-1", id, OutcomeCanceled)
	stopManager(t, m) // (counted after the commit the test has just seen)
	n, _ := hookCallsOf(t, db, id)
	require.Equal(t, 1, n, "one committed hook call")
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.canceled.WithLabelValues("default")),
		"the cancelation in the rolled-back iteration is counted too")
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.hookCalls.WithLabelValues("default", "ok")))
}
