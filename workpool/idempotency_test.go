package workpool

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

func withWorkRetention(d time.Duration) harnessOpt { return func(c *Config) { c.WorkRetention = d } }

func withPools(pools map[string]int) harnessOpt { return func(c *Config) { c.Pools = pools } }

func (h *harness) enqueueKeyed(key string, opts ...workOpt) (uuid.UUID, error) {
	h.t.Helper()
	p := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", Args: json.RawMessage(`{"a":1,"b":[1,2]}`), IdempotencyKey: key}
	for _, o := range opts {
		o(&p)
	}
	return h.m.Enqueue(h.ctx, p)
}

func withArgs(args string) workOpt { return func(p *EnqueueParams) { p.Args = json.RawMessage(args) } }

func withPool(pool string) workOpt { return func(p *EnqueueParams) { p.Pool = pool } }

// An enqueue retried after an unknown outcome (a 5xx after the commit)
// must not enqueue twice — also when the first work has finished and its
// record was purged, for as long as the key is kept (24 h).
func TestEnqueue_ARepeatedKeyReturnsTheFirstWorkEvenAfterItsRecordIsPurged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkRetention(time.Hour))
	first, err := h.enqueueKeyed("k1")
	require.NoError(t, err)

	again, err := h.enqueueKeyed("k1", withArgs(`{ "b": [1, 2], "a": 1 }`))
	require.NoError(t, err)
	require.Equal(t, first, again, "the same request, spelt differently")
	require.Equal(t, 1, h.workCount())

	h.runMain()
	h.complete(first, "success", 1)
	h.runMain()
	h.clock.Advance(2 * time.Hour)
	n, err := h.l.purge(h.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the work record is past retention")
	n, err = h.l.purgeKeys(h.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the key is kept for 24 h")

	again, err = h.enqueueKeyed("k1")
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Zero(t, h.workCount(), "nothing enqueued again")

	h.clock.Advance(IdempotencyRetention)
	n, err = h.l.purgeKeys(h.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	fresh, err := h.enqueueKeyed("k1")
	require.NoError(t, err)
	require.NotEqual(t, first, fresh, "past its retention the key is free again")
	require.Equal(t, 1, h.workCount())
}

func TestEnqueue_AKeyIsKeptAsLongAsFinishedWorkWhenRetentionIsLonger(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkRetention(48*time.Hour))
	_, err := h.enqueueKeyed("k1")
	require.NoError(t, err)

	h.clock.Advance(IdempotencyRetention + time.Hour)
	n, err := h.l.purgeKeys(h.ctx)

	require.NoError(t, err)
	require.Zero(t, n)
}

func TestEnqueue_AKeyIsScopedToItsOrgAndPoolAndRefusesADifferentRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withPools(map[string]int{"default": 10, "other": 10}))
	h.m.Register("other_handle", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	first, err := h.enqueueKeyed("k1")
	require.NoError(t, err)

	for name, opt := range map[string]workOpt{
		"other args":    withArgs(`{"a":2,"b":[1,2]}`),
		"other handler": func(p *EnqueueParams) { p.Handler = "other_handle" },
		"a run_at":      withRunAt(h.clock.Now().Add(time.Hour)),
		"a retry":       withRetry(3, 10, 2),
		"a timeout":     func(p *EnqueueParams) { p.TimeoutMS = 5 },
	} {
		_, err := h.enqueueKeyed("k1", opt)
		require.ErrorIs(t, err, ErrIdempotencyKeyReused, name)
		require.ErrorIs(t, err, apperr.ErrConflict, name)
	}
	otherOrg, err := h.enqueueKeyed("k1", withOrg("org-2"))
	require.NoError(t, err)
	otherPool, err := h.enqueueKeyed("k1", withPool("other"))
	require.NoError(t, err)
	require.NotEqual(t, first, otherOrg)
	require.NotEqual(t, first, otherPool)
	require.NotEqual(t, otherOrg, otherPool)
	require.Equal(t, 3, h.workCount())
}

func TestEnqueue_ConcurrentEnqueuesWithOneKeyEnqueueOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const n = 8
	ids := make([]uuid.UUID, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = h.m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default",
				Handler: "test_handle", IdempotencyKey: "same"})
		}()
	}
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
	}
	require.Equal(t, 1, h.workCount())
}

func TestEnqueueMany_KeysReplayItemByItemAndMayNotRepeatInOneBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	item := func(key, args string) EnqueueParams {
		return EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", Args: json.RawMessage(args), IdempotencyKey: key}
	}
	first, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{item("a", `{}`), item("", `{}`)})
	require.NoError(t, err)

	batch, err := h.m.EnqueueMany(h.ctx, []EnqueueParams{item("b", `{}`), item("a", `{}`), item("", `{}`)})
	require.NoError(t, err)
	require.Equal(t, first[0], batch[1], "the replayed item takes the first id")
	require.NotEqual(t, first[1], batch[2], "an item without a key is always new")
	require.Equal(t, 4, h.workCount())

	_, err = h.m.EnqueueMany(h.ctx, []EnqueueParams{item("c", `{}`), item("c", `{}`)})
	requireInvalid(t, err, "[1].idempotency_key")
	_, err = h.m.Enqueue(h.ctx, item("bad\x00key", `{}`))
	requireInvalid(t, err, "idempotency_key")
	_, err = h.m.Enqueue(h.ctx, item(strings.Repeat("é", 128), `{}`))
	requireInvalid(t, err, "idempotency_key")
	require.Equal(t, 4, h.workCount())
}

func TestEnqueueTx_AKeyIsKeptOnlyIfTheTransactionCommits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", IdempotencyKey: "k"}
	tx, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	rolledBack, err := h.m.EnqueueTx(h.ctx, tx, p)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(h.ctx))

	id, err := h.m.Enqueue(h.ctx, p)

	require.NoError(t, err)
	require.NotEqual(t, rolledBack, id)
	require.Equal(t, 1, h.workCount())
}

// A replay that arrives while the first enqueue's transaction is still
// open waits for it: its commit makes the replay return the first work,
// its rollback lets the replay enqueue afresh. Either way one item.
func TestEnqueue_AReplayWaitsForTheFirstEnqueuesOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		commit      bool
		sameAsFirst bool
	}{
		{"the first commits", true, true},
		{"the first rolls back", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			p := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", IdempotencyKey: "k"}
			tx, err := h.db.Begin(h.ctx)
			require.NoError(t, err)
			first, err := h.m.EnqueueTx(h.ctx, tx, p)
			require.NoError(t, err)
			type result struct {
				id  uuid.UUID
				err error
			}
			replayed := make(chan result, 1)
			go func() {
				id, err := h.m.Enqueue(context.Background(), p)
				replayed <- result{id, err}
			}()
			// The replay is blocked on the first's uncommitted key.
			require.Eventually(t, func() bool {
				var waiting int
				require.NoError(t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
				return waiting == 1
			}, 10*time.Second, 10*time.Millisecond)

			if tc.commit {
				require.NoError(t, tx.Commit(h.ctx))
			} else {
				require.NoError(t, tx.Rollback(h.ctx))
			}
			r := <-replayed

			require.NoError(t, r.err)
			require.Equal(t, tc.sameAsFirst, r.id == first)
			require.Equal(t, 1, h.workCount())
		})
	}
}

// A value left out and its default spelled out are the same request: a
// retry that spells a default the first attempt left out (or the other way
// round) replays the first work instead of being refused as different.
func TestEnqueue_ADefaultLeftOutOrSpelledOutIsTheSameRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		first, second workOpt
	}{
		{"timeout", func(p *EnqueueParams) {}, func(p *EnqueueParams) { p.TimeoutMS = DefaultTimeoutMS }},
		{"backoff base", withRetry(3, 10, 0), withRetry(3, 10, 2)},
		{"key limit", withKey("k", 0), withKey("k", 1)},
		{"key limit, the other way round", withKey("k", 1), withKey("k", 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			first, err := h.enqueueKeyed("idem", tc.first)
			require.NoError(t, err)
			again, err := h.enqueueKeyed("idem", tc.second)
			require.NoError(t, err)
			require.Equal(t, first, again)
			require.Equal(t, 1, h.workCount())
			_, err = h.enqueueKeyed("idem", withKey("k", 2))
			require.ErrorIs(t, err, ErrIdempotencyKeyReused, "a limit that differs is a different request")
		})
	}
}
