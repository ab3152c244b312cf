package workpool

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// countingQuerier is the test's database, counting what Check asks it.
type countingQuerier struct {
	Querier
	queries int
}

func (c *countingQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.queries++
	return c.Querier.Query(ctx, sql, args...)
}

func TestCheck_KnowsPoolsWithoutAQueryAndFindsNewOnesAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// before runs between the first check and the second.
		before  func(h *harness)
		pool    string
		valid   bool // the second check's answer
		queries int  // what the second check asked the database
	}{
		{name: "a pool found once is known without a query", pool: "default", valid: true, queries: 0},
		{name: "an unknown pool is asked for every time", pool: "later", valid: false, queries: 1},
		{name: "a pool another replica creates is found by the next check", pool: "later", valid: true, queries: 1,
			before: func(h *harness) {
				_, err := New(h.db, Config{Pools: map[string]int{"later": 1}, Logger: h.m.logger})
				require.NoError(h.t, err)
			}},
		{name: "a pool dropped by hand is refused once its entry is stale", pool: "default", valid: false, queries: 1,
			before: func(h *harness) {
				_, err := h.db.Exec(h.ctx, `DELETE FROM workpool_pools WHERE name = 'default'`)
				require.NoError(h.t, err)
				h.clock.Advance(knownPoolTTL)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			p := EnqueueParams{OrgID: "org-1", Pool: tt.pool, Handler: "test_handle"}
			q := &countingQuerier{Querier: h.db}
			_ = h.m.Check(h.ctx, q, p, "work.")
			if tt.before != nil {
				tt.before(h)
			}
			q.queries = 0

			err := h.m.Check(h.ctx, q, p, "work.")

			if tt.valid {
				require.NoError(t, err)
			} else {
				requireInvalid(t, err, "work.pool")
			}
			require.Equal(t, tt.queries, q.queries)
		})
	}
}
