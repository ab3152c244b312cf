package workpool

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// In a pool of many orgs with a backlog the ledger holds every org served
// in the current round: it grows to the number of orgs before the clock
// moves on. The leader saves it every second, and the save drops the
// lines no longer in it: as `org_id <> ALL($orgs)`, the plan a pooled
// connection reuses after five saves (generic: a parameter array is never
// hashed) compared every saved line with every org of the ledger — 10^8
// comparisons, about a second of the loop's time every second, at 10,000
// orgs. Counted on the analyzed plan of the sixth save, the lines the save
// reads times the array each is compared with must stay linear.
func TestFairTurns_SavingALedgerOfManyOrgsComparesEachLineOnce(t *testing.T) {
	ctx := context.Background()
	db := testkit.NewPool(t)
	m, err := New(db, Config{Pools: map[string]int{"default": 100}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	l := newLoop(m, "default")
	require.NoError(t, l.takeover(ctx))
	const orgs = 5000
	// the end of a round: every org served once more than the clock
	l.turns.orgs = make(map[string]orgTurns, orgs)
	for i := range orgs {
		l.turns.orgs[fmt.Sprintf("org-%05d", i)] = orgTurns{served: 2, weight: 1}
	}
	l.turns.num, l.turns.den = 1, 1
	args := append([]any{l.pool, l.gen}, l.turns.args()...)

	plan := testkit.PlanAfter(t, db, sqlSaveTurns, [][]any{args, args, args, args, args}, args)

	compared := 0
	for i, line := range plan {
		// a node run again for every line (a nested loop's inner side)
		if m := loopedRows.FindStringSubmatch(line); m != nil {
			rows, _ := strconv.Atoi(m[1])
			loops, _ := strconv.Atoi(m[2])
			if loops > 1 {
				compared += rows * loops
			}
		}
		// a filter comparing each row read with a whole parameter array
		if !arrayFilter.MatchString(line) {
			continue
		}
		// the node's rows (line above, or two above) and the rows it removed
		node := plan[max(i-1, 0)]
		if !strings.Contains(node, "actual") {
			node = plan[max(i-2, 0)]
		}
		read := 0
		if m := actualRows.FindStringSubmatch(node); m != nil {
			read, _ = strconv.Atoi(m[1])
		}
		if i+1 < len(plan) {
			if m := removedByFilterLine.FindStringSubmatch(plan[i+1]); m != nil {
				n, _ := strconv.Atoi(m[1])
				read += n
			}
		}
		compared += read * orgs
	}
	require.LessOrEqual(t, compared, 4*orgs, "a save of %d lines makes %d comparisons:\n%s", orgs, compared, strings.Join(plan, "\n"))
}

var (
	arrayFilter         = regexp.MustCompile(`Filter: .*(?:ANY|ALL) \(\$\d+\)`)
	loopedRows          = regexp.MustCompile(`actual time=\S+ rows=(\d+) loops=(\d+)`)
	actualRows          = regexp.MustCompile(`actual time=\S+ rows=(\d+)`)
	removedByFilterLine = regexp.MustCompile(`Rows Removed by Filter: (\d+)`)
)
