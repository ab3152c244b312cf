package leader

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

// written counts the marker rows a write under test left (in leader_terms
// itself, under names no leadership uses: the package owns no other table).
func written(t *testing.T, q db.Querier, marker string) int {
	t.Helper()
	var n int
	require.NoError(t, q.QueryRow(context.Background(), `SELECT count(*) FROM leader_terms WHERE name = $1`, marker).Scan(&n))
	return n
}

func TestAFencedWriteLandsOnlyUnderTheCurrentTerm(t *testing.T) {
	pool := testkit.NewPool(t)
	ctx := context.Background()
	old, err := NewTerm(ctx, pool, "test.fence")
	require.NoError(t, err)
	current, err := NewTerm(ctx, pool, "test.fence") // another replica took over
	require.NoError(t, err)
	require.Greater(t, current.N, old.N)

	tests := []struct {
		name        string
		ctx         context.Context
		deposed     bool
		inStatement bool // FenceSQL in the write itself instead of Hold
	}{
		{name: "the current term, in a transaction", ctx: WithTerm(ctx, current)},
		{name: "a superseded term, in a transaction", ctx: WithTerm(ctx, old), deposed: true},
		{name: "no term: a call outside any leadership", ctx: ctx},
		{name: "the current term, in the statement", ctx: WithTerm(ctx, current), inStatement: true},
		{name: "a superseded term, in the statement", ctx: WithTerm(ctx, old), deposed: true, inStatement: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			marker := fmt.Sprint("written.", i)
			if tt.inStatement {
				term, _ := TermFrom(tt.ctx)
				tag, err := pool.Exec(tt.ctx, `INSERT INTO leader_terms (name, term) SELECT $3, 0 WHERE `+FenceSQL(1, 2),
					term.Name, term.N, marker)
				require.NoError(t, err)
				require.EqualValues(t, map[bool]int{false: 1, true: 0}[tt.deposed], tag.RowsAffected())
			} else {
				err := FencedTx(tt.ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(tt.ctx, `INSERT INTO leader_terms (name, term) VALUES ($1, 0)`, marker)
					return err
				})
				if tt.deposed {
					require.ErrorIs(t, err, ErrDeposed)
				} else {
					require.NoError(t, err)
				}
			}
			require.Equal(t, map[bool]int{false: 1, true: 0}[tt.deposed], written(t, pool, marker))
		})
	}
}

// A transaction that saw its term current must commit before a later
// leader leads: NewTerm waits for it, so the old leader's write cannot land
// after the takeover.
func TestANewTermWaitsForTheFencedTransactionsOfTheOldOne(t *testing.T) {
	pool := testkit.NewPool(t)
	ctx := context.Background()
	old, err := NewTerm(ctx, pool, "test.fence")
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, Hold(WithTerm(ctx, old), tx))
	_, err = tx.Exec(ctx, `INSERT INTO leader_terms (name, term) VALUES ('written.old', 0)`)
	require.NoError(t, err)

	next := make(chan Term, 1)
	go func() {
		term, err := NewTerm(ctx, pool, "test.fence")
		if err != nil {
			term.N = -1
		}
		next <- term
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO leader_terms%ON CONFLICT%')`).Scan(&waiting)
		return err == nil && waiting
	}, testWait, pollEvery, "the new term waits for the old term's transaction")
	select {
	case <-next:
		t.Fatal("a new term started while the old term's write was in flight")
	default:
	}

	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, old.N+1, (<-next).N)
	require.Equal(t, 1, written(t, pool, "written.old"), "the old term's write committed before the takeover")
	err = FencedTx(WithTerm(ctx, old), pool, func(pgx.Tx) error { return nil })
	require.ErrorIs(t, err, ErrDeposed, "and none after it")
}

func TestEveryStandsDownWhenItsTermIsSuperseded(t *testing.T) {
	var rounds int
	var reported []error
	fn := Every(time.Millisecond, func(context.Context) error {
		rounds++
		return fmt.Errorf("sweeping: %w", ErrDeposed)
	}, func(err error) { reported = append(reported, err) })
	done := make(chan struct{})
	go func() { defer close(done); fn(context.Background()) }() // a context that never ends
	select {
	case <-done:
	case <-time.After(testWait):
		t.Fatal("a deposed leader's loop went on")
	}
	require.Equal(t, 1, rounds)
	require.Len(t, reported, 1)
	require.ErrorIs(t, reported[0], ErrDeposed)
}

func TestSweepBatchesStopsAtTheFirstDeposedItem(t *testing.T) {
	handled := 0
	n, err := SweepBatches(context.Background(), 10,
		func(context.Context, *int, int) ([]int, error) { return []int{1, 2, 3}, nil },
		func(context.Context, int) (bool, error) {
			handled++
			return false, fmt.Errorf("expiring: %w", ErrDeposed)
		},
		func(int, error) { t.Error("a deposed sweep is not an item's failure") })
	require.ErrorIs(t, err, ErrDeposed)
	require.Zero(t, n)
	require.Equal(t, 1, handled, "the other items would only meet it too")
}

// The whole chain on a running leader: its rounds write under the term
// the Elector handed it; once another replica starts a newer term, its next
// round writes nothing and it stands down, and when it leads again it does
// so under a term newer still.
func TestARunningLeaderDeposedByANewerTermStandsDownAndLeadsAgainUnderTheNext(t *testing.T) {
	pool := testkit.NewPool(t)
	ctx := context.Background()
	e := &Elector{DB: pool, Name: "test.fenced", Retry: 10 * time.Millisecond, Logger: testkit.Logger(t)}
	deposedRounds := make(chan error, 10)
	round := func(ctx context.Context) error {
		term, _ := TermFrom(ctx)
		return FencedTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO leader_terms (name, term) VALUES ($1, 0) ON CONFLICT DO NOTHING`, fmt.Sprint("written.", term.N))
			return err
		})
	}
	var b Background
	require.NoError(t, b.Start(ctx, e, Every(time.Millisecond, round, func(err error) { deposedRounds <- err })))
	defer func() { require.NoError(t, b.Stop(ctx)) }()
	require.Eventually(t, func() bool { return written(t, pool, "written.1") == 1 }, testWait, pollEvery, "the first leader writes under term 1")

	_, err := NewTerm(ctx, pool, "test.fenced") // another replica took over (term 2)
	require.NoError(t, err)
	require.ErrorIs(t, <-deposedRounds, ErrDeposed)
	require.Eventually(t, func() bool { return written(t, pool, "written.3") == 1 }, testWait, pollEvery, "it leads again under term 3")
}
