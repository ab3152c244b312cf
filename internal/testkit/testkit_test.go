package testkit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
)

func TestMain(m *testing.M) { Main(m) }

// Another test process reaps what reapAbandoned's pattern matches unless a
// live process holds its lock: this process's cluster must be both.
func TestTheTestClusterIsLockedByItsTestProcess(t *testing.T) {
	if os.Getenv("REVEILLE_TEST_DATABASE_URL") != "" {
		require.Empty(t, serverDir, "with an external database the tests start no cluster, so there is none to lock")
		return
	}
	matched, err := filepath.Match(filepath.Join(os.TempDir(), testDirPattern), serverDir)
	require.NoError(t, err)
	require.True(t, matched, serverDir)

	_, _, abandoned := devstack.LockAbandonedDataDir(serverDir)
	require.False(t, abandoned)
	_, err = devstack.LockDataDir(serverDir, "another test process")
	var inUse *devstack.DataDirInUseError
	require.ErrorAs(t, err, &inUse)
	require.Equal(t, os.Getpid(), inUse.PID)
	require.Equal(t, filepath.Base(os.Args[0]), inUse.Holder)
}
