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

// Work without a retry policy has a single attempt (docs/workpool.md §
// Retries). A start commits without waiting for the disk, and the handler
// runs as soon as it commits: a Postgres crash just after (an immediate
// shutdown here, as a kill or an OOM would) loses the start, the work is
// pending again with no attempt counted, and the loop starts it again —
// on this replica, whose executor runs that attempt already: it goes on
// once, not twice. (On another replica it would run again: see
// docs/operations.md.)
func TestAStartLostInAPostgresCrashDoesNotRunItsAttemptTwice(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := devstack.PostgresOptions{DataDir: dir, DieWithParent: true}
	pg, err := devstack.StartPostgres(ctx, opts)
	require.NoError(t, err)
	current := pg
	t.Cleanup(func() { _ = current.Stop(context.Background()) })
	opts.Port = pg.Port()

	db, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = migrations.UpPool(ctx, db, nil)
	require.NoError(t, err)

	m, err := New(db, Config{Pools: map[string]int{"p": 1}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	type run struct {
		id      uuid.UUID
		attempt int
	}
	var mu sync.Mutex
	var runs []run
	first := make(chan struct{}, 1)
	m.Register("h", func(hctx context.Context, j Job) (json.RawMessage, error) {
		mu.Lock()
		runs = append(runs, run{j.ID, j.Attempt})
		mu.Unlock()
		select {
		case first <- struct{}{}:
		default:
		}
		<-hctx.Done() // a long job: still running across the outage
		return nil, hctx.Err()
	})
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(sctx)
	})

	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "o", Pool: "p", Handler: "h"}) // no retry policy: one attempt
	require.NoError(t, err)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}

	var crashAt time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT now()`).Scan(&crashAt))
	// Postgres crashes now (immediate shutdown: no WAL written after this).
	b, err := os.ReadFile(filepath.Join(pg.ClusterDir(), "postmaster.pid"))
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT))
	select {
	case <-pg.Wait():
	case <-time.After(30 * time.Second):
		t.Fatal("postgres did not stop")
	}
	time.Sleep(500 * time.Millisecond)
	current, err = devstack.StartPostgres(ctx, opts)
	require.NoError(t, err)

	// Once the database is back, the lost start leaves the work pending
	// and the loop starts it again (unless the start reached the disk
	// before the crash: then nothing is started again); the attempt
	// already running must not run a second time.
	startedAgain := false
	for deadline := time.Now().Add(25 * time.Second); !startedAgain && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = db.QueryRow(ctx, `SELECT state = 'running' AND started_at > $2 FROM workpool_work WHERE id = $1`, id, crashAt).Scan(&startedAgain)
	}
	if !startedAgain {
		t.Log("the start reached the disk before the crash: nothing was started again")
	}
	time.Sleep(time.Second) // (a second run would have begun by now)
	var state string
	var attempts int
	_ = db.QueryRow(ctx, `SELECT state, attempts FROM workpool_work WHERE id = $1`, id).Scan(&state, &attempts)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, 1, "the single-attempt handler of work %s ran %d times (%v); the row is now %s with %d attempts counted",
		id, len(runs), runs, state, attempts)
}

// crashPostgres stops pg as a crash does (immediate shutdown: nothing more
// is written) and starts it again on the same port and directory.
func crashPostgres(t *testing.T, pg *devstack.Postgres, opts devstack.PostgresOptions) *devstack.Postgres {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pg.ClusterDir(), "postmaster.pid"))
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT))
	select {
	case <-pg.Wait():
	case <-time.After(30 * time.Second):
		t.Fatal("postgres did not stop")
	}
	time.Sleep(500 * time.Millisecond)
	opts.Port = pg.Port()
	next, err := devstack.StartPostgres(context.Background(), opts)
	require.NoError(t, err)
	return next
}

// A cancel of running work: the loop flags it and tells the executor,
// which stops the handler; the attempt finishes canceled (SPEC §3). The
// iteration that flags it commits durably before the executor is told: a
// Postgres crash right after lost the flag of a commit that had not
// waited for the disk, and the stopped attempt finished failed.
func TestACancelOfRunningWorkSurvivesAPostgresCrash(t *testing.T) {
	ctx := context.Background()
	opts := devstack.PostgresOptions{DataDir: t.TempDir(), DieWithParent: true}
	pg, err := devstack.StartPostgres(ctx, opts)
	require.NoError(t, err)
	current := pg
	t.Cleanup(func() { _ = current.Stop(context.Background()) })

	db, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = migrations.UpPool(ctx, db, nil)
	require.NoError(t, err)

	m, err := New(db, Config{Pools: map[string]int{"p": 1}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	started, sawCancel := make(chan struct{}, 1), make(chan struct{}, 1)
	m.Register("h", func(hctx context.Context, j Job) (json.RawMessage, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-hctx.Done()
		select {
		case sawCancel <- struct{}{}:
		default:
		}
		return nil, hctx.Err()
	})
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(sctx)
	})
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "o", Pool: "p", Handler: "h"})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	require.NoError(t, m.Cancel(ctx, "o", id))
	select {
	case <-sawCancel:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was never told of the cancel")
	}
	current = crashPostgres(t, pg, opts)

	var state string
	var outcome, errText *string
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		err := db.QueryRow(ctx, `SELECT state, outcome, error FROM workpool_work WHERE id = $1`, id).Scan(&state, &outcome, &errText)
		if err == nil && state == "finished" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, "finished", state)
	require.Equal(t, "canceled", *outcome, "work canceled while running finished %s (error %q)", *outcome, deref(errText))
}

// The same lost start, with heartbeats often enough that one lands after
// the database is back and before the loop starts the work again: it finds
// the row pending, not this executor's, and gives the run up (errLost);
// the handler winds down for a few seconds. The re-start then runs the
// attempt anew (the run given up does not "go on"), and the run given up
// reports nothing: its "context canceled" was recorded as the attempt's
// result, failing work whose handler never failed.
func TestARunGivenUpAfterAPostgresCrashDoesNotDecideItsWork(t *testing.T) {
	ctx := context.Background()
	opts := devstack.PostgresOptions{DataDir: t.TempDir(), DieWithParent: true}
	pg, err := devstack.StartPostgres(ctx, opts)
	require.NoError(t, err)
	current := pg
	t.Cleanup(func() { _ = current.Stop(context.Background()) })

	db, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = migrations.UpPool(ctx, db, nil)
	require.NoError(t, err)

	m, err := New(db, Config{Pools: map[string]int{"p": 1}, Logger: testkit.Logger(t),
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 20 * time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	var causes []string
	first := make(chan struct{}, 1)
	m.Register("h", func(hctx context.Context, j Job) (json.RawMessage, error) {
		select {
		case first <- struct{}{}:
		default:
		}
		<-hctx.Done()
		mu.Lock()
		causes = append(causes, context.Cause(hctx).Error())
		mu.Unlock()
		time.Sleep(5 * time.Second) // winding down
		return nil, hctx.Err()
	})
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(sctx)
	})

	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "o", Pool: "p", Handler: "h"})
	require.NoError(t, err)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	var crashAt time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT now()`).Scan(&crashAt))
	current = crashPostgres(t, pg, opts)

	startedAgain := false
	for deadline := time.Now().Add(25 * time.Second); !startedAgain && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = db.QueryRow(ctx, `SELECT (state = 'running' AND started_at > $2) OR state = 'finished' FROM workpool_work WHERE id = $1`, id, crashAt).Scan(&startedAgain)
	}
	if !startedAgain {
		t.Skip("the start reached the disk before the crash: nothing was started again")
	}
	time.Sleep(7 * time.Second)
	var state string
	var outcome, errText *string
	_ = db.QueryRow(ctx, `SELECT state, outcome, error FROM workpool_work WHERE id = $1`, id).Scan(&state, &outcome, &errText)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("handler contexts ended by: %q; row: %s outcome=%v error=%v", causes, state, deref(outcome), deref(errText))
	require.NotEqual(t, "finished", state, "single-attempt work whose handler never failed finished %v: %v", deref(outcome), deref(errText))
}
