package queue

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/listen"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/migrations"
)

// dispatcherWarnings are the times of the dispatcher's connection warnings
// logged to logs.
func dispatcherWarnings(t *testing.T, logs *testkit.LogBuffer) []time.Time {
	t.Helper()
	var out []time.Time
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Time  time.Time `json:"time"`
			Level string    `json:"level"`
			Msg   string    `json:"msg"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line %s", line)
		if rec.Level == "WARN" && strings.HasPrefix(rec.Msg, "signal dispatcher ") {
			out = append(out, rec.Time)
		}
	}
	return out
}

// Through a Postgres outage the dispatcher retries its connection with
// the LISTEN hubs' capped exponential backoff — one warning per attempt,
// further and further apart — rather than every second for the whole
// outage, and once Postgres is back it sends what is due. The test runs a
// cluster of its own, so that it can stop and restart it.
func TestTheDispatcherBacksOffThroughAPostgresOutage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop(context.Background()); _ = os.RemoveAll(pg.ClusterDir()) })
	db, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = migrations.UpPool(ctx, db, nil)
	require.NoError(t, err)

	var logs testkit.LogBuffer
	sig := newRecordingSignaler()
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, d.Start(ctx))
	t.Cleanup(func() { require.NoError(t, d.Stop(context.Background())) })
	_, _, err = Enqueue(ctx, db, signalParams("wf-before"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return sig.count("wf-before") == 1 }, testWait, testTick)

	port := pg.Port()
	require.NoError(t, pg.Stop(ctx))
	// 50 ms doubled: the attempts after 0.05, 0.15, 0.35, 0.75, 1.55, 3.15
	// and 6.35 s; at a fixed second there were seven by 6 s, a second apart.
	const outage = 7 * time.Second
	time.Sleep(outage)
	warnings := dispatcherWarnings(t, &logs)
	require.GreaterOrEqual(t, len(warnings), 5, "the dispatcher retries through the outage")
	require.LessOrEqual(t, len(warnings), 9, "one warning per attempt, the attempts backing off")
	var gaps []time.Duration
	for i := 1; i < len(warnings); i++ {
		gaps = append(gaps, warnings[i].Sub(warnings[i-1]))
	}
	for i := 1; i < len(gaps); i++ {
		require.Greater(t, gaps[i], gaps[i-1], "each wait longer than the last: %v", gaps)
	}
	require.Greater(t, gaps[len(gaps)-1], 1500*time.Millisecond, "the waits grow past the old fixed second: %v", gaps)
	require.LessOrEqual(t, gaps[len(gaps)-1], listen.ReconnectMax+time.Second, "and stop at the cap: %v", gaps)

	pg, err = devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir, Port: port})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	require.Eventually(t, func() bool {
		_, _, err := Enqueue(ctx, db, signalParams("wf-after"))
		return err == nil
	}, testWait, 100*time.Millisecond)
	require.Eventually(t, func() bool { return sig.count("wf-after") == 1 }, testWait+listen.ReconnectMax, testTick,
		"the dispatcher reconnected and sent what was due")
}
