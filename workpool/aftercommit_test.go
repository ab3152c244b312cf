package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestAfterCommit_RunsOnceAfterTheHooksTransactionCommitsAndNeverForAFailedCall(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 10}})
	hookTable(t, db)
	var mu sync.Mutex
	ran := map[uuid.UUID]int{}
	committed := map[uuid.UUID]bool{}
	m.RegisterHook("after", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if err := recordHook(ctx, tx, c); err != nil {
			return err
		}
		ok := AfterCommit(ctx, func() {
			// The hook's write is visible: the callback runs after the commit.
			n, _ := hookCallsOf(t, db, c.WorkID)
			mu.Lock()
			defer mu.Unlock()
			ran[c.WorkID]++
			committed[c.WorkID] = n == 1
		})
		if !ok {
			return errors.New("AfterCommit refused a hook's context")
		}
		var args struct{ Fail bool }
		_ = json.Unmarshal(c.Result, &args)
		if args.Fail {
			return errors.New("this call fails after registering")
		}
		return nil
	})
	m.Register("echo", func(_ context.Context, j Job) (json.RawMessage, error) { return j.Args, nil })
	ctx := context.Background()
	var good []uuid.UUID
	var bad uuid.UUID
	for i := range 6 {
		args := `{"Fail":false}`
		if i == 3 {
			args = `{"Fail":true}`
		}
		id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "echo",
			Args: json.RawMessage(args), OnComplete: &OnComplete{Hook: "after"}})
		require.NoError(t, err)
		if i == 3 {
			bad = id
		} else {
			good = append(good, id)
		}
	}
	for _, id := range good {
		requireFinished(t, m, "org-1", id, OutcomeSucceeded)
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return ran[id] > 0 }, testWait, testTick)
	}
	requireFinished(t, m, "org-1", bad, OutcomeSucceeded)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range good {
		require.Equal(t, 1, ran[id], "a kept call's action runs exactly once, even when a sibling's failure re-ran it")
		require.True(t, committed[id], "the action sees the committed hook write")
	}
	require.Zero(t, ran[bad], "a failed call's action is dropped")
}

func TestAfterCommit_OutsideAHookIsRefused(t *testing.T) {
	require.False(t, AfterCommit(context.Background(), func() { t.Fatal("must not run") }))
}
