package devstack

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestASecondLockOfADataDirFailsAtOnceNamingTheHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	held, err := LockDataDir(dir, "engine dev")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release() })

	// flock belongs to the open file description: a second open of the
	// same file conflicts even within one process.
	_, err = LockDataDir(dir, "engine devstack")
	require.ErrorIs(t, err, ErrDataDirInUse)
	var inUse *DataDirInUseError
	require.ErrorAs(t, err, &inUse)
	require.Equal(t, DataDirInUseError{Dir: dir, PID: os.Getpid(), Holder: "engine dev"}, *inUse)
	require.EqualError(t, err, fmt.Sprintf("data directory %s is in use by pid %d (engine dev)", dir, os.Getpid()))

	require.NoError(t, held.Release())
	require.NoError(t, held.Release(), "releasing twice is fine")
	again, err := LockDataDir(dir, "engine devstack")
	require.NoError(t, err, "a released lock is free")
	require.NoError(t, again.Release())
}

func TestDataDirInUseErrorSaysWhatItKnows(t *testing.T) {
	cases := []struct {
		err  DataDirInUseError
		want string
	}{
		{DataDirInUseError{Dir: "./.reveille", PID: 1234, Holder: "engine dev"}, "data directory ./.reveille is in use by pid 1234 (engine dev)"},
		{DataDirInUseError{Dir: "./.reveille", PID: 1234}, "data directory ./.reveille is in use by pid 1234"},
		{DataDirInUseError{Dir: "./.reveille"}, "data directory ./.reveille is in use by another process"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			require.Equal(t, tc.want, tc.err.Error())
		})
	}
}
