package workpool

import (
	"cmp"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// liveConfig fills short timings so that started managers react fast.
func liveConfig(t *testing.T, cfg Config) Config {
	cfg.Logger = cmp.Or(cfg.Logger, testkit.Logger(t))
	cfg.Cooldown = cmp.Or(cfg.Cooldown, 50*time.Millisecond)
	cfg.LeaderRetry = cmp.Or(cfg.LeaderRetry, 200*time.Millisecond)
	cfg.RecoveryPeriod = cmp.Or(cfg.RecoveryPeriod, 300*time.Millisecond)
	cfg.HeartbeatTimeout = cmp.Or(cfg.HeartbeatTimeout, 2*time.Second)
	cfg.HookRetryBackoff = cmp.Or(cfg.HookRetryBackoff, 50*time.Millisecond)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, 2*time.Second)
	return cfg
}

// newStartedManager runs a Manager on a fresh database with a "noop"
// handler; it is stopped when the test ends.
func newStartedManager(t *testing.T, cfg Config) (*pgxpool.Pool, *Manager) {
	t.Helper()
	db := testkit.NewPool(t)
	return db, startManager(t, db, cfg)
}

// startManager runs another replica on db.
func startManager(t *testing.T, db *pgxpool.Pool, cfg Config) *Manager {
	t.Helper()
	m, err := New(db, liveConfig(t, cfg))
	require.NoError(t, err)
	m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(ctx)
	})
	return m
}

// stopManager stops m now: once it returns, every iteration m ran has
// ended, and what they count after their commits is counted.
func stopManager(t *testing.T, m *Manager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, m.Stop(ctx))
}

func requireRunStatus(t *testing.T, db *pgxpool.Pool, pool, kind string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got string
		err := db.QueryRow(context.Background(), `SELECT run_kind FROM workpool_pools WHERE name = $1`, pool).Scan(&got)
		return err == nil && got == kind
	}, testWait, testTick, "run status of %s never became %s", pool, kind)
}

// requireLoopSettled waits until m leads pool and its loop has run its
// first full iteration and published kind. A new pool row reads "idle"
// before any iteration, so the status alone proves nothing: the generation
// must have moved past the takeover's bump and the loop must be waiting.
func requireLoopSettled(t *testing.T, db *pgxpool.Pool, m *Manager, pool, kind string) {
	t.Helper()
	require.Eventually(t, func() bool {
		l := m.loopFor(pool)
		if l == nil || !l.leading.Load() || l.iterations.Load() == 0 {
			return false
		}
		var (
			got string
			gen int64
		)
		err := db.QueryRow(context.Background(), `SELECT run_kind, generation FROM workpool_pools WHERE name = $1`, pool).Scan(&got, &gen)
		return err == nil && got == kind && gen >= 2 && len(l.kickc) == 0
	}, testWait, testTick, "the loop of %s never settled %s after an iteration", pool, kind)
}

func requireFinished(t *testing.T, m *Manager, org string, id uuid.UUID, want Outcome) Status {
	t.Helper()
	var s Status
	require.Eventually(t, func() bool {
		var err error
		s, err = m.Status(context.Background(), org, id)
		return err == nil && s.State == StateFinished
	}, testWait, testTick, "work %s never finished", id)
	require.Equal(t, want, s.Outcome, "outcome of %s (error %q)", id, s.Error)
	return s
}

// slotsInUse counts a pool's slots: started or running work plus
// unprocessed completions.
func slotsInUse(t *testing.T, db *pgxpool.Pool, pool string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `
		SELECT count(*) FROM workpool_work WHERE pool = $1 AND state = 'running'`, pool).Scan(&n))
	return n
}
