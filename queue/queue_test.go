package queue

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// The dispatcher is tested against a real Temporal server in internal/e2e
// (outage, not-found grace, redelivery); these tests cover the queue itself.

func TestEnqueueIsIdempotentOnTheKey(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	p := EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: "k", Payload: json.RawMessage(`{"n":1}`)}
	first, created, err := Enqueue(ctx, db, p)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, StatusPending, first.Status)
	require.Nil(t, first.Signal)

	p.Payload = json.RawMessage(`{"n":2}`)
	again, created, err := Enqueue(ctx, db, p)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	require.JSONEq(t, `{"n":1}`, string(again.Payload), "the first message stands")

	other, created, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o2", Queue: "q", IdempotencyKey: "k"})
	require.NoError(t, err)
	require.True(t, created, "keys are per org")
	require.NotEqual(t, first.ID, other.ID)
}

func TestAnotherOrgsMessageIsAbsent(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	m, _, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: "k"})
	require.NoError(t, err)
	_, err = Get(ctx, db, "intruder", m.ID)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = GetByKey(ctx, db, "intruder", "q", "k")
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, SetPayload(ctx, db, "intruder", m.ID, json.RawMessage(`{}`)), ErrNotFound)
	require.NoError(t, Settle(ctx, db, "intruder", m.ID, StatusFailed, "x"))
	got, err := Get(ctx, db, "o", m.ID)
	require.NoError(t, err)
	require.Equal(t, StatusPending, got.Status, "another org cannot settle it")
}

func TestSettleAndRedeliver(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := &Signal{WorkflowID: "o/wf", Name: "wake"}
	m, _, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: "k", Signal: sig})
	require.NoError(t, err)
	require.Equal(t, sig, m.Signal)

	ok, err := Redeliver(ctx, db, "o", m.ID)
	require.NoError(t, err)
	require.False(t, ok, "a pending message is not redelivered")

	require.NoError(t, Settle(ctx, db, "o", m.ID, StatusFailed, "workflow gone"))
	got, _ := Get(ctx, db, "o", m.ID)
	require.Equal(t, StatusFailed, got.Status)
	require.Equal(t, "workflow gone", got.LastError)
	require.NoError(t, Settle(ctx, db, "o", m.ID, StatusDelivered, ""))
	got, _ = Get(ctx, db, "o", m.ID)
	require.Equal(t, StatusFailed, got.Status, "a settled message stays settled")

	ok, err = Redeliver(ctx, db, "o", m.ID)
	require.NoError(t, err)
	require.True(t, ok)
	got, _ = Get(ctx, db, "o", m.ID)
	require.Equal(t, StatusPending, got.Status)

	require.Error(t, Settle(ctx, db, "o", m.ID, "pending", ""), "only delivered or failed settle")
	_, err = Get(ctx, db, "o", uuid.New())
	require.ErrorIs(t, err, ErrNotFound)
}

func TestEnqueueRejectsIncompleteMessages(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	for _, p := range []EnqueueParams{
		{Queue: "q", IdempotencyKey: "k"},
		{OrgID: "o", IdempotencyKey: "k"},
		{OrgID: "o", Queue: "q"},
		{OrgID: "o", Queue: "q", IdempotencyKey: "k", Signal: &Signal{Name: "x"}},
	} {
		_, _, err := Enqueue(ctx, db, p)
		require.Error(t, err)
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	d := NewDispatcher(nil, nil, DispatcherConfig{})
	require.InDelta(t, float64(d.cfg.MinBackoff), float64(d.backoff(1)), float64(d.cfg.MinBackoff)/4+1)
	require.Greater(t, d.backoff(6), d.backoff(1))
	for range 20 {
		require.LessOrEqual(t, d.backoff(50), d.cfg.MaxBackoff*5/4)
	}
}

// A send that reached Temporal counts even when its lease ran out and
// another dispatcher re-claimed the message meanwhile; a stale failure
// does not.
func TestADeliveryCountsWhicheverClaimMadeItAndAStaleFailureDoesNot(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	d := NewDispatcher(db, nil, DispatcherConfig{})
	enqueue := func(key string) Message {
		// (a workflow each: a claim takes one message a workflow)
		m, _, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: key, Signal: &Signal{WorkflowID: "o/wf-" + key, Name: "wake"}})
		require.NoError(t, err)
		return m
	}
	reclaim := func() []claimed {
		_, err := db.Exec(ctx, `UPDATE queue_messages SET next_attempt_at = now() WHERE status = 'pending'`)
		require.NoError(t, err)
		msgs, err := d.claim(ctx, 10, nil)
		require.NoError(t, err)
		return msgs
	}
	delivered, failed := enqueue("a"), enqueue("b")
	first := reclaim()  // attempt 1: its lease runs out
	second := reclaim() // attempt 2, by another dispatcher
	require.Len(t, first, 2)
	require.Len(t, second, 2)
	results := make([]sendResult, len(first))
	for i, m := range first {
		results[i] = sendResult{id: m.ID, attempts: m.Attempts}
		if m.ID == failed.ID {
			results[i].err = errors.New("connection reset")
		}
	}

	require.NoError(t, d.settle(ctx, first, results))

	got, err := Get(ctx, db, "o", delivered.ID)
	require.NoError(t, err)
	require.Equal(t, StatusDelivered, got.Status)
	got, err = Get(ctx, db, "o", failed.ID)
	require.NoError(t, err)
	require.Equal(t, StatusPending, got.Status, "the newer claim decides")
	require.Empty(t, got.LastError)
}
