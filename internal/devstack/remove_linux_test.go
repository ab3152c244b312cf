package devstack

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// DieWithParent is Linux only (Pdeathsig), so is its test.
func TestAPostmasterStartedToDieWithItsParentStopsWhenTheParentIsKilled(t *testing.T) {
	killed := killedTestProcess(t, filepath.Join(t.TempDir(), "data"), true)
	require.Eventually(t, func() bool { return processGone(killed.postmaster) }, 30*time.Second, 20*time.Millisecond)
}
