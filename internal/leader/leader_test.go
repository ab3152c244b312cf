package leader

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	testWait  = 10 * time.Second
	pollEvery = 5 * time.Millisecond
)

// terms records every leadership term of a group of electors.
type terms struct {
	mu      sync.Mutex
	started []int   // elector index per term, in order
	numbers []int64 // the term number each was handed (TermFrom)
	ended   []bool
	active  int
	maxSeen int
}

// lead returns the fn an elector leads with: it records the term and holds
// it until the term's context ends.
func (tr *terms) lead(elector int) func(ctx context.Context) {
	return func(ctx context.Context) {
		tr.mu.Lock()
		term := len(tr.started)
		tr.started = append(tr.started, elector)
		n, _ := TermFrom(ctx)
		tr.numbers = append(tr.numbers, n.N)
		tr.ended = append(tr.ended, false)
		tr.active++
		tr.maxSeen = max(tr.maxSeen, tr.active)
		tr.mu.Unlock()
		<-ctx.Done()
		tr.mu.Lock()
		tr.active--
		tr.ended[term] = true
		tr.mu.Unlock()
	}
}

func (tr *terms) snapshot() (started []int, ended []bool, active, maxSeen int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]int(nil), tr.started...), append([]bool(nil), tr.ended...), tr.active, tr.maxSeen
}

// electorPool opens a pool for one elector that counts its released
// connections: a standby's failed try acquires and releases one, a leader
// keeps its connection.
func electorPool(t *testing.T, dsn string, releases *atomic.Int64) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.AfterRelease = func(*pgx.Conn) bool { releases.Add(1); return true }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// group runs n electors for one leadership, each on its own pool.
type group struct {
	terms    terms
	releases []*atomic.Int64
	stop     context.CancelFunc
	done     []chan struct{}
}

func startGroup(t *testing.T, dsn string, n int, retry time.Duration) *group {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &group{stop: cancel}
	for i := range n {
		rel := &atomic.Int64{}
		g.releases = append(g.releases, rel)
		e := &Elector{DB: electorPool(t, dsn, rel), Name: "test.sweeper", Retry: retry, Logger: testkit.Logger(t)}
		done := make(chan struct{})
		g.done = append(g.done, done)
		go func() { defer close(done); e.Run(ctx, g.terms.lead(i)) }()
	}
	t.Cleanup(g.shutdown)
	return g
}

func (g *group) shutdown() {
	g.stop()
	for _, d := range g.done {
		<-d
	}
}

// lockHolder is the backend pid holding the advisory lock of the
// leadership, 0 when none does.
func lockHolder(t *testing.T, db *pgxpool.Pool, name string) int {
	t.Helper()
	key := uint64(Key(name))
	var pid int
	err := db.QueryRow(context.Background(), `
		SELECT pid FROM pg_locks
		 WHERE locktype = 'advisory' AND granted AND objsubid = 1
		   AND classid::bigint = $1 AND objid::bigint = $2
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(key>>32), int64(key&0xffffffff)).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return pid
}

func terminate(t *testing.T, db *pgxpool.Pool, pid int) {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(t, ok)
}

func TestOnlyOneOfSeveralElectorsLeads(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	g := startGroup(t, dsn, 4, 10*time.Millisecond)
	require.Eventually(t, func() bool { s, _, _, _ := g.terms.snapshot(); return len(s) == 1 }, testWait, pollEvery)
	started, _, _, _ := g.terms.snapshot()
	leaderIdx := started[0]

	// Every standby has since been refused the lock several times.
	base := make([]int64, len(g.releases))
	for i, r := range g.releases {
		base[i] = r.Load()
	}
	require.Eventually(t, func() bool {
		for i, r := range g.releases {
			if i != leaderIdx && r.Load() < base[i]+3 {
				return false
			}
		}
		return true
	}, testWait, pollEvery)

	started, ended, active, maxSeen := g.terms.snapshot()
	require.Equal(t, []int{leaderIdx}, started, "one term, no other elector led")
	require.Equal(t, []bool{false}, ended)
	require.Equal(t, 1, active)
	require.Equal(t, 1, maxSeen)
	require.NotZero(t, lockHolder(t, testkit.NewPoolFor(t, dsn), "test.sweeper"))
}

func TestAStandbyTakesOverWhenTheLeadersConnectionDies(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	admin := testkit.NewPoolFor(t, dsn)
	g := startGroup(t, dsn, 3, 10*time.Millisecond)
	for round := 1; round <= 3; round++ {
		require.Eventually(t, func() bool {
			s, _, active, _ := g.terms.snapshot()
			return len(s) == round && active == 1 && lockHolder(t, admin, "test.sweeper") != 0
		}, testWait, pollEvery, "term %d began", round)
		pid := lockHolder(t, admin, "test.sweeper")
		terminate(t, admin, pid)
		require.Eventually(t, func() bool {
			s, ended, active, _ := g.terms.snapshot()
			holder := lockHolder(t, admin, "test.sweeper")
			return ended[round-1] && len(s) == round+1 && active == 1 && holder != 0 && holder != pid
		}, testWait, pollEvery, "term %d ended and another began on a new connection", round)
	}
	g.terms.mu.Lock()
	defer g.terms.mu.Unlock()
	require.Equal(t, []int64{1, 2, 3, 4}, g.terms.numbers, "each leader was handed a new, larger term")
}

// The leader must not go on leading on a lock that is gone: it learns of
// its connection's death when it happens, not at its next periodic check.
func TestALeaderLearnsAtOnceThatItsLockConnectionDied(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	admin := testkit.NewPoolFor(t, dsn)
	g := startGroup(t, dsn, 1, time.Hour)
	// Leading, not just holding the lock: a connection that dies while the
	// term is being started never leads (and retries in an hour).
	require.Eventually(t, func() bool {
		s, _, _, _ := g.terms.snapshot()
		return len(s) == 1 && lockHolder(t, admin, "test.sweeper") != 0
	}, testWait, pollEvery)
	terminate(t, admin, lockHolder(t, admin, "test.sweeper"))
	require.Eventually(t, func() bool {
		_, ended, active, _ := g.terms.snapshot()
		return len(ended) == 1 && ended[0] && active == 0
	}, testWait, pollEvery, "the term ended though the next check is an hour away")
}

func TestRunReturnsWhenItsContextEndsAndReleasesTheLeadership(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	admin := testkit.NewPoolFor(t, dsn)
	g := startGroup(t, dsn, 2, 10*time.Millisecond)
	require.Eventually(t, func() bool { s, _, _, _ := g.terms.snapshot(); return len(s) == 1 }, testWait, pollEvery)
	g.shutdown() // waits for every Run to return
	started, ended, active, _ := g.terms.snapshot()
	require.Len(t, started, 1)
	require.Equal(t, []bool{true}, ended)
	require.Zero(t, active)
	require.Eventually(t, func() bool { return lockHolder(t, admin, "test.sweeper") == 0 }, testWait, pollEvery)
}

// A leader whose fn returns gives the leadership up; it is taken again.
func TestLeadershipIsTakenAgainAfterTheLeaderReturns(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var terms atomic.Int64
	e := &Elector{DB: testkit.NewPoolFor(t, dsn), Name: "test.short", Retry: 10 * time.Millisecond, Logger: testkit.Logger(t)}
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx, func(context.Context) { terms.Add(1) }) }()
	require.Eventually(t, func() bool { return terms.Load() >= 3 }, testWait, pollEvery)
	cancel()
	<-done
}

func TestElectionsOfDifferentNamesDoNotExcludeEachOther(t *testing.T) {
	require.NotEqual(t, Key("a"), Key("b"))
	dsn := testkit.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	leading := make(chan string, 2)
	for _, name := range []string{"a", "b"} {
		e := &Elector{DB: testkit.NewPoolFor(t, dsn), Name: name, Retry: 10 * time.Millisecond, Logger: testkit.Logger(t)}
		wg.Go(func() { e.Run(ctx, func(ctx context.Context) { leading <- name; <-ctx.Done() }) })
	}
	got := map[string]bool{<-leading: true, <-leading: true}
	cancel()
	wg.Wait()
	require.Equal(t, map[string]bool{"a": true, "b": true}, got)
}

// A leader whose node drops off the network closes nothing: the server
// would keep its session, and the lock, until TCP gave up on the peer
// (hours). The lock is a lease instead: the server ends a lock session
// idle for LeaseFor(retry), which a live leader's pings never let happen.
func TestAStandbyTakesOverFromALeaderThatVanishedFromTheNetwork(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	admin := testkit.NewPoolFor(t, dsn)
	relay, relayed := testkit.NewRelay(t, dsn)
	const retry = 2 * time.Second // the default
	ctx, cancel := context.WithCancel(context.Background())
	var tr terms
	var done sync.WaitGroup
	t.Cleanup(func() { cancel(); done.Wait() })
	for i, db := range []*pgxpool.Pool{testkit.NewPoolFor(t, relayed), testkit.NewPoolFor(t, dsn)} {
		if i == 1 { // the standby starts once the first leads
			require.Eventually(t, func() bool { s, _, _, _ := tr.snapshot(); return len(s) == 1 }, testWait, pollEvery)
		}
		e := &Elector{DB: db, Name: "test.sweeper", Retry: retry, Logger: testkit.Logger(t)}
		done.Go(func() { e.Run(ctx, tr.lead(i)) })
	}

	time.Sleep(LeaseFor(retry) + retry) // a live leader outlives its lease
	started, ended, _, _ := tr.snapshot()
	require.Equal(t, []int{0}, started)
	require.Equal(t, []bool{false}, ended)

	relay.Partition()
	require.Eventually(t, func() bool {
		s, _, _, _ := tr.snapshot()
		return len(s) == 2 && s[1] == 1
	}, LeaseFor(retry)+2*retry+testWait, pollEvery, "the standby took over once the lease ran out")
	require.NotZero(t, lockHolder(t, admin, "test.sweeper"))
}

// A leader that vanishes from the network mid-write leaves its fenced
// transaction idle on the server, holding the term row FOR SHARE: the
// standby that takes the lock once the lease ran out waits on that row to
// start its term. The server ends the transaction once it sat idle for
// fencedIdleBound, and the standby leads.
func TestAStandbyTakesOverFromALeaderThatVanishedMidWrite(t *testing.T) {
	old := fencedIdleBound
	fencedIdleBound = 3 * time.Second
	t.Cleanup(func() { fencedIdleBound = old })
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	const retry = 2 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	var tr terms
	var done sync.WaitGroup
	t.Cleanup(func() { cancel(); done.Wait() })
	writing := make(chan struct{}, 1)
	leaderDB := testkit.NewPoolFor(t, relayed)
	first := &Elector{DB: leaderDB, Name: "test.sweeper", Retry: retry, Logger: testkit.Logger(t)}
	done.Go(func() {
		first.Run(ctx, func(lctx context.Context) {
			go tr.lead(0)(lctx)
			_ = FencedTx(lctx, leaderDB, func(pgx.Tx) error {
				writing <- struct{}{}
				<-lctx.Done() // a sweep's write under way
				return lctx.Err()
			})
		})
	})
	<-writing
	standby := &Elector{DB: testkit.NewPoolFor(t, dsn), Name: "test.sweeper", Retry: retry, Logger: testkit.Logger(t)}
	done.Go(func() { standby.Run(ctx, tr.lead(1)) })
	relay.Partition()
	require.Eventually(t, func() bool {
		s, _, _, _ := tr.snapshot()
		return len(s) >= 2 && s[len(s)-1] == 1
	}, LeaseFor(retry)+2*retry+testWait, pollEvery, "the standby took over")
}
