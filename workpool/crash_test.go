package workpool

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/migrations"
)

// crashable is a Manager of pool "p" (one slot) on a Postgres of its own,
// which its test crashes: the commits that do not wait for the disk are
// the ones a crash can take back.
type crashable struct {
	pg   *devstack.Postgres
	opts devstack.PostgresOptions
	db   *pgxpool.Pool
	m    *Manager
}

// newCrashable starts the Postgres and the Manager (cfg's pools and logger
// set here), with handler "h" registered, and enqueues one item of it
// without a retry policy: a single attempt.
func newCrashable(t *testing.T, cfg Config, h Handler) (*crashable, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	// (the WAL writer flushes what a commit left unflushed every 10 s,
	// not every 200 ms: the crash finds it unflushed, busy machine or not)
	c := &crashable{opts: devstack.PostgresOptions{DataDir: t.TempDir(), DieWithParent: true,
		Settings: map[string]string{"wal_writer_delay": "10s"}}}
	var err error
	c.pg, err = devstack.StartPostgres(ctx, c.opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.pg.Stop(context.Background())
		// (as root the cluster lives outside the test's temporary
		// directory, which the server's user cannot reach)
		_ = os.RemoveAll(c.pg.ClusterDir())
	})
	c.opts.Port = c.pg.Port()
	c.db, err = pgxpool.New(ctx, c.pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(c.db.Close)
	_, err = migrations.UpPool(ctx, c.db, nil)
	require.NoError(t, err)
	cfg.Pools, cfg.Logger = map[string]int{"p": 1}, testkit.Logger(t)
	c.m, err = New(c.db, cfg)
	require.NoError(t, err)
	c.m.Register("h", h)
	require.NoError(t, c.m.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.m.Stop(sctx)
	})
	id, err := c.m.Enqueue(ctx, EnqueueParams{OrgID: "o", Pool: "p", Handler: "h"})
	require.NoError(t, err)
	return c, id
}

// crash stops Postgres as a crash does (immediate shutdown: nothing more
// is written) and starts it again on the same port and directory. It
// returns the database's time just before.
func (c *crashable) crash(t *testing.T) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, c.db.QueryRow(context.Background(), `SELECT now()`).Scan(&at))
	b, err := os.ReadFile(filepath.Join(c.pg.ClusterDir(), "postmaster.pid"))
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT))
	select {
	case <-c.pg.Wait():
	case <-time.After(30 * time.Second):
		t.Fatal("postgres did not stop")
	}
	time.Sleep(500 * time.Millisecond)
	c.pg, err = devstack.StartPostgres(context.Background(), c.opts)
	require.NoError(t, err)
	return at
}

// startedAgain waits until work id, its start lost in the crash at at, is
// started again (or finished): false when the start had reached the disk
// before the crash and nothing is started again.
func (c *crashable) startedAgain(id uuid.UUID, at time.Time) bool {
	again := false
	for deadline := time.Now().Add(25 * time.Second); !again && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = c.db.QueryRow(context.Background(), `SELECT (state = 'running' AND started_at > $2) OR state = 'finished'
			FROM workpool_work WHERE id = $1`, id, at).Scan(&again)
	}
	return again
}

// row is work id's state, outcome and error.
func (c *crashable) row(id uuid.UUID) (state string, outcome, errText *string) {
	_ = c.db.QueryRow(context.Background(), `SELECT state, outcome, error FROM workpool_work WHERE id = $1`, id).Scan(&state, &outcome, &errText)
	return state, outcome, errText
}

// quietHeartbeat keeps the executor's own heartbeat out of a crash test:
// its commit waits for the disk, and would write out the start (or the
// cancel) the crash is to find unflushed; a test that needs one calls it.
var quietHeartbeat = Config{HeartbeatInterval: 20 * time.Second, HeartbeatTimeout: time.Minute}

// signal sends on ch without waiting (a test's "it happened").
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func waitOn(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal(what)
	}
}

// Work without a retry policy has a single attempt (docs/workpool.md §
// Retries). A start commits without waiting for the disk, and the handler
// runs as soon as it commits: a Postgres crash just after (an immediate
// shutdown here, as a kill or an OOM would) loses the start, the work is
// pending again with no attempt counted, and the loop starts it again —
// on this replica, whose executor runs that attempt already: it goes on
// once, not twice (unless a heartbeat gave it up first: the next test).
func TestAStartLostInAPostgresCrashDoesNotRunItsAttemptTwice(t *testing.T) {
	var mu sync.Mutex
	runs := 0
	first := make(chan struct{}, 1)
	c, id := newCrashable(t, quietHeartbeat, func(hctx context.Context, j Job) (json.RawMessage, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		signal(first)
		<-hctx.Done() // a long job: still running across the outage
		return nil, hctx.Err()
	})
	waitOn(t, first, "the handler never ran")

	require.True(t, c.startedAgain(id, c.crash(t)), "the start was lost in the crash and the work started again")
	time.Sleep(time.Second) // (a second run would have begun by now)
	state, _, _ := c.row(id)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, runs, "the single-attempt handler of work %s ran %d times; the row is %s", id, runs, state)
}

// The same lost start, with a heartbeat after the database is back and
// before the loop starts the work again: it finds
// the row pending, not this executor's, and gives the run up (errLost);
// the handler winds down for a few seconds. The re-start then runs the
// attempt anew (the run given up does not "go on"), and the run given up
// reports nothing: its "context canceled" was recorded as the attempt's
// result, failing work whose handler never failed.
func TestARunGivenUpAfterAPostgresCrashDoesNotDecideItsWork(t *testing.T) {
	var mu sync.Mutex
	var causes []string
	first := make(chan struct{}, 1)
	c, id := newCrashable(t, quietHeartbeat,
		func(hctx context.Context, j Job) (json.RawMessage, error) {
			signal(first)
			<-hctx.Done()
			mu.Lock()
			causes = append(causes, context.Cause(hctx).Error())
			mu.Unlock()
			time.Sleep(5 * time.Second) // winding down
			return nil, hctx.Err()
		})
	waitOn(t, first, "the handler never ran")

	at := c.crash(t)
	// the heartbeat, as soon as the database answers (the loop leads
	// again only after its retry delay)
	require.Eventually(t, func() bool { return c.m.exec.heartbeat() == nil }, 20*time.Second, 50*time.Millisecond)
	require.True(t, c.startedAgain(id, at), "the start was lost in the crash and the work started again")
	time.Sleep(7 * time.Second) // (the run given up has wound down and reported, or not)
	state, outcome, errText := c.row(id)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("handler contexts ended by: %q; row: %s outcome=%v error=%v", causes, state, deref(outcome), deref(errText))
	require.NotEqual(t, "finished", state, "single-attempt work whose handler never failed finished %v: %v", deref(outcome), deref(errText))
}

// A cancel of running work: the loop flags it and tells the executor,
// which stops the handler; the attempt finishes canceled (SPEC §3). The
// iteration that flags it commits durably before the executor is told: a
// Postgres crash right after lost the flag of a commit that had not
// waited for the disk, and the stopped attempt finished failed.
func TestACancelOfRunningWorkSurvivesAPostgresCrash(t *testing.T) {
	started, sawCancel, crashed := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	c, id := newCrashable(t, quietHeartbeat,
		func(hctx context.Context, j Job) (json.RawMessage, error) {
			signal(started)
			<-hctx.Done()
			signal(sawCancel)
			<-crashed // (its result, recorded durably, would write the flag out too)
			return nil, hctx.Err()
		})
	waitOn(t, started, "the handler never ran")
	require.NoError(t, c.m.Cancel(context.Background(), "o", id))
	waitOn(t, sawCancel, "the handler was never told of the cancel")
	c.crash(t)
	close(crashed)

	var state string
	var outcome, errText *string
	for deadline := time.Now().Add(40 * time.Second); state != "finished" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		state, outcome, errText = c.row(id)
	}
	require.Equal(t, "finished", state)
	require.Equal(t, "canceled", *outcome, "work canceled while running finished %s (error %q)", *outcome, deref(errText))
}
