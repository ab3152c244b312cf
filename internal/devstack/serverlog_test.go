package devstack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// ServerLog finds the server log of a data dir's cluster where
// clusterDirFor put it: inside the data dir, or under the temp dir (when
// the server's user cannot reach the data dir, as under root); none when
// neither has one.
func TestServerLogIsFoundWhereverTheClusterLives(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster func(abs string) string
	}{
		{"inside the data dir", func(abs string) string { return filepath.Join(abs, "postgres") }},
		{"under the temp dir", tempClusterDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			require.Empty(t, ServerLog(dataDir), "no cluster, no log")
			cluster := tc.cluster(dataDir)
			require.NoError(t, os.MkdirAll(cluster, 0o755))
			t.Cleanup(func() { _ = os.RemoveAll(cluster) })
			require.Empty(t, ServerLog(dataDir), "a cluster without a log")
			log := filepath.Join(cluster, "server.log")
			require.NoError(t, os.WriteFile(log, []byte("LOG:  database system is ready\n"), 0o644))
			require.Equal(t, log, ServerLog(dataDir))
		})
	}
}
