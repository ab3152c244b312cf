package main

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// `engine demo` with no engine answering starts one in process — the data
// dir's local Postgres and an embedded Temporal — and stops it when the
// demo ends: runDemo returned without ending the context that engine ran
// under, so the process exited with its postmaster still running. Found
// by review.
func TestTheDemoStopsThePostgresItStartedWhenItEnds(t *testing.T) {
	clearEnv(t)
	work, err := os.MkdirTemp("", "reveille-demo-stop-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(work) })
	require.NoError(t, os.Chmod(work, 0o755)) // (Postgres runs as its own user under root)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	api := "http://" + ln.Addr().String() // nothing answers there: the demo starts its engine
	require.NoError(t, ln.Close())
	data := filepath.Join(work, "data")

	require.NoError(t, runDemo(context.Background(), []string{"--api", api, "--data-dir", data}))

	pids, err := filepath.Glob(filepath.Join(data, "*", "postmaster.pid"))
	require.NoError(t, err)
	require.Empty(t, pids, "the demo's Postgres still runs after the demo ended")
	entries, err := os.ReadDir(data)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the demo started its stack in the data dir")
	_, err = os.Stat(filepath.Join(data, "postmaster.pid"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}
