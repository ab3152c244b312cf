package migrations

import (
	"testing"
	"time"
)

// SetLockWait shortens how long a migrator waits for another's lock, for
// the test (the package's tests do not run in parallel).
func SetLockWait(t *testing.T, d time.Duration) {
	old := lockWait
	lockWait = d
	t.Cleanup(func() { lockWait = old })
}

// LockID is the migration lock's advisory key.
const LockID = lockID
