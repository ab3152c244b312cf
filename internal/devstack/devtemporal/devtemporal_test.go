package devtemporal

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/dynamicconfig"
)

func dial(t *testing.T, s *Server) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{
		HostPort:  s.Address(),
		Namespace: s.Namespace(),
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func TestServerPersistsAcrossRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dataDir := filepath.Join(t.TempDir(), "data") // does not exist yet
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	began := time.Now()
	s, err := Start(ctx, Options{DataDir: dataDir, Logger: logger})
	require.NoError(t, err)
	t.Logf("first start (schema setup) took %s", time.Since(began))
	t.Cleanup(func() { _ = s.Stop() })

	require.Equal(t, "default", s.Namespace())
	host, _, err := net.SplitHostPort(s.Address())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	require.FileExists(t, filepath.Join(dataDir, "temporal.sqlite"))

	c := dial(t, s)
	_, err = c.CheckHealth(ctx, &client.CheckHealthRequest{})
	require.NoError(t, err)
	ns, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Equal(t, "default", ns.GetNamespaceInfo().GetName())

	// The frontend port is taken now: a second server on it must fail clearly.
	_, err = Start(ctx, Options{DataDir: t.TempDir(), Port: portOf(t, s.Address())})
	require.ErrorContains(t, err, "not available")
	require.ErrorIs(t, err, syscall.EADDRINUSE)

	// The data dir is in use by s: refused before touching the database.
	_, err = Start(ctx, Options{DataDir: dataDir})
	require.ErrorContains(t, err, "already used by another server")

	// A second server with its own data dir and a free port runs side by side.
	other, err := Start(ctx, Options{DataDir: t.TempDir(), Namespace: "other"})
	require.NoError(t, err)
	require.NotEqual(t, s.Address(), other.Address())
	_, err = dial(t, other).CheckHealth(ctx, &client.CheckHealthRequest{})
	require.NoError(t, err)
	require.NoError(t, other.Stop())

	// Start a workflow on a task queue nobody polls: it stays running.
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:        "devtemporal-restart-test",
		TaskQueue: "devtemporal-nobody-polls",
	}, "SomeWorkflow", "arg")
	require.NoError(t, err)

	began = time.Now()
	require.NoError(t, s.Stop())
	t.Logf("stop took %s", time.Since(began))
	require.NoError(t, s.Stop(), "second Stop must be a no-op")

	began = time.Now()
	s2, err := Start(ctx, Options{DataDir: dataDir, Logger: logger})
	require.NoError(t, err)
	t.Logf("restart took %s", time.Since(began))
	t.Cleanup(func() { _ = s2.Stop() })

	c2 := dial(t, s2)
	desc, err := c2.DescribeWorkflowExecution(ctx, run.GetID(), run.GetRunID())
	require.NoError(t, err)
	info := desc.GetWorkflowExecutionInfo()
	require.Equal(t, "SomeWorkflow", info.GetType().GetName())
	require.Equal(t, run.GetRunID(), info.GetExecution().GetRunId())
	require.Equal(t, "devtemporal-nobody-polls", info.GetTaskQueue())

	began = time.Now()
	require.NoError(t, s2.Stop())
	t.Logf("second stop took %s", time.Since(began))
}

func TestServerWritesItsDatabaseInWALMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dataDir := t.TempDir()
	s, err := Start(ctx, Options{DataDir: dataDir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })

	// Bytes 18 and 19 of an SQLite file's header are its write and read
	// format versions: 2 in WAL mode, 1 with the rollback journal.
	f, err := os.Open(filepath.Join(dataDir, "temporal.sqlite"))
	require.NoError(t, err)
	defer f.Close()
	header := make([]byte, 20)
	_, err = io.ReadFull(f, header)
	require.NoError(t, err)
	require.Equal(t, []byte{2, 2}, header[18:20], "the database is not in WAL mode: every commit pays the rollback journal's fsyncs")
}

func TestServerGivesEveryTaskQueueOnePartition(t *testing.T) {
	// Four partitions (Temporal's default) left workflow tasks in the
	// backlogs of partitions no poller was on, for up to a long poll (a
	// minute); one host needs no spreading. Checked on the configuration:
	// the stall itself needs a loaded machine to show.
	conf := dynamicConfig()
	for _, key := range []dynamicconfig.Key{
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key(),
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(),
	} {
		t.Run(key.String(), func(t *testing.T) {
			require.Equal(t, 1, conf[key])
		})
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	port, err := net.LookupPort("tcp", p)
	require.NoError(t, err)
	return port
}
