package workpool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// The loop's statements run on a table that holds every item a pool ever
// had until retention purges it: a statement whose plan reads the whole
// table turns each iteration into a scan of it. Postgres plans them once
// and then reuses the generic plan, whose estimates know nothing of the
// parameters or of a subquery's value; an EXISTS or a probe bounded by one
// ("another org than the first", "any keyed work") then looks cheapest as a
// sequential scan expected to stop at its first row, which on a table of
// one org's backlog reads every row. Each statement here is planned
// generically on analyzed tables of one org's backlog and of 20 orgs', and
// must reach workpool_work through its indexes.
func TestTheLoopsStatementsNeverScanTheWholeWorkTable(t *testing.T) {
	for _, orgs := range []int{1, 20} {
		t.Run(fmt.Sprintf("%d orgs", orgs), func(t *testing.T) {
			ctx := context.Background()
			m, err := New(testkit.NewPool(t), Config{Pools: map[string]int{"default": 100}, Logger: testkit.Logger(t), MaxPendingPerOrg: 1_000_000})
			require.NoError(t, err)
			m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
			ps := make([]EnqueueParams, 20_000)
			for i := range ps {
				ps[i] = EnqueueParams{OrgID: fmt.Sprintf("org-%02d", i*orgs/len(ps)), Pool: "default", Handler: "noop", Args: json.RawMessage(`{}`)}
			}
			for i := 0; i < len(ps); i += 1000 {
				_, err := m.EnqueueMany(ctx, ps[i:i+1000])
				require.NoError(t, err)
			}
			// some run, some finished, as in any busy pool
			_, err = m.db.Exec(ctx, `UPDATE workpool_work SET state = 'running', started_at = now()
				WHERE id IN (SELECT id FROM workpool_work ORDER BY id LIMIT 50)`)
			require.NoError(t, err)
			_, err = m.db.Exec(ctx, `UPDATE workpool_work SET state = 'finished', started_at = now(), finished_at = now()
				WHERE id IN (SELECT id FROM workpool_work WHERE state = 'pending' ORDER BY id LIMIT 5000)`)
			require.NoError(t, err)
			_, err = m.db.Exec(ctx, `VACUUM ANALYZE workpool_work`)
			require.NoError(t, err)

			l := newLoop(m, "default")
			require.NoError(t, l.takeover(ctx))
			now := time.Now()
			start := append(l.startArgs(now), l.gen)
			fair := append(append([]any{}, start...), l.turns.args()...)
			for _, s := range []struct {
				name string
				sql  string
				args []any
			}{
				{"sqlIterateFast", sqlIterateFast, start},
				{"sqlIterateFastNear", sqlIterateFastNear, fair},
				{"sqlIterateFastShared", sqlIterateFastShared, fair},
				{"sqlCensus", sqlCensus, []any{l.pool, now}},
				{"sqlOutlook", sqlOutlook, []any{l.pool, now}},
				{"sqlStartPlain", sqlStartPlain, append(l.startArgs(now), int32(100))},
				{"sqlStartFair", sqlStartFair, append(append(l.startArgs(now), int32(100), (*int32)(nil)), l.turns.args()...)},
				{"sqlStale", sqlStale, []any{l.pool, now}},
				{"sqlDueHooks", sqlDueHooks, []any{l.pool, now}},
			} {
				plan := testkit.GenericPlan(t, m.db, s.sql, s.args)
				for i, line := range plan {
					if strings.Contains(line, "Seq Scan on workpool_work ") {
						t.Errorf("%s reads the whole table:\n%s\n%s", s.name, line, plan[min(i+1, len(plan)-1)])
					}
				}
			}
		})
	}
}
