package service_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
)

// Postgres compiles a statement with LLVM (JIT) at every execution once its
// estimated cost passes jit_above_cost (100,000 by default; jit is on by
// default wherever the server was built with LLVM, as in the official
// images). The pool loop's fair start estimates its cost from the orgs
// queued: 18,000 at 500 orgs with work, 260,000 at 1,000, 7.4 million at
// 2,000 (its custom plans; its generic plan passes the bar from about 4,000
// orgs). Past it every fair start compiled 483 functions, ~4 s of a start
// that runs in ~30 ms (workpool: sqlStartFair, 2,000 orgs), so a pool of a
// few thousand orgs started work every few seconds. The service's sessions
// must not compile: counted on a statement estimated past the bar, as the
// fair start of a pool of 2,000 orgs is.
func TestTheServicesSessionsDoNotCompileStatementsWithJIT(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	var pc *pgxpool.Config
	cfg.ConfigureDB = func(c *pgxpool.Config) { pc = c.Copy() }
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	svc.Close()
	require.NotNil(t, pc, "the service configured its pool")

	db, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(ctx, `EXPLAIN SELECT count(*) FROM generate_series(1, 100000) a, generate_series(1, 100000) b`)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	compiled := 0
	for _, line := range plan {
		if m := jitFunctions.FindStringSubmatch(line); m != nil {
			compiled, _ = strconv.Atoi(m[1])
		}
	}
	require.Zero(t, compiled, "functions compiled for one execution:\n%s", strings.Join(plan, "\n"))
}

var jitFunctions = regexp.MustCompile(`Functions: (\d+)`)
