package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// captureStderr points the engine's stderr at a buffer for the test and
// puts the process's default loggers back after it.
func captureStderr(t *testing.T) *testkit.LogBuffer {
	t.Helper()
	buf := &testkit.LogBuffer{}
	saved, savedDefault, savedFlags, savedOut := stderr, slog.Default(), log.Flags(), log.Writer()
	stderr = buf
	t.Cleanup(func() {
		stderr = saved
		slog.SetDefault(savedDefault)
		log.SetOutput(savedOut)
		log.SetFlags(savedFlags)
	})
	return buf
}

// requireJSONLines fails unless every line of out is a JSON object, and
// returns their messages.
func requireJSONLines(t *testing.T, out string) []string {
	t.Helper()
	var msgs []string
	for line := range strings.Lines(out) {
		var rec struct{ Msg string }
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a line that is not JSON: %q", line)
		msgs = append(msgs, rec.Msg)
	}
	return msgs
}

// serve's and dev's stderr is a JSON log stream: what a library writes
// to the standard library's log package or to slog.Default (the JWKS
// refresher's "Failed to refresh HTTP JWK Set"), the signal handler's lines
// and the command's failure are JSON lines like the service's own.
func TestServeAndDevWriteOnlyJSONLinesToStderr(t *testing.T) {
	for _, c := range commands() {
		if c.name != "serve" && c.name != "dev" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			// Both set: dev starts neither; a canceled context ends the
			// run at the first database ping, after logging is set up (a
			// stop during the start, logged as such).
			t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/reveille?connect_timeout=1")
			t.Setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")
			t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
			t.Setenv("REVEILLE_DATA_DIR", t.TempDir())
			buf := captureStderr(t)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()

			err := c.run(ctx, []string{"--addr", "127.0.0.1:0"})
			require.NoError(t, err, "a stop during the start is not a failure")
			log.Printf("2026/12/02 11:25:18 a library's plain line")
			slog.Default().Error("Failed to refresh HTTP JWK Set from remote HTTP resource.")
			sigs := make(chan os.Signal, 2)
			sigs <- syscall.SIGTERM
			sigs <- syscall.SIGTERM
			exited := -1
			onSignals(sigs, func() {}, func(code int) { exited = code })
			reportFailure(c, errors.New("boom"))

			msgs := requireJSONLines(t, buf.String())
			require.Equal(t, 1, exited, "a second signal exits non-zero")
			for _, want := range []string{"2026/12/02 11:25:18 a library's plain line", "Failed to refresh HTTP JWK Set from remote HTTP resource.",
				"stopping: send the signal again to exit at once", "signal again: exiting without waiting for the drain", "engine " + c.name + " failed",
				"stopped before the start completed"} {
				require.Contains(t, msgs, want)
			}
		})
	}
}

// The commands that print for people (migrate, token…) keep a plain
// failure line.
func TestOtherCommandsReportAFailureInPlainText(t *testing.T) {
	buf := captureStderr(t)
	reportFailure(command{name: "migrate"}, errors.New("boom"))
	require.Equal(t, "engine migrate: boom\n", buf.String())
}
